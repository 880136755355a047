// dropout.h: Dropout (Srivastava et al., 2014) with a counter-based Philox mask.
//
// In training, element i of x (flattened, row-major) is kept iff
//     uniform01(philox_u32(seed, base, i)) >= p,     base = gen.reserve(numel)
// and kept values are scaled by 1 / (1 - p) ("inverted dropout": eval is the identity).
// The mask is a pure function of (seed, base, i): the CPU and every CUDA thread
// compute the same mask bit for bit, and backward recomputes it from (seed, base) instead of
// saving it, so dropout costs no activation memory. p is compared as a float on every device.
// x: any shape, f32 or f64. p must be in [0, 1); p == 0 or eval mode returns x itself.
#pragma once

#include <cstdint>
#include <string>

#include "engine/philox.h"
#include "layers/dropout_kernels.h"  // dropout_keep(bits, p)
#include "layers/module.h"

namespace kiln {

// The mask bit of element i: the keep rule (layers/dropout_kernels.h) on its Philox bits.
KILN_HOST_DEVICE inline bool dropout_keep(uint64_t seed, uint64_t base, uint64_t i, float p) {
  return dropout_keep(philox_u32(seed, base, i), p);
}

Tensor dropout(const Tensor& x, double p, bool training, Generator& gen = default_generator());

class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5, Generator& gen = default_generator());
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Dropout"; }
  double p() const { return p_; }

 protected:
  std::string extra_repr() const override;

 private:
  double p_;
  Generator* gen_;
};

}  // namespace kiln
