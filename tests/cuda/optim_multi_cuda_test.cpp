// optim_multi_cuda_test.cpp: the one-launch optimizer step on CUDA (engine/optim/multi_tensor.h,
// engine/cuda/kernels/optim_multi.cu) against the per-parameter kernels it replaces, bit for
// bit, and against the CPU loop (to rounding, as optim_cuda_test.cpp). SGD with momentum,
// dampening, Nesterov and weight decay, Adam, Adam with L2 decay, AdamW; f32 and f64; odd
// sizes, a parameter of several chunks, more parameters than one table holds; a parameter
// without gradient on some steps and a step skipped by the device flag.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/cuda/launch_count.h"
#include "engine/optim/adam.h"
#include "engine/optim/multi_tensor.h"
#include "engine/optim/sgd.h"
#include "support/cuda_skip.h"
#include "support/gradcheck.h"
#include "parity/parity_harness.h"

namespace kiln {
namespace {

using testing::kCpu;
using testing::kCuda;
using testing::near;
using testing::random_tensor;

using MakeOpt = std::function<std::unique_ptr<Optimizer>(std::vector<Tensor>)>;

struct OptCase {
  std::string name;
  MakeOpt make;
};

std::vector<OptCase> cases() {
  using P = std::vector<Tensor>;
  return {
      {"sgd", [](P p) { return std::make_unique<SGD>(std::move(p), 0.1); }},
      {"sgd_momentum", [](P p) { return std::make_unique<SGD>(std::move(p), 0.1, 0.9); }},
      {"sgd_dampening_wd",
       [](P p) { return std::make_unique<SGD>(std::move(p), 0.05, 0.8, 0.3, 1e-2); }},
      {"sgd_nesterov_wd",
       [](P p) { return std::make_unique<SGD>(std::move(p), 0.1, 0.9, 0.0, 1e-3, true); }},
      {"adam", [](P p) { return std::make_unique<Adam>(std::move(p), 1e-2); }},
      {"adam_l2", [](P p) { return std::make_unique<Adam>(std::move(p), 1e-2, 0.8, 0.99, 1e-6, 0.1); }},
      {"adamw", [](P p) { return std::make_unique<AdamW>(std::move(p), 1e-2, 0.9, 0.999, 1e-8, 0.05); }},
  };
}

// Odd sizes; 131073 elements is three chunks (the last of one element); then more small
// parameters than one update table holds, so the step takes two update launches.
std::vector<Shape> shapes() {
  std::vector<Shape> s = {{1}, {7}, {33, 5}, {131073}};
  for (int i = 0; i < multi_tensor::kMaxTensors; ++i) s.push_back({3 + i % 5});
  return s;
}

// The bits of t (f32 and f64 widen exactly to double, so equal doubles are equal bits).
std::vector<double> values(const Tensor& t) { return t.to(kCpu).to_vector<double>(); }

void expect_same_bits(const std::string& what, const Tensor& got, const Tensor& want) {
  const std::vector<double> g = values(got), w = values(want);
  ASSERT_EQ(g.size(), w.size()) << what;
  EXPECT_EQ(std::memcmp(g.data(), w.data(), g.size() * sizeof(double)), 0)
      << what << " differs from the per-parameter path";
}

// Runs kSteps steps on three copies of the parameters: CUDA in one launch, CUDA one parameter
// at a time, the CPU. Step 2 is skipped by the flag; parameter 1 has no gradient on odd steps.
void run_case(const OptCase& c, DType dt) {
  constexpr int kSteps = 5, kSkipped = 2;
  const std::vector<Shape> sh = shapes();
  std::vector<Tensor> multi, single, cpu;
  for (size_t i = 0; i < sh.size(); ++i) {
    const Tensor init = random_tensor(sh[i], 100 + static_cast<uint32_t>(i), -1.0, 1.0, dt);
    multi.push_back(testing::leaf_on(init, kCuda));
    single.push_back(testing::leaf_on(init, kCuda));
    cpu.push_back(testing::leaf_on(init, kCpu));
  }
  auto opt_multi = c.make(multi);
  auto opt_single = c.make(single);
  auto opt_cpu = c.make(cpu);
  opt_single->set_multi_tensor(false);
  ASSERT_TRUE(opt_multi->multi_tensor());
  const Tensor skip_cuda = Tensor::zeros({1}, DType::I32, kCuda);
  const Tensor skip_set = Tensor::ones({1}, DType::I32, kCuda);
  for (int step = 0; step < kSteps; ++step) {
    for (size_t i = 0; i < sh.size(); ++i) {
      if (i == 1 && step % 2 == 1) {
        multi[i].set_grad(Tensor());
        single[i].set_grad(Tensor());
        cpu[i].set_grad(Tensor());
        continue;
      }
      const Tensor g = random_tensor(
          sh[i], 1000 + 100 * static_cast<uint32_t>(step) + static_cast<uint32_t>(i), -1.0, 1.0,
          dt);
      multi[i].set_grad(g.to(kCuda));
      single[i].set_grad(g.to(kCuda));
      cpu[i].set_grad(g);
    }
    const Tensor& flag = step == kSkipped ? skip_set : skip_cuda;
    opt_multi->step(flag);
    opt_single->step(flag);
    if (step != kSkipped) opt_cpu->step();
  }
  for (size_t i = 0; i < sh.size(); ++i) {
    expect_same_bits("param " + std::to_string(i), multi[i], single[i]);
    EXPECT_TRUE(near("param " + std::to_string(i), multi[i], cpu[i],
                     dt == DType::F64 ? 1e-12 : 1e-5));
  }
  const auto sd_multi = opt_multi->state_dict(), sd_single = opt_single->state_dict();
  const auto sd_cpu = opt_cpu->state_dict();
  ASSERT_EQ(sd_multi.size(), sd_single.size());
  ASSERT_EQ(sd_multi.size(), sd_cpu.size());
  for (const auto& [key, want] : sd_single) {
    auto it = sd_multi.find(key);
    ASSERT_NE(it, sd_multi.end()) << key;
    expect_same_bits("state " + key, it->second, want);
    if (!is_floating(want.dtype())) {
      EXPECT_EQ(values(it->second), values(sd_cpu.at(key))) << key;
    }
  }
}

TEST(OptimMultiCuda, MatchesPerParameterBitForBit) {
  KILN_SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::F32, DType::F64})
    for (const OptCase& c : cases()) {
      SCOPED_TRACE(c.name + " " + dtype_name(dt));
      run_case(c, dt);
    }
}

