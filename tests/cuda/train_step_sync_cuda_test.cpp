// train_step_sync_cuda_test.cpp: a whole training step on cuda:0 queues its work without
// waiting for the device once, the condition for capturing it into a CUDA graph and for the
// host to run ahead of the GPU. A small CNN (models/mnist_cnn.h) and a narrow ResNet train for
// three steps, f32 and with f16 autocast, with the device-side learning rate (set_lr every
// step), loss scaling's device-side path (engine/optim/grad_scaler.h: found_inf never comes
// back to the host) and the optimizer skipping on it; every step runs under
// cuda::set_sync_debug_mode(Error) (engine/cuda/sync_debug.h), and the test fails when any call
// inside a step waited, even a named one. It also checks the launch counter
// (engine/cuda/launch_count.h): one elementwise op is one launch, and every step after the
// first queues the same number of launches.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/autocast.h"
#include "engine/cuda/launch_count.h"
#include "engine/cuda/sync_debug.h"
#include "engine/init.h"
#include "engine/ops.h"
#include "engine/optim/grad_scaler.h"
#include "engine/optim/sgd.h"
#include "engine/tensor.h"
#include "layers/loss.h"
#include "layers/module.h"
#include "models/mnist_cnn.h"
#include "models/resnet.h"
#include "support/cuda_skip.h"

namespace kiln {
namespace {

const Device kCuda(DeviceType::CUDA, 0);

// Trains `net` for three steps on cuda:0 with every step under the sync debug mode's error
// setting; returns the launches of each step.
std::vector<int64_t> train_without_waiting(Module& net, const Shape& input, int64_t classes,
                                           DType autocast) {
  manual_seed(3);
  net.to(kCuda);
  Tensor x = Tensor::empty(input);
  uniform_(x, -1, 1);
  x = x.to(kCuda);
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < input[0]; ++i) labels.push_back(i % classes);
  const Tensor y = Tensor::from_vector(labels, {input[0]}).to(kCuda);
  SGD opt(net.parameters(), 0.05, 0.9);
  GradScaler scaler;
  scaler.keep_on_device(kCuda);

  std::vector<int64_t> launches;
  Tensor loss;
  for (int step = 0; step < 3; ++step) {
    cuda::reset_sync_debug_counts();
    cuda::set_sync_debug_mode(cuda::SyncDebug::Error);
    const int64_t before = cuda::launch_count();
    try {
      opt.set_lr(0.05 / (step + 1));
      opt.zero_grad();
      {
        AutocastGuard mixed(autocast, autocast != DType::F32);
        loss = cross_entropy(net.forward(x), y);
      }
      scaler.scale(loss).backward();
      scaler.unscale_on_device(net.parameters());
      opt.step(scaler.found_inf());
      scaler.update_on_device();
    } catch (...) {
      cuda::set_sync_debug_mode(cuda::SyncDebug::Off);
      throw;  // the report names the call that waited and its site
    }
    launches.push_back(cuda::launch_count() - before);
    const cuda::SyncDebugCounts counts = cuda::sync_debug_counts();
    cuda::set_sync_debug_mode(cuda::SyncDebug::Off);
    EXPECT_EQ(counts.checked, 0) << "step " << step << ": " << counts.checked
                                 << " calls waited for the device (" << counts.allowed
                                 << " of them named with cuda::AllowSync)";
  }
  EXPECT_TRUE(std::isfinite(loss.item()));  // read after the steps, as logging would
  EXPECT_EQ(scaler.steps(), 3);
  EXPECT_EQ(opt.step_count(), 3 - scaler.skipped_steps());
  return launches;
}

void expect_steady_launches(const std::vector<int64_t>& launches) {
  ASSERT_EQ(launches.size(), 3u);
  EXPECT_GT(launches[1], 0);
  EXPECT_EQ(launches[1], launches[2]) << "the steady-state step queues a fixed number of launches";
}

std::shared_ptr<ResNet> narrow_resnet() {
  ResNetConfig config = resnet_config("resnet18", 10);
  config.layers = {1, 1, 1, 1};
  config.base_planes = 4;
  config.width_per_group = 16;
  return make_resnet(config);
}

TEST(TrainStepSyncCuda, OneElementwiseOpIsOneLaunch) {
  KILN_SKIP_WITHOUT_CUDA();
  const Tensor a = Tensor::ones({1000}, DType::F32, kCuda);
  const int64_t before = cuda::launch_count();
  const Tensor b = add(a, a);
  EXPECT_EQ(cuda::launch_count() - before, 1);
}

TEST(TrainStepSyncCuda, SmallCnnF32) {
  KILN_SKIP_WITHOUT_CUDA();
  auto net = make_mnist_cnn();
  expect_steady_launches(train_without_waiting(*net, {4, 1, 28, 28}, 10, DType::F32));
}

TEST(TrainStepSyncCuda, SmallCnnF16Autocast) {
  KILN_SKIP_WITHOUT_CUDA();
  auto net = make_mnist_cnn();
  expect_steady_launches(train_without_waiting(*net, {4, 1, 28, 28}, 10, DType::F16));
}

TEST(TrainStepSyncCuda, NarrowResNetF32) {
  KILN_SKIP_WITHOUT_CUDA();
  auto net = narrow_resnet();
  expect_steady_launches(train_without_waiting(*net, {2, 3, 32, 32}, 10, DType::F32));
}

TEST(TrainStepSyncCuda, NarrowResNetF16Autocast) {
  KILN_SKIP_WITHOUT_CUDA();
  auto net = narrow_resnet();
  expect_steady_launches(train_without_waiting(*net, {2, 3, 32, 32}, 10, DType::F16));
}

}  // namespace
}  // namespace kiln
