// sim_cudnn_test.cpp: the simulated cuDNN (engine/cuda/sim/cudnn.h): forward, backward-data and
// backward-filter convolutions against naive loops (padding, stride, dilation, true convolution,
// alpha and beta with beta = 0 over NaN, float and double, and half and bfloat16 computed in
// float), bias gradient and AddTensor; the algorithm lists (tensor-op entries, unsupported and
// non-deterministic ones), the workspace and TF32 rules of running an algorithm, Find*Ex;
// descriptor and range errors (16-bit data and compute type pairings too); the handle's stream.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "engine/cuda/dnn.h"
#include "engine/cuda/sim/library.h"
#include "engine/error.h"
#include "engine/host_device.h"
#include "sim_vendor_test_util.h"

namespace {

using kiln::sim_test::DeviceBuffer;
using kiln::sim_test::near_all;
using kiln::sim_test::random_values;

struct Conv {
  int n, c, h, w, k, r, s;
  int pad_h, pad_w, stride_h, stride_w, dil_h, dil_w;
  cudnnConvolutionMode_t mode;
  int p() const { return (h + 2 * pad_h - ((r - 1) * dil_h + 1)) / stride_h + 1; }
  int q() const { return (w + 2 * pad_w - ((s - 1) * dil_w + 1)) / stride_w + 1; }
  size_t x_size() const { return static_cast<size_t>(n) * c * h * w; }
  size_t w_size() const { return static_cast<size_t>(k) * c * r * s; }
  size_t y_size() const { return static_cast<size_t>(n) * k * p() * q(); }
};

const Conv kCases[] = {
    {2, 3, 7, 6, 4, 3, 3, 1, 1, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION},
    {1, 2, 9, 8, 3, 3, 2, 2, 0, 2, 3, 1, 1, CUDNN_CROSS_CORRELATION},
    {2, 2, 9, 9, 2, 3, 3, 2, 1, 1, 2, 2, 3, CUDNN_CROSS_CORRELATION},  // dilation
    {1, 3, 5, 5, 2, 3, 3, 1, 1, 2, 2, 1, 1, CUDNN_CONVOLUTION},        // flipped filter
    {3, 4, 4, 4, 5, 1, 1, 0, 0, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION},  // 1x1
};

// The input pixel that tap (r, s) of output (p, q) reads, or false in the padding.
bool tap(const Conv& g, int p, int q, int r, int s, int* h, int* w) {
  const int rr = g.mode == CUDNN_CONVOLUTION ? g.r - 1 - r : r;
  const int ss = g.mode == CUDNN_CONVOLUTION ? g.s - 1 - s : s;
  *h = p * g.stride_h - g.pad_h + rr * g.dil_h;
  *w = q * g.stride_w - g.pad_w + ss * g.dil_w;
  return *h >= 0 && *h < g.h && *w >= 0 && *w < g.w;
}

// The three passes as naive loops in double: out += products (callers start from 0).
template <typename T, typename Fn>
void for_each_product(const Conv& g, Fn fn) {
  for (int n = 0; n < g.n; ++n)
    for (int k = 0; k < g.k; ++k)
      for (int p = 0; p < g.p(); ++p)
        for (int q = 0; q < g.q(); ++q)
          for (int c = 0; c < g.c; ++c)
            for (int r = 0; r < g.r; ++r)
              for (int s = 0; s < g.s; ++s) {
                int h, w;
                if (!tap(g, p, q, r, s, &h, &w)) continue;
                const size_t xi = ((static_cast<size_t>(n) * g.c + c) * g.h + h) * g.w + w;
                const size_t wi = ((static_cast<size_t>(k) * g.c + c) * g.r + r) * g.s + s;
                const size_t yi = ((static_cast<size_t>(n) * g.k + k) * g.p() + p) * g.q() + q;
                fn(xi, wi, yi);
              }
}

// out = alpha v + beta out0 (out0 not read when beta is 0).
template <typename T>
std::vector<double> blend(const std::vector<double>& v, double alpha, double beta,
                          const std::vector<T>& out0) {
  std::vector<double> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = alpha * v[i] + (beta == 0 ? 0 : beta * out0[i]);
  return r;
}

// Descriptors for one case, destroyed with the object.
struct Descriptors {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  Descriptors(const Conv& g, cudnnDataType_t dt, cudnnMathType_t math = CUDNN_DEFAULT_MATH) {
    EXPECT_EQ(cudnnCreateTensorDescriptor(&x), CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(cudnnCreateTensorDescriptor(&y), CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(cudnnCreateFilterDescriptor(&w), CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(cudnnCreateConvolutionDescriptor(&conv), CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(cudnnSetTensor4dDescriptor(x, CUDNN_TENSOR_NCHW, dt, g.n, g.c, g.h, g.w),
              CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(cudnnSetTensor4dDescriptor(y, CUDNN_TENSOR_NCHW, dt, g.n, g.k, g.p(), g.q()),
              CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(cudnnSetFilter4dDescriptor(w, dt, CUDNN_TENSOR_NCHW, g.k, g.c, g.r, g.s),
              CUDNN_STATUS_SUCCESS);
    // 16-bit data computes in FLOAT (PSEUDO_HALF / BFLOAT16 configurations).
    const cudnnDataType_t compute =
        dt == CUDNN_DATA_HALF || dt == CUDNN_DATA_BFLOAT16 ? CUDNN_DATA_FLOAT : dt;
    EXPECT_EQ(cudnnSetConvolution2dDescriptor(conv, g.pad_h, g.pad_w, g.stride_h, g.stride_w,
                                              g.dil_h, g.dil_w, g.mode, compute),
              CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(cudnnSetConvolutionMathType(conv, math), CUDNN_STATUS_SUCCESS);
  }
  ~Descriptors() {
    (void)cudnnDestroyTensorDescriptor(x);
    (void)cudnnDestroyTensorDescriptor(y);
    (void)cudnnDestroyFilterDescriptor(w);
    (void)cudnnDestroyConvolutionDescriptor(conv);
  }
};

class SimCudnn : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(cudnnCreate(&handle_), CUDNN_STATUS_SUCCESS);
  }
  void TearDown() override {
    EXPECT_EQ(cudnnDestroy(handle_), CUDNN_STATUS_SUCCESS);
    (void)cudaSetDevice(0);
  }
  cudnnHandle_t handle_ = nullptr;
};

template <typename T>
constexpr cudnnDataType_t dtype() {
  return std::is_same_v<T, float> ? CUDNN_DATA_FLOAT : CUDNN_DATA_DOUBLE;
}

// All three passes of one case with beta 0 (over NaN) and beta 0.5, against the loops.
template <typename T>
void check_passes(cudnnHandle_t handle, const Conv& g, double rtol, uint32_t seed) {
  const Descriptors d(g, dtype<T>());
  const std::vector<T> x = random_values<T>(g.x_size(), seed), w = random_values<T>(g.w_size(), seed + 1);
  const std::vector<T> dy = random_values<T>(g.y_size(), seed + 2);
  std::vector<double> y_ref(g.y_size()), dx_ref(g.x_size()), dw_ref(g.w_size());
  for_each_product<T>(g, [&](size_t xi, size_t wi, size_t yi) {
    y_ref[yi] += static_cast<double>(w[wi]) * x[xi];
    dx_ref[xi] += static_cast<double>(w[wi]) * dy[yi];
    dw_ref[wi] += static_cast<double>(dy[yi]) * x[xi];
  });
  DeviceBuffer<T> dx_in(x), dw_in(w), ddy(dy);
  const std::string name = "case n" + std::to_string(g.n) + " c" + std::to_string(g.c) + " r" +
                           std::to_string(g.r) + " stride " + std::to_string(g.stride_h);
  for (double beta : {0.0, 0.5}) {
    const T alpha = static_cast<T>(1.5), b = static_cast<T>(beta);
    std::vector<T> y0 = random_values<T>(g.y_size(), seed + 3), dx0 = random_values<T>(g.x_size(), seed + 4),
                   dw0 = random_values<T>(g.w_size(), seed + 5);
    if (beta == 0)
      for (auto* v : {&y0, &dx0, &dw0}) std::fill(v->begin(), v->end(), std::numeric_limits<T>::quiet_NaN());
    DeviceBuffer<T> y(y0), dx(dx0), dw(dw0);
    ASSERT_EQ(cudnnConvolutionForward(handle, &alpha, d.x, dx_in.get(), d.w, dw_in.get(), d.conv,
                                      CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, nullptr, 0, &b,
                                      d.y, y.get()),
              CUDNN_STATUS_SUCCESS)
        << kiln::sim::last_library_error();
    ASSERT_EQ(cudnnConvolutionBackwardData(handle, &alpha, d.w, dw_in.get(), d.y, ddy.get(), d.conv,
                                           CUDNN_CONVOLUTION_BWD_DATA_ALGO_0, nullptr, 0, &b, d.x,
                                           dx.get()),
              CUDNN_STATUS_SUCCESS)
        << kiln::sim::last_library_error();
    ASSERT_EQ(cudnnConvolutionBackwardFilter(handle, &alpha, d.x, dx_in.get(), d.y, ddy.get(),
                                             d.conv, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0, nullptr,
                                             0, &b, d.w, dw.get()),
              CUDNN_STATUS_SUCCESS)
        << kiln::sim::last_library_error();
    EXPECT_TRUE(near_all(name + " y", y.download(), blend(y_ref, 1.5, beta, y0), rtol));
    EXPECT_TRUE(near_all(name + " dx", dx.download(), blend(dx_ref, 1.5, beta, dx0), rtol));
    EXPECT_TRUE(near_all(name + " dw", dw.download(), blend(dw_ref, 1.5, beta, dw0), rtol));
  }
}

TEST_F(SimCudnn, ConvolutionsMatchNaiveLoopsFloat) {
  uint32_t seed = 10;
  for (const Conv& g : kCases) check_passes<float>(handle_, g, 1e-5, seed += 10);
}

TEST_F(SimCudnn, ConvolutionsMatchNaiveLoopsDouble) {
  uint32_t seed = 100;
  for (const Conv& g : kCases) check_passes<double>(handle_, g, 1e-13, seed += 10);
}

// ---- 16-bit data: HALF and BFLOAT16, computed in float ----------------------------------------

uint16_t to_bits(cudnnDataType_t t, float v) {
  return t == CUDNN_DATA_HALF ? kiln::f32_to_f16(v) : kiln::f32_to_bf16(v);
}
double from_bits(cudnnDataType_t t, uint16_t b) {
  return t == CUDNN_DATA_HALF ? kiln::f16_to_f32(b) : kiln::bf16_to_f32(b);
}
std::vector<double> values_of(cudnnDataType_t t, const std::vector<uint16_t>& bits) {
  std::vector<double> v;
  for (uint16_t b : bits) v.push_back(from_bits(t, b));
  return v;
}
std::vector<uint16_t> random_bits(cudnnDataType_t t, size_t count, uint32_t seed) {
  std::vector<uint16_t> bits;
  for (float f : random_values<float>(count, seed)) bits.push_back(to_bits(t, f));
  return bits;
}

// All three passes of one case on 16-bit data (float scaling factors), beta 0 (over NaN) and
// 0.5, against the loops in double on the stored values. Each output is rounded once from its
// float result: within half an ulp, 2^-11 (half) or 2^-8 (bfloat16) relative.
void check_passes_16(cudnnHandle_t handle, const Conv& g, cudnnDataType_t dt, uint32_t seed) {
  const Descriptors d(g, dt, CUDNN_TENSOR_OP_MATH);
  const std::vector<uint16_t> x = random_bits(dt, g.x_size(), seed);
  const std::vector<uint16_t> w = random_bits(dt, g.w_size(), seed + 1);
  const std::vector<uint16_t> dy = random_bits(dt, g.y_size(), seed + 2);
  const std::vector<double> xv = values_of(dt, x), wv = values_of(dt, w), dyv = values_of(dt, dy);
  std::vector<double> y_ref(g.y_size()), dx_ref(g.x_size()), dw_ref(g.w_size());
  for_each_product<double>(g, [&](size_t xi, size_t wi, size_t yi) {
    y_ref[yi] += wv[wi] * xv[xi];
    dx_ref[xi] += wv[wi] * dyv[yi];
    dw_ref[wi] += dyv[yi] * xv[xi];
  });
  DeviceBuffer<uint16_t> dx_in(x), dw_in(w), ddy(dy);
  const std::string name = std::string(dt == CUDNN_DATA_HALF ? "half" : "bfloat16") + " case n" +
                           std::to_string(g.n) + " c" + std::to_string(g.c) + " r" +
                           std::to_string(g.r) + " stride " + std::to_string(g.stride_h);
  const double rtol = dt == CUDNN_DATA_HALF ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
  for (double beta : {0.0, 0.5}) {
    const float alpha = 1.5f, b = static_cast<float>(beta);
    std::vector<uint16_t> y0 = random_bits(dt, g.y_size(), seed + 3);
    std::vector<uint16_t> dx0 = random_bits(dt, g.x_size(), seed + 4);
    std::vector<uint16_t> dw0 = random_bits(dt, g.w_size(), seed + 5);
    if (beta == 0)
      for (auto* v : {&y0, &dx0, &dw0}) std::fill(v->begin(), v->end(), uint16_t{0xFFFF});  // NaN
    DeviceBuffer<uint16_t> y(y0), dx(dx0), dw(dw0);
    ASSERT_EQ(cudnnConvolutionForward(handle, &alpha, d.x, dx_in.get(), d.w, dw_in.get(), d.conv,
                                      CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, nullptr, 0, &b,
                                      d.y, y.get()),
              CUDNN_STATUS_SUCCESS)
        << kiln::sim::last_library_error();
    ASSERT_EQ(cudnnConvolutionBackwardData(handle, &alpha, d.w, dw_in.get(), d.y, ddy.get(), d.conv,
                                           CUDNN_CONVOLUTION_BWD_DATA_ALGO_0, nullptr, 0, &b, d.x,
                                           dx.get()),
              CUDNN_STATUS_SUCCESS)
        << kiln::sim::last_library_error();
    ASSERT_EQ(cudnnConvolutionBackwardFilter(handle, &alpha, d.x, dx_in.get(), d.y, ddy.get(),
                                             d.conv, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0, nullptr,
                                             0, &b, d.w, dw.get()),
              CUDNN_STATUS_SUCCESS)
        << kiln::sim::last_library_error();
    EXPECT_TRUE(near_all(name + " y", values_of(dt, y.download()),
                         blend(y_ref, 1.5, beta, values_of(dt, y0)), rtol));
    EXPECT_TRUE(near_all(name + " dx", values_of(dt, dx.download()),
                         blend(dx_ref, 1.5, beta, values_of(dt, dx0)), rtol));
    EXPECT_TRUE(near_all(name + " dw", values_of(dt, dw.download()),
                         blend(dw_ref, 1.5, beta, values_of(dt, dw0)), rtol));
  }
}

TEST_F(SimCudnn, ConvolutionsMatchNaiveLoopsHalfAndBfloat16) {
  uint32_t seed = 200;
  for (cudnnDataType_t dt : {CUDNN_DATA_HALF, CUDNN_DATA_BFLOAT16})
    for (const Conv& g : kCases) check_passes_16(handle_, g, dt, seed += 10);
}

TEST_F(SimCudnn, SixteenBitOutputsAreRoundedOnceToNearest) {
  // A 1x1 convolution over two channels: y = x0 + x1 with x1 = 0.75 ulp of 1 in the data type.
  // Rounding the float sum to nearest gives 1 + ulp; truncating it would give 1.
  const Conv g{1, 2, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION};
  for (cudnnDataType_t dt : {CUDNN_DATA_HALF, CUDNN_DATA_BFLOAT16}) {
    const int ulp_exp = dt == CUDNN_DATA_HALF ? -10 : -7;
    const float x1 = std::ldexp(1.0f, ulp_exp - 1) + std::ldexp(1.0f, ulp_exp - 2);
    const Descriptors d(g, dt, CUDNN_TENSOR_OP_MATH);
    DeviceBuffer<uint16_t> x(std::vector<uint16_t>{to_bits(dt, 1.0f), to_bits(dt, x1)});
    DeviceBuffer<uint16_t> w(std::vector<uint16_t>{to_bits(dt, 1.0f), to_bits(dt, 1.0f)}), y(1);
    const float one = 1, zero = 0;
    ASSERT_EQ(cudnnConvolutionForward(handle_, &one, d.x, x.get(), d.w, w.get(), d.conv,
                                      CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, nullptr, 0, &zero,
                                      d.y, y.get()),
              CUDNN_STATUS_SUCCESS)
        << kiln::sim::last_library_error();
    EXPECT_EQ(from_bits(dt, y.download()[0]), 1.0 + std::ldexp(1.0, ulp_exp)) << dt;
  }
}

TEST_F(SimCudnn, SixteenBitTypeAndComputeErrors) {
  const Conv g = kCases[0];
  const Descriptors half(g, CUDNN_DATA_HALF), bf16(g, CUDNN_DATA_BFLOAT16);
  // Buffers sized in 2-byte elements: x one element short is refused.
  DeviceBuffer<uint16_t> x(g.x_size()), w(g.w_size()), y(g.y_size()), x_short(g.x_size() - 1);
  const float one = 1, zero = 0;
  auto fwd = [&](cudnnTensorDescriptor_t xd, const void* xp, cudnnFilterDescriptor_t wd,
                 cudnnConvolutionDescriptor_t cd, cudnnTensorDescriptor_t yd) {
    return cudnnConvolutionForward(handle_, &one, xd, xp, wd, w.get(), cd,
                                   CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, nullptr, 0, &zero, yd,
                                   y.get());
  };
  EXPECT_EQ(fwd(half.x, x.get(), half.w, half.conv, half.y), CUDNN_STATUS_SUCCESS)
      << kiln::sim::last_library_error();
  EXPECT_EQ(fwd(bf16.x, x.get(), bf16.w, bf16.conv, bf16.y), CUDNN_STATUS_SUCCESS)
      << kiln::sim::last_library_error();
  EXPECT_EQ(fwd(half.x, x_short.get(), half.w, half.conv, half.y), CUDNN_STATUS_BAD_PARAM);
  EXPECT_NE(std::string(kiln::sim::last_library_error()).find("past its end"), std::string::npos);
  // A half input with a bfloat16 filter, or a half input into a float output: types differ.
  EXPECT_EQ(fwd(half.x, x.get(), bf16.w, half.conv, half.y), CUDNN_STATUS_BAD_PARAM);
  const Descriptors flt(g, CUDNN_DATA_FLOAT);
  EXPECT_EQ(fwd(half.x, x.get(), half.w, half.conv, flt.y), CUDNN_STATUS_BAD_PARAM);
  // Half data with a DOUBLE compute type is no documented configuration; half computed in half
  // (TRUE_HALF_CONFIG) is not simulated.
  const Descriptors dbl(g, CUDNN_DATA_DOUBLE);
  EXPECT_EQ(fwd(half.x, x.get(), half.w, dbl.conv, half.y), CUDNN_STATUS_NOT_SUPPORTED);
  EXPECT_NE(std::string(kiln::sim::last_library_error()).find("HALF data with compute type DOUBLE"),
            std::string::npos)
      << kiln::sim::last_library_error();
  cudnnConvolutionDescriptor_t c;
  ASSERT_EQ(cudnnCreateConvolutionDescriptor(&c), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(cudnnSetConvolution2dDescriptor(c, 1, 1, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION,
                                            CUDNN_DATA_HALF),
            CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE);
  EXPECT_EQ(cudnnDestroyConvolutionDescriptor(c), CUDNN_STATUS_SUCCESS);
  // A data type outside the subset is refused when set.
  cudnnTensorDescriptor_t t;
  ASSERT_EQ(cudnnCreateTensorDescriptor(&t), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(cudnnSetTensor4dDescriptor(t, CUDNN_TENSOR_NCHW, static_cast<cudnnDataType_t>(3), 1, 1,
                                       1, 1),
            CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE);  // INT8
  EXPECT_EQ(cudnnDestroyTensorDescriptor(t), CUDNN_STATUS_SUCCESS);
  // The 16-bit lists offer tensor-op kernels first; FFT (float only in the model) is unsupported.
  int count = 0;
  std::vector<cudnnConvolutionFwdAlgoPerf_t> perf(32);
  ASSERT_EQ(cudnnGetConvolutionForwardAlgorithm_v7(handle_, bf16.x, bf16.w, bf16.conv, bf16.y, 32,
                                                   &count, perf.data()),
            CUDNN_STATUS_SUCCESS);
  ASSERT_GT(count, 0);
  EXPECT_EQ(perf[0].mathType, CUDNN_TENSOR_OP_MATH);
  for (int i = 0; i < count; ++i) {
    if (perf[i].algo == CUDNN_CONVOLUTION_FWD_ALGO_FFT) {
      EXPECT_EQ(perf[i].status, CUDNN_STATUS_NOT_SUPPORTED);
    }
  }
}

TEST_F(SimCudnn, BackwardBiasAndAddTensorOnBfloat16) {
  // dy (1, 2, 1, 2) = [1, 2, 3, 4.5] in bfloat16; db = [3, 7.5]; C = 2 bias + C.
  const cudnnDataType_t dt = CUDNN_DATA_BFLOAT16;
  cudnnTensorDescriptor_t y, b;
  ASSERT_EQ(cudnnCreateTensorDescriptor(&y), CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(cudnnCreateTensorDescriptor(&b), CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(cudnnSetTensor4dDescriptor(y, CUDNN_TENSOR_NCHW, dt, 1, 2, 1, 2), CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(cudnnSetTensor4dDescriptor(b, CUDNN_TENSOR_NCHW, dt, 1, 2, 1, 1), CUDNN_STATUS_SUCCESS);
  const std::vector<uint16_t> dyv = {to_bits(dt, 1), to_bits(dt, 2), to_bits(dt, 3),
                                     to_bits(dt, 4.5f)};
  DeviceBuffer<uint16_t> dy(dyv), db(2), out(dyv);
  DeviceBuffer<uint16_t> bias(std::vector<uint16_t>{to_bits(dt, 1), to_bits(dt, -1)});
  const float one = 1, zero = 0, two = 2;
  ASSERT_EQ(cudnnConvolutionBackwardBias(handle_, &one, y, dy.get(), &zero, b, db.get()),
            CUDNN_STATUS_SUCCESS)
      << kiln::sim::last_library_error();
  EXPECT_EQ(values_of(dt, db.download()), (std::vector<double>{3, 7.5}));
  ASSERT_EQ(cudnnAddTensor(handle_, &two, b, bias.get(), &one, y, out.get()), CUDNN_STATUS_SUCCESS)
      << kiln::sim::last_library_error();
  EXPECT_EQ(values_of(dt, out.download()), (std::vector<double>{3, 4, 1, 2.5}));
  // A FLOAT bias into bfloat16 data: the types differ.
  cudnnTensorDescriptor_t bf;
  ASSERT_EQ(cudnnCreateTensorDescriptor(&bf), CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(cudnnSetTensor4dDescriptor(bf, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, 2, 1, 1),
            CUDNN_STATUS_SUCCESS);
  DeviceBuffer<float> bias_f(std::vector<float>{1, 2});
  EXPECT_EQ(cudnnAddTensor(handle_, &one, bf, bias_f.get(), &one, y, out.get()),
            CUDNN_STATUS_BAD_PARAM);
  for (auto* t : {y, b, bf}) EXPECT_EQ(cudnnDestroyTensorDescriptor(t), CUDNN_STATUS_SUCCESS);
}

TEST_F(SimCudnn, BackwardBiasAndAddTensor) {
  cudnnTensorDescriptor_t y, b;
  ASSERT_EQ(cudnnCreateTensorDescriptor(&y), CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(cudnnCreateTensorDescriptor(&b), CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(cudnnSetTensor4dDescriptor(y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 2, 3, 2, 2),
            CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(cudnnSetTensor4dDescriptor(b, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, 3, 1, 1),
            CUDNN_STATUS_SUCCESS);
  std::vector<float> yv(24);
  for (size_t i = 0; i < yv.size(); ++i) yv[i] = static_cast<float>(i);
  DeviceBuffer<float> dy(yv), db(3), bias(std::vector<float>{1, 2, 3}), out(yv);
  const float one = 1, zero = 0, two = 2;
  ASSERT_EQ(cudnnConvolutionBackwardBias(handle_, &one, y, dy.get(), &zero, b, db.get()),
            CUDNN_STATUS_SUCCESS);
  // Channel k sums n in {0, 1}, 4 pixels each: elements 4k..4k+3 and 12+4k..12+4k+3.
  EXPECT_EQ(db.download(), (std::vector<float>{0 + 1 + 2 + 3 + 12 + 13 + 14 + 15,
                                               4 + 5 + 6 + 7 + 16 + 17 + 18 + 19,
                                               8 + 9 + 10 + 11 + 20 + 21 + 22 + 23}));
  // out = 2 bias + 1 out, bias broadcast over n, h, w.
  ASSERT_EQ(cudnnAddTensor(handle_, &two, b, bias.get(), &one, y, out.get()), CUDNN_STATUS_SUCCESS);
  const std::vector<float> got = out.download();
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_EQ(got[i], yv[i] + 2.0f * static_cast<float>((i / 4) % 3 + 1)) << i;
  // A that does not broadcast to C, and C smaller than its descriptor.
  EXPECT_EQ(cudnnAddTensor(handle_, &one, y, out.get(), &one, b, bias.get()), CUDNN_STATUS_BAD_PARAM);
  DeviceBuffer<float> short_out(23);
  EXPECT_EQ(cudnnAddTensor(handle_, &one, b, bias.get(), &one, y, short_out.get()),
            CUDNN_STATUS_BAD_PARAM);
  EXPECT_EQ(cudnnConvolutionBackwardBias(handle_, &one, y, dy.get(), &zero, y, db.get()),
            CUDNN_STATUS_BAD_PARAM);
  EXPECT_EQ(cudnnDestroyTensorDescriptor(y), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(cudnnDestroyTensorDescriptor(b), CUDNN_STATUS_SUCCESS);
}

TEST_F(SimCudnn, AlgorithmListsLookLikeCudnns) {
  const Conv strided{2, 3, 9, 9, 4, 3, 3, 1, 1, 2, 2, 1, 1, CUDNN_CROSS_CORRELATION};
  const Descriptors fma(strided, CUDNN_DATA_FLOAT, CUDNN_FMA_MATH);
  int max = 0, count = 0;
  ASSERT_EQ(cudnnGetConvolutionForwardAlgorithmMaxCount(handle_, &max), CUDNN_STATUS_SUCCESS);
  ASSERT_GE(max, CUDNN_CONVOLUTION_FWD_ALGO_COUNT);
  std::vector<cudnnConvolutionFwdAlgoPerf_t> fwd(max);
  ASSERT_EQ(cudnnGetConvolutionForwardAlgorithm_v7(handle_, fma.x, fma.w, fma.conv, fma.y, max,
                                                   &count, fwd.data()),
            CUDNN_STATUS_SUCCESS);
  ASSERT_GT(count, 3);
  ASSERT_LE(count, max);
  // The fastest is a tensor-op kernel, even under FMA math: the caller filters.
  EXPECT_EQ(fwd[0].mathType, CUDNN_TENSOR_OP_MATH);
  EXPECT_EQ(fwd[0].status, CUDNN_STATUS_SUCCESS);
  bool fma_entry = false, fft_unsupported = false;
  for (int i = 0; i < count; ++i) {
    if (fwd[i].status == CUDNN_STATUS_SUCCESS && fwd[i].mathType == CUDNN_FMA_MATH) fma_entry = true;
    if (fwd[i].algo == CUDNN_CONVOLUTION_FWD_ALGO_FFT) fft_unsupported = fwd[i].status == CUDNN_STATUS_NOT_SUPPORTED;
    if (i > 0 && fwd[i].status == CUDNN_STATUS_SUCCESS) {
      EXPECT_GE(fwd[i].time, fwd[i - 1].time);
    }
  }
  EXPECT_TRUE(fma_entry);
  EXPECT_TRUE(fft_unsupported) << "FFT needs stride 1";
  // Backward data: ALGO_0 is documented non-deterministic.
  ASSERT_EQ(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(handle_, &max), CUDNN_STATUS_SUCCESS);
  std::vector<cudnnConvolutionBwdDataAlgoPerf_t> bwd(max);
  ASSERT_EQ(cudnnGetConvolutionBackwardDataAlgorithm_v7(handle_, fma.w, fma.y, fma.conv, fma.x, max,
                                                        &count, bwd.data()),
            CUDNN_STATUS_SUCCESS);
  bool nondet = false;
  for (int i = 0; i < count; ++i)
    if (bwd[i].algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_0)
      nondet = bwd[i].determinism == CUDNN_NON_DETERMINISTIC;
  EXPECT_TRUE(nondet);
  // Double: no tensor-op entries. Asking for fewer than all returns the best ones.
  const Descriptors dbl(strided, CUDNN_DATA_DOUBLE);
  ASSERT_EQ(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(handle_, &max), CUDNN_STATUS_SUCCESS);
  std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> flt(max);
  ASSERT_EQ(cudnnGetConvolutionBackwardFilterAlgorithm_v7(handle_, dbl.x, dbl.y, dbl.conv, dbl.w,
                                                          max, &count, flt.data()),
            CUDNN_STATUS_SUCCESS);
  for (int i = 0; i < count; ++i) EXPECT_NE(flt[i].mathType, CUDNN_TENSOR_OP_MATH);
  ASSERT_EQ(cudnnGetConvolutionBackwardFilterAlgorithm_v7(handle_, dbl.x, dbl.y, dbl.conv, dbl.w,
                                                          2, &count, flt.data()),
            CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(count, 2);
  EXPECT_EQ(cudnnGetConvolutionBackwardFilterAlgorithm_v7(handle_, dbl.x, dbl.y, dbl.conv, dbl.w,
                                                          0, &count, flt.data()),
            CUDNN_STATUS_BAD_PARAM);
}

TEST_F(SimCudnn, RunningAnAlgorithmHonoursWorkspaceAndMath) {
  const Conv g{1, 2, 6, 6, 3, 3, 3, 1, 1, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION};
  const Descriptors d(g, CUDNN_DATA_FLOAT);
  int count = 0;
  std::vector<cudnnConvolutionFwdAlgoPerf_t> perf(16);
  ASSERT_EQ(cudnnGetConvolutionForwardAlgorithm_v7(handle_, d.x, d.w, d.conv, d.y, 16, &count,
                                                   perf.data()),
            CUDNN_STATUS_SUCCESS);
  const cudnnConvolutionFwdAlgo_t precomp = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
  size_t need = 0;
  for (int i = 0; i < count; ++i)
    if (perf[i].algo == precomp) need = perf[i].memory;
  ASSERT_GT(need, 0u);
  // Inputs that TF32 changes: 1 + 2^-12 everywhere.
  const float v = 1.0f + std::ldexp(1.0f, -12);
  DeviceBuffer<float> x(std::vector<float>(g.x_size(), v)), w(std::vector<float>(g.w_size(), v));
  DeviceBuffer<float> y(g.y_size()), ws(need / sizeof(float) + 1), small_ws(1);
  const float one = 1, zero = 0;
  auto run = [&](cudnnConvolutionFwdAlgo_t algo, void* workspace, size_t bytes) {
    return cudnnConvolutionForward(handle_, &one, d.x, x.get(), d.w, w.get(), d.conv, algo,
                                   workspace, bytes, &zero, d.y, y.get());
  };
  EXPECT_EQ(run(precomp, ws.get(), need - 1), CUDNN_STATUS_BAD_PARAM);
  EXPECT_NE(std::string(kiln::sim::last_library_error()).find("workspace"), std::string::npos);
  EXPECT_EQ(run(precomp, nullptr, need), CUDNN_STATUS_BAD_PARAM_NULL_POINTER);  // a lie
  EXPECT_EQ(run(precomp, small_ws.get(), need), CUDNN_STATUS_BAD_PARAM);
  EXPECT_EQ(run(static_cast<cudnnConvolutionFwdAlgo_t>(42), nullptr, 0), CUDNN_STATUS_BAD_PARAM);
  EXPECT_EQ(run(CUDNN_CONVOLUTION_FWD_ALGO_DIRECT, nullptr, 0), CUDNN_STATUS_NOT_SUPPORTED);
  // Centre output: all 18 taps inside the image. DEFAULT math on a tensor-op algorithm: TF32.
  const size_t centre = 2 * g.q() + 2;
  ASSERT_EQ(run(precomp, ws.get(), need), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(y.download()[centre], 18.0f);
  // FMA math: FP32 inputs, the exact products show.
  ASSERT_EQ(cudnnSetConvolutionMathType(d.conv, CUDNN_FMA_MATH), CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(run(precomp, ws.get(), need), CUDNN_STATUS_SUCCESS);
  EXPECT_NEAR(y.download()[centre], 18.0 * v * v, 1e-5);
  EXPECT_GT(y.download()[centre], 18.0f);
  // An algorithm without a tensor-op kernel is FP32 whatever the math type.
  ASSERT_EQ(cudnnSetConvolutionMathType(d.conv, CUDNN_TENSOR_OP_MATH), CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(run(CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, nullptr, 0), CUDNN_STATUS_SUCCESS);
  EXPECT_GT(y.download()[centre], 18.0f);
}

TEST_F(SimCudnn, FindRunsWithinTheWorkspaceAndOverwritesTheOutput) {
  const Conv g{2, 3, 8, 8, 4, 3, 3, 1, 1, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION};
  const Descriptors d(g, CUDNN_DATA_FLOAT, CUDNN_FMA_MATH);
  DeviceBuffer<float> x(random_values<float>(g.x_size(), 1)), w(random_values<float>(g.w_size(), 2));
  DeviceBuffer<float> y(std::vector<float>(g.y_size(), 7.0f));
  int max = 0, count = 0;
  ASSERT_EQ(cudnnGetConvolutionForwardAlgorithmMaxCount(handle_, &max), CUDNN_STATUS_SUCCESS);
  std::vector<cudnnConvolutionFwdAlgoPerf_t> perf(max);
  // No workspace: only the algorithms that need none succeed, and they come first.
  ASSERT_EQ(cudnnFindConvolutionForwardAlgorithmEx(handle_, d.x, x.get(), d.w, w.get(), d.conv, d.y,
                                                   y.get(), max, &count, perf.data(), nullptr, 0),
            CUDNN_STATUS_SUCCESS);
  bool failed_seen = false;
  for (int i = 0; i < count; ++i) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS) {
      failed_seen = true;
    } else {
      EXPECT_FALSE(failed_seen) << "a successful entry after a failed one";
      EXPECT_EQ(perf[i].memory, 0u);
    }
  }
  EXPECT_TRUE(failed_seen);
  for (float v : y.download()) EXPECT_TRUE(std::isnan(v));
}

TEST_F(SimCudnn, DescriptorAndRangeErrors) {
  const Conv g = kCases[0];
  const Descriptors d(g, CUDNN_DATA_FLOAT);
  DeviceBuffer<float> x(g.x_size()), w(g.w_size()), y(g.y_size()), x_short(g.x_size() - 1);
  const float one = 1, zero = 0;
  auto fwd = [&](cudnnHandle_t h, cudnnTensorDescriptor_t xd, const float* xp,
                 cudnnTensorDescriptor_t yd) {
    return cudnnConvolutionForward(h, &one, xd, xp, d.w, w.get(), d.conv,
                                   CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, nullptr, 0, &zero, yd,
                                   y.get());
  };
  EXPECT_EQ(fwd(handle_, d.x, x.get(), d.y), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(fwd(nullptr, d.x, x.get(), d.y), CUDNN_STATUS_BAD_PARAM);
  EXPECT_EQ(fwd(handle_, d.x, x_short.get(), d.y), CUDNN_STATUS_BAD_PARAM);
  EXPECT_NE(std::string(kiln::sim::last_library_error()).find("past its end"), std::string::npos);
  std::vector<float> host(g.x_size());
  EXPECT_EQ(fwd(handle_, d.x, host.data(), d.y), CUDNN_STATUS_BAD_PARAM);
  EXPECT_EQ(fwd(handle_, d.x, nullptr, d.y), CUDNN_STATUS_BAD_PARAM_NULL_POINTER);
  // x and y swapped: the output shape disagrees.
  EXPECT_EQ(fwd(handle_, d.y, x.get(), d.x), CUDNN_STATUS_BAD_PARAM);
  cudnnTensorDescriptor_t other;
  ASSERT_EQ(cudnnCreateTensorDescriptor(&other), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(fwd(handle_, other, x.get(), d.y), CUDNN_STATUS_BAD_PARAM);  // never set
  // One channel too many for the filter.
  ASSERT_EQ(cudnnSetTensor4dDescriptor(other, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, g.n, g.c + 1,
                                       g.h, g.w),
            CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(fwd(handle_, other, x.get(), d.y), CUDNN_STATUS_BAD_PARAM);
  // A double input with a float filter.
  ASSERT_EQ(cudnnSetTensor4dDescriptor(other, CUDNN_TENSOR_NCHW, CUDNN_DATA_DOUBLE, g.n, g.c, g.h,
                                       g.w),
            CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(fwd(handle_, other, x.get(), d.y), CUDNN_STATUS_BAD_PARAM);
  ASSERT_EQ(cudnnDestroyTensorDescriptor(other), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(fwd(handle_, other, x.get(), d.y), CUDNN_STATUS_BAD_PARAM);  // destroyed
  // Outside the subset, or invalid, at Set time.
  cudnnTensorDescriptor_t t;
  ASSERT_EQ(cudnnCreateTensorDescriptor(&t), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(cudnnSetTensor4dDescriptor(t, static_cast<cudnnTensorFormat_t>(2), CUDNN_DATA_FLOAT,
                                       1, 1, 1, 1),
            CUDNN_STATUS_NOT_SUPPORTED_LAYOUT);  // NCHW_VECT_C (vectorised INT8 only)
  EXPECT_EQ(cudnnSetTensor4dDescriptor(t, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, -1, 1, 1),
            CUDNN_STATUS_BAD_PARAM);
  EXPECT_EQ(cudnnDestroyTensorDescriptor(t), CUDNN_STATUS_SUCCESS);
  cudnnConvolutionDescriptor_t c;
  ASSERT_EQ(cudnnCreateConvolutionDescriptor(&c), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(cudnnSetConvolution2dDescriptor(c, 0, 0, 0, 1, 1, 1, CUDNN_CROSS_CORRELATION,
                                            CUDNN_DATA_FLOAT),
            CUDNN_STATUS_BAD_PARAM);
  EXPECT_EQ(cudnnSetConvolutionMathType(c, static_cast<cudnnMathType_t>(9)), CUDNN_STATUS_BAD_PARAM);
  EXPECT_EQ(cudnnDestroyConvolutionDescriptor(c), CUDNN_STATUS_SUCCESS);
  EXPECT_STREQ(cudnnGetErrorString(CUDNN_STATUS_BAD_PARAM), "CUDNN_STATUS_BAD_PARAM");
  // Kiln's check macro carries the simulator's reason.
  try {
    KILN_CUDNN_CHECK(fwd(handle_, d.x, x_short.get(), d.y));
    FAIL() << "no error";
  } catch (const kiln::Error& e) {
    EXPECT_NE(std::string(e.what()).find("past its end"), std::string::npos) << e.what();
  }
}

TEST_F(SimCudnn, WorkGoesOnTheHandlesStreamAndOutlivesTheDescriptors) {
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  ASSERT_EQ(cudnnSetStream(handle_, s), CUDNN_STATUS_SUCCESS);
  cudaStream_t got = nullptr;
  ASSERT_EQ(cudnnGetStream(handle_, &got), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(got, s);
  const Conv g{1, 1, 3, 3, 1, 1, 1, 0, 0, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION};
  DeviceBuffer<float> x(9), w(std::vector<float>{2}), y(9);
  float* px = x.get();
  kiln::sim_test::delayed_write(s, 50, [px] {
    for (int i = 0; i < 9; ++i) px[i] = static_cast<float>(i);
  });
  {
    const Descriptors d(g, CUDNN_DATA_FLOAT);
    const float one = 1, zero = 0;
    ASSERT_EQ(cudnnConvolutionForward(handle_, &one, d.x, x.get(), d.w, w.get(), d.conv,
                                      CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, nullptr, 0, &zero,
                                      d.y, y.get()),
              CUDNN_STATUS_SUCCESS);
  }  // descriptors destroyed while the work may still be queued
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(y.download(), (std::vector<float>{0, 2, 4, 6, 8, 10, 12, 14, 16}));
  ASSERT_EQ(cudnnSetStream(handle_, nullptr), CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
  EXPECT_EQ(cudnnSetStream(handle_, s), CUDNN_STATUS_BAD_PARAM);  // destroyed
}

}  // namespace
