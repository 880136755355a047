// parity_cases.h: the parity table of Kiln's ops and layers. One row (a Case) is an op or layer
// with its parameters bound, its inputs (shapes, value ranges, which require grad), how its
// results compare, and which suites run it (tests/parity/parity_test.cpp):
//
//   kGradcheck      finite differences in double on the CPU           (parity_test: unit, gradcheck)
//   kVendorCpu      hand kernels == oneDNN on the CPU, in float       (parity_test)
//   kDevice         CPU == cuda:0, forward and every gradient,        (parity_cuda_test: sim, gpu)
//                   in each dtype of `dtypes`, under each Variant
//   kGradcheckCuda  finite differences in double through cuda:0       (parity_cuda_test)
//   kVendorCuda     hand kernels == cuBLAS/cuDNN on cuda:0            (parity_cuda_test)
//   kAutocast       under AutocastGuard(bf16 / f16) == f32, on the CPU (parity_test); every row
//                   that runs in f32 is in it without asking (cases_in)
//   kAutocastCuda   the same on cuda:0, for the rows that name it       (parity_cuda_test)
//   kLowPrecision   16-bit activations == the f32 op rounded once,     (parity_test)
//                   on the CPU, for bf16 and f16
//   kLowPrecisionCuda  the same on cuda:0, and CPU 16-bit == cuda:0      (parity_cuda_test)
//                   16-bit
//
// kLowPrecision / kLowPrecisionCuda. For each of bf16 and f16 the row's f32 inputs listed in
// `lp_inputs` (the activations; default input 0) are rounded to the 16-bit dtype, the others
// (parameters, e.g. BatchNorm's weight) stay f32; the op runs on them ("the 16-bit run"), and
// again on the same values widened back to f32 ("the reference"). Backward gets the harness's
// fixed dy, rounded to the 16-bit dtype where output 0 is 16-bit (both runs get the same
// values). Compared:
//   - a 16-bit output against the reference's rounded once: within `lp_fwd_ulps` ulps of the
//     16-bit format (default 0: bit-identical; an elementwise op computes the same f32 value);
//   - an output that is f32 by design (a reduction's result, running statistics) as f32:
//     close_in_norm within `lp_f32_rtol` (default 1e-5: the order of a sum may differ);
//   - the gradient of each 16-bit input (it must have that dtype) against the reference's
//     rounded once: within `lp_bwd_ulps` ulps (default 1) or an absolute slack of
//     lp_bwd_slack * u * max|reference gradient| (u: the format's unit roundoff, 2^-8 bf16,
//     2^-11 f16; default lp_bwd_slack 2). Why: the 16-bit backward rounds every gradient that
//     flows between ops, the reference only once at the end. A gradient that is one f32
//     expression of 16-bit values is the reference's bit for bit; one that adds k rounded
//     terms (a tensor used twice gets two) carries up to k * u * max|term| more, and when the
//     terms cancel that is many ulps of a small result but never more than k * u times the
//     gradient's largest magnitude: k = 2 covers a residual's accumulation;
//   - the gradient of an f32 input (a parameter) as f32 within lp_f32_rtol.
// The CUDA suite runs both comparisons on cuda:0, then compares the CPU 16-bit run with the
// cuda:0 one under the same bounds (16-bit outputs in ulps, f32 ones in norm).
//
// Adding a layer's tests = adding rows to parity_layers.cpp (a mylayer_rows(rows) function that
// add_layer_rows calls; the engine ops' rows are in parity_cases.cpp), e.g.
//
//   rows.push_back(Case("mylayer_2x3x5x5_k3")           // the test's name (letters, digits, _)
//                      .in(uniform({2, 3, 5, 5}))         // x in [-1, 1), requires grad
//                      .in(uniform({3}, 0.5, 1.5))        // a parameter
//                      .fn([](const Inputs& v) { return Outputs{mylayer(v[0], v[1], 3)}; })
//                      .tol(DTol::rel(2e-5, 1e-12))       // forward and backward, per dtype
//                      .suites(kGradcheck | kDevice));
//
// fn returns the outputs: the first is differentiated (the harness backpropagates a fixed
// random dy through it), every output is compared (running statistics, indices, a generator's
// offset). Inputs come from generators (uniform, away_from_zero, ties, ...) or one `make`
// function when values depend on each other; an undefined Tensor() stands for an absent
// optional input. Keep gradcheck inputs off kinks (ReLU at 0, max-pool ties) and small: the
// check costs two forwards per input element.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "engine/tensor.h"
#include "parity/parity_harness.h"

