// sync_debug_e2e_test: mnist_train and resnet_bench train on a CUDA device under
// KILN_SYNC_DEBUG=error (engine/cuda/sync_debug.h) and finish: every host wait of their runs
// (setup, the steady state of the training step, the loader, evaluation, checkpoints, teardown)
// is either gone or named with a cuda::AllowSync. A wait that nobody named would stop the run
// with "kiln: sync debug: ... waits for the device at <file>:<line>", which the test prints.
//
// mnist_train reads a small MNIST written here in the IDX format (the waits do not depend on the
// pixels): the MLP for two epochs of 36 steps (a full 32-step group of loss reads, the loader's
// slots reused, loader workers, mid-epoch and epoch-end checkpoints), and the CNN for a few
// steps with the loader on the training thread (--workers 0). resnet_bench runs the simulator
// smoke test's tiny ResNet on one device and as a pipeline over two. Label sim under the
// simulator (about a minute in all), gpu on a real GPU (skips without one). As tools/test.sh
// does with the other whole programs under the simulator, the ThreadSanitizer tree skips them
// all and the AddressSanitizer tree skips resnet_bench's (minutes there); the detector's own
// test, sync_debug_cuda_test, runs in both.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/cuda/context.h"
#include "support/cuda_skip.h"
#include "support/run_command.h"
#include "support/tiny_mnist.h"

namespace fs = std::filesystem;

namespace {

using kiln::testing::RunResult;

#if defined(__SANITIZE_THREAD__)
constexpr bool kThreadSanitizer = true;
#else
constexpr bool kThreadSanitizer = false;
#endif
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAddressSanitizer = true;
#else
constexpr bool kAddressSanitizer = false;
#endif

RunResult run(const std::string& env, const std::string& program,
              const std::vector<std::string>& args) {
  std::string cmd = env + " '" + program + "'";
  for (const std::string& a : args) cmd += " '" + a + "'";
  return kiln::testing::run_command(cmd + " 2>&1");
}

class SyncDebugE2e : public ::testing::Test {
 protected:
  void SetUp() override {
    KILN_SKIP_WITHOUT_CUDA();
    if (kThreadSanitizer) GTEST_SKIP() << "skipped: a whole program under ThreadSanitizer";
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(::testing::TempDir()) /
           ("kiln_sync_debug_" + std::string(info->name()) + "_" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    kiln::testing::write_tiny_mnist_split(dir_, "train", 2304);
    kiln::testing::write_tiny_mnist_split(dir_, "t10k", 256);
  }
  void TearDown() override {
    if (!dir_.empty() && !HasFailure()) fs::remove_all(dir_);
  }
  std::vector<std::string> mlp_args() const {
    return {"--device", "cuda:0", "--model", "mlp", "--data", dir_.string(), "--epochs", "2",
            "--batch-size", "64", "--eval-batch-size", "64", "--threads", "1", "--workers", "2",
            "--kernels", "hand", "--checkpoint", (dir_ / "run.ckpt").string(),
            "--checkpoint-every", "20"};
  }

  fs::path dir_;
};

TEST_F(SyncDebugE2e, MnistTrainMlpRunsCleanUnderError) {
  const RunResult r = run("KILN_SYNC_DEBUG=error", KILN_MNIST_TRAIN, mlp_args());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("sync debug"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(dir_ / "run.ckpt")) << r.output;
}

TEST_F(SyncDebugE2e, MnistTrainCnnRunsCleanUnderError) {
  const RunResult r = run("KILN_SYNC_DEBUG=error", KILN_MNIST_TRAIN,
                          {"--device", "cuda:0", "--data", dir_.string(), "--limit-train", "128",
                           "--limit-test", "64", "--epochs", "1", "--batch-size", "64",
                           "--eval-batch-size", "64", "--threads", "1", "--workers", "0",
                           "--kernels", "hand"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("sync debug"), std::string::npos) << r.output;
}

// The variable reaches the app: a misspelt mode stops the run at its first wait (exit 2).
TEST_F(SyncDebugE2e, MnistTrainReadsTheVariable) {
  const RunResult r = run("KILN_SYNC_DEBUG=eror", KILN_MNIST_TRAIN, mlp_args());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("KILN_SYNC_DEBUG=eror is not a sync debug mode"), std::string::npos)
      << r.output;
}

TEST_F(SyncDebugE2e, ResnetBenchRunsCleanUnderError) {
  KILN_SKIP_WITHOUT_CUDA_DEVICES(2);
  if (kAddressSanitizer) GTEST_SKIP() << "skipped: minutes under AddressSanitizer";
  const RunResult r = run("KILN_SYNC_DEBUG=error", KILN_RESNET_BENCH,
                          {"--model", "resnet18", "--width", "8", "--image-size", "64",
                           "--batch-size", "4", "--classes", "5", "--steps", "1", "--repeats", "1",
                           "--devices", "cuda:0,cuda:1", "--modes", "single,pipeline",
                           "--split-sizes", "2"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("sync debug"), std::string::npos) << r.output;
}

}  // namespace
