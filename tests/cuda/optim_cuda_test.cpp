// optim_cuda_test.cpp: the fused CUDA optimizer updates (engine/cuda/kernels/optim.cu) against
// the CPU loops: the same parameters and the same gradient sequence on both devices, several
// steps, then the parameters and every state buffer (state_dict) compared. SGD (plain,
// momentum, dampening, Nesterov, weight decay), Adam, AdamW, Adadelta; float and double;
// odd sizes (1, 7, 33x5, 70000: the grid-stride loop); a parameter without gradient on some
// steps keeps its value and its step count, as on the CPU.
//
// Tolerance: the per-element rule is the same function on both devices, but nvcc fuses
// a * b + c into one FMA (one rounding instead of two) and sqrt/division may differ by an
// ulp; over 6 steps that stays within 1e-5 relative in float (1e-12 in double) of the scale.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/optim/adadelta.h"
#include "engine/optim/adam.h"
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
      {"adadelta", [](P p) { return std::make_unique<Adadelta>(std::move(p)); }},
      {"adadelta_wd", [](P p) { return std::make_unique<Adadelta>(std::move(p), 0.5, 0.95, 1e-5, 0.1); }},
  };
}

double rtol_for(DType dt) { return dt == DType::F64 ? 1e-12 : 1e-5; }

TEST(OptimCuda, StepsMatchCpu) {
  KILN_SKIP_WITHOUT_CUDA();
  const std::vector<Shape> shapes = {{1}, {7}, {33, 5}, {70000}};
  constexpr int kSteps = 6;
  for (DType dt : {DType::F32, DType::F64}) {
    for (const OptCase& c : cases()) {
      SCOPED_TRACE(c.name + " " + dtype_name(dt));
      std::vector<Tensor> on_cpu, on_cuda;
      for (size_t i = 0; i < shapes.size(); ++i) {
        const Tensor init = random_tensor(shapes[i], 100 + static_cast<uint32_t>(i), -1.0, 1.0, dt);
        on_cpu.push_back(testing::leaf_on(init, kCpu));
        on_cuda.push_back(testing::leaf_on(init, kCuda));
      }
      auto opt_cpu = c.make(on_cpu);
      auto opt_cuda = c.make(on_cuda);
      for (int step = 0; step < kSteps; ++step) {
        for (size_t i = 0; i < shapes.size(); ++i) {
          // Parameter 1 gets no gradient on odd steps: skipped, as on the CPU.
          if (i == 1 && step % 2 == 1) {
            on_cpu[i].set_grad(Tensor());
            on_cuda[i].set_grad(Tensor());
            continue;
          }
          const Tensor g = random_tensor(shapes[i], 1000 + 10 * static_cast<uint32_t>(step) +
                                                        static_cast<uint32_t>(i),
                                         -1.0, 1.0, dt);
          on_cpu[i].set_grad(g);
          on_cuda[i].set_grad(g.to(kCuda));
        }
        opt_cpu->step();
        opt_cuda->step();
      }
      for (size_t i = 0; i < shapes.size(); ++i) {
        EXPECT_EQ(on_cuda[i].device(), kCuda);
        EXPECT_TRUE(near("param " + std::to_string(i), on_cuda[i], on_cpu[i], rtol_for(dt)));
      }
      const auto sd_cpu = opt_cpu->state_dict(), sd_cuda = opt_cuda->state_dict();
      ASSERT_EQ(sd_cpu.size(), sd_cuda.size());
      for (const auto& [key, want] : sd_cpu) {
        auto it = sd_cuda.find(key);
        ASSERT_NE(it, sd_cuda.end()) << "state " << key << " missing on CUDA";
        if (is_floating(want.dtype())) {
          if (key != "lr") {
            EXPECT_EQ(it->second.device(), kCuda) << key;
          }
          EXPECT_TRUE(near("state " + key, it->second, want, rtol_for(dt)));
        } else {
          EXPECT_EQ(it->second.to(kCpu).to_vector<double>(), want.to_vector<double>()) << key;
        }
      }
    }
  }
}

TEST(OptimCuda, GradientOnAnotherDeviceIsAnError) {
  KILN_SKIP_WITHOUT_CUDA();
  Tensor p = testing::leaf_on(Tensor::ones({3}), kCuda);
  SGD opt({p}, 0.1);
  EXPECT_THROW(
      {
        p.set_grad(Tensor::ones({3}));  // on the CPU
        opt.step();
      },
      Error);
}

}  // namespace
}  // namespace kiln
