// pipeline_test_util.h: a small block model and comparisons shared by the pipeline tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/error.h"
#include "engine/philox.h"
#include "layers/activation.h"
#include "layers/linear.h"
#include "layers/loss.h"
#include "layers/module.h"
#include "models/pipeline/partition.h"
#include "models/pipeline/pipeline.h"

namespace kiln::test {

inline Tensor random_tensor(const Shape& shape, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = normal(rng);
  return Tensor::from_vector(v, shape);
}

// Linear+ReLU blocks, then a Linear: 6 -> width ... -> 3, `count` blocks (five by default:
// four Linear+ReLU and the last Linear). The same seed and shape give the same weights.
class MlpBlocks {
 public:
  explicit MlpBlocks(uint64_t seed, int64_t width = 16, int count = 5) {
    manual_seed(seed);
    for (int b = 0; b < count; ++b) {
      const int64_t in = b == 0 ? 6 : width, out = b == count - 1 ? 3 : width;
      auto seq = std::make_shared<Sequential>();
      seq->push_back("0", std::make_shared<Linear>(in, out));
      if (b < count - 1) seq->push_back("1", std::make_shared<ReLU>());
      blocks_.push_back({"block" + std::to_string(b), seq});
    }
  }
  const std::vector<Block>& blocks() const { return blocks_; }
  std::vector<Tensor> parameters() const {
    std::vector<Tensor> all;
    for (const Block& b : blocks_) {
      for (const Tensor& t : b.module->parameters()) all.push_back(t);
    }
    return all;
  }
  Tensor forward(const Tensor& x) const {
    Tensor y = x;
    for (const Block& b : blocks_) y = b.module->forward(y);
    return y;
  }

 private:
  std::vector<Block> blocks_;
};

inline double max_abs_diff(const Tensor& a, const Tensor& b) {
  std::vector<float> va = a.to(Device("cpu")).to_vector<float>();
  std::vector<float> vb = b.to(Device("cpu")).to_vector<float>();
  EXPECT_EQ(va.size(), vb.size());
  double worst = 0;
  for (size_t i = 0; i < std::min(va.size(), vb.size()); ++i) {
    worst = std::max(worst, static_cast<double>(std::fabs(va[i] - vb[i])));
  }
  return worst;
}

inline void expect_same_parameters(const MlpBlocks& got, const MlpBlocks& want, double tol) {
  std::vector<Tensor> g = got.parameters(), w = want.parameters();
  ASSERT_EQ(g.size(), w.size());
  for (size_t i = 0; i < g.size(); ++i) {
    EXPECT_LT(max_abs_diff(g[i], w[i]), tol) << "parameter " << i;
  }
}

// cpu:0 .. cpu:n-1, one device per stage.
inline std::vector<Device> cpu_devices(int n) {
  std::vector<Device> devices;
  for (int s = 0; s < n; ++s) devices.push_back(Device(DeviceType::CPU, s));
  return devices;
}

// The mean squared error, as a pipeline's loss.
inline Pipeline::LossFn mse() {
  return [](const Tensor& out, const Tensor& t) { return mse_loss(out, t); };
}

// A block that passes its input through and throws on a chosen call (counted over every
// forward, across steps), to check that a failing stage ends its step with the error.
class FailOnCall : public Module {
 public:
  explicit FailOnCall(int call) : fail_at_(call) {}
  Tensor forward(const Tensor& x) override {
    if (calls_++ == fail_at_) throw Error("planted failure", ErrorKind::Input);
    return x;
  }
  std::string type_name() const override { return "FailOnCall"; }
  void disarm() { fail_at_ = -1; }

 private:
  int fail_at_;
  int calls_ = 0;
};

}  // namespace kiln::test
