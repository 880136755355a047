// parity_cases.cpp: the rows of the parity table (how to add one: parity_cases.h).
//
// Tolerances, and why (CPU vs CUDA unless said otherwise):
//   exact   one IEEE operation per element on both devices: + - * / (also broadcast), neg,
//           square, relu, add_relu, scalar ops, transpose (a copy), argmax, the expand of a
//           sum's backward, dropout (the mask is a pure function of seed, counter, element).
//   values  max pooling: outputs, indices and gradients to the bit; NaNs win their window.
//   2e-5 / 1e-12 (float / double, relative to the tensor's scale: testing::near)
//           sums, softmax, matmul: a tree on the GPU instead of a left-to-right loop; exp and
//           log from different math libraries (within 2 ulp). BatchNorm2d: both accumulate in
//           double; in float the statistics round differently at the last bit.
//   5e-5 / 1e-11  Conv2d: sums of up to ~2000 products in different orders.
//   1e-6 / 1e-14  average pooling: the CPU's order and count, a few ulp at most.
//   2e-6 / 1e-13  cross-entropy: expf/logf vs std::exp/log, row sums in another order.
//   1e-6 / 1e-13  MSE against the CPU op in double, rounded (the CUDA kernel sums in double);
//                 1e-4 / 1e-12 against the CPU op in the dtype (its float mean sums in float).
//   hand vs oneDNN (float): 1e-3 absolute, sums of up to C*R*S or N*P*Q terms of size ~1.
#include "parity/parity_cases.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "engine/impl.h"
#include "engine/memory_format.h"
#include "engine/ops.h"
#include "support/gradcheck.h"

