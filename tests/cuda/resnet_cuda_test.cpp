// resnet_cuda_test.cpp: whole ResNets (models/resnet.h) on cuda:0 against the same model on
// the CPU, from identical weights:
//   - ResNet-18 (10 classes) at 64x64, batch 4 (tests/models/resnet_parity_case.h), in double
//     and in float: the training forward (logits, loss), backward (the gradient of every
//     parameter) and the running statistics of every BatchNorm;
//   - narrow nets with the depth of ResNet-50, -101 and -152 (Bottleneck blocks with the
//     standard stage lengths, base_planes 4, width_per_group 32: 3x3 convolutions of 2 to 16
//     channels, stage outputs of 16 to 128), in double, 32x32, batch 2: a training forward and
//     backward, one SGD step, then an eval forward: logits, loss, every gradient, the running
//     statistics, every parameter after the step, the eval logits.
// The convolutions run the hand implicit GEMM with KILN_KERNELS=hand (the simulator's test runs,
// tools/gpu_check.sh's first) and cuDNN with vendor (the resnet_cuda_test_vendor run, the
// simulated cuDNN under the simulator; on a GPU FP32 without TF32). The sizes keep each
// simulated test within a minute on two cores.
//
// Conditioning (docs/resnet.md). A comparison of two devices is only as tight as the dtype
// carries the case, so the ResNet-18 tests measure that first: they run the case on the CPU in
// f64 and in f32 and take, per tensor, the gap max |f32 - f64| (tests/support/precision_gap.h).
// A gap above 1e-3 of the tensor's largest value fails as "the case is ill-conditioned".
// Otherwise cuda:0's f32 results may be 10x the gap plus 1e-4 of the tensor's largest value
// away from the CPU's, and its f64 results 10x the gap scaled to double (2^-29) plus 1e-10 of
// the largest value. Measured under the simulator: float errors up to 3.2x the gap (2e-5 of a
// tensor's largest value), double errors up to 2e-14 of it.
// The case was 32x32, batch 2 before: layer4 is 1x1 there, its BatchNorms normalise two values
// per channel, and their backward is a difference of two terms equal but for a factor
// eps / (d^2 + eps), d half the two values' difference. The CPU's own f32 gradients were up to
// 8% of a tensor's largest value from its f64 ones, and a GPU (cuDNN) run failed the float
// test with the values f64 gives when one channel's d, where the two values agree to three
// digits, has the other sign (which swaps the two images' ReLU masks there; not a kernel
// bug, a case whose answer rounding decides). At 64x64, batch 4 every BatchNorm
// normalises at least 16 values per channel and the gap is ~1e-5
// (tests/models/resnet_conditioning_test.cpp measures both).
// The narrow nets compare in double only, with fixed bounds (parity/parity_harness.h's near:
// |error| <= rtol * (|want| + max|want|)): float carries no digit of their gradients (the gap
// is 0.2 to 160 times a tensor's largest value at 32x32, batch 2, and still 0.3 for the 101
// and 152 depths at 64x64, batch 4), so no gap sets their bounds. Double carries them:
// measured under the simulator, gradients <= 4.6e-9 relative to each tensor's largest value,
// parameters after the step <= 3.1e-9, eval logits <= 2.6e-10.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "engine/autograd.h"
#include "engine/optim/sgd.h"
#include "engine/philox.h"
#include "layers/loss.h"
#include "models/resnet.h"
#include "support/cuda_skip.h"
#include "support/gradcheck.h"
#include "parity/parity_harness.h"
#include "support/precision_gap.h"
#include "../models/resnet_parity_case.h"

