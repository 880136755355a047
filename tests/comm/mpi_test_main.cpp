// mpi_test_main.cpp: the GoogleTest main of the tests that run under mpirun (kiln_mpi_test()).
//
// Every rank runs every test; a test is the same code on every rank, branching on the rank
// where the ranks differ. Rules that keep a job from hanging:
//   - MPI is initialised here, before any test, with MPI_THREAD_MULTIPLE (the transport then
//     finds it initialised and only checks the thread level);
//   - rank 0 prints the usual report; the other ranks print only their failures, prefixed with
//     their rank, so the output of 4 ranks stays readable;
//   - a rank whose tests failed calls MPI_Abort after the run: the job then ends at once with
//     a non-zero exit code, even if another rank is still waiting for a message from it. A
//     rank whose tests passed finalises MPI and returns 0. mpirun's exit code is non-zero as
//     soon as one rank failed, so ctest sees the failure of any rank.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

namespace {

// Prints failed assertions only, with the rank (for ranks other than 0).
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_,
                 r.file_name() ? r.file_name() : "?", r.line_number(), r.summary());
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed()) {
      std::fprintf(stderr, "[rank %d] FAILED %s.%s\n", rank_, info.test_suite_name(), info.name());
    }
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  int provided = MPI_THREAD_SINGLE;
  if (MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
    std::fprintf(stderr, "mpi_test_main: MPI_Init_thread failed\n");
    return 1;
  }
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  ::testing::InitGoogleTest(&argc, argv);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
  const int failed = RUN_ALL_TESTS();
  if (failed != 0) {
    std::fprintf(stderr, "[rank %d/%d] tests failed: aborting the MPI job\n", rank, size);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
  MPI_Finalize();
  return 0;
}