namespace kiln::parity {

using testing::random_tensor;

// ---- Inputs ---------------------------------------------------------------------------------

Input uniform(const Shape& shape, double lo, double hi, bool grad) {
  return {[=](DType dt, uint32_t seed) { return random_tensor(shape, seed, lo, hi, dt); }, grad};
}

Input away_from_zero(const Shape& shape, bool grad) {
  return {[=](DType dt, uint32_t seed) {
            std::vector<double> v = random_tensor(shape, seed, 0.5, 2.0).to_vector<double>();
            for (size_t i = 0; i < v.size(); i += 2) v[i] = -v[i];
            return Tensor::from_vector(v, shape).to(dt);
          },
          grad};
}

Input ties(const Shape& shape, double lo, double hi, bool grad) {
  return {[=](DType dt, uint32_t seed) {
            std::vector<double> v = random_tensor(shape, seed, lo, hi).to_vector<double>();
            for (double& e : v) e = std::floor(e);
            return Tensor::from_vector(v, shape).to(dt);
          },
          grad};
}

Input distinct(const Shape& shape, bool grad) {
  return {[=](DType dt, uint32_t seed) {
            const int64_t numel = shape_numel(shape);
            std::vector<double> v(static_cast<size_t>(numel));
            std::iota(v.begin(), v.end(), 0.0);
            std::shuffle(v.begin(), v.end(), std::mt19937(seed));
            for (auto& x : v) x = (x - numel / 2.0) / (numel / 2.0 + 1);
            return Tensor::from_vector(v, shape).to(dt);
          },
          grad};
}

Input values(const std::vector<double>& v, const Shape& shape, bool grad) {
  return {[=](DType dt, uint32_t) { return Tensor::from_vector(v, shape).to(dt); }, grad};
}

Input targets(int64_t n, int64_t classes) {
  return {[=](DType, uint32_t seed) {
            std::vector<int64_t> t(static_cast<size_t>(n));
            uint32_t s = seed;
            for (auto& v : t) {
              s = s * 1664525u + 1013904223u;
              v = static_cast<int64_t>((s >> 8) % static_cast<uint32_t>(classes));
            }
            return Tensor::from_vector(t, {n});
          },
          false};
}

Input absent() { return {[](DType, uint32_t) { return Tensor(); }, false}; }

Input off_zero(Input in, double margin) {
  Gen g = in.gen;
  in.gen = [=](DType dt, uint32_t seed) {
    std::vector<double> v = g(DType::F64, seed).to_vector<double>();
    const Shape shape = g(DType::F64, seed).shape();
    for (double& e : v) e += e >= 0 ? margin : -margin;
    return Tensor::from_vector(v, shape).to(dt);
  };
  return in;
}

Inputs Case::build(DType dtype) const {
  if (make) {
    // A make function may produce one dtype whatever it is asked: its floats are converted.
    Inputs out = make(dtype);
    for (Tensor& t : out)
      if (t.defined() && is_floating(t.dtype()) && t.dtype() != dtype) t = t.to(dtype);
    return out;
  }
  Inputs out;
  for (size_t i = 0; i < inputs.size(); ++i)
    out.push_back(inputs[i].gen(dtype, seed + static_cast<uint32_t>(i)));
  return out;
}

bool Case::requires_grad(size_t i) const {
  if (make) return i < grads.size() && grads[i];
  return i < inputs.size() && inputs[i].grad;
}

namespace {

// ---- Naming ---------------------------------------------------------------------------------

std::string dims(const Shape& s) {
  if (s.empty()) return "scalar";
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) out += (i ? "x" : "") + std::to_string(s[i]);
  return out;
}

std::string num(double v) {  // 0.25 -> 0p25, -1.7 -> m1p7
  std::string s = std::to_string(v);
  s.erase(s.find_last_not_of('0') + 1);
  if (s.back() == '.') s.pop_back();
  for (char& ch : s) ch = ch == '.' ? 'p' : ch == '-' ? 'm' : ch;
  return s;
}

Outputs one(const Tensor& t) { return {t}; }

const DTol kSum = DTol::rel(2e-5, 1e-12);

class Table {
 public:
  std::vector<Case> rows;
  Case& add(Case c) {
    rows.push_back(std::move(c));
    return rows.back();
  }
};

// ---- Engine ops (engine/ops.h) --------------------------------------------------------------

using Binary = Tensor (*)(const Tensor&, const Tensor&);

void elementwise(Table& t) {
  const std::pair<const char*, Binary> binary[] = {
      {"add", add}, {"sub", sub}, {"mul", mul}, {"div", div}};
  // CPU vs CUDA: odd shapes (1, 7, 33, 130, 257: not multiples of a warp or a tile), b the
  // same shape, a one-element scalar, a row. The backward of a broadcast sums (near).
  const Shape shapes[] = {{1}, {7}, {33, 5}, {3, 130}, {2, 3, 257}};
  for (const auto& [name, op] : binary)
    for (const Shape& s : shapes) {
      const Shape others[] = {s, {1}, {s.back()}};
      const char* kinds[] = {"same", "scalar", "row"};
      for (int k = 0; k < 3; ++k) {
        const bool exact_bwd = k == 0 && op != div;
        Binary f = op;
        t.add(Case(std::string(name) + "_" + dims(s) + "_" + kinds[k])
                  .in(uniform(s, -2.0, 2.0))
                  .in(away_from_zero(others[k]))
                  .fn([f](const Inputs& v) { return one(f(v[0], v[1])); })
                  .tol(DTol::exact(), exact_bwd ? DTol::exact() : kSum)
                  .suites(kDevice));
      }
    }
  // Gradient checks: b the same shape, a row, a one-element scalar.
  for (const auto& [name, op] : binary) {
    const Shape others[] = {{3, 5}, {5}, {1}};
    for (const Shape& o : others) {
      Binary f = op;
      t.add(Case(std::string("gradcheck_") + name + "_3x5_by_" + dims(o))
                .in(uniform({3, 5}))
                .in(uniform(o, 0.5, 2.0))
                .fn([f](const Inputs& v) { return one(f(v[0], v[1])); })
                .suites(kGradcheck));
    }
  }

  struct Unary {
    const char* name;
    Tensor (*f)(const Tensor&);
    bool exact, positive;
  };
  const Unary unary[] = {
      {"neg", [](const Tensor& x) { return neg(x); }, true, false},
      {"square", [](const Tensor& x) { return square(x); }, true, false},
      {"relu", [](const Tensor& x) { return relu(x); }, true, false},
      {"add_scalar", [](const Tensor& x) { return add(x, 0.3); }, true, false},
      {"mul_scalar", [](const Tensor& x) { return mul(x, -1.7); }, true, false},
      {"exp", [](const Tensor& x) { return exp(x); }, false, false},
      {"log", [](const Tensor& x) { return log(x); }, false, true},
  };
  // 70000: the grid-stride loop.
  for (const Unary& u : unary)
    for (const Shape& s : {Shape{1}, Shape{7}, Shape{33, 5}, Shape{2, 3, 257}, Shape{70000}}) {
      auto f = u.f;
      t.add(Case(std::string(u.name) + "_" + dims(s))
                .in(u.positive ? uniform(s, 0.1, 3.0) : uniform(s, -2.0, 2.0))
                .fn([f](const Inputs& v) { return one(f(v[0])); })
                .tol(u.exact ? DTol::exact() : kSum)
                .suites(kDevice));
    }
  t.add(Case("relu_signed_zeros_tiny_and_inf")
            .in(values({-1.0, -0.0, 0.0, 1e-30, -1e-30, 3.5,
                        -std::numeric_limits<double>::infinity()},
                       {7}))
            .fn([](const Inputs& v) { return one(relu(v[0])); })
            .dtypes({DType::F32})
            .suites(kDevice));
  // Gradient checks: x positive (log); relu's input moved off its kink.
  for (const Unary& u : unary) {
    if (std::string(u.name) == "add_scalar" || std::string(u.name) == "mul_scalar") continue;
    auto f = u.f;
    const bool kinked = std::string(u.name) == "relu";
    t.add(Case(std::string("gradcheck_") + u.name + "_4x3")
              .in(kinked ? off_zero(uniform({4, 3}), 0.1) : uniform({4, 3}, 0.2, 2.0))
              .fn([f](const Inputs& v) { return one(f(v[0])); })
              .suites(kGradcheck));
  }
  t.add(Case("gradcheck_affine_scalar_ops_4x3")
            .in(uniform({4, 3}))
            .fn([](const Inputs& v) { return one(v[0] * 3.0 + 1.0); })
            .suites(kGradcheck));
}

// a and b in [-2, 2) with b = -a at every 7th element (the sum is exactly 0: the ReLU's tie).
Inputs add_relu_operands(const Shape& s, uint32_t seed, DType dt) {
  const Tensor a = random_tensor(s, seed, -2.0, 2.0);
  std::vector<double> bv = random_tensor(s, seed + 1, -2.0, 2.0).to_vector<double>();
  const std::vector<double> av = a.to_vector<double>();
  for (size_t i = 0; i < bv.size(); i += 7) bv[i] = -av[i];
  return {a.to(dt), Tensor::from_vector(bv, s).to(dt)};
}

// a and b with b moved 0.2 away wherever |a + b| < 0.1: off the kink of relu(a + b).
Inputs add_relu_off_kink(const Shape& s, uint32_t sa, uint32_t sb) {
  const Tensor a = random_tensor(s, sa);
  std::vector<double> bv = random_tensor(s, sb).to_vector<double>();
  const std::vector<double> av = a.to_vector<double>();
  for (size_t i = 0; i < bv.size(); ++i) {
    const double sum = av[i] + bv[i];
    if (std::fabs(sum) < 0.1) bv[i] += sum >= 0 ? 0.2 : -0.2;
  }
  return {a, Tensor::from_vector(bv, s)};
}

void fused_add_relu(Table& t) {
  auto fused = [](const Inputs& v) { return one(add_relu(v[0], v[1])); };
  auto composed = [](const Inputs& v) { return one(relu(add(v[0], v[1]))); };
  // Sizes just above a warp (33), a block (257), several blocks (65,537 = 256 * 256 + 1).
  for (const Shape& s : {Shape{1}, Shape{33}, Shape{257}, Shape{2, 3, 257}, Shape{65537}}) {
    Case pair("add_relu_" + dims(s));
    pair.make = [s](DType dt) { return add_relu_operands(s, 91, dt); };
    pair.grads = {true, true};
    pair.fn(fused).suites(kDevice);
    pair.same_bits = composed;
    t.add(pair);
    Case self("add_relu_self_" + dims(s));
    self.make = [s](DType dt) { return Inputs{add_relu_operands(s, 91, dt)[0]}; };
    self.grads = {true};
    self.fn([](const Inputs& v) { return one(add_relu(v[0], v[0])); }).suites(kDevice);
    t.add(self);
  }
  // 2,097,153 = 8192 blocks x 256 threads + 1: the grid is capped there, so one thread takes
  // a second element (the grid-stride loop).
  Case big("add_relu_grid_stride_2097153");
  big.make = [](DType dt) { return add_relu_operands({2097153}, 90, dt); };
  big.grads = {true, true};
  t.add(big.fn(fused).dtypes({DType::F32}).suites(kDevice));
  // -0 + -0 = -0 (relu gives +0), inf + -inf = NaN (relu gives 0), NaN operands, tiny sums.
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  t.add(Case("add_relu_special_values")
            .in(values({-0.0, 0.0, -0.0, inf, inf, -inf, nan, 1.0, 1e-30, -1e-30, 3.5}, {11}))
            .in(values({-0.0, -0.0, 0.0, -inf, 2.0, 1.0, 1.0, nan, 1e-30, 1e-31, -3.5}, {11}))
            .fn(fused)
            .suites(kDevice));

  // Gradient checks, off the kink; both sides of it populated (checked by sanity).
  Case both("gradcheck_add_relu_3x5x2");
  both.make = [](DType) { return add_relu_off_kink({3, 5, 2}, 15, 16); };
  both.grads = {true, true};
  t.add(both.fn(fused).suites(kGradcheck));
  // Only one operand requires grad (the other is data, as an identity shortcut from an input).
  Case left("gradcheck_add_relu_3x5x2_grad_a_only");
  left.make = both.make;
  left.grads = {true, false};
  t.add(left.fn(fused).suites(kGradcheck));
  Case right("gradcheck_add_relu_3x5x2_grad_b_only");
  right.make = both.make;
  right.grads = {false, true};
  t.add(right.fn(fused).suites(kGradcheck));
  // The same tensor as both operands: relu(2x), both edges into one leaf.
  t.add(Case("gradcheck_add_relu_self_4x3")
            .in(off_zero(uniform({4, 3}), 0.1))
            .with_seed(17)
            .fn([](const Inputs& v) { return one(add_relu(v[0], v[0])); })
            .suites(kGradcheck));
  // Downstream of other ops: add_relu(a * b, a), a reached along two paths.
  Case chain("gradcheck_add_relu_of_mul_3x5x2");
  chain.make = [](DType) {
    Inputs ab = add_relu_off_kink({3, 5, 2}, 15, 16);
    const std::vector<double> a = ab[0].to_vector<double>(), b = ab[1].to_vector<double>();
    for (size_t i = 0; i < a.size(); ++i)
      if (std::fabs(a[i] * b[i] + a[i]) <= 1e-3) ADD_FAILURE() << "a * b + a at the kink: " << i;
    return ab;
  };
  chain.grads = {true, true};
  t.add(chain.fn([](const Inputs& v) { return one(add_relu(mul(v[0], v[1]), v[0])); })
            .suites(kGradcheck));
  // Through cuda:0.
  Case cuda("gradcheck_cuda_add_relu_3x5");
  cuda.make = [](DType) { return add_relu_off_kink({3, 5}, 71, 75); };
  cuda.grads = {true, true};
  t.add(cuda.fn(fused).suites(kGradcheckCuda));
}

void reductions(Table& t) {
  struct R {
    Shape shape;
    std::vector<int64_t> dims;
    bool keepdim;
  };
  // Rows short and long, columns (reduced dim in the middle or first), and shapes large
  // enough that the kernels split the reduction into pieces.
  const R cases[] = {
      {{7}, {0}, false},          {{33, 5}, {0}, false},       {{33, 5}, {1}, true},
      {{33, 5}, {0, 1}, false},   {{2, 3, 257}, {1}, false},   {{2, 3, 257}, {0, 2}, true},
      {{2, 3, 257}, {-1}, false}, {{4, 1500}, {1}, false},     {{1, 70000}, {1}, false},
      {{5000, 3}, {0}, false},    {{3, 2000, 33}, {1}, false}, {{130, 1}, {0}, false},
  };
  for (const R& r : cases)
    for (bool is_mean : {false, true}) {
      std::string d;
      for (int64_t x : r.dims) d += "_" + num(static_cast<double>(x));
      const std::vector<int64_t> ds = r.dims;
      const bool keep = r.keepdim;
      t.add(Case(std::string(is_mean ? "mean_" : "sum_") + dims(r.shape) + "_dims" + d +
                 (keep ? "_keepdim" : ""))
                .in(uniform(r.shape))
                .fn([=](const Inputs& v) {
                  return one(is_mean ? mean(v[0], ds, keep) : sum(v[0], ds, keep));
                })
                .tol(kSum, DTol::exact())
                .suites(kDevice));
    }
  t.add(Case("sum_all_3x130x7").in(uniform({3, 130, 7}))
            .fn([](const Inputs& v) { return one(sum(v[0])); }).tol(kSum, DTol::exact())
            .suites(kDevice));
  t.add(Case("mean_all_3x130x7").in(uniform({3, 130, 7}))
            .fn([](const Inputs& v) { return one(mean(v[0])); }).tol(kSum, DTol::exact())
            .suites(kDevice));
  // Gradient checks.
  const std::pair<const char*, Fn> gc[] = {
      {"sum_all", [](const Inputs& v) { return one(sum(v[0])); }},
      {"mean_all", [](const Inputs& v) { return one(mean(v[0])); }},
      {"sum_dim1", [](const Inputs& v) { return one(sum(v[0], {1})); }},
      {"mean_dims0_2_keepdim", [](const Inputs& v) { return one(mean(v[0], {0, 2}, true)); }},
      {"sum_dims2_0", [](const Inputs& v) { return one(sum(v[0], {2, 0})); }},
  };
  for (const auto& [name, f] : gc)
    t.add(Case(std::string("gradcheck_") + name + "_2x3x4").in(uniform({2, 3, 4})).fn(f)
              .suites(kGradcheck));
  t.add(Case("gradcheck_cuda_mean_square_dim0_3x5").in(uniform({3, 5}))
            .fn([](const Inputs& v) { return one(mean(square(v[0]), {0})); })
            .suites(kGradcheckCuda));

  // argmax: ties go to the lowest index as on the CPU (few distinct values: many ties).
  const std::pair<Shape, int64_t> am[] = {{{7}, 0},      {{33, 10}, 1},   {{5, 100}, -1},
                                          {{3, 1500}, 1}, {{33, 10}, 0},  {{2, 7, 33}, 1},
                                          {{1, 1}, 0}};
  for (const auto& [s, d] : am)
    for (bool tied : {false, true}) {
      const int64_t dim = d;
      t.add(Case("argmax_" + dims(s) + "_dim" + num(static_cast<double>(dim)) +
                 (tied ? "_ties" : ""))
                .in(tied ? ties(s, -2.0, 2.0, false) : uniform(s, -2.0, 2.0, false))
                .with_seed(31)
                .fn([dim](const Inputs& v) { return one(argmax(v[0], dim)); })
                .suites(kDevice));
    }
  // NaNs: the CPU's scan `x[l] > x[best]` skips them, unless the first element is NaN.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> rows = {nan, 5,   1,   2,   1,  nan, 3,  0,
                                    nan, nan, nan, nan, -1, -1,  -1, -1};
  for (int64_t dim : {1, 0})
    t.add(Case(std::string("argmax_nan_") + (dim ? "rows" : "cols"))
              .in(values(rows, {4, 4}, false))
              .fn([dim](const Inputs& v) { return one(argmax(v[0], dim)); })
              .suites(kDevice));
}

