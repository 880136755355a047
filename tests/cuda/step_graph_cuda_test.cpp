// step_graph_cuda_test.cpp: a training step replayed from a CUDA graph (engine/step_graph.h)
// trains exactly as the same step run eagerly. Two copies of a model, built from one seed, train
// on the same sequence of batches: one calls the step directly every time, the other through a
// StepGraph (two eager warm-up steps, a capture, then replays). Every step's loss and every
// parameter at the end must be equal bit for bit: a replay runs the very kernels of the eager
// step, in the same order, on the same values, so any difference is a bug (a baked-in learning
// rate, a dropout mask drawn once, a skip decided at capture, a pointer that moved).
//
// Covered: the MNIST CNN (dropout: the device offset of engine/philox.h) and a narrow ResNet
// (BatchNorm's running statistics), with the hand kernels and the vendor ones (cuBLAS/cuDNN),
// f32, bf16 autocast, and fp16 with device-side loss scaling, where one batch overflows f16 on
// purpose during the replays: that step must be skipped on the device, as eagerly.
#include <cstddef>
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/autocast.h"
#include "engine/impl.h"
#include "engine/init.h"
#include "engine/ops.h"
#include "engine/optim/grad_scaler.h"
#include "engine/optim/sgd.h"
#include "engine/philox.h"
#include "engine/step_graph.h"
#include "engine/tensor.h"
#include "layers/loss.h"
#include "layers/module.h"
#include "models/mnist_cnn.h"
#include "models/resnet.h"
#include "support/cuda_skip.h"

