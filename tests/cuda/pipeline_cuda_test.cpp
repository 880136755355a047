// Pipelines over CUDA devices: every schedule trains like one CPU device, with the stages'
// activations and gradients crossing devices on copy streams ordered by events.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/optim/sgd.h"
#include "layers/loss.h"
#include "engine/cuda/context.h"
#include "models/pipeline/pipeline.h"
#include "support/cuda_skip.h"
#include "support/precision_gap.h"
#include "../models/pipeline_test_util.h"

namespace kiln {
namespace {

// Tolerances from the reference's own f32-vs-f64 gap on the CPU (support/precision_gap.h): a
// reference whose f32 results are further than 1e-3 of a tensor's largest value from its f64
// ones fails as ill-conditioned; the pipeline's f32 results may be 10x that gap plus 1e-6 of
// the tensor's largest value away from the f32 reference's. Measured under the simulator: the
// largest error is 1.5x the gap (the gaps are below 1e-7 of the values).
constexpr testing::GapRule kPipelineRule{1e-3, 10, 1e-6};

// The reference: three SGD steps of the MLP blocks on the CPU in `dtype`, whole batch.
// Results: "loss <step>" for each step, then "parameter <i>" after the last.
NamedTensors train_reference(DType dtype, const Tensor& x, const Tensor& y) {
  test::MlpBlocks reference(11);
  for (Tensor& p : reference.parameters()) p.set_data(p.to(dtype));
  SGD opt(reference.parameters(), 0.1, 0.9);
  NamedTensors out;
  for (int step = 0; step < 3; ++step) {
    opt.zero_grad();
    Tensor loss = mse_loss(reference.forward(x.to(dtype)), y.to(dtype));
    loss.backward();
    opt.step();
    out.push_back({"loss " + std::to_string(step), loss.detach()});
  }
  const std::vector<Tensor> params = reference.parameters();
  for (size_t i = 0; i < params.size(); ++i)
    out.push_back({"parameter " + std::to_string(i), params[i].detach().clone()});
  return out;
}

// Three SGD steps of the MLP blocks on cuda devices, against the same on the CPU, whole batch.
// chunks > 1: the interleaved schedule, the 5 blocks cut into devices x chunks pieces.
void expect_matches_cpu(const std::vector<Device>& devices, Schedule schedule, int64_t split,
                        bool recompute, int chunks = 1) {
  const int64_t batch = 12;
  Tensor x = test::random_tensor({batch, 6}, 1), y = test::random_tensor({batch, 3}, 2);
  const NamedTensors want = train_reference(DType::F32, x, y);
  const std::vector<testing::PrecisionGap> gaps =
      testing::precision_gaps(want, train_reference(DType::F64, x, y));
  ASSERT_TRUE(testing::well_conditioned(gaps, kPipelineRule.max_gap));
  test::MlpBlocks model(11);
  PipelineOptions options;
  options.schedule = schedule;
  options.split_size = split;
  options.recompute = recompute;
  options.chunks = chunks;
  const int stages = static_cast<int>(devices.size());
  Pipeline pipe(model.blocks(), balance(std::vector<double>(5, 1.0), stages * chunks), devices,
                [](const Tensor& out, const Tensor& t) { return mse_loss(out, t); },
                [](std::vector<Tensor> p) { return std::make_unique<SGD>(p, 0.1, 0.9); },
                options);
  for (int step = 0; step < 3; ++step) {
    const Tensor loss = Tensor::from_vector<double>({pipe.train_step(x, y, step)}, {1});
    EXPECT_TRUE(testing::near_within_gap("pipeline " + gaps[step].name, loss,
                                         want[step].second.reshape({1}),
                                         gaps[step], kPipelineRule));
  }
  const std::vector<Tensor> params = model.parameters();
  ASSERT_EQ(want.size(), 3 + params.size());
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_TRUE(testing::near_within_gap(gaps[3 + i].name, params[i], want[3 + i].second,
                                         gaps[3 + i], kPipelineRule));
}

TEST(PipelineCuda, TwoDevicesEveryScheduleMatchesTheCpu) {
  KILN_SKIP_WITHOUT_CUDA_DEVICES(2);
  const std::vector<Device> devices = {Device("cuda:0"), Device("cuda:1")};
  expect_matches_cpu(devices, Schedule::Naive, 0, false);
  expect_matches_cpu(devices, Schedule::GPipe, 3, false);
  expect_matches_cpu(devices, Schedule::OneFOneB, 2, false);
  expect_matches_cpu(devices, Schedule::GPipe, 4, true);
}

// The backward split into B and W (zero-bubble), and two chunks per device (interleaved: the
// activations go cuda:0 -> cuda:1 -> cuda:0 -> cuda:1 and the gradients back).
TEST(PipelineCuda, TwoDevicesSplitBackwardAndInterleavedMatchTheCpu) {
  KILN_SKIP_WITHOUT_CUDA_DEVICES(2);
  const std::vector<Device> devices = {Device("cuda:0"), Device("cuda:1")};
  expect_matches_cpu(devices, Schedule::ZeroBubbleH1, 2, false);
  expect_matches_cpu(devices, Schedule::ZeroBubbleH1, 3, true);
  expect_matches_cpu(devices, Schedule::Interleaved, 3, false, /*chunks=*/2);
}

// Two stages on one GPU: each stage thread has its own stream there, so the events still
// order every hand-over (the only form a one-GPU machine can run).
TEST(PipelineCuda, TwoStagesOnOneDeviceMatchTheCpu) {
  KILN_SKIP_WITHOUT_CUDA();
  expect_matches_cpu({Device("cuda:0"), Device("cuda:0")}, Schedule::OneFOneB, 2, false);
  expect_matches_cpu({Device("cuda:0"), Device("cuda:0")}, Schedule::ZeroBubbleH1, 2, false);
}

// A pipeline from the CPU to a GPU and back: a mix of device kinds.
TEST(PipelineCuda, CpuAndGpuStagesMatchTheCpu) {
  KILN_SKIP_WITHOUT_CUDA();
  expect_matches_cpu({Device("cpu:0"), Device("cuda:0"), Device("cpu:1")}, Schedule::GPipe, 4,
                     false);
}

// Two zero-bubble steps submitted at once overlap (stage 0 starts the second while stage 1
// drains the first): every stage runs the operations of two train_step calls in the same order,
// so the losses and weights equal those of a pipeline stepped one step at a time. The streams
// and events order the hand-overs of both steps; a GPU's kernels may still differ in the last
// bits from run to run (atomics), hence a tolerance of 1e-6 of the values.
TEST(PipelineCuda, TwoSubmittedZeroBubbleStepsEqualTwoTrainSteps) {
  KILN_SKIP_WITHOUT_CUDA();
  const std::vector<Device> devices =
      cuda::device_count() >= 2 ? std::vector<Device>{Device("cuda:0"), Device("cuda:1")}
                                : std::vector<Device>{Device("cuda:0"), Device("cuda:0")};
  Tensor x0 = test::random_tensor({12, 6}, 1), y0 = test::random_tensor({12, 3}, 2);
  Tensor x1 = test::random_tensor({12, 6}, 3), y1 = test::random_tensor({12, 3}, 4);
  PipelineOptions options;
  options.schedule = Schedule::ZeroBubbleH2;
  options.split_size = 2;
  auto make = [&](test::MlpBlocks& model) {
    return std::make_unique<Pipeline>(
        model.blocks(), balance(std::vector<double>(5, 1.0), 2), devices,
        [](const Tensor& out, const Tensor& t) { return mse_loss(out, t); },
        [](std::vector<Tensor> p) { return std::make_unique<SGD>(p, 0.1, 0.9); }, options);
  };
  test::MlpBlocks stepped(11), overlapped(11);
  std::vector<double> want;
  {
    auto pipe = make(stepped);
    want.push_back(pipe->train_step(x0, y0, 0));
    want.push_back(pipe->train_step(x1, y1, 1));
  }
  auto pipe = make(overlapped);
  pipe->submit_step(x0, y0, 0);
  pipe->submit_step(x1, y1, 1);
  for (int step = 0; step < 2; ++step) {
    EXPECT_NEAR(pipe->wait_step(), want[step], 1e-6 * std::fabs(want[step])) << "step " << step;
  }
  const std::vector<Tensor> got = overlapped.parameters(), ref = stepped.parameters();
  ASSERT_EQ(got.size(), ref.size());
  for (size_t i = 0; i < got.size(); ++i) {
    double largest = 0;
    for (float v : ref[i].to(Device("cpu")).to_vector<float>()) {
      largest = std::max(largest, static_cast<double>(std::fabs(v)));
    }
    EXPECT_LE(test::max_abs_diff(got[i], ref[i]), 1e-6 * largest) << "parameter " << i;
  }
}

}  // namespace
}  // namespace kiln
