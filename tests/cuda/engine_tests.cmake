# Tests of the engine's CUDA kernels (engine/cuda/kernels) beyond the parity table of
# tests/parity: the ops' errors, determinism and a second device (ops_cuda_test), every
# step of the hand GEMM and cuBLAS called directly (gemm_cuda_test), and the fused optimizer
# updates (optim_cuda_test). Included by CMakeLists.txt here.
kiln_test(ops_cuda_test SOURCES ops_cuda_test.cpp
          LABELS ${KILN_CUDA_TEST_LABEL} LIBS kiln_engine)
kiln_test(gemm_cuda_test SOURCES gemm_cuda_test.cpp
          LABELS ${KILN_CUDA_TEST_LABEL} LIBS kiln_engine)
kiln_test(optim_cuda_test SOURCES optim_cuda_test.cpp
          LABELS ${KILN_CUDA_TEST_LABEL} LIBS kiln_engine)
# The mixed-precision GEMM (bf16 / f16 inputs, f32 output), hand and cuBLAS.
kiln_test(gemm_lowp_cuda_test SOURCES gemm_lowp_cuda_test.cpp
          LABELS ${KILN_CUDA_TEST_LABEL} LIBS kiln_engine)
