// mnist_train_e2e_test: runs the real mnist_train binary, as a user would, and checks what it
// writes (the JSON summary, the checkpoints) and how it fails (exit codes, messages).
//
//   1. Learning: the MNIST CNN, 1 epoch on the first 10,000 real training images (batch 32),
//      evaluated on the full 10,000-image test set, reaches >= 95% test accuracy.
//   2. Checkpoints: 2 epochs straight and 1 epoch + --resume 1 epoch give bit-identical model
//      and optimizer state (CNN + Adadelta, with dropout drawing from the restored Philox
//      generator; and MLP + SGD momentum). --threads 1: results are bit-reproducible for a fixed
//      thread count, and one thread keeps the test independent of the machine's core count.
//   3. Bad input: unknown flag, missing data, corrupt/truncated/mismatched checkpoint,
//      --device cuda:9 (absent in every build): exit code 2 and a message that says what to do.
//   4. --trace: a Chrome trace with the loader waits, forward, backward and optimizer spans of
//      every step, and with --dist local:2 each replica's allreduce buckets.
// Tests that need real MNIST skip, saying how to get it, when datasets/mnist/ is absent.
// The binary path comes from CMake ($<TARGET_FILE:mnist_train>).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <utility>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "engine/serialize.h"
#include "tests/apps/mnist_train_runner.h"


