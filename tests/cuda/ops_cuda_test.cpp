// ops_cuda_test.cpp: what the parity table (tests/parity) does not cover of the core ops on
// cuda:0: errors (add_relu's devices, shapes and dtypes; mixed devices), sums that give the same
// bits run after run, the same bits on a second device, and the 16-bit elementwise kernels'
// two paths (8 elements per 16-byte access where aligned, one at a time otherwise) against the
// CPU's, bit for bit, on offsets and lengths that exercise both and the tail.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/autograd.h"
#include "engine/cuda/runtime.h"
#include "engine/ops.h"
#include "engine/ops_cpu.h"
#include "engine/ops_cuda.h"
#include "parity/parity_harness.h"
#include "support/cuda_skip.h"
#include "support/gradcheck.h"

namespace kiln {
namespace {

using testing::bit_identical;
using testing::kCuda;
using testing::leaf_on;
using testing::random_tensor;

TEST(OpsCuda, AddReluErrors) {
  KILN_SKIP_WITHOUT_CUDA();
  const Tensor g = Tensor::ones({2, 3}, DType::F32, kCuda);
  EXPECT_THROW(add_relu(g, Tensor::ones({2, 3})), Error);                    // devices
  EXPECT_THROW(add_relu(g, Tensor::ones({3}, DType::F32, kCuda)), Error);    // no broadcast
  EXPECT_THROW(add_relu(g, Tensor::ones({2, 3}, DType::F64, kCuda)), Error); // dtypes
}

TEST(OpsCuda, SumIsDeterministic) {
  KILN_SKIP_WITHOUT_CUDA();
  for (const Shape& s : {Shape{1, 200000}, Shape{20000, 7}}) {
    const Tensor x = random_tensor(s, 5, -1.0, 1.0, DType::F32).to(kCuda);
    const Tensor first = sum(x, {0, 1}), second = sum(x, {0, 1});
    EXPECT_TRUE(bit_identical("sum twice " + shape_str(s), second, first));
  }
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

// ---- 16-bit elementwise kernels ----------------------------------------------------------------

// Runs each 16-bit kernel on elements [off, off + n) of buffers of n + 8 elements, on cuda:0
// and on the CPU; the whole buffers must match (the elements outside stay 0 on both).
template <typename T>
void check_lp_kernels(int64_t off, int64_t n) {
  const DType dt = dtype_of<T>::value;
  const int64_t len = n + 8;
  const Tensor a = random_tensor({len}, 91, -3.0, 3.0, dt), b = random_tensor({len}, 92, -3.0, 3.0, dt);
  const Tensor ac = a.to(kCuda), bc = b.to(kCuda);
  const std::string where = std::string(dtype_name(dt)) + " offset " + std::to_string(off) +
                            " n " + std::to_string(n);
  auto compare = [&](const std::string& what, auto&& run_gpu, auto&& run_cpu) {
    Tensor oc = Tensor::zeros({len}, dt, kCuda), oh = Tensor::zeros({len}, dt);
    run_gpu(ac.data<T>() + off, bc.data<T>() + off, oc.data<T>() + off);
    run_cpu(a.data<T>() + off, b.data<T>() + off, oh.data<T>() + off);
    EXPECT_TRUE(bit_identical(what + " " + where, oc, oh));
  };
  for (BinaryOp op : {BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::AddRelu}) {
    for (Broadcast kind : {Broadcast::Same, Broadcast::Scalar}) {
      compare(
          "binary " + std::to_string(static_cast<int>(op)) + "/" + std::to_string(static_cast<int>(kind)),
          [&](const T* x, const T* y, T* o) { cuda::binary(cuda::Backend{}, op, kind, x, y, o, n, 1); },
          [&](const T* x, const T* y, T* o) { cpu::binary(cpu::Backend{}, op, kind, x, y, o, n, 1); });
    }
  }
  for (UnaryOp op : {UnaryOp::Relu, UnaryOp::Neg, UnaryOp::MulScalar, UnaryOp::AddScalar}) {
    compare(
        "unary " + std::to_string(static_cast<int>(op)),
        [&](const T* x, const T*, T* o) { cuda::unary(cuda::Backend{}, op, x, o, n, 0.37f); },
        [&](const T* x, const T*, T* o) { cpu::unary(cpu::Backend{}, op, x, o, n, 0.37f); });
  }
  compare(
      "relu_backward",
      [&](const T* g, const T* y, T* o) { cuda::relu_backward(cuda::Backend{}, g, y, o, n); },
      [&](const T* g, const T* y, T* o) { cpu::relu_backward(cpu::Backend{}, g, y, o, n); });
}

TEST(OpsCuda, LowPrecisionKernelsMatchTheCpuOnBothPaths) {
  KILN_SKIP_WITHOUT_CUDA();
  // Offset 0: 16-byte aligned (the vector path); 1 and 3: not (one element at a time). Lengths:
  // less than one vector, exactly one, and many with a tail of 7.
  for (int64_t off : {int64_t{0}, int64_t{1}, int64_t{3}}) {
    for (int64_t n : {int64_t{3}, int64_t{8}, int64_t{8 * 700 + 7}}) {
      check_lp_kernels<Half>(off, n);
      check_lp_kernels<BFloat16>(off, n);
    }
  }
}

// sum and mean of a 16-bit tensor on cuda:0: an F32 result within f32 summation error of the
// CPU's (a different order: each of the `len` additions rounds by at most 2^-24 of the running
// magnitude, bounded by sum |x|), and the gradient in the input's dtype, equal to the CPU's
// bit for bit (the same f32 product rounded once).
TEST(OpsCuda, LowPrecisionSumAndMean) {
  KILN_SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::BF16, DType::F16}) {
    const Tensor x = random_tensor({4, 16, 9, 9}, 95, -2.0, 2.0, dt);
    for (int which = 0; which < 3; ++which) {
      auto f = [&](const Tensor& t) {
        if (which == 0) return sum(t);
        if (which == 1) return mean(t, {2, 3});
        return mean(t.reshape({4, 16, -1}), {2});
      };
      const Tensor xh = leaf_on(x, testing::kCpu), xc = leaf_on(x, kCuda);
      const Tensor yh = f(xh), yc = f(xc);
      ASSERT_EQ(yc.dtype(), DType::F32);
      const std::vector<double> h = yh.to_vector<double>(), c = yc.to(testing::kCpu).to_vector<double>();
      const std::vector<double> xv = x.to(DType::F64).to_vector<double>();
      double total = 0;
      for (double v : xv) total += std::fabs(v);
      for (size_t i = 0; i < h.size(); ++i)
        EXPECT_LE(std::fabs(h[i] - c[i]), static_cast<double>(xv.size()) * 0x1p-24 * total)
            << dtype_name(dt) << " reduction " << which << " element " << i;
      const Tensor dy = random_tensor(yh.shape(), 96, -1.0, 1.0, DType::F32);
      backward(yh, dy);
      backward(yc, dy.to(kCuda));
      ASSERT_EQ(xc.grad().dtype(), dt);
      EXPECT_TRUE(bit_identical(std::string("grad ") + dtype_name(dt), xc.grad(), xh.grad()));
    }
  }
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
