# Parity tests of the layer kernels in layers/*_cuda.cu against their CPU twins: BatchNorm2d,
# Dropout (bit-identical masks), CrossEntropyLoss and MSELoss. Included by CMakeLists.txt here.
kiln_test(batchnorm2d_cuda_test SOURCES batchnorm2d_cuda_test.cpp
          LABELS ${KILN_CUDA_TEST_LABEL} LIBS kiln_layers)
kiln_test(dropout_cuda_test SOURCES dropout_cuda_test.cpp
          LABELS ${KILN_CUDA_TEST_LABEL} LIBS kiln_layers)
kiln_test(loss_cuda_test SOURCES loss_cuda_test.cpp
          LABELS ${KILN_CUDA_TEST_LABEL} LIBS kiln_layers)