namespace {

// Every tensor of `a` equals the one of the same name in `b`, bit for bit.
void expect_same_tensors(const kiln::Checkpoint& a, const kiln::Checkpoint& b) {
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (const auto& [name, ta] : a.tensors) {
    auto it = b.tensors.find(name);
    ASSERT_NE(it, b.tensors.end()) << "missing " << name;
    const kiln::Tensor& tb = it->second;
    ASSERT_EQ(ta.shape(), tb.shape()) << name;
    ASSERT_EQ(ta.dtype(), tb.dtype()) << name;
    ASSERT_EQ(ta.nbytes(), tb.nbytes()) << name;
    EXPECT_EQ(0, std::memcmp(ta.raw_data(), tb.raw_data(), ta.nbytes()))
        << "tensor " << name << " differs between the straight and the resumed run";
  }
}

bool same_tensors(const kiln::Checkpoint& a, const kiln::Checkpoint& b) {
  for (const auto& [name, ta] : a.tensors) {
    auto it = b.tensors.find(name);
    if (it == b.tensors.end() || it->second.nbytes() != ta.nbytes() ||
        std::memcmp(ta.raw_data(), it->second.raw_data(), ta.nbytes()) != 0)
      return false;
  }
  return true;
}

// ---- 1. Learning ------------------------------------------------------------------------

TEST_F(MnistTrainTest, CnnOneEpochOn10kImagesReaches95Percent) {
  SKIP_WITHOUT_MNIST();
  const std::string json = path("summary.json");
  // Batch 32: 313 Adadelta steps in the epoch. Measured: 96.3-96.6% over seeds and thread
  // counts (batch 64: 95.3-96.5%, too close to the bar; batch 128: 93.7%, only 79 steps).
  RunResult r = run_mnist_train({"--data", mnist_dir(), "--limit-train", "10000", "--epochs", "1",
                                 "--batch-size", "32", "--json", json});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = read_json(json);
  EXPECT_EQ(j["model"], "cnn");
  EXPECT_EQ(j["device"], "cpu:0");
  EXPECT_EQ(j["epochs"], 1);
  EXPECT_EQ(j["batch_size"], 32);
  EXPECT_EQ(j["simulated"], false);
  EXPECT_EQ(j["test_images"], 10000);
  ASSERT_EQ(j["test_accuracy_per_epoch"].size(), 1u);
  ASSERT_EQ(j["train_loss_per_epoch"].size(), 1u);
  ASSERT_EQ(j["epoch_seconds"].size(), 1u);
  std::printf("1 epoch on 10k images: test accuracy %.4f, %.0f train images/s\n",
              j["test_accuracy"].get<double>(), j["train_images_per_sec"].get<double>());
  EXPECT_GE(j["test_accuracy"].get<double>(), 0.95) << r.output;
  EXPECT_LE(j["test_accuracy"].get<double>(), 1.0);
  EXPECT_GT(j["train_images_per_sec"].get<double>(), 0.0);
  EXPECT_GT(j["peak_memory_bytes"].get<int64_t>(), 0);
  EXPECT_GE(j["peak_rss_bytes"].get<int64_t>(), j["peak_memory_bytes"].get<int64_t>());
  const double wait = j["loader_wait_fraction"].get<double>();
  EXPECT_GT(wait, 0.0);  // measured, not a constant: building batches takes some time
  EXPECT_LT(wait, 1.0);
  for (const char* key : {"threads", "kernels", "seed"}) EXPECT_TRUE(j.contains(key)) << key;
  // Plain lines, no progress bar, when stdout is not a terminal.
  EXPECT_EQ(r.output.find('\r'), std::string::npos);
  EXPECT_NE(r.output.find("epoch  1/1"), std::string::npos) << r.output;
}

// ---- 2. Checkpoint round trip ----------------------------------------------------------

// Runs 2 epochs straight, then 1 epoch + resume, and compares the final checkpoints.
void check_round_trip(MnistTrainTest& t, const std::string& dir, const std::vector<std::string>& flags) {
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {"--data", mnist_dir(), "--threads", "1", "--quiet"};
    args.insert(args.end(), flags.begin(), flags.end());
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  const std::string straight = dir + "/straight.ckpt", first = dir + "/first.ckpt",
                    resumed = dir + "/resumed.ckpt";
  RunResult a = run_mnist_train(with({"--epochs", "2", "--checkpoint", straight}));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  RunResult b = run_mnist_train(with({"--epochs", "1", "--checkpoint", first}));
  ASSERT_EQ(b.exit_code, 0) << b.output;
  RunResult c = run_mnist_train(with({"--epochs", "2", "--resume", first, "--checkpoint", resumed}));
  ASSERT_EQ(c.exit_code, 0) << c.output;

  const kiln::Checkpoint ca = kiln::read_checkpoint(straight);
  const kiln::Checkpoint cb = kiln::read_checkpoint(first);
  const kiln::Checkpoint cc = kiln::read_checkpoint(resumed);
  EXPECT_EQ(cb.meta.at("epoch"), "1");
  EXPECT_EQ(ca.meta.at("epoch"), "2");
  EXPECT_EQ(cc.meta.at("epoch"), "2");
  EXPECT_FALSE(same_tensors(ca, cb)) << "the second epoch changed nothing: the test would be vacuous";
  expect_same_tensors(ca, cc);
  EXPECT_EQ(ca.meta.at("generator_offset"), cc.meta.at("generator_offset"));
  EXPECT_EQ(ca.meta.at("lr"), cc.meta.at("lr"));
  (void)t;
}

TEST_F(MnistTrainTest, CnnResumeReproducesUninterruptedRunBitForBit) {
  SKIP_WITHOUT_MNIST();
  // 1200 = 9 * 128 + 48: the last batch of each epoch is a partial one.
  check_round_trip(*this, dir_.string(), {"--limit-train", "1200", "--limit-test", "300"});
}

TEST_F(MnistTrainTest, MlpSgdResumeReproducesUninterruptedRunBitForBit) {
  SKIP_WITHOUT_MNIST();
  check_round_trip(*this, dir_.string(), {"--model", "mlp", "--optimizer", "sgd", "--limit-train",
                                          "3000", "--limit-test", "500"});
}

TEST_F(MnistTrainTest, ResumeRejectsAMismatchedOrDamagedCheckpoint) {
  SKIP_WITHOUT_MNIST();
  const std::string ckpt = path("mlp.ckpt");
  const std::vector<std::string> base = {"--data", mnist_dir(), "--quiet", "--limit-train", "256",
                                         "--limit-test", "100", "--model", "mlp"};
  auto args = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = base;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  ASSERT_EQ(run_mnist_train(args({"--epochs", "1", "--checkpoint", ckpt})).exit_code, 0);

  // The wrong model: the message says which one the checkpoint holds.
  std::vector<std::string> cnn = {"--data", mnist_dir(), "--quiet", "--epochs", "2", "--resume", ckpt};
  RunResult m = run_mnist_train(cnn);
  EXPECT_EQ(m.exit_code, 2) << m.output;
  EXPECT_NE(m.output.find("--model mlp"), std::string::npos) << m.output;

  // The wrong optimizer.
  RunResult o = run_mnist_train(args({"--epochs", "2", "--optimizer", "adam", "--resume", ckpt}));
  EXPECT_EQ(o.exit_code, 2) << o.output;
  EXPECT_NE(o.output.find("--optimizer adadelta"), std::string::npos) << o.output;

  // Nothing left to train.
  RunResult d = run_mnist_train(args({"--epochs", "1", "--resume", ckpt}));
  EXPECT_EQ(d.exit_code, 2) << d.output;
  EXPECT_NE(d.output.find("--epochs"), std::string::npos) << d.output;

  // A truncated copy: exit 2, naming the file.
  const std::string cut = path("truncated.ckpt");
  fs::copy_file(ckpt, cut);
  fs::resize_file(cut, fs::file_size(cut) / 2);
  RunResult tr = run_mnist_train(args({"--epochs", "2", "--resume", cut}));
  EXPECT_EQ(tr.exit_code, 2) << tr.output;
  EXPECT_NE(tr.output.find(cut), std::string::npos) << tr.output;
}

// ---- 3. Bad usage and bad input (no data needed) ----------------------------------------

TEST_F(MnistTrainTest, UnknownFlagIsAUsageError) {
  RunResult r = run_mnist_train({"--no-such-flag"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--no-such-flag"), std::string::npos) << r.output;
}

TEST_F(MnistTrainTest, InvalidFlagValuesAreUsageErrors) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--epochs", "0"}, {"--model", "resnet"}, {"--optimizer", "lbfgs"},
        {"--batch-size", "-5"}, {"--kernels", "fast"}, {"--device", "tpu"}, {"--epochs", "abc"}}) {
    RunResult r = run_mnist_train(args);
    EXPECT_EQ(r.exit_code, 2) << args[0] << " " << args[1] << ": " << r.output;
  }
}

