# Tests of the CUDA simulator (engine/cuda/sim), label `sim`: the runtime API and kernels.
kiln_test(sim_runtime_test SOURCES sim_runtime_test.cpp LABELS sim LIBS kiln_engine)
kiln_test(sim_kernel_test SOURCES sim_kernel_test.cpp LABELS sim LIBS kiln_engine)
kiln_test(sim_streams_test SOURCES sim_streams_test.cpp LABELS sim LIBS kiln_engine)

# The kernel tests once more with the other execution paths switched on from the environment:
# the portable ucontext fibers, every block on the launching thread, and the debug shuffle for
# every launch (tests that need order mode turn the shuffle off themselves).
add_test(NAME sim_kernel_test_ucontext_shuffle
         COMMAND sim_kernel_test --gtest_filter=-*MillionElement*)
set_tests_properties(sim_kernel_test_ucontext_shuffle PROPERTIES LABELS sim
  ENVIRONMENT "KILN_SIM_UCONTEXT=1;KILN_SIM_THREADS=1;KILN_SIM_SHUFFLE=1;KILN_SIM_SHUFFLE_SEED=99")

# A machine without a GPU: KILN_SIM_DEVICES=0.
add_test(NAME sim_runtime_test_no_device
         COMMAND sim_runtime_test --gtest_filter=SimNoDevice.*)
set_tests_properties(sim_runtime_test_no_device PROPERTIES LABELS sim ENVIRONMENT "KILN_SIM_DEVICES=0")

# The simulator's NCCL (engine/cuda/sim/nccl.h), ranks as threads; the three-rank cases need a
# third device, so they run once more with four.
kiln_test(sim_nccl_test SOURCES sim_nccl_test.cpp LABELS sim LIBS kiln_engine)
add_test(NAME sim_nccl_test_4_devices
         COMMAND sim_nccl_test --gtest_filter=SimNccl.*ThreeRanks*:SimNccl.SendRecvRingInAGroup)
set_tests_properties(sim_nccl_test_4_devices PROPERTIES LABELS sim
  ENVIRONMENT "KILN_SIM_DEVICES=4")
# The simulated cuBLAS and cuDNN (engine/cuda/sim/cublas.h, cudnn.h) against naive references.
kiln_test(sim_cublas_test SOURCES sim_cublas_test.cpp LABELS sim LIBS kiln_engine)
kiln_test(sim_cudnn_test SOURCES sim_cudnn_test.cpp LABELS sim LIBS kiln_engine)
