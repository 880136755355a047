# Parity of whole models (models/) on CUDA against the CPU: ResNet-18, and narrow nets of the
# depth of ResNet-50/101/152, training step and eval forward. Included by CMakeLists.txt here.
kiln_test(resnet_cuda_test SOURCES resnet_cuda_test.cpp
          LABELS ${KILN_CUDA_TEST_LABEL} LIBS kiln_models)
