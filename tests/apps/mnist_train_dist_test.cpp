// mnist_train_dist_test: the real mnist_train binary training data-parallel on real MNIST.
//
// Built twice (tests/apps/CMakeLists.txt):
//   mnist_train_dist_test (label e2e): --dist local:N, ranks as threads of one process
//     1. local:2 writes the data-parallel JSON fields, every rank says its weights equal rank
//        0's, and the gradient traffic is exactly what the ring sends: K bytes per step per
//        rank for N = 2 (2(N-1)K/N).
//     2. The equivalence end to end: the MLP (no dropout) with SGD, --dist none, local:2 and
//        local:4 with the same global batch, give the same per-epoch loss and accuracy.
//     3. Synchronous PS with a dedicated server rank, fp16 and bf16 on the wire, small buckets,
//        and the large-minibatch recipe (--batch-per-rank): the runs finish with equal replicas.
//     4. The asynchronous parameter server (local:3 = 2 workers + 1 server) converges.
//     4b. --no-bucket-view (gradients copied into the buckets) reaches the very numbers of the
//        default (each .grad a view into its bucket).
//     5. Bad flag combinations exit 2 with a message saying what to do.
//   mnist_train_mpi_test (label mpi): the same binary under `mpirun -np 2 --dist mpi`; it must
//     reach the very numbers of --dist local:2 (same sampler, same reduction order); a flag
//     error found after MPI started exits on every rank; an error on one rank aborts the job
//     (transport abort) instead of leaving the other waiting forever; ranks started with
//     different flags (mpirun's MPMD form, `-np 1 app --model cnn : -np 1 app --model mlp`)
//     exit 2 within seconds, rank 0 naming the flags and the ranks, none hanging.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tests/apps/mnist_train_runner.h"

