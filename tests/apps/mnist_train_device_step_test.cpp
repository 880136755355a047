// mnist_train_device_step_test: mnist_train's GPU fast paths give the results of the plain run,
// bit for bit. --data-on-device (the sets in GPU memory, batches gathered by a kernel) trains on
// the very batches the loader builds, so the losses per epoch and the test accuracy printed in
// the JSON summary are the same numbers (compared with ==, not a tolerance). The run is a small
// subset: a batch count that leaves a smaller last batch, and two epochs (a new order each).
// The flag combinations the fast paths cannot serve exit 2 before any work, saying what to do.
// Under the simulator this carries the label sim; on a real GPU, gpu (it skips without one).
#include <string>
#include <vector>

#include "tests/apps/mnist_train_runner.h"
#include "tests/support/cuda_skip.h"

namespace {

// A short CUDA run of the CNN (dropout included) with `extra` flags; returns its JSON summary.
nlohmann::json train(const std::string& json, const std::vector<std::string>& extra) {
  std::vector<std::string> args = {"--device", "cuda", "--data", mnist_dir(), "--limit-train",
                                   "168", "--limit-test", "64", "--epochs", "2",
                                   "--batch-size", "32", "--eval-batch-size", "64",
                                   "--threads", "1", "--kernels", "hand", "--json", json};
  args.insert(args.end(), extra.begin(), extra.end());
  RunResult r = run_mnist_train(args);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return read_json(json);
}

// The numbers that must not move: losses per epoch, test loss and accuracy.
void expect_same_training(const nlohmann::json& a, const nlohmann::json& b) {
  EXPECT_EQ(a["train_loss_per_epoch"], b["train_loss_per_epoch"]);
  EXPECT_EQ(a["test_loss_per_epoch"], b["test_loss_per_epoch"]);
  EXPECT_EQ(a["test_accuracy_per_epoch"], b["test_accuracy_per_epoch"]);
  EXPECT_EQ(a["train_examples_per_epoch"], b["train_examples_per_epoch"]);
}

TEST_F(MnistTrainTest, DataOnDeviceTrainsOnTheLoadersBatches) {
  SKIP_WITHOUT_MNIST();
  KILN_SKIP_WITHOUT_CUDA();
  const nlohmann::json loader = train(path("loader.json"), {});
  const nlohmann::json on_device = train(path("on_device.json"), {"--data-on-device"});
  EXPECT_EQ(loader["data_on_device"], false);
  EXPECT_EQ(on_device["data_on_device"], true);
  expect_same_training(on_device, loader);
  // 168 examples in batches of 32: five full ones and one of 8, every epoch.
  EXPECT_EQ(on_device["train_examples_per_epoch"], nlohmann::json::array({168, 168}));
  // It learned: the loss fell below chance (ln 10 = 2.30) in the second epoch.
  EXPECT_LT(on_device["train_loss_per_epoch"][1].get<double>(), 2.3);
}

// Each refusal names the flag and what to do, with exit 2, before training starts.
TEST_F(MnistTrainTest, FastPathsRefuseWhatTheyCannotServe) {
  KILN_SKIP_WITHOUT_CUDA();  // a build without a GPU refuses --device cuda first
  struct Case {
    std::vector<std::string> args;
    const char* says;
  };
  const std::vector<Case> cases = {
      {{"--data-on-device", "--device", "cpu"}, "pass --device cuda (or cuda:N)"},
      {{"--data-on-device", "--dist", "local:2"}, "--data-on-device keeps the data set in one GPU"},
      {{"--data-on-device", "--device", "cuda", "--format", "imagefolder"}, "use --format idx"},
      {{"--data-on-device", "--device", "cuda", "--workers", "2"},
       "no loader runs (a kernel gathers each batch on the GPU): drop --workers"},
      {{"--data-on-device", "--device", "cuda", "--pin-memory"}, "drop --pin-memory"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = c.args;
    args.insert(args.end(), {"--data", mnist_dir(), "--epochs", "1", "--limit-train", "64"});
    const RunResult r = run_mnist_train(args);
    std::string line;
    for (const std::string& a : c.args) line += " " + a;
    EXPECT_EQ(r.exit_code, 2) << line << "\n" << r.output;
    EXPECT_NE(r.output.find(c.says), std::string::npos) << line << "\n" << r.output;
  }
}

}  // namespace
