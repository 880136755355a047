# transport_tests.cmake: tests of the transports (local threads, MPI, NCCL), their failure
# paths and timeouts, and kiln_mpi_test(), which the other comm/ test files use too.

# kiln_mpi_test(<name> NP 2 [3 4 ...] SOURCES a.cpp ... LIBS kiln_comm ... [TIMEOUT s]
#               [LABELS gpu ...])
#
# One executable (the sources + mpi_test_main.cpp, which initialises MPI), and one ctest test
# per NP value, <name>_np<n>, that runs the whole executable under mpirun on n ranks:
#   mpirun -n <n> --oversubscribe <exe>
# --oversubscribe lets 4 ranks run on a 2-core machine. Root may run mpirun only with
# OMPI_ALLOW_RUN_AS_ROOT*; no MCA flags are needed here (shared-memory and self transports
# are picked by default). Label: mpi, and any LABELS given; build them all with the
# kiln_tests_mpi target.
function(kiln_mpi_test name)
  cmake_parse_arguments(T "" "TIMEOUT" "NP;SOURCES;LIBS;LABELS" ${ARGN})
  if(NOT T_NP)
    message(FATAL_ERROR "kiln_mpi_test(${name}): give at least one NP <ranks>")
  endif()
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  add_executable(${name} ${T_SOURCES} ${PROJECT_SOURCE_DIR}/tests/comm/mpi_test_main.cpp)
  target_link_libraries(${name} PRIVATE ${T_LIBS} kiln_test_support GTest::gtest MPI::MPI_CXX)
  foreach(np ${T_NP})
    kiln_test_run(${name}_np${np}
      COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe
              ${MPIEXEC_PREFLAGS} $<TARGET_FILE:${name}> ${MPIEXEC_POSTFLAGS}
      LABELS mpi ${T_LABELS}
      ENVIRONMENT OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
      PROPERTIES TIMEOUT ${T_TIMEOUT} PROCESSORS ${np})
  endforeach()
endfunction()

# The local transport (threads): matching, failure propagation, timeouts.
kiln_test(local_transport_test SOURCES local_transport_test.cpp LABELS unit comm LIBS kiln_comm)

# A rank that dies mid-collective: every algorithm's survivors stop promptly, naming it; the
# /proc liveness checks and the SIGTERM report of the MPI transport; KILN_FAULT's parsing.
kiln_test(rank_death_test SOURCES rank_death_test.cpp LABELS unit comm LIBS kiln_comm)

# NCCL with ranks as threads (run_nccl_local), in any build with NCCL (comm/CMakeLists.txt then
# gives kiln_comm the public definition KILN_WITH_NCCL=1): under the simulator (labels sim, comm: 2
# ranks on the default 2 devices, and 3 ranks on 3), or on a real multi-GPU machine (label gpu;
# skips without a GPU per rank).
get_target_property(kiln_comm_defs kiln_comm INTERFACE_COMPILE_DEFINITIONS)
if(kiln_comm_defs MATCHES "KILN_WITH_NCCL=1")
  if(KILN_CUDA_SIM)
    kiln_test(nccl_transport_test SOURCES nccl_transport_test.cpp LABELS sim comm LIBS kiln_comm)
    kiln_test_run(nccl_transport_test_3_ranks
      COMMAND nccl_transport_test --gtest_filter=-*FewerGpus*
      LABELS sim comm ENVIRONMENT KILN_SIM_DEVICES=3 KILN_TEST_NCCL_RANKS=3 PROPERTIES TIMEOUT 600)
  else()
    kiln_test(nccl_transport_test SOURCES nccl_transport_test.cpp LABELS gpu LIBS kiln_comm)
  endif()
endif()

# Everything below needs MPI (a build without it has no mpi transport: see CMakeLists.txt).
if(NOT KILN_WITH_MPI)
  message(STATUS "Kiln: no MPI: the mpi tests are left out")
  return()
endif()

# The MPI transport itself, then every algorithm over it.
kiln_mpi_test(mpi_transport_test NP 2 4 SOURCES mpi_transport_test.cpp LIBS kiln_comm TIMEOUT 120)
kiln_mpi_test(mpi_algorithms_test NP 2 3 4 SOURCES mpi_algorithms_test.cpp LIBS kiln_comm
              TIMEOUT 300)
# Binary blocks on the other non-powers of two up to 7 (5 = 4 + 1, 6 = 4 + 2, 7 = 4 + 2 + 1):
# its tests only, oversubscribed like the others.
set(bb_environment OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    KILN_SOURCE_DIR=${PROJECT_SOURCE_DIR})
kiln_sanitizer_environment(mpi bb_sanitizer_env)  # tests/CMakeLists.txt
list(APPEND bb_environment ${bb_sanitizer_env})
foreach(np 5 6 7)
  add_test(NAME mpi_algorithms_test_bb_np${np}
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe
                   ${MPIEXEC_PREFLAGS} $<TARGET_FILE:mpi_algorithms_test> ${MPIEXEC_POSTFLAGS}
                   --gtest_filter=*MpiAlgorithms*/bb:MpiBinaryBlocks.*)
  set_tests_properties(mpi_algorithms_test_bb_np${np} PROPERTIES
    LABELS mpi
    TIMEOUT 300
    PROCESSORS ${np}
    ENVIRONMENT "${bb_environment}")
endforeach()

# A rank that leaves the job while rank 0 waits for it, killed (SIGKILL) or by abort(): the
# whole job must end quickly, with a non-zero exit code and a message. mpi_rank_dies_test.sh
# runs mpirun and checks all three (Open MPI's launcher ends the job, not our timeout).
add_executable(mpi_rank_dies mpi_rank_dies.cpp)
target_link_libraries(mpi_rank_dies PRIVATE kiln_comm MPI::MPI_CXX)
foreach(mode kill abort)
  kiln_test_run(mpi_rank_dies_${mode}
    COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/mpi_rank_dies_test.sh ${MPIEXEC_EXECUTABLE}
            $<TARGET_FILE:mpi_rank_dies> ${mode}
    LABELS mpi
    ENVIRONMENT OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    PROPERTIES TIMEOUT 90 PROCESSORS 2)
endforeach()

# NCCL under mpirun, one process per GPU: a real CUDA build with NCCL only (the simulator's NCCL
# connects threads, not processes). NP 2 needs two GPUs on this host and skips on one.
if(kiln_comm_defs MATCHES "KILN_WITH_NCCL=1" AND NOT KILN_CUDA_SIM)
  kiln_mpi_test(nccl_transport_mpi_test NP 1 2 SOURCES nccl_transport_test.cpp LIBS kiln_comm
                TIMEOUT 120 LABELS gpu)
  target_compile_definitions(nccl_transport_mpi_test PRIVATE KILN_NCCL_TEST_MPI=1)
endif()