namespace {

// The arguments shared by the short runs: 2,000 training images, 1,000 test images, 1 thread.
std::vector<std::string> short_run(std::vector<std::string> extra) {
  std::vector<std::string> a = {"--data", mnist_dir(), "--limit-train", "2000", "--limit-test",
                                "1000", "--epochs", "1", "--threads", "1"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

bool contains(const std::string& s, const std::string& what) {
  return s.find(what) != std::string::npos;
}

#if !KILN_DIST_TEST_MPI

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

constexpr int64_t kCnnParameters = 1199882;

TEST_F(MnistTrainTest, LocalTwoRanksWritesTheDistributedFieldsAndEqualReplicas) {
  SKIP_WITHOUT_MNIST();
  const std::string json = path("summary.json");
  RunResult r = run_mnist_train(short_run({"--dist", "local:2", "--json", json}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "rank 0: weights equal rank 0's")) << r.output;
  EXPECT_TRUE(contains(r.output, "rank 1: weights equal rank 0's")) << r.output;
  const nlohmann::json j = read_json(json);
  EXPECT_EQ(j["dist"], "local:2");
  EXPECT_EQ(j["world_size"], 2);
  EXPECT_EQ(j["worker_ranks"], 2);
  EXPECT_EQ(j["allreduce"], "ring");
  EXPECT_EQ(j["fp16_allreduce"], false);
  EXPECT_EQ(j["bucket_mb"], 1.0);
  EXPECT_EQ(j["buckets"], 3);  // fc2 + fc1's bias | fc1's weight alone | conv2 + conv1
  EXPECT_EQ(j["ps_servers"], 0);
  EXPECT_EQ(j["ps_async"], false);
  EXPECT_EQ(j["batch_size"], 128);
  EXPECT_EQ(j["rank_batch_size"], 64);
  EXPECT_EQ(j["global_batch_size"], 128);
  EXPECT_EQ(j["replicas_equal"], true);
  EXPECT_GT(j["comm_seconds"].get<double>(), 0.0);
  EXPECT_GE(j["overlap_fraction"].get<double>(), 0.0);
  EXPECT_LE(j["overlap_fraction"].get<double>(), 1.0);
  // Ring with N = 2: each rank sends half the gradient in the reduce-scatter and half in the
  // allgather, i.e. K = 4 bytes x parameters per step; 1,000 images per rank in batches of 64.
  const int64_t steps = ceil_div(1000, 64);
  EXPECT_EQ(j["bytes_sent_per_rank"].get<int64_t>(), steps * 4 * kCnnParameters);
  EXPECT_GT(j["test_accuracy"].get<double>(), 0.5);  // 76% measured: it learned
  std::printf("local:2 short run: %.0f img/s, overlap %.2f, test accuracy %.4f\n",
              j["train_images_per_sec"].get<double>(), j["overlap_fraction"].get<double>(),
              j["test_accuracy"].get<double>());
}

TEST_F(MnistTrainTest, BucketViewsAndCopiedGradientsGiveTheSameRun) {
  SKIP_WITHOUT_MNIST();
  std::vector<nlohmann::json> runs;
  for (const bool copies : {false, true}) {
    const std::string json = path(copies ? "copies.json" : "views.json");
    std::vector<std::string> flags = {"--dist", "local:2", "--json", json};
    if (copies) flags.push_back("--no-bucket-view");
    RunResult r = run_mnist_train(short_run(flags));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    runs.push_back(read_json(json));
  }
  EXPECT_EQ(runs[0]["train_loss_per_epoch"], runs[1]["train_loss_per_epoch"]);
  EXPECT_EQ(runs[0]["test_accuracy"], runs[1]["test_accuracy"]);
  EXPECT_EQ(runs[0]["replicas_equal"], true);
  EXPECT_EQ(runs[1]["replicas_equal"], true);
}

TEST_F(MnistTrainTest, MlpOnTwoAndFourLocalRanksFollowsTheSingleRankRun) {
  SKIP_WITHOUT_MNIST();
  std::vector<nlohmann::json> runs;
  for (const char* dist : {"none", "local:2", "local:4"}) {
    const std::string json = path(std::string("mlp_") + dist + ".json");
    RunResult r = run_mnist_train({"--data", mnist_dir(), "--limit-train", "2000",
                                   "--limit-test", "1000", "--epochs", "2", "--threads", "1",
                                   "--dist", dist, "--model", "mlp", "--optimizer", "sgd",
                                   "--batch-size", "64", "--json", json});
    ASSERT_EQ(r.exit_code, 0) << dist << "\n" << r.output;
    runs.push_back(read_json(json));
  }
  for (size_t k = 1; k < runs.size(); ++k) {
    for (int e = 0; e < 2; ++e) {
      const double l0 = runs[0]["train_loss_per_epoch"][e], lk = runs[k]["train_loss_per_epoch"][e];
      EXPECT_NEAR(lk, l0, 1e-5 * l0) << "run " << k << " epoch " << e + 1;
      const double a0 = runs[0]["test_accuracy_per_epoch"][e];
      const double ak = runs[k]["test_accuracy_per_epoch"][e];
      EXPECT_NEAR(ak, a0, 0.002) << "run " << k << " epoch " << e + 1;  // 2 of 1,000 images
    }
  }
  // The single-rank run learned something (else equality would be cheap).
  EXPECT_GT(runs[0]["test_accuracy"].get<double>(), 0.5);
}

TEST_F(MnistTrainTest, SynchronousPsFp16SmallBucketsAndTheLargeMinibatchRecipeKeepReplicasEqual) {
  SKIP_WITHOUT_MNIST();
  struct Variant {
    std::vector<std::string> flags;
    std::vector<int> ranks;  // worker ranks that must report
  };
  const std::vector<Variant> variants = {
      {{"--dist", "local:3", "--allreduce", "ps", "--ps-servers", "1"}, {0, 1}},
      {{"--dist", "local:2", "--allreduce", "hd", "--fp16-allreduce", "--bucket-mb", "25"},
       {0, 1}},
      {{"--dist", "local:2", "--batch-per-rank", "--batch-size", "32", "--warmup-epochs", "0.5"},
       {0, 1}},
      {{"--dist", "local:2", "--bf16-allreduce"}, {0, 1}},
  };
  for (size_t v = 0; v < variants.size(); ++v) {
    const std::string json = path("variant" + std::to_string(v) + ".json");
    std::vector<std::string> flags = variants[v].flags;
    flags.push_back("--json");
    flags.push_back(json);
    RunResult r = run_mnist_train(short_run(flags));
    ASSERT_EQ(r.exit_code, 0) << "variant " << v << "\n" << r.output;
    for (int rank : variants[v].ranks) {
      EXPECT_TRUE(contains(r.output, "rank " + std::to_string(rank) + ": weights equal rank 0's"))
          << "variant " << v << "\n" << r.output;
    }
    EXPECT_FALSE(contains(r.output, "rank 2: weights")) << "a server rank holds no replica";
    const nlohmann::json j = read_json(json);
    EXPECT_GT(j["test_accuracy"].get<double>(), 0.5) << "variant " << v;
    if (v == 0) {
      EXPECT_EQ(j["world_size"], 3);
      EXPECT_EQ(j["worker_ranks"], 2);
      EXPECT_EQ(j["ps_servers"], 1);
    } else if (v == 1) {
      EXPECT_EQ(j["fp16_allreduce"], true);
      // Halves on the wire: halving-doubling with N = 2 sends K/2 + K/2 = K bytes per step.
      EXPECT_EQ(j["bytes_sent_per_rank"].get<int64_t>(), ceil_div(1000, 64) * 2 * kCnnParameters);
    } else if (v == 3) {
      EXPECT_EQ(j["bf16_allreduce"], true);
      EXPECT_EQ(j["fp16_allreduce"], false);
      // bf16 on the wire: the ring with N = 2 sends K/2 + K/2 = K two-byte values per step.
      EXPECT_EQ(j["bytes_sent_per_rank"].get<int64_t>(), ceil_div(1000, 64) * 2 * kCnnParameters);
    } else {
      EXPECT_EQ(j["batch_per_rank"], true);
      EXPECT_EQ(j["rank_batch_size"], 32);
      EXPECT_EQ(j["global_batch_size"], 64);
      EXPECT_EQ(j["warmup_steps"], ceil_div(1000, 32) / 2);
    }
  }
}

// --allreduce bb on 3 ranks (blocks of 2 and 1): every replica ends equal to rank 0's.
TEST_F(MnistTrainTest, BinaryBlocksOnThreeRanksKeepsReplicasEqual) {
  SKIP_WITHOUT_MNIST();
  const std::string json = path("bb.json");
  RunResult r = run_mnist_train(short_run({"--dist", "local:3", "--allreduce", "bb",
                                           "--batch-size", "96", "--json", json}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (int rank = 0; rank < 3; ++rank)
    EXPECT_TRUE(contains(r.output, "rank " + std::to_string(rank) + ": weights equal rank 0's"))
        << r.output;
  const nlohmann::json j = read_json(json);
  EXPECT_EQ(j["allreduce"], "bb");
  EXPECT_EQ(j["world_size"], 3);
  EXPECT_GT(j["test_accuracy"].get<double>(), 0.5);
}

TEST_F(MnistTrainTest, AsyncParameterServerConverges) {
  SKIP_WITHOUT_MNIST();
  const std::string json = path("async.json");
  // 2 workers x 63 steps of batch 32 (4,000 images), 126 updates applied by the server as
  // they come. Measured: 89.8%, 90.2%, 92.1% (asynchrony: runs differ) on 2,000 test images.
  RunResult r = run_mnist_train({"--data", mnist_dir(), "--limit-train", "4000", "--limit-test",
                                 "2000", "--epochs", "1", "--threads", "1", "--batch-size", "64",
                                 "--dist", "local:3", "--allreduce", "ps", "--ps-servers", "1",
                                 "--ps-async", "--ps-staleness", "2", "--json", json});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "rank 0: weights equal rank 0's")) << r.output;
  EXPECT_TRUE(contains(r.output, "rank 1: weights equal rank 0's")) << r.output;
  const nlohmann::json j = read_json(json);
  EXPECT_EQ(j["ps_async"], true);
  EXPECT_EQ(j["ps_servers"], 1);
  EXPECT_EQ(j["ps_staleness"], 2);
  EXPECT_GT(j["bytes_sent_per_rank"].get<int64_t>(), 0);
  std::printf("async PS: test accuracy %.4f\n", j["test_accuracy"].get<double>());
  EXPECT_GT(j["test_accuracy"].get<double>(), 0.80) << r.output;  // chance is 0.10
}

TEST_F(MnistTrainTest, BadDistributedFlagsExit2SayingWhatToDo) {
  struct Bad {
    std::vector<std::string> flags;
    std::string says;
  };
  const std::vector<Bad> bad = {
      {{"--dist", "local:2", "--ps-async"}, "--ps-async needs --allreduce ps"},
      {{"--dist", "local:3", "--allreduce", "ps", "--ps-async"}, "--ps-servers >= 1"},
      {{"--dist", "local:2", "--ps-servers", "1"}, "needs --allreduce ps"},
      {{"--dist", "local:2", "--allreduce", "ps", "--ps-servers", "2"}, "leaves no worker"},
      {{"--dist", "local:0"}, "use none, local:N"},
      {{"--dist", "tcp"}, "use none, local:N"},
      {{"--dist", "local:3"}, "multiple of 3"},  // the default global batch 128
      {{"--dist", "local:2", "--allreduce", "native"}, "--dist mpi or nccl"},
      {{"--dist", "local:2", "--warmup-epochs", "1"}, "add --batch-per-rank"},
      {{"--allreduce", "hd"}, "add --dist local:N"},
      {{"--allreduce", "bb"}, "add --dist local:N"},
      {{"--dist", "local:2", "--allreduce", "rabenseifner"}, "ring"},
      {{"--dist", "local:3", "--allreduce", "ps", "--ps-servers", "1", "--ps-async",
        "--fp16-allreduce"}, "drop one of the two"},
      {{"--dist", "local:3", "--allreduce", "ps", "--ps-servers", "1", "--ps-async",
        "--checkpoint", "/tmp/x.ckpt"}, "--checkpoint/--resume with --ps-async"},
      {{"--dist", "local:2", "--ps-staleness", "3"}, "add --ps-async"},
      {{"--dist", "local:2", "--fp16-allreduce", "--bf16-allreduce"}, "give one of them"},
      {{"--bf16-allreduce"}, "add --dist local:N"},
      {{"--dist", "local:3", "--allreduce", "ps", "--ps-servers", "1", "--ps-async",
        "--bf16-allreduce"}, "drop one of the two"},
  };
  for (const Bad& b : bad) {
    std::vector<std::string> flags = {"--data", mnist_dir()};
    flags.insert(flags.end(), b.flags.begin(), b.flags.end());
    RunResult r = run_mnist_train(flags);
    std::string cmd;
    for (const auto& f : b.flags) cmd += f + " ";
    EXPECT_EQ(r.exit_code, 2) << cmd << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, b.says)) << cmd << ": expected '" << b.says << "' in\n"
                                            << r.output;
  }
}

#else  // KILN_DIST_TEST_MPI

// `mnist_train 'arg' 'arg' ...` for an mpirun command line.
std::string app_context(const std::vector<std::string>& args) {
  std::string cmd = std::string("'") + KILN_MNIST_TRAIN + "'";
  for (const std::string& a : args) cmd += " '" + a + "'";
  return cmd;
}

// Runs `mpirun <rest>` (allowed as root: the container runs as root), never longer than 300 s:
// a test of "no rank hangs" must not hang itself.
RunResult run_mpirun_command(const std::string& rest) {
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  return kiln::testing::run_command(std::string("timeout 300 '") + KILN_MPIEXEC + "' " + rest +
                                    " 2>&1");
}

// `mpirun -np <np> mnist_train <args>`.
RunResult run_mpirun(int np, const std::vector<std::string>& args) {
  return run_mpirun_command("-np " + std::to_string(np) + " --oversubscribe " + app_context(args));
}

TEST_F(MnistTrainTest, TwoMpiRanksTrainLikeTwoLocalRanks) {
  SKIP_WITHOUT_MNIST();
  const std::string mpi_json = path("mpi.json"), local_json = path("local.json");
  RunResult m = run_mpirun(2, short_run({"--dist", "mpi", "--json", mpi_json}));
  ASSERT_EQ(m.exit_code, 0) << m.output;
  EXPECT_TRUE(contains(m.output, "rank 0: weights equal rank 0's")) << m.output;
  EXPECT_TRUE(contains(m.output, "rank 1: weights equal rank 0's")) << m.output;
  RunResult l = run_mnist_train(short_run({"--dist", "local:2", "--json", local_json}));
  ASSERT_EQ(l.exit_code, 0) << l.output;
  const nlohmann::json jm = read_json(mpi_json), jl = read_json(local_json);
  EXPECT_EQ(jm["dist"], "mpi");
  EXPECT_EQ(jm["world_size"], 2);
  EXPECT_EQ(jm["bytes_sent_per_rank"], jl["bytes_sent_per_rank"]);
  // Same shards, same ring, same order of additions: the same numbers as the threads.
  EXPECT_EQ(jm["train_loss_per_epoch"], jl["train_loss_per_epoch"]);
  EXPECT_EQ(jm["test_accuracy"], jl["test_accuracy"]);
}

TEST_F(MnistTrainTest, MpiBadFlagsExit2FromEveryRankWithoutHanging) {
  // --ps-servers 2 of 2 ranks: found only once MPI says the world has 2 ranks.
  RunResult r = run_mpirun(2, {"--data", mnist_dir(), "--dist", "mpi", "--allreduce", "ps",
                               "--ps-servers", "2"});
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "leaves no worker")) << r.output;
}

