// mnist_train_checkpoint_test: crash consistency of mnist_train's checkpoints, with the real
// binary on real MNIST (small runs: an MLP on a few hundred images).
//
//   1. A mid-epoch checkpoint (--checkpoint-every): the run is SIGKILLed while it writes its
//      second checkpoint (KILN_CHECKPOINT_TEST_STALL_MS holds the writer with the .tmp half
//      written), so the file on disk is the first one, at a known step; --resume from it with
//      the same flags ends bit for bit where the uninterrupted run ends.
//   2. The same checkpoint, written by --dist local:2, resumed with --dist local:3 and with
//      --dist none: the epoch's remaining examples are dealt out among the new ranks; the
//      epoch's example count (JSON train_examples_per_epoch) is the dataset plus only the new
//      ranks' padding, and the replicas end equal.
//   3. A checkpoint of the older format (kiln-train/1, epoch ends only) still resumes, bit for bit.
//   4. A checkpoint that cannot be written (ulimit -f: the write fails with EFBIG, as on a full
//      disk): exit 1, a message naming the file and the errno text, the previous checkpoint
//      untouched and still resumable, no .tmp left.
//   5. Usage: --checkpoint-every without --checkpoint, or with --ps-async: exit 2.
//   6. The run's history (per epoch: train loss, test loss, test accuracy, seconds) travels in
//      the checkpoint: the JSON summary of a resumed run lists every epoch, the ones before the
//      resume included, with the values of the uninterrupted run; a file without a history
//      (an older Kiln's) still resumes.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "engine/serialize.h"
#include "tests/apps/mnist_train_runner.h"

namespace {

std::string quoted(const std::vector<std::string>& args) {
  std::string s;
  for (const std::string& a : args) s += " '" + a + "'";
  return s;
}

std::vector<char> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The meta entries of a and b, but for the epochs' seconds (history_seconds: timings, the one
// entry a resumed run does not reproduce).
void expect_same_meta(const std::string& a_path, const std::string& b_path) {
  std::map<std::string, std::string> a = kiln::read_checkpoint(a_path).meta,
                                      b = kiln::read_checkpoint(b_path).meta;
  EXPECT_EQ(a.erase("history_seconds"), 1u) << a_path;
  EXPECT_EQ(b.erase("history_seconds"), 1u) << b_path;
  EXPECT_EQ(a, b) << "the meta entries of " << a_path << " and " << b_path << " differ";
}

// Every tensor record of a and b, bit for bit.
void expect_same_tensors(const std::string& a_path, const std::string& b_path) {
  const kiln::Checkpoint a = kiln::read_checkpoint(a_path), b = kiln::read_checkpoint(b_path);
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (const auto& [name, ta] : a.tensors) {
    auto it = b.tensors.find(name);
    ASSERT_NE(it, b.tensors.end()) << name;
    ASSERT_EQ(ta.nbytes(), it->second.nbytes()) << name;
    EXPECT_EQ(0, std::memcmp(ta.raw_data(), it->second.raw_data(), ta.nbytes()))
        << name << " differs between " << a_path << " and " << b_path;
  }
}

class CheckpointTest : public MnistTrainTest {
 protected:
  // The flags of every run here: an MLP (fast) on `limit` images, batch 60, 1 thread per rank.
  std::vector<std::string> flags(int64_t limit, std::vector<std::string> extra,
                                 bool quiet = true) const {
    std::vector<std::string> a = {"--data", mnist_dir(), "--model", "mlp",
                                  "--limit-train", std::to_string(limit), "--limit-test", "100",
                                  "--batch-size", "60", "--threads", "1", "--workers", "1"};
    if (quiet) a.push_back("--quiet");
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }

  // Runs mnist_train with `args` plus --checkpoint-every 3 --checkpoint `ckpt`, and SIGKILLs it
  // while it writes its second checkpoint: `ckpt` is then the one of step 3.
  void run_and_kill_in_second_write(const std::vector<std::string>& args, const std::string& ckpt) {
    const std::string cmd =
        "KILN_CHECKPOINT_TEST_STALL_MS=1500 '" + std::string(KILN_MNIST_TRAIN) + "'" +
        quoted(args) + " --checkpoint-every 3 --checkpoint '" + ckpt + "' >/dev/null 2>&1 & " +
        "pid=$!; c='" + ckpt + "'; " +
        // The first checkpoint appears (its write is complete), then the second one's .tmp.
        "while [ ! -f \"$c\" ]; do kill -0 $pid 2>/dev/null || exit 3; sleep 0.02; done; "
        "while [ ! -f \"$c.tmp\" ]; do kill -0 $pid 2>/dev/null || exit 4; sleep 0.02; done; "
        "kill -9 $pid; wait $pid; exit 0";
    const RunResult r = kiln::testing::run_command(cmd);
    ASSERT_EQ(r.exit_code, 0) << "the run ended before its second checkpoint (3: before the "
                                 "first, 4: before the second): " << r.output;
    const kiln::Checkpoint c = kiln::read_checkpoint(ckpt);  // complete and valid
    EXPECT_EQ(c.meta.at("format"), "kiln-train/2");
    EXPECT_EQ(c.meta.at("epoch"), "0");
    EXPECT_EQ(c.meta.at("global_step"), "3");
    EXPECT_EQ(c.meta.at("epoch_steps"), "3");
  }
};

TEST_F(CheckpointTest, KilledMidEpochResumesAtTheSameBatchBitForBit) {
  SKIP_WITHOUT_MNIST();
  const std::string straight = path("straight.ckpt"), ckpt = path("run.ckpt");
  // 2 epochs of 10 steps; the checkpoint is at step 3 of epoch 1.
  const RunResult a = run_mnist_train(flags(600, {"--epochs", "2", "--checkpoint", straight}));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  run_and_kill_in_second_write(flags(600, {"--epochs", "2"}), ckpt);
  EXPECT_EQ(kiln::read_checkpoint(ckpt).meta.at("epoch_position"), "180");  // 3 x 60
  const RunResult b = run_mnist_train(
      flags(600, {"--epochs", "2", "--resume", ckpt, "--checkpoint", ckpt, "--json",
                  path("resumed.json")}));
  ASSERT_EQ(b.exit_code, 0) << b.output;
  expect_same_tensors(straight, ckpt);
  expect_same_meta(straight, ckpt);
  const nlohmann::json j = read_json(path("resumed.json"));
  EXPECT_EQ(j["start_position"], 180);
  EXPECT_EQ(j["train_examples_per_epoch"][0], 600);
}

TEST_F(CheckpointTest, WrittenByTwoRanksResumedByThreeOrOneReshardsTheRest) {
  SKIP_WITHOUT_MNIST();
  // 601 images: local:2 runs 10 steps of 2 x 30 (the last one padded); the checkpoint is at
  // global position 3 x 60 = 180, leaving 421.
  const std::string ckpt = path("two_ranks.ckpt");
  run_and_kill_in_second_write(flags(601, {"--epochs", "1", "--dist", "local:2"}), ckpt);
  EXPECT_EQ(kiln::read_checkpoint(ckpt).meta.at("epoch_position"), "180");
  EXPECT_EQ(kiln::read_checkpoint(ckpt).meta.at("workers"), "2");
  // local:3 (20 per rank and step): 421 left is 140 x 3 + 1, padded by 2 to 423.
  // none (60 per step): 421, no padding.
  for (const auto& [dist, examples] : {std::pair<std::string, int>{"local:3", 180 + 423},
                                       std::pair<std::string, int>{"none", 601}}) {
    SCOPED_TRACE(dist);
    const std::string copy = path("copy.ckpt"), json = path("resumed_" + dist + ".json");
    fs::copy_file(ckpt, copy, fs::copy_options::overwrite_existing);
    // Not --quiet: the lines say where the run resumed and that the replicas agree.
    const RunResult r = run_mnist_train(
        flags(601, {"--epochs", "1", "--dist", dist, "--resume", copy, "--json", json}, false));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("after 180 of its 601 examples"), std::string::npos) << r.output;
    if (dist != "none") {
      EXPECT_NE(r.output.find("rank 2: weights equal rank 0's"), std::string::npos) << r.output;
    }
    const nlohmann::json j = read_json(json);
    EXPECT_EQ(j["train_examples_per_epoch"][0], examples);
  }
}