std::vector<Variant> hand_and_vendor() {
  return {
      {"hand", [] { testing::enter_kernels(Impl::Hand); }, [] { testing::leave_kernels(); }},
      {"vendor", [] { testing::enter_kernels(Impl::Vendor); }, [] { testing::leave_kernels(); }}};
}

void matmul_transpose_softmax(Table& t) {
  // Our GEMM and cuBLAS (the simulated one under the simulator), every transpose.
  struct Mnk {
    int64_t m, n, k;
  };
  for (const Mnk& s : {Mnk{1, 1, 1}, Mnk{7, 1, 33}, Mnk{33, 130, 7}, Mnk{130, 33, 257},
                       Mnk{257, 7, 130}})
    for (int tr = 0; tr < 4; ++tr) {
      const bool ta = tr & 1, tb = tr & 2;
      t.add(Case("matmul_m" + std::to_string(s.m) + "_n" + std::to_string(s.n) + "_k" +
                 std::to_string(s.k) + (ta ? "_At" : "") + (tb ? "_Bt" : ""))
                .in(uniform(ta ? Shape{s.k, s.m} : Shape{s.m, s.k}))
                .in(uniform(tb ? Shape{s.n, s.k} : Shape{s.k, s.n}))
                .with_seed(41)
                .fn([=](const Inputs& v) { return one(matmul(v[0], v[1], ta, tb)); })
                .tol(kSum)
                .variants(hand_and_vendor())
                .suites(kDevice | kAutocastCuda));
    }
  for (int tr = 0; tr < 4; ++tr) {
    const bool ta = tr & 1, tb = tr & 2;
    t.add(Case(std::string("gradcheck_matmul_3x4x5") + (ta ? "_At" : "") + (tb ? "_Bt" : ""))
              .in(uniform(ta ? Shape{4, 3} : Shape{3, 4}))
              .in(uniform(tb ? Shape{5, 4} : Shape{4, 5}))
              .fn([=](const Inputs& v) { return one(matmul(v[0], v[1], ta, tb)); })
              .suites(kGradcheck));
  }
  t.add(Case("gradcheck_cuda_matmul_3x5x4").in(uniform({3, 5})).in(uniform({5, 4}))
            .fn([](const Inputs& v) { return one(matmul(v[0], v[1])); })
            .suites(kGradcheckCuda));
  t.add(Case("gradcheck_cuda_div_3x5_by_row").in(uniform({3, 5})).in(uniform({5}, 0.5, 1.5))
            .fn([](const Inputs& v) { return one(div(v[0], v[1])); })
            .suites(kGradcheckCuda));

  // (A, D0, B, D1, C): C == 1 takes the tiled kernel, C > 1 the gather, d0 == d1 a copy.
  struct Tr {
    Shape shape;
    int64_t d0, d1;
  };
  for (const Tr& c : {Tr{{7, 33}, 0, 1}, Tr{{33, 130}, 1, 0}, Tr{{3, 130, 5}, 0, 1},
                      Tr{{3, 130, 5}, 0, 2}, Tr{{3, 130, 5}, 1, 2}, Tr{{2, 3, 4, 5}, 1, 3},
                      Tr{{2, 3, 4, 5}, 0, 2}, Tr{{2, 3, 4, 5}, 2, 2}, Tr{{1, 1}, 0, 1},
                      Tr{{257, 40}, -1, -2}}) {
    const int64_t d0 = c.d0, d1 = c.d1;
    t.add(Case("transpose_" + dims(c.shape) + "_" + num(static_cast<double>(d0)) + "_" +
               num(static_cast<double>(d1)))
              .in(uniform(c.shape))
              .with_seed(51)
              .fn([=](const Inputs& v) { return one(transpose(v[0], d0, d1)); })
              .suites(kDevice));
  }
  t.add(Case("gradcheck_transpose_2x3x4_0_2").in(uniform({2, 3, 4}))
            .fn([](const Inputs& v) { return one(transpose(v[0], 0, 2)); }).suites(kGradcheck));
  t.add(Case("gradcheck_reshape_2x3x4_to_6x4").in(uniform({2, 3, 4}))
            .fn([](const Inputs& v) { return one(v[0].reshape({6, 4})); }).suites(kGradcheck));
  t.add(Case("gradcheck_to_cpu1_2x3x4").in(uniform({2, 3, 4}))
            .fn([](const Inputs& v) { return one(v[0].to("cpu:1")); }).suites(kGradcheck));

  // Rows of 1, short rows (a warp each), rows longer than 1024 (a block each), and softmax
  // over a middle or first dim (one thread per column). Logits of +-60: without the max
  // subtraction exp would overflow in float.
  for (const auto& [s, d] : {std::pair<Shape, int64_t>{{1, 1}, -1}, {{7, 10}, -1},
                             {{33, 1000}, 1}, {{3, 3000}, -1}, {{2, 5, 7}, 1}, {{5, 33}, 0},
                             {{257}, 0}})
    for (bool lg : {false, true}) {
      const int64_t dim = d;
      t.add(Case(std::string(lg ? "log_softmax_" : "softmax_") + dims(s) + "_dim" +
                 num(static_cast<double>(dim)))
                .in(uniform(s, -60.0, 60.0))
                .with_seed(61)
                .fn([=](const Inputs& v) {
                  return one(lg ? log_softmax(v[0], dim) : softmax(v[0], dim));
                })
                .tol(kSum)
                .suites(kDevice));
    }
  const std::tuple<const char*, Shape, int64_t, bool> sm[] = {
      {"softmax_3x5_dimlast", {3, 5}, -1, false},   {"log_softmax_3x5_dimlast", {3, 5}, -1, true},
      {"softmax_2x3x4_dim1", {2, 3, 4}, 1, false}, {"log_softmax_2x3x4_dim0", {2, 3, 4}, 0, true}};
  for (const auto& [name, s, d, lg] : sm) {
    const int64_t dim = d;
    const bool l = lg;
    t.add(Case(std::string("gradcheck_") + name).in(uniform(s, -3.0, 3.0))
              .fn([=](const Inputs& v) { return one(l ? log_softmax(v[0], dim) : softmax(v[0], dim)); })
              .suites(kGradcheck));
  }
  t.add(Case("gradcheck_cuda_log_softmax_3x5_dim1").in(uniform({3, 5}))
            .fn([](const Inputs& v) { return one(log_softmax(v[0], 1)); }).suites(kGradcheckCuda));
  t.add(Case("gradcheck_cuda_softmax_3x5_dim0").in(uniform({3, 5}))
            .fn([](const Inputs& v) { return one(softmax(v[0], 0)); }).suites(kGradcheckCuda));
}

}  // namespace

