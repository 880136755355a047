# Parity tests of the engine's CUDA kernels (engine/cuda/kernels) against the CPU: elementwise,
# reductions, transpose, softmax and matmul through the ops and autograd (ops_cuda_test), every
# step of the hand GEMM and cuBLAS called directly (gemm_cuda_test), and the fused optimizer
# updates (optim_cuda_test). Included by CMakeLists.txt here.
kiln_test(ops_cuda_test SOURCES ops_cuda_test.cpp
          LABELS ${KILN_CUDA_TEST_LABEL} LIBS kiln_engine)
if(KILN_CUDA_SIM)
  # Transposes and sums once more with every grid-stride loop taking several passes
  # (engine/cuda/kernels/grid_stride.h): the barriers before shared memory is reused run.
  add_test(NAME ops_cuda_test_grid_stride
           COMMAND ops_cuda_test --gtest_filter=OpsCuda.Transpose*:OpsCuda.SumAndMean*)
  set_tests_properties(ops_cuda_test_grid_stride PROPERTIES LABELS sim
    ENVIRONMENT "KILN_SIM_GRID_STRIDE_CAP=2")
endif()
kiln_test(gemm_cuda_test SOURCES gemm_cuda_test.cpp
          LABELS ${KILN_CUDA_TEST_LABEL} LIBS kiln_engine)
kiln_test(optim_cuda_test SOURCES optim_cuda_test.cpp
          LABELS ${KILN_CUDA_TEST_LABEL} LIBS kiln_engine)
