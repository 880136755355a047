// mnist_train_rank_death_test (label e2e): one rank of `mnist_train --dist local:3` dies in the
// middle of training (KILN_FAULT="rank=1,step=5", comm/fault_injection.h: its thread throws
// while the other ranks wait in the step's gradient allreduce). The run must end with exit
// code 1 well within 30 s, and each surviving rank must say, on its own error line, that
// rank 1 is the one that failed. A malformed KILN_FAULT is a usage error (exit 2).
// (`mpirun -np 3` with a rank SIGKILLed, and nccl:3 under the simulator: tools/rank_death.sh,
// registered in CMakeLists.txt.)
#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "mnist_train_runner.h"

namespace {

// mnist_train inherits the test's environment.
RunResult run_with_fault(const std::string& fault, const std::vector<std::string>& args) {
  setenv("KILN_FAULT", fault.c_str(), 1);
  RunResult r = run_mnist_train(args);
  unsetenv("KILN_FAULT");
  return r;
}

std::vector<std::string> local3_run() {
  return {"--data", mnist_dir(), "--dist", "local:3", "--limit-train", "6000", "--limit-test",
          "1000", "--epochs", "1", "--threads", "1", "--batch-size", "96"};
}

}  // namespace

TEST(MnistTrainRankDeath, LocalRankDiesMidRunOthersNameItAndExit1) {
  SKIP_WITHOUT_MNIST();
  const auto t0 = std::chrono::steady_clock::now();
  const RunResult r = run_with_fault("rank=1,step=5", local3_run());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_LT(seconds, 30.0) << "the survivors did not stop promptly";
  EXPECT_NE(r.output.find("KILN_FAULT: rank 1 dies at step 5 (throw)"), std::string::npos)
      << r.output;
  for (int survivor : {0, 2}) {
    const std::string prefix = "mnist_train: rank " + std::to_string(survivor) + ": error: ";
    const size_t at = r.output.find(prefix);
    ASSERT_NE(at, std::string::npos) << "rank " << survivor << " printed no error\n" << r.output;
    const std::string line = r.output.substr(at, r.output.find('\n', at) - at);
    EXPECT_NE(line.find("because rank 1 failed"), std::string::npos) << line;
  }
  // The run's own last line reports the first failure: the dead rank's.
  EXPECT_NE(r.output.find("mnist_train: error: rank 1 failed at step 5"), std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("weights equal"), std::string::npos) << "training went on\n" << r.output;
}

TEST(MnistTrainRankDeath, MalformedFaultSpecIsAUsageError) {
  SKIP_WITHOUT_MNIST();
  const RunResult r = run_with_fault("rank=1", local3_run());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("KILN_FAULT='rank=1'"), std::string::npos) << r.output;
}
