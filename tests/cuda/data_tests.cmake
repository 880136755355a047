# CUDA tests of data/: MNIST held in device memory and its gather kernel, against the CPU twin
# and the host pipeline's batches. Included by CMakeLists.txt here.
kiln_test(device_mnist_cuda_test SOURCES device_mnist_cuda_test.cpp
          LABELS ${KILN_CUDA_TEST_LABEL} LIBS kiln_data)