namespace kiln {
namespace {

using testing::kCpu;
using testing::kCuda;
using testing::near;
using testing::random_tensor;

struct Tolerances {
  double forward;  // logits, loss, running statistics
  double grad;     // parameter gradients
  double param;    // parameters after one SGD step
  double eval;     // eval logits after the step
};

// Converts every parameter and floating buffer of m to `dtype` in place (models are built in
// f32); the handles (module members, named_parameters()) stay the same tensors.
void convert(Module& m, DType dtype) {
  for (auto& [name, t] : m.named_parameters()) t.set_data(t.to(dtype));
  for (auto& [name, t] : m.named_buffers())
    if (is_floating(t.dtype())) t.set_data(t.to(dtype));
}

// The same model twice, from one initialisation: one on the CPU, one on cuda:0.
struct Twins {
  std::shared_ptr<ResNet> cpu, gpu;
};

Twins make_twins(const ResNetConfig& config, DType dtype, uint64_t seed) {
  manual_seed(seed);
  Twins t{make_resnet(config), make_resnet(config)};
  t.gpu->load_state_dict(t.cpu->state_dict());
  convert(*t.cpu, dtype);
  convert(*t.gpu, dtype);
  t.gpu->to(kCuda);
  return t;
}

struct Step {
  Tensor logits, loss;
};

// A training forward and backward: cross-entropy of the logits against `targets`.
Step forward_backward(ResNet& model, const Tensor& x, const Tensor& targets) {
  model.train();
  model.zero_grad();
  Step s;
  s.logits = model.forward(x);
  s.loss = cross_entropy(s.logits, targets);
  s.loss.backward();
  return s;
}

// Every named tensor (or its gradient) of `got` (on cuda:0) near its twin in `want` (the CPU).
void expect_all_near(const std::string& what, const NamedTensors& got, const NamedTensors& want,
                     double rtol, bool grads) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got[i].first, want[i].first) << what;
    if (!is_floating(want[i].second.dtype())) continue;  // num_batches_tracked: checked apart
    const Tensor g = grads ? got[i].second.grad() : got[i].second;
    const Tensor w = grads ? want[i].second.grad() : want[i].second;
    ASSERT_TRUE(g.defined() && w.defined()) << what << " " << want[i].first << ": no gradient";
    ASSERT_TRUE(g.device() == kCuda) << what << " " << want[i].first;
    EXPECT_TRUE(near(what + " " + want[i].first, g, w, rtol));
  }
}

Tensor batch_of_images(int64_t n, uint32_t seed, DType dtype) {
  return random_tensor({n, 3, 32, 32}, seed, -2.0, 2.0, dtype);
}

// Prints the largest cuda:0-vs-CPU error relative to its tensor's largest |value| and as a
// multiple of its tensor's f32-vs-f64 gap (scaled by `unit`): the figures the tolerances are
// set against.
void report_worst(const NamedTensors& gpu, const NamedTensors& cpu,
                  const std::vector<testing::PrecisionGap>& gaps, double unit) {
  double worst_relative = 0, worst_in_gaps = 0;
  std::string relative_at, gaps_at;
  for (size_t i = 0; i < cpu.size(); ++i) {
    const auto& [name, want] = cpu[i];
    if (!is_floating(want.dtype())) continue;
    const testing::PrecisionGap e = testing::precision_gap(name, gpu[i].second, want);
    if (e.relative() > worst_relative) worst_relative = e.relative(), relative_at = name;
    const testing::PrecisionGap* g = testing::find_gap(gaps, name);
    if (g && g->gap > 0 && e.gap / (unit * g->gap) > worst_in_gaps)
      worst_in_gaps = e.gap / (unit * g->gap), gaps_at = name;
  }
  std::printf("cuda:0 vs cpu:0: largest error relative to the tensor's largest |value| %.3g (%s); "
              "largest error / gap %.3g (%s)\n",
              worst_relative, relative_at.c_str(), worst_in_gaps, gaps_at.c_str());
}

// The ResNet-18 case (test::kResNet18Case) in `dtype` on cuda:0 against the CPU, with
// tolerances from the case's own f32-vs-f64 gap on the CPU (see the header): first that gap,
// and a clear failure where float cannot carry the case. Results: the logits, the loss, every
// parameter's gradient (62 tensors), the running statistics of all 20 BatchNorms.
void check_resnet18(DType dtype, const testing::GapRule& rule) {
  SCOPED_TRACE(dtype_name(dtype));
  const test::ResNetCase& c = test::kResNet18Case;
  const NamedTensors f64 = test::run_case(*test::make_case_model(c, DType::F64, kCpu), c);
  const NamedTensors f32 = test::run_case(*test::make_case_model(c, DType::F32, kCpu), c);
  const std::vector<testing::PrecisionGap> gaps = testing::precision_gaps(f32, f64);
  ASSERT_TRUE(testing::well_conditioned(gaps, rule.max_gap)) << c.str();
  const NamedTensors& cpu = dtype == DType::F64 ? f64 : f32;
  const NamedTensors gpu = test::run_case(*test::make_case_model(c, dtype, kCuda), c);
  ASSERT_EQ(gpu.size(), cpu.size());
  ASSERT_TRUE(gpu.at(0).second.device() == kCuda);
  for (size_t i = 0; i < cpu.size(); ++i) {
    const auto& [name, want] = cpu[i];
    ASSERT_EQ(gpu[i].first, name);
    if (!is_floating(want.dtype())) {  // num_batches_tracked: one training step
      EXPECT_EQ(gpu[i].second.to(kCpu).item(), 1) << name;
      continue;
    }
    const testing::PrecisionGap* gap = testing::find_gap(gaps, name);
    ASSERT_NE(gap, nullptr) << name;
    EXPECT_TRUE(testing::near_within_gap(name, gpu[i].second, want, *gap, rule));
  }
  report_worst(gpu, cpu, gaps, rule.unit);
}

