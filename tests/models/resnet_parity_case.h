// resnet_parity_case.h: one ResNet training forward and backward from a fixed initialisation
// and batch, runnable on any device in f32 or f64, with its results as named tensors. It is the
// case tests/cuda/resnet_cuda_test.cpp compares between cuda:0 and the CPU, and the case
// tests/models/resnet_conditioning_test.cpp measures in f32 against f64 on the CPU.
//
// Every dtype gets the same numbers: the model is built in f32 from `model_seed` and then
// converted, and the images are drawn, rounded to f32, then converted. So f64 computes exactly
// the function f32 approximates, and their difference is float's rounding alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/autograd.h"
#include "engine/philox.h"
#include "layers/loss.h"
#include "models/resnet.h"
#include "support/gradcheck.h"
#include "support/precision_gap.h"

namespace kiln::test {

struct ResNetCase {
  std::string model = "resnet18";
  int64_t num_classes = 10;
  int64_t base_planes = 64;       // ResNetConfig's; 64 is the standard net
  int64_t width_per_group = 64;
  int64_t batch = 4;
  int64_t size = 64;              // images are size x size
  uint64_t model_seed = 18;
  uint32_t input_seed = 180;

  ResNetConfig config() const {
    ResNetConfig c = resnet_config(model, num_classes);
    c.base_planes = base_planes;
    c.width_per_group = width_per_group;
    return c;
  }
  // The values each BatchNorm of the last stage normalises per channel: batch * (size/32)^2,
  // the spatial size rounded up as the stride-2 layers round it.
  int64_t last_stage_values() const {
    int64_t s = size;
    for (int i = 0; i < 5; ++i) s = (s + 1) / 2;
    return batch * s * s;
  }
  std::string str() const {
    return model + " " + std::to_string(size) + "x" + std::to_string(size) + " batch " +
           std::to_string(batch);
  }
};

// The ResNet-18 case of the CUDA test: 64x64, batch 4, so every BatchNorm normalises at least
// 16 values per channel (layer4 is 2x2). At 32x32 and batch 2 layer4's BatchNorms normalise two
// values per channel and the case is ill-conditioned in float (docs/resnet.md, conditioning;
// resnet_conditioning_test.cpp measures both).
inline const ResNetCase kResNet18Case{};

// The float comparisons of the ResNet cases (support/precision_gap.h): a case whose f32
// results on the CPU are further than 1e-3 of a tensor's largest value from its f64 ones is
// ill-conditioned; CUDA's f32 results may be 10x the CPU's gap plus 1e-4 of the tensor's
// largest value away from the CPU's f32 results.
inline constexpr testing::GapRule kResNetFloatRule{1e-3, 10, 1e-4};
// The double comparison of the same case: 10x the float gap scaled to double, plus 1e-10 of
// the tensor's largest value.
inline constexpr testing::GapRule kResNetDoubleRule{1e-3, 10, 1e-10, 0x1p-29};

// A net of the narrow configuration of the CUDA test's double-only cases: the depth of `model`
// ("resnet50", "resnet101", "resnet152"), base_planes 4 and width_per_group 32 (3x3
// convolutions of 2 to 16 channels, stage outputs of 16 to 128), at the default batch and
// size (resnet_conditioning_test.cpp's table measures it at others).
inline ResNetCase narrow_case(const std::string& model, uint64_t seed) {
  ResNetCase c;
  c.model = model;
  c.base_planes = 4;
  c.width_per_group = 32;
  c.model_seed = seed;
  c.input_seed = static_cast<uint32_t>(seed) + 1;
  return c;
}

// Converts every parameter and floating buffer of m to `dtype` in place; the handles (module
// members, named_parameters()) stay the same tensors.
inline void convert_module(Module& m, DType dtype) {
  for (auto& [name, t] : m.named_parameters()) t.set_data(t.to(dtype));
  for (auto& [name, t] : m.named_buffers())
    if (is_floating(t.dtype())) t.set_data(t.to(dtype));
}

// The case's model in `dtype` on `device`: every call gives the same weights.
inline std::shared_ptr<ResNet> make_case_model(const ResNetCase& c, DType dtype, Device device) {
  manual_seed(c.model_seed);
  std::shared_ptr<ResNet> m = make_resnet(c.config());
  convert_module(*m, dtype);
  m->to(device);
  return m;
}

// The batch: (batch, 3, size, size) uniform in [-2, 2], rounded to f32, then in `dtype`.
inline Tensor case_images(const ResNetCase& c, DType dtype) {
  return testing::random_tensor({c.batch, 3, c.size, c.size}, c.input_seed, -2.0, 2.0,
                                DType::F32)
      .to(dtype);
}

// Targets 3, 7, 1, 5, 9, 3, ...: every image its own class where the batch allows.
inline Tensor case_targets(const ResNetCase& c) {
  std::vector<int64_t> t(static_cast<size_t>(c.batch));
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<int64_t>(3 + 4 * i) % c.num_classes;
  return Tensor::from_vector<int64_t>(t, {c.batch});
}

// A training forward and backward (cross-entropy) of `model` (in the case's dtype, on its
// device) on the case's batch. Results, in this order: "logits", "loss", "grad <parameter>"
// for every parameter, "<buffer>" for every buffer (running statistics, num_batches_tracked).
inline NamedTensors run_case(ResNet& model, const ResNetCase& c) {
  const NamedTensors params = model.named_parameters();
  const DType dtype = params.at(0).second.dtype();
  const Device device = params.at(0).second.device();
  model.train();
  model.zero_grad();
  const Tensor logits = model.forward(case_images(c, dtype).to(device));
  const Tensor loss = cross_entropy(logits, case_targets(c).to(device));
  loss.backward();
  NamedTensors out = {{"logits", logits.detach()}, {"loss", loss.detach()}};
  for (const auto& [name, t] : params) out.push_back({"grad " + name, t.grad()});
  for (const auto& [name, t] : model.named_buffers()) out.push_back({name, t.clone()});
  return out;
}

}  // namespace kiln::test