namespace kiln::parity {

using testing::DTol;
using testing::Tol;
using Inputs = std::vector<Tensor>;
using Outputs = std::vector<Tensor>;
using Fn = std::function<Outputs(const Inputs&)>;

enum Suite : unsigned {
  kGradcheck = 1,
  kVendorCpu = 2,
  kDevice = 4,
  kGradcheckCuda = 8,
  kVendorCuda = 16,
  kAutocast = 32,
  kAutocastCuda = 64,
  kLowPrecision = 128,
  kLowPrecisionCuda = 256,
};

// Autocast's tolerance (engine/autocast.h), norm-wise relative error against the f32 result:
// the inputs of conv/matmul are rounded to 8 (bf16) or 11 (f16) significant bits, each product
// then carries a relative error up to ~2^-8 / 2^-11, and the f32 sums add no more than f32's own.
// Four times that bound leaves room for the gradient's own rounding in backward. Rows whose ops
// are not changed by autocast must give the f32 bits exactly.
inline double autocast_rtol(DType low) { return low == DType::BF16 ? 1.0 / 64 : 1.0 / 512; }

// A CPU tensor of the given dtype (generators that make integers ignore it).
using Gen = std::function<Tensor(DType dtype, uint32_t seed)>;

struct Input {
  Gen gen;
  bool grad = true;
};

// Uniform in [lo, hi) (testing::random_tensor).
Input uniform(const Shape& shape, double lo = -1.0, double hi = 1.0, bool grad = true);
// Magnitudes in [0.5, 2), alternating in sign: safe divisors.
Input away_from_zero(const Shape& shape, bool grad = true);
// floor(uniform(lo, hi)): few distinct values, many ties.
Input ties(const Shape& shape, double lo, double hi, bool grad = true);
// Distinct values in [-1, 1), shuffled: no max-pool window has a tie.
Input distinct(const Shape& shape, bool grad = true);
// These exact values (as double, then the dtype).
Input values(const std::vector<double>& v, const Shape& shape, bool grad = true);
// (N) int64 class indices in [0, classes), never requiring grad.
Input targets(int64_t n, int64_t classes);
// An absent optional input (Tensor()).
Input absent();
// Moves every element of a tensor `margin` further from 0 (keeps ReLU inputs off the kink).
Input off_zero(Input in, double margin);

// Something set up around a run on CUDA (a kernel choice): enter before, leave after.
struct Variant {
  std::string name;
  std::function<void()> enter, leave;
};

struct Case {
  std::string name;
  std::vector<Input> inputs;
  // Instead of inputs' generators: all inputs at once (for values that depend on each other).
  std::function<Inputs(DType)> make;
  Fn f;
  unsigned suite_mask = 0;
  std::vector<DType> dtype_list = {DType::F32, DType::F64};
  DTol fwd, bwd;              // CPU vs CUDA
  DTol vendor_tol;            // hand vs vendor
  std::vector<Variant> variant_list;  // kDevice, kGradcheckCuda, kVendorCuda: each runs alone
  uint32_t seed = 1;
  // kDevice extras:
  bool reference_f64 = false;  // the CPU reference runs in double, rounded to the dtype
  DTol same_dtype_fwd;         // ... and output 0 against the CPU in the dtype itself
  bool has_same_dtype_fwd = false;
  // On cuda:0, must give fn's bits (a fused op vs its composition). Only where both run the
  // same operations in the same order with their rounding spelled out (fma_t / mul_rn for each
  // multiply-add, engine/cuda/kernels/common.h): which multiply-adds nvcc or the simulator's
  // host compiler fuse on their own may differ between two kernels, two copies of one loop, or
  // two CPUs (docs/cuda_simulator.md, "Floating point: contraction as nvcc does it").
  Fn same_bits;
  // Absolute slack for input 0's gradient: rtol * grad0_scale(cpu inputs, dy) (a cancelling
  // sum whose terms are larger than its result).
  std::function<double(const Inputs&, const Tensor& dy)> grad0_scale;
  // kLowPrecision / kLowPrecisionCuda (see the header comment): which inputs are activations
  // (rounded to 16 bits), and the bounds.
  std::vector<size_t> lp_inputs = {0};
  double lp_fwd_ulps = 0;
  double lp_bwd_ulps = 1;
  double lp_bwd_slack = 2;
  double lp_f32_rtol = 1e-5;
  // A check of the CPU outputs (that the inputs exercise what the row is about).
  std::function<::testing::AssertionResult(const Outputs&)> sanity;

  explicit Case(std::string n) : name(std::move(n)) {}
  Case& in(Input i) { inputs.push_back(std::move(i)); return *this; }
  Case& fn(Fn g) { f = std::move(g); return *this; }
  Case& suites(unsigned s) { suite_mask = s; return *this; }
  Case& dtypes(std::vector<DType> d) { dtype_list = std::move(d); return *this; }
  Case& tol(DTol both) { fwd = bwd = both; return *this; }
  Case& tol(DTol f, DTol b) { fwd = f; bwd = b; return *this; }
  Case& vendor(DTol t) { vendor_tol = t; return *this; }
  Case& variants(std::vector<Variant> v) { variant_list = std::move(v); return *this; }
  Case& with_seed(uint32_t s) { seed = s; return *this; }
  Case& low_precision(std::vector<size_t> activations, double fwd_ulps = 0, double bwd_ulps = 1) {
    lp_inputs = std::move(activations);
    lp_fwd_ulps = fwd_ulps;
    lp_bwd_ulps = bwd_ulps;
    return *this;
  }
  bool has(Suite s) const { return (suite_mask & s) != 0; }
  // The inputs of one run: CPU tensors in dtype.
  Inputs build(DType dtype) const;
  // Which inputs require grad (make: set by the caller in `grads`).
  std::vector<bool> grads;
  bool requires_grad(size_t i) const;
};

// The table.
const std::vector<Case>& cases();
// Its rows that run in suite s.
std::vector<Case> cases_in(Suite s);

}  // namespace kiln::parity
