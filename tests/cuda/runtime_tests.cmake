# The CUDA runtime layer: tensors on CUDA devices (copies between every pair of places, dtype
# conversion and fill on the device, pinned memory), the caching allocator and its
# out-of-memory error. Included by CMakeLists.txt here.
kiln_test(tensor_cuda_test SOURCES tensor_cuda_test.cpp
          LABELS ${KILN_CUDA_TEST_LABEL} LIBS kiln_engine)
kiln_test(caching_allocator_test SOURCES caching_allocator_test.cpp
          LABELS ${KILN_CUDA_TEST_LABEL} LIBS kiln_engine)
# Its private pools, the memory of CUDA graph captures.
kiln_test(caching_allocator_pool_test SOURCES caching_allocator_pool_test.cpp
          LABELS ${KILN_CUDA_TEST_LABEL} LIBS kiln_engine)
# cuda::Graph: Kiln ops captured into a CUDA graph with a private pool, replayed; the capture
# rules' errors.
kiln_test(graph_test SOURCES graph_test.cpp LABELS ${KILN_CUDA_TEST_LABEL} LIBS kiln_engine)
# Its own binary: it limits the simulated device memory before the first CUDA call.
kiln_test(caching_allocator_oom_test SOURCES caching_allocator_oom_test.cpp
          LABELS ${KILN_CUDA_TEST_LABEL} LIBS kiln_engine)
# Tracer spans on a CUDA device: GPU events on the current stream, resolved to host times.
kiln_test(trace_cuda_test SOURCES trace_cuda_test.cpp
          LABELS ${KILN_CUDA_TEST_LABEL} LIBS kiln_engine)
# cuBLAS is opened on first use: a CPU-only run of a CUDA build never maps it (label unit: it
# runs without a GPU), and the first GPU product does (skipped without a GPU).
if(NOT KILN_CUDA_SIM)
  kiln_test(cublas_lazy_test SOURCES cublas_lazy_test.cpp LABELS unit gpu LIBS kiln_engine)
endif()
# The sync debug mode (KILN_SYNC_DEBUG): off/warn/error, call sites, AllowSync, every waiting
# API, and the Loader's steady state under error.
kiln_test(sync_debug_cuda_test SOURCES sync_debug_cuda_test.cpp
          LABELS ${KILN_CUDA_TEST_LABEL} LIBS kiln_data)
