// mnist_train_nccl_test: mnist_train with --dist nccl:2, two data-parallel ranks as threads of
// one process, rank r on cuda:r, gradients averaged by ncclAllReduce (--allreduce native) or
// by the ring over NCCL send/receive. Label sim under the CUDA simulator (its NCCL stand-in,
// two simulated GPUs), gpu on a real machine (skips without two GPUs).
//   1. The short run ends with equal replicas, and trains exactly like --dist local:2 on the
//      CPU: the same global batch split over the same two shards, the same two-rank sums; the
//      devices differ only in the order of floating-point sums inside the kernels (cuda vs cpu
//      agree to ~1e-5 relative, mnist_train_cuda_e2e_test).
//   2. Bad nccl:N values exit 2 naming what to use instead.
#include <cstdio>
#include <initializer_list>
#include <string>
#include <vector>

#include "engine/cuda/context.h"
#include "tests/apps/mnist_train_runner.h"
#include "tests/support/cuda_skip.h"

namespace {

std::vector<std::string> short_run(const std::string& dist, const std::string& json,
                                   std::vector<std::string> extra) {
  std::vector<std::string> a = {"--dist", dist, "--data", mnist_dir(), "--limit-train", "256",
                                "--limit-test", "128", "--epochs", "1", "--batch-size", "64",
                                "--threads", "1", "--json", json};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

bool contains(const std::string& s, const std::string& what) {
  return s.find(what) != std::string::npos;
}

TEST_F(MnistTrainTest, TwoNcclThreadRanksEndWithEqualReplicasAndTrainLikeTwoLocalRanks) {
  SKIP_WITHOUT_MNIST();
  KILN_SKIP_WITHOUT_CUDA_DEVICES(2);
  RunResult cpu = run_mnist_train(short_run("local:2", path("local.json"), {}));
  ASSERT_EQ(cpu.exit_code, 0) << cpu.output;
  const nlohmann::json local = read_json(path("local.json"));
  for (const std::string alg : {"native", "ring"}) {
    const std::string json = path("nccl_" + alg + ".json");
    RunResult r = run_mnist_train(short_run("nccl:2", json, {"--allreduce", alg,
                                                             "--kernels", "hand"}));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(contains(r.output, "rank 0: weights equal rank 0's")) << r.output;
    EXPECT_TRUE(contains(r.output, "rank 1: weights equal rank 0's")) << r.output;
    const nlohmann::json j = read_json(json);
    EXPECT_EQ(j["dist"], "nccl:2");
    EXPECT_EQ(j["world_size"], 2);
    EXPECT_EQ(j["allreduce"], alg);
    EXPECT_EQ(j["device"], "cuda:0");
    EXPECT_EQ(j["replicas_equal"], true);
    const double loss = j["train_loss_per_epoch"][0].get<double>();
    const double want = local["train_loss_per_epoch"][0].get<double>();
    std::printf("nccl:2 %s: train loss %.6f (local:2 on the cpu %.6f), test accuracy %.4f "
                "(%.4f)\n", alg.c_str(), loss, want, j["test_accuracy"].get<double>(),
                local["test_accuracy"].get<double>());
    EXPECT_NEAR(loss, want, 1e-3 * want) << alg;
    EXPECT_NEAR(j["test_accuracy"].get<double>(), local["test_accuracy"].get<double>(), 0.02);
  }
}

TEST_F(MnistTrainTest, BadNcclRankCountsExit2SayingWhatToUse) {
  KILN_SKIP_WITHOUT_CUDA();
  const int gpus = kiln::cuda::device_count();
  RunResult more = run_mnist_train({"--dist", "nccl:" + std::to_string(gpus + 1), "--batch-size",
                                    std::to_string(64 * (gpus + 1)), "--epochs", "1"});
  EXPECT_EQ(more.exit_code, 2) << more.output;
  EXPECT_TRUE(contains(more.output, "nccl needs one GPU per rank")) << more.output;
  EXPECT_TRUE(contains(more.output, "nccl:" + std::to_string(gpus))) << more.output;
  RunResult zero = run_mnist_train({"--dist", "nccl:0"});
  EXPECT_EQ(zero.exit_code, 2) << zero.output;
  EXPECT_TRUE(contains(zero.output, "nccl:N (N ranks as threads")) << zero.output;
}

}  // namespace