TEST_F(CheckpointTest, OldFormatEpochEndCheckpointStillResumes) {
  SKIP_WITHOUT_MNIST();
  const std::string straight = path("straight.ckpt"), old = path("old.ckpt"),
                    resumed = path("resumed.ckpt");
  ASSERT_EQ(run_mnist_train(flags(300, {"--epochs", "2", "--checkpoint", straight})).exit_code, 0);
  ASSERT_EQ(run_mnist_train(flags(300, {"--epochs", "1", "--checkpoint", old})).exit_code, 0);
  // Rewrite it as an older Kiln wrote it: format kiln-train/1, none of the position entries.
  kiln::Checkpoint c = kiln::read_checkpoint(old);
  for (const char* key : {"epoch_position", "global_step", "epoch_steps", "epoch_loss_sum",
                          "epoch_seen", "workers", "history", "history_seconds"}) {
    ASSERT_EQ(c.meta.erase(key), 1u) << key;
  }
  c.meta["format"] = "kiln-train/1";
  kiln::write_checkpoint(old, c.tensors, c.meta);
  const RunResult r =
      run_mnist_train(flags(300, {"--epochs", "2", "--resume", old, "--checkpoint", resumed}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_same_tensors(straight, resumed);
  EXPECT_EQ(kiln::read_checkpoint(resumed).meta.at("global_step"), "10");  // 2 x 5 steps
}

TEST_F(CheckpointTest, FailedWriteExitsOneAndKeepsThePreviousCheckpoint) {
  SKIP_WITHOUT_MNIST();
  const std::string ckpt = path("run.ckpt");
  ASSERT_EQ(run_mnist_train(flags(300, {"--epochs", "1", "--checkpoint", ckpt})).exit_code, 0);
  const std::vector<char> before = file_bytes(ckpt);
  ASSERT_GT(before.size(), 2000u * 1024);  // the MLP's checkpoint is ~6 MB
  // ulimit -f counts 512-byte blocks in dash and 1024-byte ones in bash: 2000 is <= 2 MB.
  const std::string cmd = "ulimit -f 2000 && '" + std::string(KILN_MNIST_TRAIN) + "'" +
                          quoted(flags(300, {"--epochs", "2", "--resume", ckpt, "--checkpoint",
                                             ckpt, "--checkpoint-every", "2"})) +
                          " 2>&1";
  const RunResult r = kiln::testing::run_command(cmd);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find(ckpt + ".tmp"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(std::strerror(EFBIG)), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(ckpt + ".tmp")) << "the failed write left its .tmp";
  EXPECT_EQ(file_bytes(ckpt), before) << "the previous checkpoint changed";
  // And it still resumes.
  const RunResult again = run_mnist_train(flags(300, {"--epochs", "2", "--resume", ckpt}));
  EXPECT_EQ(again.exit_code, 0) << again.output;
}

TEST_F(CheckpointTest, JsonSummaryOfAResumedRunHasTheWholeHistory) {
  SKIP_WITHOUT_MNIST();
  const std::string ckpt = path("run.ckpt"), straight = path("straight.json"),
                    resumed = path("resumed.json"), old = path("old.ckpt"),
                    from_old = path("from_old.json");
  ASSERT_EQ(run_mnist_train(flags(300, {"--epochs", "3", "--json", straight})).exit_code, 0);
  ASSERT_EQ(run_mnist_train(flags(300, {"--epochs", "2", "--checkpoint", ckpt})).exit_code, 0);
  fs::copy_file(ckpt, old);
  const RunResult r =
      run_mnist_train(flags(300, {"--epochs", "3", "--resume", ckpt, "--json", resumed}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json a = read_json(straight), b = read_json(resumed);
  ASSERT_EQ(a["history"].size(), 3u) << a.dump(2);
  ASSERT_EQ(b["history"].size(), 3u) << b.dump(2);  // epochs 1 and 2 from the checkpoint
  EXPECT_EQ(b["test_accuracy_per_epoch"].size(), 1u);  // this process ran epoch 3 alone
  for (size_t e = 0; e < 3; ++e) {
    SCOPED_TRACE(e);
    EXPECT_EQ(b["history"][e]["epoch"], e + 1);
    for (const char* field : {"train_loss", "test_loss", "test_accuracy"}) {
      EXPECT_EQ(b["history"][e][field], a["history"][e][field]) << field;  // bit for bit
    }
    EXPECT_GT(b["history"][e]["seconds"].get<double>(), 0.0);
    EXPECT_GT(b["history"][e]["test_loss"].get<double>(), 0.0);
  }
  EXPECT_EQ(b["test_loss"], a["test_loss"]);
  EXPECT_EQ(b["test_loss_per_epoch"][0], a["history"][2]["test_loss"]);

  // A checkpoint without a history (written by an older Kiln) resumes; the history then
  // starts where this run did.
  kiln::Checkpoint c = kiln::read_checkpoint(old);
  ASSERT_EQ(c.meta.erase("history"), 1u);
  ASSERT_EQ(c.meta.erase("history_seconds"), 1u);
  kiln::write_checkpoint(old, c.tensors, c.meta);
  const RunResult o =
      run_mnist_train(flags(300, {"--epochs", "3", "--resume", old, "--json", from_old}));
  ASSERT_EQ(o.exit_code, 0) << o.output;
  const nlohmann::json h = read_json(from_old)["history"];
  ASSERT_EQ(h.size(), 1u) << h.dump(2);
  EXPECT_EQ(h[0]["epoch"], 3);
  EXPECT_EQ(h[0]["test_accuracy"], a["history"][2]["test_accuracy"]);
}

TEST_F(CheckpointTest, CheckpointEveryUsageErrors) {
  const RunResult no_file = run_mnist_train({"--checkpoint-every", "5"});
  EXPECT_EQ(no_file.exit_code, 2) << no_file.output;
  EXPECT_NE(no_file.output.find("--checkpoint FILE"), std::string::npos) << no_file.output;
  const RunResult async = run_mnist_train(
      {"--checkpoint-every", "5", "--checkpoint", path("x.ckpt"), "--dist", "local:3",
       "--allreduce", "ps", "--ps-servers", "1", "--ps-async"});
  EXPECT_EQ(async.exit_code, 2) << async.output;
  EXPECT_NE(async.output.find("--ps-async"), std::string::npos) << async.output;
}

}  // namespace