// Defined in parity_layers.cpp.
// dtype conversion into and out of f16 and bf16 (Tensor::to, fill): one integer rule per element
// on both devices (engine/host_device.h), so the CPU (vectorised) and cuda:0 give the same bits,
// NaN payloads included. The f64 runs take the double -> f16/bf16 path (rounded once).
// 16-bit activations (kLowPrecision, kLowPrecisionCuda; the header comment of parity_cases.h):
// the elementwise ops, a residual join (x used twice: its gradients accumulate in 16 bits),
// and the reductions, whose results are f32. Sizes cross the CPU's 1024-element blocks and
// leave a tail after the CUDA kernels' 8-element vectors.
void low_precision(Table& t) {
  constexpr unsigned kLp = kLowPrecision | kLowPrecisionCuda;
  t.add(Case("lp_add_5x411").in(uniform({5, 411})).in(uniform({5, 411}))
            .fn([](const Inputs& v) { return one(add(v[0], v[1])); })
            .low_precision({0, 1}).suites(kLp));
  t.add(Case("lp_sub_scalar_5x411").in(uniform({5, 411})).in(uniform({1}))
            .fn([](const Inputs& v) { return one(sub(v[0], v[1])); })
            .low_precision({0, 1}).suites(kLp));
  t.add(Case("lp_add_row_7x40").in(uniform({7, 40})).in(uniform({40}))
            .fn([](const Inputs& v) { return one(add(v[0], v[1])); })
            .low_precision({0, 1}).suites(kLp));
  t.add(Case("lp_mul_3x1029").in(uniform({3, 1029}, -3.0, 3.0)).in(uniform({3, 1029}, -3.0, 3.0))
            .fn([](const Inputs& v) { return one(mul(v[0], v[1])); })
            .low_precision({0, 1}).suites(kLp));
  t.add(Case("lp_add_relu_2x8x9x9").in(uniform({2, 8, 9, 9})).in(uniform({2, 8, 9, 9}))
            .fn([](const Inputs& v) { return one(add_relu(v[0], v[1])); })
            .low_precision({0, 1}).suites(kLp));
  t.add(Case("lp_add_relu_channels_last_2x8x9x9").in(uniform({2, 8, 9, 9})).in(uniform({2, 8, 9, 9}))
            .fn([](const Inputs& v) {
              // Computed channels-last (a's format), compared in NCHW.
              const MemoryFormat cl = MemoryFormat::ChannelsLast;
              return one(add_relu(v[0].to(cl), v[1].to(cl)).contiguous());
            })
            .low_precision({0, 1}).suites(kLp));
  t.add(Case("lp_relu_3001").in(uniform({3001}))
            .fn([](const Inputs& v) { return one(relu(v[0])); }).suites(kLp));
  // One op per row: a chain would round between its ops, where the reference rounds once.
  t.add(Case("lp_mul_scalar_3001").in(uniform({3001}))
            .fn([](const Inputs& v) { return one(mul(v[0], 0.3)); }).suites(kLp));
  t.add(Case("lp_add_scalar_3001").in(uniform({3001}))
            .fn([](const Inputs& v) { return one(add(v[0], -0.25)); }).suites(kLp));
  t.add(Case("lp_neg_3001").in(uniform({3001}))
            .fn([](const Inputs& v) { return one(neg(v[0])); }).suites(kLp));
  // x feeds both the block and the skip: y = relu(relu(x * 0.5) + x).
  t.add(Case("lp_residual_2x8x9x9").in(uniform({2, 8, 9, 9}))
            .fn([](const Inputs& v) { return one(add_relu(relu(mul(v[0], 0.5)), v[0])); })
            .suites(kLp));
  // Reductions: f32 results; the gradient in the input's dtype.
  t.add(Case("lp_sum_all_3x130x7").in(uniform({3, 130, 7}))
            .fn([](const Inputs& v) { return one(sum(v[0])); }).suites(kLp));
  t.add(Case("lp_mean_all_3x130x7").in(uniform({3, 130, 7}))
            .fn([](const Inputs& v) { return one(mean(v[0])); }).suites(kLp));
  t.add(Case("lp_sum_dim1_keepdim_4x33x5").in(uniform({4, 33, 5}))
            .fn([](const Inputs& v) { return one(sum(v[0], {1}, true)); }).suites(kLp));
  // The ResNet head's two forms: NCHW over {2, 3}, and the (N, HW, C) view over dim 1.
  t.add(Case("lp_mean_dims23_2x16x7x7").in(uniform({2, 16, 7, 7}))
            .fn([](const Inputs& v) { return one(mean(v[0], {2, 3})); }).suites(kLp));
  t.add(Case("lp_mean_nhwc_dim1_2x49x16").in(uniform({2, 49, 16}))
            .fn([](const Inputs& v) { return one(mean(v[0], {1})); }).suites(kLp));
}