namespace kiln {
namespace {

const Device kCuda(DeviceType::CUDA, 0);
constexpr int kSteps = 6;          // 2 eager warm-up steps, the capture (replayed once), 3 replays
constexpr int kOverflowStep = 4;   // fp16: this batch is scaled past f16's range

struct Case {
  std::function<std::shared_ptr<Module>()> make;
  Shape input;  // one batch
  int64_t classes;
  DType autocast = DType::F32;
  Impl kernels = Impl::Hand;
};

struct Trained {
  std::vector<float> losses;               // every step's
  std::vector<std::vector<float>> params;  // at the end
  int64_t skipped = 0;                     // fp16: steps the scaler skipped
  int64_t replays = 0;
};

// Trains a fresh model of `c` for kSteps, eagerly or through a StepGraph.
Trained train(const Case& c, bool graph) {
  KernelsGuard kernels(c.kernels);
  manual_seed(3);  // the same initial weights and dropout stream for both runs
  std::shared_ptr<Module> net = c.make();
  net->to(kCuda);
  net->train();
  SGD opt(net->parameters(), 0.05, 0.9);
  const bool fp16 = c.autocast == DType::F16;
  GradScaler scaler;
  if (fp16) scaler.keep_on_device(kCuda);
  // Static inputs: each step's batch is copied into them.
  Tensor x = Tensor::empty(c.input, DType::F32, kCuda);
  Tensor y = Tensor::empty({c.input[0]}, DType::I64, kCuda);
  Generator data(11);  // the batches' own stream, apart from dropout's

  const auto step = [&]() -> std::vector<Tensor> {
    opt.zero_grad();
    Tensor loss;
    {
      AutocastGuard mixed(c.autocast, c.autocast != DType::F32);
      loss = cross_entropy(net->forward(x), y);
    }
    if (fp16) {
      scaler.scale(loss).backward();
      scaler.unscale_on_device(net->parameters());
      opt.step(scaler.found_inf());
      scaler.update_on_device();
    } else {
      loss.backward();
      opt.step();
    }
    return {loss};
  };

  StepGraphOptions options;
  options.enabled = graph;
  options.warmup_steps = 2;
  StepGraph steps(kCuda, options);
  std::vector<Tensor> losses;
  for (int s = 0; s < kSteps; ++s) {
    Tensor batch = Tensor::empty(c.input);
    uniform_(batch, -1, 1, data);
    if (fp16 && s == kOverflowStep) batch = batch * 1e6;  // activations overflow f16: inf grads
    x.copy_(batch);
    std::vector<int64_t> labels;
    for (int64_t i = 0; i < c.input[0]; ++i) labels.push_back((i + s) % c.classes);
    y.copy_(Tensor::from_vector(labels, {c.input[0]}));
    opt.set_lr(0.05 / (s + 1));  // a schedule: the replay must read the new rate
    losses.push_back(steps.run(step)[0].clone());  // the graph's loss is overwritten next replay
  }
  Trained t;
  for (const Tensor& l : losses) t.losses.push_back(l.to(Device()).to_vector<float>()[0]);
  for (const Tensor& p : net->parameters()) t.params.push_back(p.to(Device()).to_vector<float>());
  if (fp16) t.skipped = scaler.skipped_steps();
  t.replays = steps.replays();
  return t;
}

void expect_graph_equals_eager(const Case& c) {
  const Trained eager = train(c, false);
  const Trained replayed = train(c, true);
  EXPECT_EQ(eager.replays, 0);
  EXPECT_EQ(replayed.replays, kSteps - 2);
  ASSERT_EQ(eager.losses.size(), replayed.losses.size());
  for (size_t s = 0; s < eager.losses.size(); ++s)
    EXPECT_EQ(eager.losses[s], replayed.losses[s]) << "loss of step " << s;
  ASSERT_EQ(eager.params.size(), replayed.params.size());
  for (size_t i = 0; i < eager.params.size(); ++i)
    ASSERT_EQ(eager.params[i], replayed.params[i]) << "parameter " << i;
  EXPECT_EQ(eager.skipped, replayed.skipped);
  if (c.autocast == DType::F16) {
    EXPECT_GE(replayed.skipped, 1) << "the overflow step was not skipped";
  }
}

std::shared_ptr<Module> narrow_resnet() {
  ResNetConfig config = resnet_config("resnet18", 10);
  config.layers = {1, 1, 1, 1};
  config.base_planes = 4;
  config.width_per_group = 16;
  return make_resnet(config);
}

Case mnist_cnn(DType autocast, Impl kernels) {
  return Case{[] { return std::shared_ptr<Module>(make_mnist_cnn()); }, {4, 1, 28, 28}, 10,
              autocast, kernels};
}

Case resnet(DType autocast, Impl kernels) {
  return Case{narrow_resnet, {2, 3, 32, 32}, 10, autocast, kernels};
}

TEST(StepGraphCuda, MnistCnnHandF32) {
  KILN_SKIP_WITHOUT_CUDA();
  expect_graph_equals_eager(mnist_cnn(DType::F32, Impl::Hand));
}

TEST(StepGraphCuda, MnistCnnVendorF32) {
  KILN_SKIP_WITHOUT_CUDA();
  expect_graph_equals_eager(mnist_cnn(DType::F32, Impl::Vendor));
}

TEST(StepGraphCuda, MnistCnnBF16Autocast) {
  KILN_SKIP_WITHOUT_CUDA();
  expect_graph_equals_eager(mnist_cnn(DType::BF16, Impl::Vendor));
}

TEST(StepGraphCuda, MnistCnnFP16SkipsTheOverflowStepOnTheDevice) {
  KILN_SKIP_WITHOUT_CUDA();
  expect_graph_equals_eager(mnist_cnn(DType::F16, Impl::Vendor));
}

TEST(StepGraphCuda, NarrowResNetHandF32) {
  KILN_SKIP_WITHOUT_CUDA();
  expect_graph_equals_eager(resnet(DType::F32, Impl::Hand));
}

TEST(StepGraphCuda, NarrowResNetVendorF32) {
  KILN_SKIP_WITHOUT_CUDA();
  expect_graph_equals_eager(resnet(DType::F32, Impl::Vendor));
}

TEST(StepGraphCuda, NarrowResNetFP16) {
  KILN_SKIP_WITHOUT_CUDA();
  expect_graph_equals_eager(resnet(DType::F16, Impl::Hand));
}

// A step that reads a value on the host cannot be captured: CUDA refuses the wait, and the
// capture fails with an error that says so, instead of a graph that replays a stale value.
TEST(StepGraphCuda, AHostReadInsideTheStepFailsTheCapture) {
  KILN_SKIP_WITHOUT_CUDA();
  Tensor x = Tensor::ones({16}, DType::F32, kCuda);
  StepGraphOptions options;
  options.warmup_steps = 0;
  StepGraph steps(kCuda, options);
  EXPECT_THROW(steps.run([&] {
    Tensor y = x * 2.0;
    (void)sum(y).item();  // a blocking device->host copy
    return std::vector<Tensor>{y};
  }),
               Error);
  EXPECT_FALSE(steps.captured());
}

}  // namespace
}  // namespace kiln