TEST_F(MnistTrainTest, HelpExplainsEveryFlagAndExitsZero) {
  RunResult r = run_mnist_train({"--help"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const char* flag : {"--device", "--model", "--epochs", "--batch-size", "--lr", "--optimizer",
                           "--threads", "--seed", "--data", "--limit-train", "--limit-test",
                           "--checkpoint", "--resume", "--json", "--quiet", "--kernels",
                           "--trace"}) {
    EXPECT_NE(r.output.find(flag), std::string::npos) << flag;
  }
}

TEST_F(MnistTrainTest, UnwritableOutputIsReportedBeforeTraining) {
  for (const char* flag : {"--json", "--checkpoint", "--trace"}) {
    RunResult r = run_mnist_train({flag, path("no_such_dir/out"), "--epochs", "1"});
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("no_such_dir"), std::string::npos) << r.output;
  }
}

TEST_F(MnistTrainTest, MissingDataSaysToRunFetchScript) {
  RunResult r = run_mnist_train({"--data", path("no_such_dir"), "--epochs", "1"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("fetch_mnist.sh"), std::string::npos) << r.output;
}

TEST_F(MnistTrainTest, CorruptCheckpointIsAnInputErrorNamingTheFile) {
  const std::string bad = path("garbage.ckpt");
  {
    std::ofstream out(bad, std::ios::binary);
    out << "this is not a Kiln checkpoint, just some bytes that are long enough to read a header";
  }
  RunResult r = run_mnist_train({"--data", mnist_dir(), "--resume", bad, "--epochs", "2"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(bad), std::string::npos) << r.output;

  RunResult missing = run_mnist_train({"--resume", path("absent.ckpt"), "--epochs", "2"});
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_NE(missing.output.find("absent.ckpt"), std::string::npos) << missing.output;
}

// Whatever the build (no CUDA backend, real CUDA without a GPU, the simulator's 2 devices, one
// GPU), cuda:9 does not exist, and the error says so and what to do, before any training.
TEST_F(MnistTrainTest, MissingCudaDeviceIsAClearUsageError) {
  RunResult r = run_mnist_train({"--device", "cuda:9", "--epochs", "1"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("cuda:9"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--device cpu"), std::string::npos) << r.output;
}

// ---- 4. Tracing --------------------------------------------------------------------------

// The complete ("X") events of a Chrome trace file.
std::vector<nlohmann::json> complete_events(const std::string& path) {
  const nlohmann::json doc = read_json(path);
  std::vector<nlohmann::json> out;
  for (const nlohmann::json& e : doc["traceEvents"]) {
    if (e["ph"] == "X") out.push_back(e);
  }
  return out;
}

TEST_F(MnistTrainTest, TraceRecordsEveryStepsPhases) {
  SKIP_WITHOUT_MNIST();
  const std::string trace = path("trace.json");
  // 256 images in batches of 64: 4 steps.
  RunResult r = run_mnist_train({"--data", mnist_dir(), "--quiet", "--limit-train", "256",
                                 "--limit-test", "100", "--batch-size", "64", "--epochs", "1",
                                 "--trace", trace});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::map<std::string, std::set<int64_t>> steps_of_phase;
  for (const nlohmann::json& e : complete_events(trace)) {
    EXPECT_GE(e["dur"].get<double>(), 0.0);
    const nlohmann::json& args = e["args"];
    if (args.contains("step")) steps_of_phase[args["phase"].get<std::string>()].insert(args["step"].get<int64_t>());
  }
  const std::set<int64_t> all_steps = {0, 1, 2, 3};
  for (const char* phase : {"loader_wait", "forward", "backward", "optimizer"}) {
    EXPECT_EQ(steps_of_phase[phase], all_steps) << phase;
  }
}

TEST_F(MnistTrainTest, TraceOfDataParallelRunHasEachReplicasBuckets) {
  SKIP_WITHOUT_MNIST();
  const std::string trace = path("trace.json");
  RunResult r = run_mnist_train({"--data", mnist_dir(), "--quiet", "--limit-train", "256",
                                 "--limit-test", "100", "--batch-size", "64", "--epochs", "1",
                                 "--dist", "local:2", "--threads", "1", "--trace", trace});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::set<std::pair<int, int>> buckets;  // (replica, bucket)
  std::set<int> forward_replicas;
  for (const nlohmann::json& e : complete_events(trace)) {
    const nlohmann::json& args = e["args"];
    if (args["phase"] == "allreduce" && args.contains("bucket")) {
      buckets.emplace(args["replica"].get<int>(), args["bucket"].get<int>());
    }
    if (args["phase"] == "forward") forward_replicas.insert(args["replica"].get<int>());
  }
  EXPECT_EQ(forward_replicas, (std::set<int>{0, 1}));
  EXPECT_TRUE(buckets.count({0, 0}) > 0 && buckets.count({1, 0}) > 0) << buckets.size();
}

// The rows of a data-parallel trace are named by rank and role (engine/trace.h
// set_thread_label): each rank's thread, its loader worker and its allreduce thread.
TEST_F(MnistTrainTest, TraceRowsAreNamedByRankAndRole) {
  SKIP_WITHOUT_MNIST();
  const std::string trace = path("trace.json");
  RunResult r = run_mnist_train({"--data", mnist_dir(), "--quiet", "--limit-train", "256",
                                 "--limit-test", "100", "--batch-size", "64", "--epochs", "1",
                                 "--dist", "local:2", "--threads", "1", "--workers", "1",
                                 "--trace", trace});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::set<std::string> rows;
  const nlohmann::json doc = read_json(trace);
  for (const nlohmann::json& e : doc["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name") rows.insert(e["args"]["name"].get<std::string>());
  }
  for (const char* row : {"rank 0", "rank 1", "rank 0 loader worker 0", "rank 1 loader worker 0",
                          "rank 0 allreduce", "rank 1 allreduce"}) {
    EXPECT_EQ(rows.count(row), 1u) << row;
  }
  for (const std::string& row : rows) EXPECT_NE(row.rfind("thread ", 0), 0u) << row;
}

}  // namespace
