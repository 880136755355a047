// mnist_train_recipe_test: the learning-rate schedules (--lr-schedule) and the fast recipe
// (--recipe fast) of the real mnist_train binary (apps/mnist/schedule.h).
//
//   1. --recipe fast, cut to one epoch on the first 6,000 training images, runs, says how long
//      it trained, writes its schedule into the JSON and learns (>= 90% test accuracy).
//   2. Every schedule runs a short training (2 epochs of 4 steps) and the JSON names it.
//   3. Flags of another schedule, --gamma without step, a schedule with --batch-per-rank,
//      --base-lr above --lr, a one-cycle too short to rise and fall: exit code 2 and a message
//      naming the flag.
// Tests that need real MNIST skip, saying how to get it, when datasets/mnist/ is absent.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/apps/mnist_train_runner.h"

namespace {

TEST_F(MnistTrainTest, FastRecipeOnASubsetLearns) {
  SKIP_WITHOUT_MNIST();
  const std::string json = path("fast.json");
  // 47 steps of the one-cycle. Measured: 92.85% (seed 1), 92.75% (seed 2) on the first 2,000
  // test images; the bar leaves ~3 points for other thread counts and machines.
  RunResult r = run_mnist_train({"--data", mnist_dir(), "--recipe", "fast", "--limit-train",
                                 "6000", "--limit-test", "2000", "--epochs", "1", "--json", json});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("recipe fast: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("s of training (evaluation excluded) over 1 epoch"), std::string::npos)
      << r.output;
  const nlohmann::json j = read_json(json);
  EXPECT_EQ(j["recipe"], "fast");
  EXPECT_EQ(j["optimizer"], "adam");
  EXPECT_EQ(j["epochs"], 1);  // given explicitly: overrides the recipe's epochs
  EXPECT_EQ(j["lr_schedule"]["name"], "onecycle");
  EXPECT_DOUBLE_EQ(j["lr_schedule"]["max_lr"].get<double>(), j["lr"].get<double>());
  ASSERT_EQ(j["train_seconds_per_epoch"].size(), 1u);
  EXPECT_GT(j["train_seconds"].get<double>(), 0.0);
  EXPECT_GE(j["test_accuracy"].get<double>(), 0.90) << r.output;
}

TEST_F(MnistTrainTest, EverySchedulesRunsAndIsReported) {
  SKIP_WITHOUT_MNIST();
  const std::vector<std::vector<std::string>> runs = {
      {"--lr-schedule", "step"},
      {"--lr-schedule", "cosine", "--optimizer", "sgd"},
      {"--lr-schedule", "onecycle", "--optimizer", "adam", "--anneal", "linear"},
      {"--lr-schedule", "cyclic", "--optimizer", "sgd", "--half-cycle-epochs", "0.5",
       "--cyclic-mode", "triangular2"},
  };
  for (const std::vector<std::string>& flags : runs) {
    const std::string json = path("run.json");
    std::vector<std::string> args = {"--data", mnist_dir(), "--limit-train", "256",
                                     "--limit-test", "100", "--batch-size", "64", "--epochs",
                                     "2", "--json", json};
    args.insert(args.end(), flags.begin(), flags.end());
    RunResult r = run_mnist_train(args);
    ASSERT_EQ(r.exit_code, 0) << flags[1] << ": " << r.output;
    const nlohmann::json j = read_json(json);
    EXPECT_EQ(j["lr_schedule"]["name"], flags[1]);
    EXPECT_EQ(j["recipe"], "default");
    if (flags[1] == "step") {
      EXPECT_DOUBLE_EQ(j["lr_schedule"]["gamma"].get<double>(), 0.7);
    }
    if (flags[1] == "cyclic") {
      EXPECT_EQ(j["lr_schedule"]["mode"], "triangular2");
    }
  }
}

TEST_F(MnistTrainTest, ScheduleFlagsMisusedAreUsageErrors) {
  SKIP_WITHOUT_MNIST();  // the last case needs the data to count the steps
  struct Case {
    std::vector<std::string> args;
    std::string named;  // the flag the message must name
  };
  const std::vector<Case> cases = {
      {{"--lr-schedule", "onecycle", "--gamma", "0.5"}, "--gamma"},
      {{"--recipe", "fast", "--gamma", "0.5"}, "--gamma"},
      {{"--pct-start", "0.2"}, "--pct-start"},
      {{"--lr-schedule", "cyclic", "--anneal", "linear"}, "--anneal"},
      {{"--lr-schedule", "onecycle", "--base-lr", "0.01"}, "--base-lr"},
      {{"--half-cycle-epochs", "2"}, "--half-cycle-epochs"},
      {{"--lr-schedule", "cyclic", "--lr", "0.01", "--base-lr", "0.1"}, "--base-lr"},
      {{"--lr-schedule", "cosine", "--dist", "local:2", "--batch-per-rank"}, "--batch-per-rank"},
      {{"--lr-schedule", "sawtooth"}, "--lr-schedule"},
      {{"--recipe", "slow"}, "--recipe"},
      {{"--lr-schedule", "onecycle", "--pct-start", "2"}, "--pct-start"},
      // 1 epoch of 2 steps: 0.3 x 2 - 1 < 0, no rising phase.
      {{"--lr-schedule", "onecycle", "--limit-train", "256", "--batch-size", "128", "--epochs",
        "1"}, "--pct-start"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"--data", mnist_dir(), "--limit-test", "100"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    RunResult r = run_mnist_train(args);
    std::string what;
    for (const std::string& a : c.args) what += a + " ";
    EXPECT_EQ(r.exit_code, 2) << what << ": " << r.output;
    EXPECT_NE(r.output.find(c.named), std::string::npos) << what << ": " << r.output;
  }
}

}  // namespace
