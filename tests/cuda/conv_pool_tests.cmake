# Parity tests of Conv2d (hand implicit GEMM and direct kernels, cuDNN on a real GPU) and of
# the pooling layers on CUDA against their CPU twins. Included by CMakeLists.txt here.
kiln_test(conv2d_cuda_test SOURCES conv2d_cuda_test.cpp
          LABELS ${KILN_CUDA_TEST_LABEL} LIBS kiln_layers)
kiln_test(pool2d_cuda_test SOURCES pool2d_cuda_test.cpp
          LABELS ${KILN_CUDA_TEST_LABEL} LIBS kiln_layers)
# Mixed precision through cuDNN: bf16 / f16 inputs, f32 outputs (the simulated cuDNN here).
kiln_test(conv2d_cudnn_lowp_cuda_test SOURCES conv2d_cudnn_lowp_cuda_test.cpp
          LABELS ${KILN_CUDA_TEST_LABEL} LIBS kiln_layers)
# Channels-last activations through cuDNN (CUDNN_TENSOR_NHWC, KRSC weight copies).
kiln_test(conv2d_cudnn_nhwc_cuda_test SOURCES conv2d_cudnn_nhwc_cuda_test.cpp
          LABELS ${KILN_CUDA_TEST_LABEL} LIBS kiln_layers)
# Channels-last activations through the hand kernels (direct and implicit GEMM), either weight
# order, against the CPU in double.
kiln_test(conv2d_nhwc_cuda_test SOURCES conv2d_nhwc_cuda_test.cpp
          LABELS ${KILN_CUDA_TEST_LABEL} LIBS kiln_layers)
# 16-bit activations (AutocastOutputs::LowPrecision): conv2d's bf16/f16 y and dx on cuda:0.
kiln_test(conv2d_lowp_outputs_cuda_test SOURCES conv2d_lowp_outputs_cuda_test.cpp
          LABELS ${KILN_CUDA_TEST_LABEL} LIBS kiln_layers)
