# Tests of the CUDA simulator (engine/cuda/sim), labels `sim` and `threads`: the runtime API and
# kernels. They link kiln_cudasim alone (WITHOUT_ENGINE), so the simulator is tested as its own
# library. `threads`: the simulator runs streams, host functions, blocks and NCCL ranks on
# threads of its own and a block's GPU threads as fibers, so the ThreadSanitizer tree
# (tools/test.sh) runs these, the race-detection cases among them.
kiln_test(sim_runtime_test SOURCES sim_runtime_test.cpp LABELS sim threads LIBS kiln_cudasim WITHOUT_ENGINE)
kiln_test(sim_kernel_test SOURCES sim_kernel_test.cpp LABELS sim threads LIBS kiln_cudasim WITHOUT_ENGINE)
kiln_test(sim_streams_test SOURCES sim_streams_test.cpp LABELS sim threads LIBS kiln_cudasim WITHOUT_ENGINE)
# Stream capture and CUDA graphs (sim/graphs.cpp), a simulated cuBLAS call among the captured work.
kiln_test(sim_graph_test SOURCES sim_graph_test.cpp LABELS sim threads LIBS kiln_cudasim WITHOUT_ENGINE)
# Hopper's mbarriers and TMA (engine/cuda/sm90/mbarrier.h, tma.h; sim/sm90_mbarrier.h, sm90_tma.h),
# once more with the debug shuffle: the producer/consumer ring must not depend on the order.
kiln_test(sim_tma_test SOURCES sim_tma_test.cpp LABELS sim threads LIBS kiln_cudasim WITHOUT_ENGINE)
kiln_test_run(sim_tma_test_shuffle COMMAND sim_tma_test LABELS sim threads
  ENVIRONMENT KILN_SIM_SHUFFLE=1 KILN_SIM_SHUFFLE_SEED=7)

# The kernel tests once more with the other execution paths switched on from the environment:
# the portable ucontext fibers, every block on the launching thread, and the debug shuffle for
# every launch (tests that need order mode turn the shuffle off themselves).
kiln_test_run(sim_kernel_test_ucontext_shuffle
  COMMAND sim_kernel_test --gtest_filter=-*MillionElement*
  LABELS sim threads
  ENVIRONMENT KILN_SIM_UCONTEXT=1 KILN_SIM_THREADS=1 KILN_SIM_SHUFFLE=1 KILN_SIM_SHUFFLE_SEED=99)

# A machine without a GPU: KILN_SIM_DEVICES=0.
kiln_test_run(sim_runtime_test_no_device COMMAND sim_runtime_test --gtest_filter=SimNoDevice.*
  LABELS sim threads ENVIRONMENT KILN_SIM_DEVICES=0)

# The simulator's NCCL (engine/cuda/sim/nccl.h), ranks as threads; the three-rank cases need a
# third device, so they run once more with four.
kiln_test(sim_nccl_test SOURCES sim_nccl_test.cpp LABELS sim threads LIBS kiln_cudasim WITHOUT_ENGINE)
kiln_test_run(sim_nccl_test_4_devices
  COMMAND sim_nccl_test --gtest_filter=SimNccl.*ThreeRanks*:SimNccl.SendRecvRingInAGroup
  LABELS sim threads ENVIRONMENT KILN_SIM_DEVICES=4)
# The simulated cuBLAS and cuDNN (engine/cuda/sim/cublas.h, cudnn.h) against naive references.
# These two also check the errors as Kiln reports them (KILN_CUBLAS_CHECK, KILN_CUDNN_CHECK and
# the engine's handles: engine/cuda/blas.cpp, dnn.cpp), so they link the engine.
kiln_test(sim_cublas_test SOURCES sim_cublas_test.cpp LABELS sim threads LIBS kiln_engine)
kiln_test(sim_cudnn_test SOURCES sim_cudnn_test.cpp LABELS sim threads LIBS kiln_engine)
# The same on NHWC data: the NCHW results permuted, bit for bit; the refused layouts.
kiln_test(sim_cudnn_nhwc_test SOURCES sim_cudnn_nhwc_test.cpp LABELS sim threads LIBS kiln_engine)

# The warp matrix functions (nvcuda::wmma, sim/mma.h) and the 16-bit float types (sim/fp16.h).
kiln_test(sim_wmma_test SOURCES sim_wmma_test.cpp LABELS sim threads LIBS kiln_cudasim WITHOUT_ENGINE)

# Static shared memory (KILN_SHARED), and correctly synchronised kernels that ThreadSanitizer
# must not report (build-tsan).
kiln_test(sim_shared_memory_test SOURCES sim_shared_memory_test.cpp LABELS sim threads LIBS kiln_cudasim WITHOUT_ENGINE)
kiln_test(sim_race_free_test SOURCES sim_race_free_test.cpp LABELS sim threads LIBS kiln_cudasim WITHOUT_ENGINE)

# Race detection: each case is a kernel with one data race; under ThreadSanitizer the test
# passes only if TSan reports it, naming the kernel and both GPU threads. Elsewhere: skipped.
add_executable(sim_race_detection sim_race_detection.cpp)
target_link_libraries(sim_race_detection PRIVATE kiln_cudasim)
set(tsan_environment)
set(tsan_report)
if(KILN_SANITIZE MATCHES "thread")
  set(tsan_environment TSAN_OPTIONS=halt_on_error=1)
  set(tsan_report PASS_REGULAR_EXPRESSION
      "WARNING: ThreadSanitizer: data race.*race_[a-z_]*_kernel.*Thread T[0-9]+ 'block \\(0,0,0\\) thread \\([0-9]+,0,0\\)'.*Thread T[0-9]+ 'block \\(0,0,0\\) thread \\([0-9]+,0,0\\)'")
endif()
foreach(race syncthreads generation warp-generation subset-mask global)
  kiln_test_run(sim_race_detection_${race} COMMAND sim_race_detection ${race} LABELS sim threads
    ENVIRONMENT ${tsan_environment} PROPERTIES SKIP_RETURN_CODE 77 ${tsan_report})
endforeach()

# Hopper's warpgroup MMA (engine/cuda/sm90/wgmma.h over sim/sm90_wgmma.cpp): products in every
# swizzle mode against a reference, the asynchrony (NaN before the wait) and its rules as faults.
kiln_test(sim_wgmma_test SOURCES sim_wgmma_test.cpp LABELS sim threads LIBS kiln_cudasim WITHOUT_ENGINE)
