// resnet_cuda_test.cpp: whole ResNets (models/resnet.h) on cuda:0 against the same model on
// the CPU, from identical weights:
//   - ResNet-18 (10 classes) at 32x32, batch 2, in double and in float: the training forward
//     (logits, loss), backward (the gradient of every parameter) and the running statistics
//     of every BatchNorm;
//   - narrow nets with the depth of ResNet-50, -101 and -152 (Bottleneck blocks with the
//     standard stage lengths, base_planes 4, width_per_group 32: 3x3 convolutions of 2 to 16
//     channels, stage outputs of 16 to 128), in double, 32x32, batch 2: a training forward and
//     backward, one SGD step, then an eval forward: logits, loss, every gradient, the running
//     statistics, every parameter after the step, the eval logits.
// Under the simulator the convolutions run the hand implicit GEMM (and the simulated cuDNN in
// the resnet_cuda_test_vendor run, KILN_KERNELS=vendor); on a GPU, cuDNN (FP32
// without TF32). 32x32 is the smallest input a ResNet accepts (five halvings); the widths keep
// each simulated test within a few seconds on two cores.
//
// Conditioning. At 32x32 the last stage works on 1x1 images, so with batch 2 its BatchNorms
// normalise two values per channel, v1 and v2: x_hat = +-d / sqrt(d^2 + eps), d = (v1 - v2)/2.
// Where d is near sqrt(eps) ~ 3e-3 that amplifies an error in d ~300 times, and the input
// gradient, (g1 - g2)/2 * eps / (d^2 + eps) * invstd, is a small difference of large terms.
// Rounding differences between two summation orders therefore grow far beyond a dtype's
// epsilon here. Measured (simulator vs CPU, relative to each tensor's largest value; the worst
// over the CPU's kernel choices, oneDNN with the channel-blocked layout or KILN_KERNELS=hand,
// and over CPU BatchNorm kernels that do and do not fuse their multiply-adds):
//   double, ResNet-18: logits 2.2e-12, loss 2.8e-13, running stats 5.5e-13, gradients 4e-11;
//   double, narrow 50/101/152: logits and loss <= 9e-12, running stats <= 7e-11, gradients
//     <= 4.6e-9, parameters after the step <= 3.1e-9, eval logits <= 2.6e-10;
//   float, ResNet-18: logits 3.9e-3, loss 5e-4, running stats 1e-3, gradients 6.6e-2. The
//     CPU's own float gradients differ from its double ones by up to 1.2e-2: float carries
//     only one or two digits of these gradients.
// The bounds (parity/parity_harness.h's near: |error| <= rtol * (|want| + max|want|)) leave a margin of
// 3x to 50x over those for a GPU's different summation orders (cuDNN picks its own). The double
// run is the sharp check; the float one checks the float kernels end to end, where a wrong
// kernel (a lost mask, a wrong channel or stride) gives errors of the size of the values.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
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

// ResNet-18 (10 classes), 32x32, batch 2: a training forward and backward.
void check_resnet18(DType dtype, const Tolerances& tol) {
  SCOPED_TRACE(dtype_name(dtype));
  Twins m = make_twins(resnet_config("resnet18", 10), dtype, 18);
  const Tensor x = batch_of_images(2, 180, dtype);
  const Tensor targets = Tensor::from_vector<int64_t>({3, 7}, {2});
  const Step cpu = forward_backward(*m.cpu, x, targets);
  const Step gpu = forward_backward(*m.gpu, x.to(kCuda), targets.to(kCuda));
  ASSERT_TRUE(gpu.logits.device() == kCuda);
  EXPECT_TRUE(near("logits", gpu.logits, cpu.logits, tol.forward));
  EXPECT_TRUE(near("loss", gpu.loss, cpu.loss, tol.forward));
  // Every parameter's gradient (62 tensors), and the running statistics of all 20 BatchNorms.
  expect_all_near("grad", m.gpu->named_parameters(), m.cpu->named_parameters(), tol.grad, true);
  expect_all_near("buffer", m.gpu->named_buffers(), m.cpu->named_buffers(), tol.forward, false);
  for (const auto& [name, t] : m.gpu->named_buffers())
    if (!is_floating(t.dtype())) {
      EXPECT_EQ(t.to(kCpu).item(), 1) << name;
    }
}

// A training forward and backward, one SGD step (lr 1e-5, momentum 0.9, weight decay 1e-4),
// then an eval forward of the same batch, for a narrow Bottleneck net of the depth of `name`
// ("resnet50", ...). The gradients of these deep, freshly initialised nets reach ~1e3 (the
// two-value BatchNorms above), so the learning rate is small: with lr 1e-3 one step moves
// some weights far beyond their scale, and the eval forward, which normalises with running
// statistics measured before the step, then grows block after block (to ~1e22 in the logits)
// and compares nothing. At 1e-5 the step still changes the BN biases (zero at initialisation)
// and the weights with the largest gradients far beyond the tolerance, and the eval logits
// stay O(1).
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

// Tolerances: see the header comment (the float step and eval fields are unused).
constexpr Tolerances kDouble{1e-9, 1e-7, 1e-7, 1e-8};
constexpr Tolerances kFloat{2e-2, 2e-1, 2e-1, 2e-2};

TEST(ResNetCuda, ResNet18ForwardBackwardMatchesCpuDouble) {
  KILN_SKIP_WITHOUT_CUDA();
  check_resnet18(DType::F64, kDouble);
}

TEST(ResNetCuda, ResNet18ForwardBackwardMatchesCpuFloat) {
  KILN_SKIP_WITHOUT_CUDA();
  check_resnet18(DType::F32, kFloat);
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
