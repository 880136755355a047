// mnist_train_cuda_e2e_test: the whole training of mnist_train on a CUDA device, as a user runs
// it (--device cuda), compared with the same run on the CPU. Under the simulator (label sim) the
// subset is small, because simulated kernels are slow; on a real GPU (label gpu) it is the same
// run, to prove the GPU build end to end. Without a CUDA device the tests skip, saying why.
//
// Same seed, same data order, same initial weights: the two devices differ only in the order of
// floating-point sums, so after one epoch their losses agree to ~1e-5 (measured 2.03012 vs
// 2.03015) and their test predictions are the same. The bounds below leave room for a GPU's
// different summation order, and still fail on any real kernel bug (which moves the loss by
// far more than 1e-3 within a few steps).
#include <cstdint>
#include <cstdio>
#include <string>

#include "engine/cuda/context.h"
#include "tests/apps/mnist_train_runner.h"
#include "tests/support/cuda_skip.h"

namespace {

nlohmann::json train(const std::string& device, const std::string& json,
                     const std::string& kernels = "hand") {
  RunResult r = run_mnist_train({"--device", device, "--data", mnist_dir(), "--limit-train", "512",
                                 "--limit-test", "256", "--epochs", "1", "--batch-size", "64",
                                 "--threads", "1", "--kernels", kernels, "--json", json});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return read_json(json);
}

TEST_F(MnistTrainTest, CudaTrainingMatchesCpuTraining) {
  SKIP_WITHOUT_MNIST();
  KILN_SKIP_WITHOUT_CUDA();
  const nlohmann::json gpu = train("cuda", path("cuda.json"));
  const nlohmann::json cpu = train("cpu", path("cpu.json"));
  EXPECT_EQ(gpu["device"], "cuda:0");
  EXPECT_EQ(gpu["simulated"], kiln::cuda::kSimulated);
  EXPECT_EQ(gpu["kernels"], "hand");
  EXPECT_EQ(cpu["simulated"], false);
  const double gpu_loss = gpu["train_loss_per_epoch"][0].get<double>();
  const double cpu_loss = cpu["train_loss_per_epoch"][0].get<double>();
  std::printf("train loss: cuda %.6f, cpu %.6f; test accuracy: cuda %.4f, cpu %.4f\n", gpu_loss,
              cpu_loss, gpu["test_accuracy"].get<double>(), cpu["test_accuracy"].get<double>());
  EXPECT_NEAR(gpu_loss, cpu_loss, 1e-3 * cpu_loss);
  EXPECT_NEAR(gpu["test_accuracy"].get<double>(), cpu["test_accuracy"].get<double>(), 0.02);
  // It learned something: 8 steps take the loss well below chance (ln 10 = 2.30).
  EXPECT_LT(gpu_loss, 2.2);
  EXPECT_GT(gpu["peak_memory_bytes"].get<int64_t>(), 0);
}

// cuBLAS and cuDNN (simulated under the simulator) train like the CPU too.
TEST_F(MnistTrainTest, CudaVendorTrainingMatchesCpuTraining) {
  SKIP_WITHOUT_MNIST();
  KILN_SKIP_WITHOUT_CUDA();
  const nlohmann::json gpu = train("cuda", path("cuda_vendor.json"), "vendor");
  const nlohmann::json cpu = train("cpu", path("cpu.json"));
  EXPECT_EQ(gpu["kernels"], "vendor");
  const double gpu_loss = gpu["train_loss_per_epoch"][0].get<double>();
  const double cpu_loss = cpu["train_loss_per_epoch"][0].get<double>();
  std::printf("train loss: cuda vendor %.6f, cpu %.6f\n", gpu_loss, cpu_loss);
  EXPECT_NEAR(gpu_loss, cpu_loss, 1e-3 * cpu_loss);
  EXPECT_NEAR(gpu["test_accuracy"].get<double>(), cpu["test_accuracy"].get<double>(), 0.02);
  EXPECT_LT(gpu_loss, 2.2);
}

}  // namespace
