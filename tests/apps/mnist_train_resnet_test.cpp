// mnist_train_resnet_test: --model resnet18 of the real mnist_train binary, on a tiny MNIST
// written by the test (tests/support/tiny_mnist.h: a fixed pattern, nothing to learn; these
// runs check that the model trains, saves and resumes, not what it learns; the accuracies on
// real MNIST are in docs/mixed_precision.md, "Accuracy").
//
//   1. fp32 NCHW and bf16 channels-last with 16-bit activations each train one epoch: exit 0,
//      the header and the JSON name the model, memory format and activations, a finite loss.
//   2. A channels-last bf16 checkpoint resumes into a second epoch; resuming it as the CNN is
//      refused (the checkpoint records the model's name).
//   3. --memory-format and --activations 16bit with the CNN are usage errors (exit 2) that
//      name the flag.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "support/tiny_mnist.h"
#include "tests/apps/mnist_train_runner.h"

namespace {

class MnistTrainResNetTest : public MnistTrainTest {
 protected:
  void SetUp() override {
    MnistTrainTest::SetUp();
    kiln::testing::write_tiny_mnist_split(dir_, "train", 64);
    kiln::testing::write_tiny_mnist_split(dir_, "t10k", 32);
  }
  // One epoch of 4 steps of 16 images; 2 threads, as the machine of the measurements.
  std::vector<std::string> base(const std::vector<std::string>& more) const {
    std::vector<std::string> args = {"--model", "resnet18", "--data", dir_.string(),
                                     "--batch-size", "16", "--eval-batch-size", "16",
                                     "--threads", "2", "--workers", "0"};
    args.insert(args.end(), more.begin(), more.end());
    return args;
  }
};

TEST_F(MnistTrainResNetTest, TrainsInF32AndInBf16ChannelsLast) {
  struct Case {
    std::vector<std::string> flags;
    std::string precision, memory_format, activations, header;
  };
  const std::vector<Case> cases = {
      {{"--precision", "fp32"}, "fp32", "contiguous", "f32", "resnet18 (11175370 parameters)"},
      {{"--precision", "bf16", "--memory-format", "channels_last"},
       "bf16", "channels_last", "16bit", "bf16, channels_last, 16bit activations"},
  };
  for (const Case& c : cases) {
    const std::string json = path(c.precision + ".json");
    std::vector<std::string> flags = c.flags;
    flags.insert(flags.end(), {"--epochs", "1", "--json", json});
    RunResult r = run_mnist_train(base(flags));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find(c.header), std::string::npos) << r.output;
    const nlohmann::json j = read_json(json);
    EXPECT_EQ(j["precision"], c.precision);
    EXPECT_EQ(j["memory_format"], c.memory_format);
    EXPECT_EQ(j["activations"], c.activations);
    const double loss = j["train_loss_per_epoch"].back().get<double>();
    EXPECT_TRUE(std::isfinite(loss) && loss > 0) << loss;
  }
}

TEST_F(MnistTrainResNetTest, ResumesAChannelsLastCheckpointAndRefusesAnotherModel) {
  const std::string ckpt = path("run.kckpt"), json = path("resumed.json");
  const std::vector<std::string> flags = {"--precision", "bf16", "--memory-format",
                                          "channels_last"};
  std::vector<std::string> args = base(flags);
  args.insert(args.end(), {"--epochs", "1", "--checkpoint", ckpt});
  RunResult r = run_mnist_train(args);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  args = base(flags);
  args.insert(args.end(), {"--epochs", "2", "--resume", ckpt, "--json", json});
  r = run_mnist_train(args);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(read_json(json)["history"].size(), 2u) << r.output;
  r = run_mnist_train({"--model", "cnn", "--data", dir_.string(), "--epochs", "2", "--resume",
                       ckpt});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("resnet18"), std::string::npos) << r.output;
}

TEST_F(MnistTrainResNetTest, ResNetFlagsWithTheCnnAreUsageErrors) {
  struct Bad {
    std::vector<std::string> flags;
    std::string message;
  };
  const std::vector<Bad> bad = {
      {{"--activations", "16bit", "--precision", "bf16"},
       "--activations 16bit applies to --model resnet18"},
      {{"--memory-format", "channels_last"}, "--memory-format applies to --model resnet18"},
  };
  for (const Bad& b : bad) {
    std::vector<std::string> args = {"--model", "cnn", "--data", dir_.string(), "--epochs", "1"};
    args.insert(args.end(), b.flags.begin(), b.flags.end());
    RunResult r = run_mnist_train(args);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(b.message), std::string::npos) << r.output;
  }
}

}  // namespace