// A training forward and backward, one SGD step (lr 1e-5, momentum 0.9, weight decay 1e-4),
// then an eval forward of the same batch, for a narrow Bottleneck net of the depth of `name`
// ("resnet50", ...). The gradients of these deep, freshly initialised nets reach ~1e3 (at
// 32x32 and batch 2 their last stage's BatchNorms normalise two values per channel), so the
// learning rate is small: with lr 1e-3 one step moves some weights far beyond their scale,
// and the eval forward, which normalises with running statistics measured before the step,
// then grows block after block (to ~1e22 in the logits) and compares nothing. At 1e-5 the
// step still changes the BN biases (zero at initialisation) and the weights with the largest
// gradients far beyond the tolerance, and the eval logits stay O(1).
void check_train_step_then_eval(const std::string& name, DType dtype, const Tolerances& tol,
                                uint64_t seed) {
  SCOPED_TRACE(name + " " + dtype_name(dtype));
  ResNetConfig config = resnet_config(name, 10);
  config.base_planes = 4;
  config.width_per_group = 32;
  Twins m = make_twins(config, dtype, seed);
  SGD opt_cpu(m.cpu->parameters(), 1e-5, 0.9, 0, 1e-4);
  SGD opt_gpu(m.gpu->parameters(), 1e-5, 0.9, 0, 1e-4);
  const Tensor x = batch_of_images(2, static_cast<uint32_t>(seed) + 1, dtype);
  const Tensor targets = Tensor::from_vector<int64_t>({1, 8}, {2});

  const Step cpu = forward_backward(*m.cpu, x, targets);
  const Step gpu = forward_backward(*m.gpu, x.to(kCuda), targets.to(kCuda));
  EXPECT_TRUE(near("train logits", gpu.logits, cpu.logits, tol.forward));
  EXPECT_TRUE(near("loss", gpu.loss, cpu.loss, tol.forward));
  expect_all_near("grad", m.gpu->named_parameters(), m.cpu->named_parameters(), tol.grad, true);
  expect_all_near("buffer", m.gpu->named_buffers(), m.cpu->named_buffers(), tol.forward, false);

  opt_cpu.step();
  opt_gpu.step();
  expect_all_near("after step", m.gpu->named_parameters(), m.cpu->named_parameters(), tol.param,
                  false);

  m.cpu->eval();
  m.gpu->eval();
  NoGradGuard no_grad;
  const Tensor eval_cpu = m.cpu->forward(x);
  const Tensor eval_gpu = m.gpu->forward(x.to(kCuda));
  EXPECT_TRUE(near("eval logits", eval_gpu, eval_cpu, tol.eval));
}

// Tolerances of the narrow nets' double comparisons: see the header comment.
constexpr Tolerances kDouble{1e-9, 1e-7, 1e-7, 1e-8};

TEST(ResNetCuda, ResNet18ForwardBackwardMatchesCpuDouble) {
  KILN_SKIP_WITHOUT_CUDA();
  check_resnet18(DType::F64, test::kResNetDoubleRule);
}

TEST(ResNetCuda, ResNet18ForwardBackwardMatchesCpuFloat) {
  KILN_SKIP_WITHOUT_CUDA();
  check_resnet18(DType::F32, test::kResNetFloatRule);
}

TEST(ResNetCuda, NarrowResNet50TrainStepThenEvalMatchesCpu) {
  KILN_SKIP_WITHOUT_CUDA();
  check_train_step_then_eval("resnet50", DType::F64, kDouble, 50);
}

TEST(ResNetCuda, NarrowResNet101TrainStepThenEvalMatchesCpu) {
  KILN_SKIP_WITHOUT_CUDA();
  check_train_step_then_eval("resnet101", DType::F64, kDouble, 101);
}

TEST(ResNetCuda, NarrowResNet152TrainStepThenEvalMatchesCpu) {
  KILN_SKIP_WITHOUT_CUDA();
  check_train_step_then_eval("resnet152", DType::F64, kDouble, 152);
}

}  // namespace
}  // namespace kiln
