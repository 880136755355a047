# Tests of the engine's CUDA kernels (engine/cuda/kernels) beyond the parity table of
# tests/parity: the ops' errors, determinism and a second device (ops_cuda_test), every
# step of the hand GEMM and cuBLAS called directly (gemm_cuda_test, gemm_tensor_core_test,
# gemm_sm90_test), and the fused optimizer updates (optim_cuda_test). Included by
# CMakeLists.txt here.
kiln_test(ops_cuda_test SOURCES ops_cuda_test.cpp
          LABELS ${KILN_CUDA_TEST_LABEL} LIBS kiln_engine)
kiln_test(gemm_cuda_test SOURCES gemm_cuda_test.cpp
          LABELS ${KILN_CUDA_TEST_LABEL} LIBS kiln_engine)
# Step 4, the tensor-core GEMM (bf16 / f16 in, f32 out); under the simulator once more with the
# warps and lanes shuffled between barriers, so a missing barrier cannot hide behind the order.
kiln_test(gemm_tensor_core_test SOURCES gemm_tensor_core_test.cpp
          LABELS ${KILN_CUDA_TEST_LABEL} LIBS kiln_engine)
if(KILN_CUDA_SIM)
  kiln_test_run(gemm_tensor_core_test_shuffle COMMAND gemm_tensor_core_test LABELS sim
                ENVIRONMENT KILN_SIM_SHUFFLE=1 KILN_SIM_SHUFFLE_SEED=5)
endif()
# Steps 5-7, the Hopper GEMM (TMA, mbarriers, wgmma; compute capability 9.0, skipped
# elsewhere); under the simulator their multi-stage shapes and step 7's loop over tiles once more
# with the warps shuffled between barriers.
kiln_test(gemm_sm90_test SOURCES gemm_sm90_test.cpp
          LABELS ${KILN_CUDA_TEST_LABEL} LIBS kiln_engine)
if(KILN_CUDA_SIM)
  kiln_test_run(gemm_sm90_test_shuffle
                COMMAND gemm_sm90_test
                --gtest_filter=Steps/GemmSm90.MatchesCpuOnLargerShapesAcrossTheRing/*:GemmSm90Persistent.*
                LABELS sim ENVIRONMENT KILN_SIM_SHUFFLE=1 KILN_SIM_SHUFFLE_SEED=7)
endif()
kiln_test(optim_cuda_test SOURCES optim_cuda_test.cpp
          LABELS ${KILN_CUDA_TEST_LABEL} LIBS kiln_engine)
# The one-launch optimizer step against the per-parameter kernels, bit for bit.
kiln_test(optim_multi_cuda_test SOURCES optim_multi_cuda_test.cpp
          LABELS ${KILN_CUDA_TEST_LABEL} LIBS kiln_engine)
# The mixed-precision GEMM (bf16 / f16 inputs, f32 output), hand and cuBLAS; once more with the
# Hopper step switched off (KILN_GEMM_SM90=0: the WMMA step on compute capability 9.0 too).
kiln_test(gemm_lowp_cuda_test SOURCES gemm_lowp_cuda_test.cpp
          LABELS ${KILN_CUDA_TEST_LABEL} LIBS kiln_engine)
kiln_test_run(gemm_lowp_cuda_test_wmma COMMAND gemm_lowp_cuda_test
              LABELS ${KILN_CUDA_TEST_LABEL} ENVIRONMENT KILN_GEMM_SM90=0)
# How kernels compile a * b + c: contracted into a fused multiply-add as nvcc does it, the _rn
# intrinsics never (a kernel of the test's own, fp_contract_kernels.cu, compiled as Kiln's are).
kiln_test(fp_contract_cuda_test SOURCES fp_contract_cuda_test.cpp
          LABELS ${KILN_CUDA_TEST_LABEL} LIBS kiln_engine)
kiln_add_cuda_sources(fp_contract_cuda_test fp_contract_kernels.cu)
# Loss scaling's fused unscale-and-check against the CPU loop, and over several devices.
kiln_test(grad_scaler_cuda_test SOURCES grad_scaler_cuda_test.cpp
          LABELS ${KILN_CUDA_TEST_LABEL} LIBS kiln_engine)
# Its device-side path (found_inf and the scale rule on the device, the optimizer skipping on
# the flag) against the host's decisions, bit for bit, with no wait inside a step.
kiln_test(grad_scaler_device_cuda_test SOURCES grad_scaler_device_cuda_test.cpp
          LABELS ${KILN_CUDA_TEST_LABEL} LIBS kiln_engine)
