// mnist_train_device_step_test: mnist_train's GPU fast paths train exactly as the plain run.
//   --data-on-device  the sets in GPU memory, each batch gathered by a kernel: the very batches
//                     the loader builds;
//   --cuda-graph      the step (forward, loss, backward, update) replayed as one CUDA graph:
//                     the very kernels of the eager step, on the same values (the learning rate
//                     and dropout's random numbers read from the device);
// so the losses per epoch, the test loss and the test accuracy of the JSON summary are the same
// numbers (compared with ==, not a tolerance). The runs are small: batches of 16 over 72
// examples leave four full batches and a smaller one each epoch, and two epochs make eight
// full steps: three eager warm-up steps, the capture, then replays, with the smaller batch run
// eagerly between them. The runs use what a replay must get right: the MNIST CNN's dropout (a
// replay that drew the capture's mask again would show) and --recipe fast's Adam with a
// one-cycle learning rate, set every step (a rate or step count baked in at the capture would
// show). (fp16, whose graph scales the loss on the device, is left out for time: its simulated
// kernels are four times slower.) The combinations the fast paths cannot serve exit 2 before
// any work, saying what to do. Under the simulator this carries the label sim; on a real GPU,
// gpu.
#include <string>
#include <vector>

#include "tests/apps/mnist_train_runner.h"
#include "tests/support/cuda_skip.h"

namespace {

// A short CUDA run of the CNN with `extra` flags; returns its JSON summary.
nlohmann::json train(const std::string& json, const std::vector<std::string>& extra) {
  std::vector<std::string> args = {"--device", "cuda", "--data", mnist_dir(), "--limit-train",
                                   "72", "--limit-test", "32", "--epochs", "2",
                                   "--batch-size", "16", "--eval-batch-size", "32",
                                   "--threads", "1", "--kernels", "hand", "--recipe", "fast",
                                   "--precision", "fp32", "--json", json};
  args.insert(args.end(), extra.begin(), extra.end());
  RunResult r = run_mnist_train(args);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return read_json(json);
}

// The plain run (the loader, the eager step), once for the tests of this file.
const nlohmann::json& plain_run() {
  static const nlohmann::json j = train(::testing::TempDir() + "kiln_device_step_plain_" +
                                            std::to_string(getpid()) + ".json", {});
  return j;
}

// The numbers that must not move: losses per epoch, test loss and accuracy.
void expect_same_training(const nlohmann::json& got, const nlohmann::json& plain) {
  EXPECT_EQ(got["train_loss_per_epoch"], plain["train_loss_per_epoch"]);
  EXPECT_EQ(got["test_loss_per_epoch"], plain["test_loss_per_epoch"]);
  EXPECT_EQ(got["test_accuracy_per_epoch"], plain["test_accuracy_per_epoch"]);
  EXPECT_EQ(got["train_examples_per_epoch"], plain["train_examples_per_epoch"]);
}

TEST_F(MnistTrainTest, DataOnDeviceTrainsOnTheLoadersBatches) {
  SKIP_WITHOUT_MNIST();
  KILN_SKIP_WITHOUT_CUDA();
  const nlohmann::json on_device = train(path("on_device.json"), {"--data-on-device"});
  EXPECT_EQ(plain_run()["data_on_device"], false);
  EXPECT_EQ(on_device["data_on_device"], true);
  expect_same_training(on_device, plain_run());
  EXPECT_EQ(on_device["train_examples_per_epoch"], nlohmann::json::array({72, 72}));
}

// The graph's step fed by the loader (a copy into the static inputs) and by the gather of
// --data-on-device (straight into them).
TEST_F(MnistTrainTest, CudaGraphTrainsAsTheEagerStep) {
  SKIP_WITHOUT_MNIST();
  KILN_SKIP_WITHOUT_CUDA();
  const nlohmann::json graph = train(path("graph.json"), {"--cuda-graph"});
  const nlohmann::json both =
      train(path("graph_on_device.json"), {"--cuda-graph", "--data-on-device"});
  EXPECT_EQ(plain_run()["cuda_graph"], false);
  EXPECT_EQ(plain_run()["cuda_graph_replays"], 0);
  for (const nlohmann::json* j : {&graph, &both}) {
    EXPECT_EQ((*j)["cuda_graph"], true);
    // Eight full steps: three eager, the capture (replayed once), four replays.
    EXPECT_EQ((*j)["cuda_graph_replays"], 5);
    expect_same_training(*j, plain_run());
  }
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
      {{"--cuda-graph", "--device", "cpu"}, "pass --device cuda (or cuda:N), or drop --cuda-graph"},
      {{"--cuda-graph", "--dist", "local:2"}, "--cuda-graph replays one device's step"},
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