TEST_F(MnistTrainTest, AnErrorOnOneMpiRankStopsTheJobInsteadOfHanging) {
  SKIP_WITHOUT_MNIST();
  // Rank 1 cannot read its data (the same flags but --data, which may differ between hosts);
  // rank 0 would wait for rank 1 in the workers' comparison of their data forever if rank 1
  // just exited.
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::string> rank1 = short_run({"--dist", "mpi"});
  rank1[1] = "/nonexistent/mnist";  // short_run's --data
  RunResult r = run_mpirun_command(
      "-np 1 --oversubscribe " + app_context(short_run({"--dist", "mpi"})) + " : -np 1 " +
      app_context(rank1));
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.exit_code, 124) << "timed out: a rank hung\n" << r.output;
  EXPECT_LT(secs, 120.0) << r.output;
  EXPECT_TRUE(contains(r.output, "mnist_train: rank 1: error: ")) << r.output;
  EXPECT_TRUE(contains(r.output, "fetch_mnist.sh")) << r.output;  // the message says what to do
  EXPECT_FALSE(contains(r.output, "weights equal")) << r.output;
}

TEST_F(MnistTrainTest, MpiRanksStartedWithOtherFlagsExit2NamingThemWithinSeconds) {
  // No MNIST needed: the ranks compare their flags right after MPI starts, before any data is
  // read. Without the comparison, --model and --allreduce hung until killed and --batch-size
  // ended in a receive buffer too small for rank 0's message.
  struct Case {
    std::vector<std::string> rank0, rank1;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--model", "cnn"}, {"--model", "mlp"},
       "mnist_train: error: ranks disagree on --model: rank 0 cnn, rank 1 mlp; every rank must be "
       "started with the same flags"},
      {{"--allreduce", "hd"}, {"--allreduce", "ring"}, "ranks disagree on --allreduce: rank 0 hd, rank 1 ring"},
      {{"--batch-size", "64"}, {"--batch-size", "128"},
       "ranks disagree on --batch-size: rank 0 64, rank 1 128"},
      // A flag rank 1 adds, and two flags at once.
      {{}, {"--bucket-mb", "4", "--precision", "bf16"},
       "ranks disagree on --precision: rank 0 fp32, rank 1 bf16; on --bucket-mb: rank 0 1, "
       "rank 1 4; every rank must be started with the same flags"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> a0 = {"--dist", "mpi", "--epochs", "1", "--threads", "1"}, a1 = a0;
    a0.insert(a0.end(), c.rank0.begin(), c.rank0.end());
    a1.insert(a1.end(), c.rank1.begin(), c.rank1.end());
    const auto start = std::chrono::steady_clock::now();
    RunResult r = run_mpirun_command("-np 1 --oversubscribe " + app_context(a0) + " : -np 1 " +
                                     app_context(a1));
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    SCOPED_TRACE(c.message);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_LT(secs, 30.0) << "the ranks took " << secs << " s to stop\n" << r.output;
    EXPECT_TRUE(contains(r.output, c.message)) << r.output;
    // Rank 0 alone says it, once.
    EXPECT_EQ(r.output.find("ranks disagree"), r.output.rfind("ranks disagree")) << r.output;
    EXPECT_FALSE(contains(r.output, "does not fit the receive buffer")) << r.output;
  }
}

#endif  // KILN_DIST_TEST_MPI

}  // namespace