// The launches of one step: per parameter two; in one go one prepare, one update per table
// (here two: more parameters than a table holds), and the step counter's.
TEST(OptimMultiCuda, LaunchesPerStep) {
  KILN_SKIP_WITHOUT_CUDA();
  const std::vector<Shape> sh = shapes();
  for (bool on : {false, true}) {
    std::vector<Tensor> params;
    for (size_t i = 0; i < sh.size(); ++i)
      params.push_back(testing::leaf_on(random_tensor(sh[i], 7 + static_cast<uint32_t>(i)), kCuda));
    Adam opt(params, 1e-3);
    opt.set_multi_tensor(on);
    for (Tensor& p : params) p.set_grad(Tensor::ones(p.shape(), p.dtype(), kCuda));
    opt.step();  // creates the state
    const int64_t before = cuda::launch_count();
    opt.step();
    const int64_t launches = cuda::launch_count() - before;
    EXPECT_EQ(launches, on ? 1 + 2 + 1 : 2 * static_cast<int64_t>(sh.size()) + 1) << on;
  }
}

// Parameters of two dtypes cannot share a table: step() falls back to one parameter at a
// time, with the same results as with the one-launch path switched off.
TEST(OptimMultiCuda, MixedDtypesFallBack) {
  KILN_SKIP_WITHOUT_CUDA();
  std::vector<Tensor> a = {testing::leaf_on(random_tensor({5}, 1, -1, 1, DType::F32), kCuda),
                           testing::leaf_on(random_tensor({9}, 2, -1, 1, DType::F64), kCuda)};
  std::vector<Tensor> b = {testing::leaf_on(a[0].detach().clone(), kCuda),
                           testing::leaf_on(a[1].detach().clone(), kCuda)};
  SGD opt_a(a, 0.1, 0.9), opt_b(b, 0.1, 0.9);
  opt_b.set_multi_tensor(false);
  for (int step = 0; step < 3; ++step) {
    for (size_t i = 0; i < a.size(); ++i) {
      const Tensor g = random_tensor(a[i].shape(), 50 + static_cast<uint32_t>(step * 2 + i), -1,
                                     1, a[i].dtype());
      a[i].set_grad(g.to(kCuda));
      b[i].set_grad(g.to(kCuda));
    }
    opt_a.step();
    opt_b.step();
  }
  for (size_t i = 0; i < a.size(); ++i) expect_same_bits("param", a[i], b[i]);
}

}  // namespace
}  // namespace kiln
