# data_parallel_tests.cmake: DataParallel over the local transport, and the equivalence that
# proves data parallelism right (N ranks with batch B/N == 1 rank with batch B).
kiln_test(data_parallel_test SOURCES data_parallel_test.cpp LABELS unit comm
          LIBS kiln_comm kiln_models)
# comm::any_rank, and loss scaling's skipped steps agreed across ranks.
kiln_test(comm_agreement_test SOURCES agreement_test.cpp LABELS unit comm LIBS kiln_comm)