void dtype_conversions(Table& t) {
  auto all = [](const Tensor& x) {
    const DType dt = x.dtype();
    return Outputs{x.to(DType::F16),
                   x.to(DType::BF16),
                   x.to(DType::F16).to(dt),
                   x.to(DType::BF16).to(dt),
                   x.to(DType::F16).to(DType::BF16),
                   x.to(DType::BF16).to(DType::F16)};
  };
  // 70000: the grid-stride loop; odd lengths: the vector loops' scalar tails.
  for (const Shape& s : {Shape{7}, Shape{33, 5}, Shape{70000}}) {
    t.add(Case("to_f16_bf16_" + dims(s))
              .in(uniform(s, -2.0, 2.0, /*grad=*/false))
              .fn([all](const Inputs& v) { return all(v[0]); })
              .tol(DTol::exact())
              .suites(kDevice));
    t.add(Case("to_f16_bf16_wide_" + dims(s))  // past f16's range: infinities
              .in(uniform(s, -1e5, 1e5, /*grad=*/false))
              .fn([all](const Inputs& v) { return all(v[0]); })
              .tol(DTol::exact())
              .suites(kDevice));
  }
  const double inf = std::numeric_limits<double>::infinity();
  t.add(Case("to_f16_bf16_specials")
            .in(values({0.0, -0.0, 1.0, -1.0, 1.0 + 0x1p-11, 1.0 + 3 * 0x1p-11,
                        1.0 + 0x1p-11 + 0x1p-40, 1.0 + 0x1p-8, 1.0 + 3 * 0x1p-8, 65504.0, 65519.0,
                        65520.0, -70000.0, 0x1p-14, 0x1p-24, 0x1p-25, 3 * 0x1p-25, 1e-40, -1e-39,
                        0x1p-133, 3.3e38, 3.4e38, 1e300, inf, -inf,
                        std::numeric_limits<double>::quiet_NaN()},
                       {26}, /*grad=*/false))
            .fn([all](const Inputs& v) {
              Outputs out = all(v[0]);
              const Device d = v[0].device();
              out.push_back(Tensor::full({5}, 0.1, DType::F16, d));
              out.push_back(Tensor::full({5}, -0.0, DType::BF16, d));
              out.push_back(Tensor::full({3}, 1e6, DType::F16, d));
              out.push_back(Tensor::zeros({3}, DType::BF16, d));
              return out;
            })
            .tol(DTol::exact())
            .suites(kDevice));
  t.add(Case("i64_to_f16_bf16")
            .in(targets(300, 70000))
            .fn([](const Inputs& v) {
              return Outputs{v[0].to(DType::F16), v[0].to(DType::BF16),
                             v[0].to(DType::BF16).to(DType::I64)};
            })
            .tol(DTol::exact())
            .dtypes({DType::F32})
            .suites(kDevice));
}

void add_layer_rows(std::vector<Case>& rows);

const std::vector<Case>& cases() {
  static const std::vector<Case> table = [] {
    Table t;
    elementwise(t);
    fused_add_relu(t);
    reductions(t);
    matmul_transpose_softmax(t);
    dtype_conversions(t);
    low_precision(t);
    add_layer_rows(t.rows);
    return t.rows;
  }();
  return table;
}

std::vector<Case> cases_in(Suite s) {
  std::vector<Case> out;
  for (const Case& c : cases()) {
    const bool in_f32 = std::find(c.dtype_list.begin(), c.dtype_list.end(), DType::F32) !=
                        c.dtype_list.end();
    if (c.has(s) || (s == kAutocast && in_f32)) out.push_back(c);
  }
  return out;
}

}  // namespace kiln::parity
