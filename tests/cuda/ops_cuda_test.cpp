// ops_cuda_test.cpp: every core op of engine/ops.h on cuda:0 against the CPU, forward and
// backward (through autograd), in float and double, on odd shapes (1, 7, 33, 130, 257: not
// multiples of a warp or a tile), plus gradient checks of CUDA ops in double. add_relu also
// against relu(add) on the device, and on the special values (signed zeros, infinities, NaN).
//
// Tolerances. Bit-identical where both devices do the same single IEEE operation per element:
// + - * / (also broadcast), neg, square, relu, add_relu, the scalar ops, transpose (a copy),
// argmax, and the expand of the sum's backward. exp and log come from different math
// libraries (within 2 ulp). Sums, softmax and matmul add in a different order on the GPU (a tree instead of a
// left-to-right loop): compared relative to the tensor's scale (engine_parity.h: near),
// 2e-5 in float and 1e-12 in double.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "engine/autograd.h"
#include "engine/impl.h"
#include "engine/ops.h"
#include "support/cuda_skip.h"
#include "support/gradcheck.h"
#include "engine_parity.h"

namespace kiln {
namespace {

using testing::bit_identical;
using testing::kCpu;
using testing::kCuda;
using testing::leaf_on;
using testing::near;
using testing::random_tensor;
using testing::sum_rtol;

const DType kFloatTypes[] = {DType::F32, DType::F64};

std::string tag(const std::string& what, DType dtype) { return what + " " + dtype_name(dtype); }

// How a result is compared: bit for bit, or near() with the dtype's sum tolerance.
enum class Match { Exact, Near };

::testing::AssertionResult matches(Match m, const std::string& what, const Tensor& got,
                                   const Tensor& want) {
  if (got.defined() && got.device() != kCuda)
    return ::testing::AssertionFailure() << what << ": result on " << got.device().str();
  return m == Match::Exact ? bit_identical(what, got, want)
                           : near(what, got, want, sum_rtol(want.dtype()));
}

// Runs f on CPU and on cuda:0 copies of `inputs` (all made leaves requiring grad); compares the
// outputs, then the gradients of sum(f(x) * w) for a fixed random w.
void check_op(const std::string& what, const std::function<Tensor(const std::vector<Tensor>&)>& f,
              const std::vector<Tensor>& inputs, Match forward, Match backward) {
  std::vector<Tensor> on_cpu, on_cuda;
  for (const Tensor& x : inputs) {
    on_cpu.push_back(leaf_on(x, kCpu));
    on_cuda.push_back(leaf_on(x, kCuda));
  }
  const Tensor y_cpu = f(on_cpu), y_cuda = f(on_cuda);
  ASSERT_TRUE(matches(forward, what + " forward", y_cuda, y_cpu));
  const Tensor w = random_tensor(y_cpu.shape(), 77, -1.0, 1.0, y_cpu.dtype());
  sum(mul(y_cpu, w)).backward();
  sum(mul(y_cuda, w.to(kCuda))).backward();
  for (size_t i = 0; i < inputs.size(); ++i) {
    ASSERT_TRUE(on_cuda[i].grad().defined()) << what << ": input " << i << " got no gradient";
    EXPECT_TRUE(matches(backward, what + " grad of input " + std::to_string(i), on_cuda[i].grad(),
                        on_cpu[i].grad()));
  }
}

// ---- Elementwise ----------------------------------------------------------------------------

// Values of magnitude in [0.5, 2], alternating in sign: safe divisors.
Tensor away_from_zero(const Shape& shape, uint32_t seed, DType dtype) {
  std::vector<double> v = random_tensor(shape, seed, 0.5, 2.0).to_vector<double>();
  for (size_t i = 0; i < v.size(); i += 2) v[i] = -v[i];
  return Tensor::from_vector(v, shape).to(dtype);
}

struct BinaryCase {
  const char* name;
  Tensor (*op)(const Tensor&, const Tensor&);
};
const BinaryCase kBinary[] = {{"add", add}, {"sub", sub}, {"mul", mul}, {"div", div}};

TEST(OpsCuda, BinarySameScalarRow) {
  KILN_SKIP_WITHOUT_CUDA();
  const Shape shapes[] = {{1}, {7}, {33, 5}, {3, 130}, {2, 3, 257}};
  for (DType dt : kFloatTypes) {
    for (const Shape& s : shapes) {
      const Tensor a = random_tensor(s, 1, -2.0, 2.0, dt);
      const Shape row{s.back()};
      const Tensor bs[] = {away_from_zero(s, 2, dt), away_from_zero({1}, 4, dt),
                           away_from_zero(row, 6, dt)};
      const char* kinds[] = {"same", "scalar", "row"};
      for (const BinaryCase& op : kBinary)
        for (int k = 0; k < 3; ++k) {
          // The backward of a broadcast sums over the broadcast dims: a reduction (Near).
          const Match bwd = k == 0 ? Match::Exact : Match::Near;
          check_op(tag(std::string(op.name) + " " + kinds[k] + " " + shape_str(s), dt),
                   [&](const std::vector<Tensor>& in) { return op.op(in[0], in[1]); },
                   {a, bs[k]}, Match::Exact, op.op == div ? Match::Near : bwd);
        }
    }
  }
}

TEST(OpsCuda, UnaryAndScalarOps) {
  KILN_SKIP_WITHOUT_CUDA();
  using Fn = std::function<Tensor(const Tensor&)>;
  struct Case {
    const char* name;
    Fn f;
    Match fwd, bwd;
    bool positive;  // inputs in (0.1, 3): log
  };
  const Case cases[] = {
      {"neg", [](const Tensor& x) { return neg(x); }, Match::Exact, Match::Exact, false},
      {"square", [](const Tensor& x) { return square(x); }, Match::Exact, Match::Exact, false},
      {"relu", [](const Tensor& x) { return relu(x); }, Match::Exact, Match::Exact, false},
      {"add_scalar", [](const Tensor& x) { return add(x, 0.3); }, Match::Exact, Match::Exact, false},
      {"mul_scalar", [](const Tensor& x) { return mul(x, -1.7); }, Match::Exact, Match::Exact, false},
      {"exp", [](const Tensor& x) { return exp(x); }, Match::Near, Match::Near, false},
      {"log", [](const Tensor& x) { return log(x); }, Match::Near, Match::Near, true},
  };
  const Shape shapes[] = {{1}, {7}, {33, 5}, {2, 3, 257}, {70000}};  // 70000: grid-stride loop
  for (DType dt : kFloatTypes)
    for (const Shape& s : shapes)
      for (const Case& c : cases) {
        Tensor x = c.positive ? random_tensor(s, 11, 0.1, 3.0, dt) : random_tensor(s, 11, -2.0, 2.0, dt);
        check_op(tag(std::string(c.name) + " " + shape_str(s), dt),
                 [&](const std::vector<Tensor>& in) { return c.f(in[0]); }, {x}, c.fwd, c.bwd);
      }
}

TEST(OpsCuda, ReluKeepsZerosAndSignsExactly) {
  KILN_SKIP_WITHOUT_CUDA();
  const std::vector<float> v = {-1.0f, -0.0f, 0.0f, 1e-30f, -1e-30f, 3.5f, -std::numeric_limits<float>::infinity()};
  const Tensor x = Tensor::from_vector(v, {static_cast<int64_t>(v.size())});
  check_op("relu specials", [](const std::vector<Tensor>& in) { return relu(in[0]); }, {x},
           Match::Exact, Match::Exact);
}

// ---- add_relu -------------------------------------------------------------------------------

// a and b in [-2, 2) with b = -a at every 7th element (the sum is exactly 0: the ReLU's tie).
std::vector<Tensor> add_relu_operands(const Shape& s, uint32_t seed, DType dt) {
  const Tensor a = random_tensor(s, seed, -2.0, 2.0);
  std::vector<double> bv = random_tensor(s, seed + 1, -2.0, 2.0).to_vector<double>();
  const std::vector<double> av = a.to_vector<double>();
  for (size_t i = 0; i < bv.size(); i += 7) bv[i] = -av[i];
  return {a.to(dt), Tensor::from_vector(bv, s).to(dt)};
}

// relu(a + b) in one kernel: one + and one compare per element, so bit-identical to the CPU
// forward and backward (the mask y > 0 and, for add_relu(x, x), the sum of the two edges).
// Sizes just above a warp (33), a block (257), several blocks (65,537 = 256 * 256 + 1), and
// once, in float, 2,097,153 = 8192 blocks x 256 threads + 1: the grid is capped there, so one
// thread takes a second element (the grid-stride loop; ~1 s in the simulator).
TEST(OpsCuda, AddReluForwardBackward) {
  KILN_SKIP_WITHOUT_CUDA();
  const Shape shapes[] = {{1}, {33}, {257}, {2, 3, 257}, {65537}};
  const Shape grid_stride{2097153};
  check_op(tag("add_relu " + shape_str(grid_stride), DType::F32),
           [](const std::vector<Tensor>& in) { return add_relu(in[0], in[1]); },
           add_relu_operands(grid_stride, 90, DType::F32), Match::Exact, Match::Exact);
  for (DType dt : kFloatTypes)
    for (const Shape& s : shapes) {
      const std::vector<Tensor> ab = add_relu_operands(s, 91, dt);
      check_op(tag("add_relu " + shape_str(s), dt),
               [](const std::vector<Tensor>& in) { return add_relu(in[0], in[1]); }, ab,
               Match::Exact, Match::Exact);
      check_op(tag("add_relu(x, x) " + shape_str(s), dt),
               [](const std::vector<Tensor>& in) { return add_relu(in[0], in[0]); }, {ab[0]},
               Match::Exact, Match::Exact);
      // The fused op is the composition on the device too.
      const Tensor a = ab[0].to(kCuda), b = ab[1].to(kCuda);
      EXPECT_TRUE(bit_identical(tag("add_relu vs relu(add) " + shape_str(s), dt), add_relu(a, b),
                                relu(add(a, b))));
    }
}

TEST(OpsCuda, AddReluSpecialValuesExactly) {
  KILN_SKIP_WITHOUT_CUDA();
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  // -0 + -0 = -0 (relu gives +0), inf + -inf = NaN (relu gives 0), NaN operands, tiny sums.
  const std::vector<double> av = {-0.0, 0.0, -0.0, inf, inf, -inf, nan, 1.0, 1e-30, -1e-30, 3.5};
  const std::vector<double> bv = {-0.0, -0.0, 0.0, -inf, 2.0, 1.0, 1.0, nan, 1e-30, 1e-31, -3.5};
  const Shape s{static_cast<int64_t>(av.size())};
  for (DType dt : kFloatTypes)
    check_op(tag("add_relu specials", dt),
             [](const std::vector<Tensor>& in) { return add_relu(in[0], in[1]); },
             {Tensor::from_vector(av, s).to(dt), Tensor::from_vector(bv, s).to(dt)},
             Match::Exact, Match::Exact);
}

TEST(OpsCuda, AddReluErrors) {
  KILN_SKIP_WITHOUT_CUDA();
  const Tensor g = Tensor::ones({2, 3}, DType::F32, kCuda);
  EXPECT_THROW(add_relu(g, Tensor::ones({2, 3})), Error);                    // devices
  EXPECT_THROW(add_relu(g, Tensor::ones({3}, DType::F32, kCuda)), Error);    // no broadcast
  EXPECT_THROW(add_relu(g, Tensor::ones({2, 3}, DType::F64, kCuda)), Error); // dtypes
}

// ---- Reductions -----------------------------------------------------------------------------

TEST(OpsCuda, SumAndMeanOverDims) {
  KILN_SKIP_WITHOUT_CUDA();
  struct Case {
    Shape shape;
    std::vector<int64_t> dims;
    bool keepdim;
  };
  // Rows (reduced dim last) short and long, columns (reduced dim in the middle or first),
  // and shapes large enough that the kernels split the reduction into pieces.
  const Case cases[] = {
      {{7}, {0}, false},          {{33, 5}, {0}, false},       {{33, 5}, {1}, true},
      {{33, 5}, {0, 1}, false},   {{2, 3, 257}, {1}, false},   {{2, 3, 257}, {0, 2}, true},
      {{2, 3, 257}, {-1}, false}, {{4, 1500}, {1}, false},     {{1, 70000}, {1}, false},
      {{5000, 3}, {0}, false},    {{3, 2000, 33}, {1}, false}, {{130, 1}, {0}, false},
  };
  for (DType dt : kFloatTypes)
    for (const Case& c : cases) {
      const Tensor x = random_tensor(c.shape, 21, -1.0, 1.0, dt);
      std::string dims;
      for (int64_t d : c.dims) dims += std::to_string(d) + ",";
      check_op(tag("sum " + shape_str(c.shape) + " dims " + dims, dt),
               [&](const std::vector<Tensor>& in) { return sum(in[0], c.dims, c.keepdim); }, {x},
               Match::Near, Match::Exact);
      check_op(tag("mean " + shape_str(c.shape) + " dims " + dims, dt),
               [&](const std::vector<Tensor>& in) { return mean(in[0], c.dims, c.keepdim); }, {x},
               Match::Near, Match::Exact);
    }
  for (DType dt : kFloatTypes) {
    const Tensor x = random_tensor({3, 130, 7}, 22, -1.0, 1.0, dt);
    check_op(tag("sum all", dt), [](const std::vector<Tensor>& in) { return sum(in[0]); }, {x},
             Match::Near, Match::Exact);
    check_op(tag("mean all", dt), [](const std::vector<Tensor>& in) { return mean(in[0]); }, {x},
             Match::Near, Match::Exact);
  }
}

TEST(OpsCuda, SumIsDeterministic) {
  KILN_SKIP_WITHOUT_CUDA();
  for (const Shape& s : {Shape{1, 200000}, Shape{20000, 7}}) {
    const Tensor x = random_tensor(s, 5, -1.0, 1.0, DType::F32).to(kCuda);
    const Tensor first = sum(x, {0, 1}), second = sum(x, {0, 1});
    EXPECT_TRUE(bit_identical("sum twice " + shape_str(s), second, first));
  }
}

TEST(OpsCuda, ArgmaxMatchesCpuIncludingTiesAndNaN) {
  KILN_SKIP_WITHOUT_CUDA();
  struct Case {
    Shape shape;
    int64_t dim;
  };
  const Case cases[] = {{{7}, 0},       {{33, 10}, 1},     {{5, 100}, -1}, {{3, 1500}, 1},
                        {{33, 10}, 0},  {{2, 7, 33}, 1},   {{1, 1}, 0}};
  for (DType dt : kFloatTypes)
    for (const Case& c : cases) {
      // Few distinct values: many ties, which must go to the lowest index as on the CPU.
      const Tensor x = random_tensor(c.shape, 31, -2.0, 2.0, dt);
      std::vector<double> v = x.to_vector<double>();
      for (double& e : v) e = std::floor(e);
      const Tensor ties = Tensor::from_vector(v, c.shape).to(dt);
      for (const Tensor& t : {x, ties}) {
        const std::string what = tag("argmax " + shape_str(c.shape) + " dim " + std::to_string(c.dim), dt);
        EXPECT_TRUE(bit_identical(what, argmax(t.to(kCuda), c.dim), argmax(t, c.dim)));
      }
    }
  // NaNs: the CPU's scan `x[l] > x[best]` skips them, unless the first element is NaN.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> rows = {nan, 5, 1,   2,  // row 0: NaN first -> 0
                                    1,   nan, 3, 0,  // row 1: NaN inside -> 2
                                    nan, nan, nan, nan,
                                    -1,  -1, -1, -1};
  for (DType dt : kFloatTypes) {
    const Tensor x = Tensor::from_vector(rows, {4, 4}).to(dt);
    EXPECT_TRUE(bit_identical(tag("argmax NaN rows", dt), argmax(x.to(kCuda), 1), argmax(x, 1)));
    EXPECT_TRUE(bit_identical(tag("argmax NaN cols", dt), argmax(x.to(kCuda), 0), argmax(x, 0)));
  }
}

// ---- Matmul and transpose -------------------------------------------------------------------

TEST(OpsCuda, MatmulForwardBackwardAllTransposes) {
  KILN_SKIP_WITHOUT_CUDA();
  struct Mnk {
    int64_t m, n, k;
  };
  const Mnk sizes[] = {{1, 1, 1}, {7, 1, 33}, {33, 130, 7}, {130, 33, 257}, {257, 7, 130}};
  // Our GEMM and cuBLAS (the simulated one under the simulator).
  for (Impl impl : {Impl::Hand, Impl::Vendor})
  for (DType dt : kFloatTypes)
    for (const Mnk& s : sizes)
      for (int t = 0; t < 4; ++t) {
        set_kernel_impl(impl);
        SCOPED_TRACE(impl_name(impl));
        const bool ta = t & 1, tb = t & 2;
        const Tensor a = random_tensor(ta ? Shape{s.k, s.m} : Shape{s.m, s.k}, 41, -1.0, 1.0, dt);
        const Tensor b = random_tensor(tb ? Shape{s.n, s.k} : Shape{s.k, s.n}, 42, -1.0, 1.0, dt);
        check_op(tag("matmul m" + std::to_string(s.m) + " n" + std::to_string(s.n) + " k" +
                         std::to_string(s.k) + (ta ? " A^T" : "") + (tb ? " B^T" : ""),
                     dt),
                 [&](const std::vector<Tensor>& in) { return matmul(in[0], in[1], ta, tb); },
                 {a, b}, Match::Near, Match::Near);
      }
  reset_kernel_impl();
}

TEST(OpsCuda, TransposeIsAnExactCopy) {
  KILN_SKIP_WITHOUT_CUDA();
  struct Case {
    Shape shape;
    int64_t d0, d1;
  };
  // (A, D0, B, D1, C): C == 1 takes the tiled kernel, C > 1 the gather, d0 == d1 a copy.
  const Case cases[] = {{{7, 33}, 0, 1},     {{33, 130}, 1, 0},    {{3, 130, 5}, 0, 1},
                        {{3, 130, 5}, 0, 2}, {{3, 130, 5}, 1, 2},  {{2, 3, 4, 5}, 1, 3},
                        {{2, 3, 4, 5}, 0, 2}, {{2, 3, 4, 5}, 2, 2}, {{1, 1}, 0, 1},
                        {{257, 40}, -1, -2}};
  for (DType dt : kFloatTypes)
    for (const Case& c : cases) {
      const Tensor x = random_tensor(c.shape, 51, -1.0, 1.0, dt);
      check_op(tag("transpose " + shape_str(c.shape) + " " + std::to_string(c.d0) + "," +
                       std::to_string(c.d1),
                   dt),
               [&](const std::vector<Tensor>& in) { return transpose(in[0], c.d0, c.d1); }, {x},
               Match::Exact, Match::Exact);
    }
}

// ---- Softmax --------------------------------------------------------------------------------

TEST(OpsCuda, SoftmaxAndLogSoftmax) {
  KILN_SKIP_WITHOUT_CUDA();
  struct Case {
    Shape shape;
    int64_t dim;
  };
  // Rows of 1, short rows (a warp each), rows longer than 1024 (a block each), and softmax over
  // a middle or first dim (one thread per column).
  const Case cases[] = {{{1, 1}, -1},   {{7, 10}, -1},   {{33, 1000}, 1}, {{3, 3000}, -1},
                        {{2, 5, 7}, 1}, {{5, 33}, 0},    {{257}, 0}};
  for (DType dt : kFloatTypes)
    for (const Case& c : cases) {
      // Large logits: without the max subtraction exp would overflow in float.
      const Tensor x = random_tensor(c.shape, 61, -60.0, 60.0, dt);
      for (bool lg : {false, true}) {
        check_op(tag(std::string(lg ? "log_softmax " : "softmax ") + shape_str(c.shape) +
                         " dim " + std::to_string(c.dim),
                     dt),
                 [&](const std::vector<Tensor>& in) {
                   return lg ? log_softmax(in[0], c.dim) : softmax(in[0], c.dim);
                 },
                 {x}, Match::Near, Match::Near);
      }
    }
}

// ---- Gradient checks of CUDA ops (double; inputs on the CPU, the op on cuda:0 through to()) --

TEST(OpsCuda, GradcheckThroughCuda) {
  KILN_SKIP_WITHOUT_CUDA();
  using testing::gradcheck;
  auto on_cuda = [](const Tensor& x) { return x.to(kCuda); };
  Tensor a = random_tensor({3, 5}, 71).set_requires_grad(true);
  Tensor b = random_tensor({5, 4}, 72).set_requires_grad(true);
  Tensor r = random_tensor({5}, 73, 0.5, 1.5).set_requires_grad(true);
  EXPECT_TRUE(gradcheck(
      [&](const std::vector<Tensor>& in) { return matmul(on_cuda(in[0]), on_cuda(in[1])).to(kCpu); },
      {a, b}));
  EXPECT_TRUE(gradcheck(
      [&](const std::vector<Tensor>& in) { return log_softmax(on_cuda(in[0]), 1).to(kCpu); }, {a}));
  EXPECT_TRUE(gradcheck(
      [&](const std::vector<Tensor>& in) { return softmax(on_cuda(in[0]), 0).to(kCpu); }, {a}));
  EXPECT_TRUE(gradcheck(
      [&](const std::vector<Tensor>& in) { return div(on_cuda(in[0]), on_cuda(in[1])).to(kCpu); },
      {random_tensor({3, 5}, 74).set_requires_grad(true), r}));
  EXPECT_TRUE(gradcheck(
      [&](const std::vector<Tensor>& in) { return mean(square(on_cuda(in[0])), {0}).to(kCpu); },
      {a}));
  // add_relu off its kink: b moved 0.2 away wherever |a + b| < 0.1.
  Tensor c = random_tensor({3, 5}, 75);
  {
    double* cv = c.data<double>();
    const std::vector<double> av = a.to_vector<double>();
    for (int64_t i = 0; i < c.numel(); ++i) {
      const double s = av[static_cast<size_t>(i)] + cv[i];
      if (std::fabs(s) < 0.1) cv[i] += s >= 0 ? 0.2 : -0.2;
    }
  }
  c.set_requires_grad(true);
  EXPECT_TRUE(gradcheck(
      [&](const std::vector<Tensor>& in) { return add_relu(on_cuda(in[0]), on_cuda(in[1])).to(kCpu); },
      {a, c}));
}

// ---- A second device -------------------------------------------------------------------------

TEST(OpsCuda, SecondDeviceGivesTheSameBits) {
  KILN_SKIP_WITHOUT_CUDA_DEVICES(2);
  // The same deterministic kernels on cuda:1 (each op sets the device of its inputs).
  const Device kCuda1(DeviceType::CUDA, 1);
  const Tensor a = random_tensor({33, 130}, 81, -1.0, 1.0, DType::F32);
  const Tensor b = random_tensor({130, 7}, 82, -1.0, 1.0, DType::F32);
  auto run = [&](Device d) {
    const Tensor x = leaf_on(a, d), y = leaf_on(b, d);
    const Tensor out = sum(log_softmax(matmul(x, y), 1), {0});
    sum(mul(out, out)).backward();
    EXPECT_EQ(out.device(), d);
    EXPECT_EQ(x.grad().device(), d);
    return std::vector<Tensor>{out, x.grad(), y.grad(), argmax(transpose(x, 0, 1), 1)};
  };
  const std::vector<Tensor> on0 = run(kCuda), on1 = run(kCuda1);
  for (size_t i = 0; i < on0.size(); ++i)
    EXPECT_TRUE(bit_identical("result " + std::to_string(i) + " on cuda:1", on1[i], on0[i]));
}

// ---- Errors ---------------------------------------------------------------------------------

TEST(OpsCuda, MixedDevicesAreAnError) {
  KILN_SKIP_WITHOUT_CUDA();
  const Tensor c = Tensor::ones({2, 3});
  const Tensor g = Tensor::ones({2, 3}, DType::F32, kCuda);
  const Tensor one = Tensor::ones({1});
  EXPECT_THROW(add(c, g), Error);
  EXPECT_THROW(mul(g, one), Error);  // even a one-element scalar must be on the same device
  EXPECT_THROW(matmul(g, c, false, true), Error);
  try {
    sub(g, c);
    FAIL() << "sub of a cuda and a cpu tensor did not throw";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("cuda:0"), std::string::npos) << msg;
    EXPECT_NE(msg.find("cpu"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace kiln
