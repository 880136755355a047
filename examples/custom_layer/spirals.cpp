// spirals.cpp: the spiral data, the Swish MLP and its training loop (spirals.h).
#include "spirals.h"

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "engine/optim/adam.h"
#include "engine/philox.h"
#include "layers/linear.h"
#include "layers/loss.h"
#include "swish.h"

namespace swish_example {

using kiln::Tensor;

Spirals make_spirals(int64_t n_per_class, uint64_t seed, kiln::Device device) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> noise(0.0f, 0.2f);
  std::vector<float> xs;
  std::vector<int64_t> ys;
  for (int64_t c = 0; c < 3; ++c) {
    for (int64_t i = 0; i < n_per_class; ++i) {
      const float r = static_cast<float>(i) / static_cast<float>(n_per_class);  // radius in [0, 1)
      const float t = 4.0f * r + 2.0944f * static_cast<float>(c) + noise(rng);   // arm c: +120 deg
      xs.push_back(r * std::sin(t));
      xs.push_back(r * std::cos(t));
      ys.push_back(c);
    }
  }
  const int64_t n = 3 * n_per_class;
  return {Tensor::from_vector(xs, {n, 2}, device), Tensor::from_vector(ys, {n}, device)};
}

std::shared_ptr<kiln::Sequential> make_swish_mlp(int64_t hidden) {
  auto model = std::make_shared<kiln::Sequential>();
  model->push_back(std::make_shared<kiln::Linear>(2, hidden));
  model->push_back(std::make_shared<Swish>());
  model->push_back(std::make_shared<kiln::Linear>(hidden, hidden));
  model->push_back(std::make_shared<Swish>());
  model->push_back(std::make_shared<kiln::Linear>(hidden, 3));
  return model;
}

namespace {

double accuracy_of(kiln::Module& model, const Spirals& data) {
  kiln::NoGradGuard no_grad;
  const Tensor predicted = kiln::argmax(model.forward(data.inputs), 1).to(kiln::Device());
  const Tensor labels = data.labels.to(kiln::Device());
  int64_t correct = 0;
  for (int64_t i = 0; i < labels.numel(); ++i)
    correct += predicted.data<int64_t>()[i] == labels.data<int64_t>()[i];
  return static_cast<double>(correct) / static_cast<double>(labels.numel());
}

double beta_of(kiln::Sequential& model, size_t index) {
  return std::static_pointer_cast<Swish>(model.at(index))->beta().detach().to(kiln::Device()).item();
}

}  // namespace

TrainResult train_spirals(kiln::Device device, int steps, int print_every) {
  kiln::manual_seed(1);  // the Linear layers' initial weights
  const Spirals train = make_spirals(200, /*seed=*/1, device);
  const Spirals test = make_spirals(100, /*seed=*/2, device);
  std::shared_ptr<kiln::Sequential> model = make_swish_mlp(32);
  model->to(device);
  kiln::Adam optimizer(model->parameters(), /*lr=*/0.02);

  TrainResult result;
  model->train();
  for (int step = 0; step < steps; ++step) {
    optimizer.zero_grad();
    Tensor loss = kiln::cross_entropy(model->forward(train.inputs), train.labels);
    loss.backward();  // through SwishBackward: gradients for x and for each beta
    optimizer.step();
    const double value = loss.item();
    if (step == 0) result.first_loss = value;
    result.final_loss = value;
    if (print_every > 0 && (step % print_every == 0 || step == steps - 1))
      std::printf("step %4d  loss %.4f\n", step, value);
  }
  model->eval();
  result.accuracy = accuracy_of(*model, test);
  result.beta1 = beta_of(*model, 1);
  result.beta2 = beta_of(*model, 3);
  return result;
}

}  // namespace swish_example
