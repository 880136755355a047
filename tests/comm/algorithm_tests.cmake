# algorithm_tests.cmake: ring, halving-doubling, parameter server, collectives and the element
# reductions (comm/algorithms.h, comm/parameter_server.h), all over the local transport.
kiln_test(comm_algorithms_test SOURCES algorithms_test.cpp LABELS unit comm LIBS kiln_comm)
kiln_test(comm_parameter_server_test SOURCES parameter_server_test.cpp LABELS unit comm LIBS kiln_comm)
# The CUDA kernels of comm/reduce_cuda.cu against the CPU loops (simulator: labels sim and comm).
if(KILN_WITH_CUDA)
  if(KILN_CUDA_SIM)
    kiln_test(comm_reduce_cuda_test SOURCES reduce_cuda_test.cpp LABELS sim comm LIBS kiln_comm)
  else()
    kiln_test(comm_reduce_cuda_test SOURCES reduce_cuda_test.cpp LABELS gpu LIBS kiln_comm)
  endif()
endif()
