// Pipelines over CUDA devices: every schedule trains like one CPU device, with the stages'
// activations and gradients crossing devices on copy streams ordered by events.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/optim/sgd.h"
#include "layers/loss.h"
#include "models/pipeline/pipeline.h"
#include "support/cuda_skip.h"
#include "../models/pipeline_test_util.h"

namespace kiln {
namespace {

// Three SGD steps of the MLP blocks on cuda devices, against the same on the CPU, whole batch.
void expect_matches_cpu(const std::vector<Device>& devices, Schedule schedule, int64_t split,
                        bool recompute) {
  const int64_t batch = 12;
  Tensor x = test::random_tensor({batch, 6}, 1), y = test::random_tensor({batch, 3}, 2);
  test::MlpBlocks reference(11), model(11);
  SGD ref_opt(reference.parameters(), 0.1, 0.9);
  PipelineOptions options;
  options.schedule = schedule;
  options.split_size = split;
  options.recompute = recompute;
  const int stages = static_cast<int>(devices.size());
  Pipeline pipe(model.blocks(), balance(std::vector<double>(5, 1.0), stages), devices,
                [](const Tensor& out, const Tensor& t) { return mse_loss(out, t); },
                [](std::vector<Tensor> p) { return std::make_unique<SGD>(p, 0.1, 0.9); },
                options);
  for (int step = 0; step < 3; ++step) {
    ref_opt.zero_grad();
    Tensor loss = mse_loss(reference.forward(x), y);
    loss.backward();
    ref_opt.step();
    EXPECT_NEAR(pipe.train_step(x, y, step), loss.item(), 1e-5) << "step " << step;
  }
  test::expect_same_parameters(model, reference, 1e-5);
}

TEST(PipelineCuda, TwoDevicesEveryScheduleMatchesTheCpu) {
  KILN_SKIP_WITHOUT_CUDA_DEVICES(2);
  const std::vector<Device> devices = {Device("cuda:0"), Device("cuda:1")};
  expect_matches_cpu(devices, Schedule::Naive, 0, false);
  expect_matches_cpu(devices, Schedule::GPipe, 3, false);
  expect_matches_cpu(devices, Schedule::OneFOneB, 2, false);
  expect_matches_cpu(devices, Schedule::GPipe, 4, true);
}

// Two stages on one GPU: each stage thread has its own stream there, so the events still
// order every hand-over (the only form a one-GPU machine can run).
TEST(PipelineCuda, TwoStagesOnOneDeviceMatchTheCpu) {
  KILN_SKIP_WITHOUT_CUDA();
  expect_matches_cpu({Device("cuda:0"), Device("cuda:0")}, Schedule::OneFOneB, 2, false);
}

// A pipeline from the CPU to a GPU and back: a mix of device kinds.
TEST(PipelineCuda, CpuAndGpuStagesMatchTheCpu) {
  KILN_SKIP_WITHOUT_CUDA();
  expect_matches_cpu({Device("cpu:0"), Device("cuda:0"), Device("cpu:1")}, Schedule::GPipe, 4,
                     false);
}

}  // namespace
}  // namespace kiln
