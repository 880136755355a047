// sim_cudnn_nhwc_test.cpp: the simulated cuDNN on NHWC data (engine/cuda/sim/cudnn_layout.h).
// Forward, backward-data, backward-filter, backward-bias and AddTensor on NHWC tensors, with an
// NHWC (KRSC) filter and with an NCHW (KCRS) one, give the NCHW results permuted, bit for bit
// (the simulator sums in the same order for both layouts), in float, double, half and bfloat16,
// beta 0 over NaN and beta 0.5. And the combinations cuDNN refuses are refused: an NHWC filter
// with NCHW tensors, an NHWC filter with a non-implicit-GEMM algorithm, FFT on NHWC tensors.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "engine/cuda/dnn.h"
#include "engine/cuda/sim/library.h"
#include "engine/host_device.h"
#include "sim_vendor_test_util.h"

namespace {

using kiln::sim_test::DeviceBuffer;
using kiln::sim_test::random_values;

struct Conv {
  int n, c, h, w, k, r, s, pad, stride, dil;
  cudnnConvolutionMode_t mode;
  int p() const { return (h + 2 * pad - ((r - 1) * dil + 1)) / stride + 1; }
  int q() const { return (w + 2 * pad - ((s - 1) * dil + 1)) / stride + 1; }
};

const Conv kCases[] = {
    {2, 3, 7, 6, 4, 3, 3, 1, 1, 1, CUDNN_CROSS_CORRELATION},
    {2, 5, 9, 8, 3, 3, 3, 1, 2, 1, CUDNN_CROSS_CORRELATION},  // stride 2
    {2, 2, 9, 9, 2, 3, 3, 2, 1, 2, CUDNN_CROSS_CORRELATION},  // dilation
    {1, 3, 5, 5, 2, 3, 3, 1, 1, 1, CUDNN_CONVOLUTION},        // flipped filter
    {3, 4, 4, 4, 5, 1, 1, 0, 1, 1, CUDNN_CROSS_CORRELATION},  // 1x1
};

// The storage of each data type: float, double, or the bits of a 16-bit value.
template <typename S>
std::vector<S> random_storage(cudnnDataType_t dt, size_t count, uint32_t seed) {
  const std::vector<double> v = random_values<double>(count, seed);
  std::vector<S> out(count);
  for (size_t i = 0; i < count; ++i) {
    if constexpr (std::is_same_v<S, uint16_t>)
      out[i] = dt == CUDNN_DATA_HALF ? kiln::f32_to_f16(static_cast<float>(v[i]))
                                     : kiln::f32_to_bf16(static_cast<float>(v[i]));
    else
      out[i] = static_cast<S>(v[i]);
  }
  return out;
}

// Logical (d0, d1, d2, d3) packed in NCHW order -> NHWC order (d0, d2, d3, d1), and back.
template <typename S>
std::vector<S> to_nhwc(const std::vector<S>& v, int d0, int d1, int d2, int d3) {
  std::vector<S> out(v.size());
  for (int a = 0; a < d0; ++a)
    for (int b = 0; b < d1; ++b)
      for (int i = 0; i < d2 * d3; ++i)
        out[(static_cast<size_t>(a) * d2 * d3 + i) * d1 + b] =
            v[(static_cast<size_t>(a) * d1 + b) * d2 * d3 + i];
  return out;
}
template <typename S>
std::vector<S> to_nchw(const std::vector<S>& v, int d0, int d1, int d2, int d3) {
  std::vector<S> out(v.size());
  for (int a = 0; a < d0; ++a)
    for (int b = 0; b < d1; ++b)
      for (int i = 0; i < d2 * d3; ++i)
        out[(static_cast<size_t>(a) * d1 + b) * d2 * d3 + i] =
            v[(static_cast<size_t>(a) * d2 * d3 + i) * d1 + b];
  return out;
}

// Bit-for-bit equality (NaN bits included).
template <typename S>
::testing::AssertionResult same_bits(const std::string& what, const std::vector<S>& got,
                                     const std::vector<S>& want) {
  const size_t bytes = got.size() * sizeof(S);
  if (got.size() == want.size() && std::memcmp(got.data(), want.data(), bytes) == 0)
    return ::testing::AssertionSuccess();
  for (size_t i = 0; i < got.size() && i < want.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(S)) != 0)
      return ::testing::AssertionFailure() << what << ": element " << i << " differs";
  return ::testing::AssertionFailure() << what << ": sizes differ";
}

struct Descriptors {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr, bias = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  Descriptors(const Conv& g, cudnnDataType_t dt, cudnnTensorFormat_t tensors,
              cudnnTensorFormat_t filter) {
    EXPECT_EQ(cudnnCreateTensorDescriptor(&x), CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(cudnnCreateTensorDescriptor(&y), CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(cudnnCreateTensorDescriptor(&bias), CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(cudnnCreateFilterDescriptor(&w), CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(cudnnCreateConvolutionDescriptor(&conv), CUDNN_STATUS_SUCCESS);
    // The dimensions are the logical ones in both formats.
    EXPECT_EQ(cudnnSetTensor4dDescriptor(x, tensors, dt, g.n, g.c, g.h, g.w), CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(cudnnSetTensor4dDescriptor(y, tensors, dt, g.n, g.k, g.p(), g.q()),
              CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(cudnnSetTensor4dDescriptor(bias, CUDNN_TENSOR_NCHW, dt, 1, g.k, 1, 1),
              CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(cudnnSetFilter4dDescriptor(w, dt, filter, g.k, g.c, g.r, g.s), CUDNN_STATUS_SUCCESS);
    const bool b16 = dt == CUDNN_DATA_HALF || dt == CUDNN_DATA_BFLOAT16;
    EXPECT_EQ(cudnnSetConvolution2dDescriptor(conv, g.pad, g.pad, g.stride, g.stride, g.dil, g.dil,
                                              g.mode, b16 ? CUDNN_DATA_FLOAT : dt),
              CUDNN_STATUS_SUCCESS);
  }
  ~Descriptors() {
    for (auto* t : {x, y, bias}) (void)cudnnDestroyTensorDescriptor(t);
    (void)cudnnDestroyFilterDescriptor(w);
    (void)cudnnDestroyConvolutionDescriptor(conv);
  }
};

// The outputs of one run of every call: y = conv(x, w) then y += bias, dx, dw, db.
template <typename S>
struct Outputs {
  std::vector<S> y, dx, dw, db;
};

// Runs the five calls with x, w, dy, bias and the outputs' starting values in the given formats
// (NCHW-ordered host data is permuted here for NHWC), and returns the outputs in NCHW order.
template <typename S>
Outputs<S> run(cudnnHandle_t handle, const Conv& g, cudnnDataType_t dt, cudnnTensorFormat_t tf,
               cudnnTensorFormat_t ff, double beta, const Outputs<S>& in, const Outputs<S>& start) {
  const Descriptors d(g, dt, tf, ff);
  const bool t_nhwc = tf == CUDNN_TENSOR_NHWC, f_nhwc = ff == CUDNN_TENSOR_NHWC;
  auto lay_x = [&](const std::vector<S>& v) { return t_nhwc ? to_nhwc(v, g.n, g.c, g.h, g.w) : v; };
  auto lay_y = [&](const std::vector<S>& v) {
    return t_nhwc ? to_nhwc(v, g.n, g.k, g.p(), g.q()) : v;
  };
  auto lay_w = [&](const std::vector<S>& v) { return f_nhwc ? to_nhwc(v, g.k, g.c, g.r, g.s) : v; };
  DeviceBuffer<S> x(lay_x(in.dx)), w(lay_w(in.dw)), dy(lay_y(in.y)), bias(in.db);
  DeviceBuffer<S> y(lay_y(start.y)), dx(lay_x(start.dx)), dw(lay_w(start.dw)), db(start.db);
  const double alpha_d = 1.5, one_d = 1;
  const float alpha_f = 1.5f, beta_f = static_cast<float>(beta), one_f = 1;
  const bool dbl = dt == CUDNN_DATA_DOUBLE;
  const void* alpha = dbl ? static_cast<const void*>(&alpha_d) : &alpha_f;
  const void* b = dbl ? static_cast<const void*>(&beta) : &beta_f;
  const void* one = dbl ? static_cast<const void*>(&one_d) : &one_f;
  DeviceBuffer<uint8_t> ws(1 << 16);
  EXPECT_EQ(cudnnConvolutionForward(handle, alpha, d.x, x.get(), d.w, w.get(), d.conv,
                                    CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, ws.get(),
                                    1 << 16, b, d.y, y.get()),
            CUDNN_STATUS_SUCCESS)
      << kiln::sim::last_library_error();
  EXPECT_EQ(cudnnAddTensor(handle, one, d.bias, bias.get(), one, d.y, y.get()),
            CUDNN_STATUS_SUCCESS)
      << kiln::sim::last_library_error();
  EXPECT_EQ(cudnnConvolutionBackwardData(handle, alpha, d.w, w.get(), d.y, dy.get(), d.conv,
                                         CUDNN_CONVOLUTION_BWD_DATA_ALGO_0, nullptr, 0, b, d.x,
                                         dx.get()),
            CUDNN_STATUS_SUCCESS)
      << kiln::sim::last_library_error();
  EXPECT_EQ(cudnnConvolutionBackwardFilter(handle, alpha, d.x, x.get(), d.y, dy.get(), d.conv,
                                           CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0, nullptr, 0, b, d.w,
                                           dw.get()),
            CUDNN_STATUS_SUCCESS)
      << kiln::sim::last_library_error();
  EXPECT_EQ(cudnnConvolutionBackwardBias(handle, alpha, d.y, dy.get(), b, d.bias, db.get()),
            CUDNN_STATUS_SUCCESS)
      << kiln::sim::last_library_error();
  Outputs<S> out;
  out.y = t_nhwc ? to_nchw(y.download(), g.n, g.k, g.p(), g.q()) : y.download();
  out.dx = t_nhwc ? to_nchw(dx.download(), g.n, g.c, g.h, g.w) : dx.download();
  out.dw = f_nhwc ? to_nchw(dw.download(), g.k, g.c, g.r, g.s) : dw.download();
  out.db = db.download();
  return out;
}

class SimCudnnNhwc : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(cudnnCreate(&handle_), CUDNN_STATUS_SUCCESS);
  }
  void TearDown() override { EXPECT_EQ(cudnnDestroy(handle_), CUDNN_STATUS_SUCCESS); }

  template <typename S>
  void check_all(cudnnDataType_t dt, uint32_t seed) {
    for (const Conv& g : kCases) {
      const size_t xs = static_cast<size_t>(g.n) * g.c * g.h * g.w;
      const size_t ws = static_cast<size_t>(g.k) * g.c * g.r * g.s;
      const size_t ys = static_cast<size_t>(g.n) * g.k * g.p() * g.q();
      // `in` carries the operands: x in dx, w in dw, dy in y, the bias in db.
      const Outputs<S> in{random_storage<S>(dt, ys, seed), random_storage<S>(dt, xs, seed + 1),
                          random_storage<S>(dt, ws, seed + 2),
                          random_storage<S>(dt, static_cast<size_t>(g.k), seed + 3)};
      for (double beta : {0.0, 0.5}) {
        Outputs<S> start{random_storage<S>(dt, ys, seed + 4), random_storage<S>(dt, xs, seed + 5),
                         random_storage<S>(dt, ws, seed + 6),
                         random_storage<S>(dt, static_cast<size_t>(g.k), seed + 7)};
        if (beta == 0)  // every byte 0xFF: NaN, never read
          for (auto* v : {&start.y, &start.dx, &start.dw, &start.db})
            std::memset(v->data(), 0xFF, v->size() * sizeof(S));
        const Outputs<S> ref =
            run(handle_, g, dt, CUDNN_TENSOR_NCHW, CUDNN_TENSOR_NCHW, beta, in, start);
        const std::string name = "type " + std::to_string(dt) + " case c" + std::to_string(g.c) +
                                 " r" + std::to_string(g.r) + " stride " +
                                 std::to_string(g.stride) + " beta " + std::to_string(beta);
        for (cudnnTensorFormat_t ff : {CUDNN_TENSOR_NHWC, CUDNN_TENSOR_NCHW}) {
          const std::string what = name + (ff == CUDNN_TENSOR_NHWC ? " KRSC" : " KCRS") + " filter";
          const Outputs<S> got = run(handle_, g, dt, CUDNN_TENSOR_NHWC, ff, beta, in, start);
          EXPECT_TRUE(same_bits(what + " y", got.y, ref.y));
          EXPECT_TRUE(same_bits(what + " dx", got.dx, ref.dx));
          EXPECT_TRUE(same_bits(what + " dw", got.dw, ref.dw));
          EXPECT_TRUE(same_bits(what + " db", got.db, ref.db));
        }
        seed += 10;
      }
    }
  }

  cudnnHandle_t handle_ = nullptr;
};

TEST_F(SimCudnnNhwc, FloatEqualsNchwPermuted) { check_all<float>(CUDNN_DATA_FLOAT, 10); }
TEST_F(SimCudnnNhwc, DoubleEqualsNchwPermuted) { check_all<double>(CUDNN_DATA_DOUBLE, 200); }
TEST_F(SimCudnnNhwc, HalfEqualsNchwPermuted) { check_all<uint16_t>(CUDNN_DATA_HALF, 400); }
TEST_F(SimCudnnNhwc, Bfloat16EqualsNchwPermuted) { check_all<uint16_t>(CUDNN_DATA_BFLOAT16, 600); }

// What cuDNN's tables of supported configurations leave out is NOT_SUPPORTED, in the lists and
// when run: an NHWC filter with NCHW tensors, an NHWC filter with any but the implicit-GEMM
// algorithms, and FFT on NHWC tensors (its NCHW filter is fine for the GEMM algorithms).
TEST_F(SimCudnnNhwc, RefusesTheLayoutsCudnnRefuses) {
  const Conv g{2, 4, 8, 8, 4, 3, 3, 1, 1, 1, CUDNN_CROSS_CORRELATION};
  DeviceBuffer<float> x(static_cast<size_t>(g.n) * g.c * g.h * g.w);
  DeviceBuffer<float> w(static_cast<size_t>(g.k) * g.c * g.r * g.s);
  DeviceBuffer<float> y(static_cast<size_t>(g.n) * g.k * g.p() * g.q());
  DeviceBuffer<uint8_t> ws(size_t(64) << 20);
  const float one = 1, zero = 0;
  auto fwd = [&](const Descriptors& d, cudnnConvolutionFwdAlgo_t algo) {
    return cudnnConvolutionForward(handle_, &one, d.x, x.get(), d.w, w.get(), d.conv, algo,
                                   ws.get(), size_t(64) << 20, &zero, d.y, y.get());
  };
  const Descriptors krsc_nchw(g, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, CUDNN_TENSOR_NHWC);
  EXPECT_EQ(fwd(krsc_nchw, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM), CUDNN_STATUS_NOT_SUPPORTED);
  EXPECT_NE(std::string(kiln::sim::last_library_error()).find("NHWC filter needs NHWC"),
            std::string::npos)
      << kiln::sim::last_library_error();
  const Descriptors nhwc(g, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NHWC, CUDNN_TENSOR_NHWC);
  EXPECT_EQ(fwd(nhwc, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM), CUDNN_STATUS_SUCCESS)
      << kiln::sim::last_library_error();
  EXPECT_EQ(fwd(nhwc, CUDNN_CONVOLUTION_FWD_ALGO_GEMM), CUDNN_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(fwd(nhwc, CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD), CUDNN_STATUS_NOT_SUPPORTED);
  const Descriptors kcrs_nhwc(g, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NHWC, CUDNN_TENSOR_NCHW);
  EXPECT_EQ(fwd(kcrs_nhwc, CUDNN_CONVOLUTION_FWD_ALGO_GEMM), CUDNN_STATUS_SUCCESS)
      << kiln::sim::last_library_error();
  EXPECT_EQ(fwd(kcrs_nhwc, CUDNN_CONVOLUTION_FWD_ALGO_FFT), CUDNN_STATUS_NOT_SUPPORTED);
  const Descriptors nchw(g, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, CUDNN_TENSOR_NCHW);
  EXPECT_EQ(fwd(nchw, CUDNN_CONVOLUTION_FWD_ALGO_FFT), CUDNN_STATUS_SUCCESS)
      << kiln::sim::last_library_error();

  // The heuristics with an NHWC filter: only the implicit-GEMM algorithms succeed, per pass.
  int count = 0;
  std::vector<cudnnConvolutionFwdAlgoPerf_t> fwd_perf(32);
  ASSERT_EQ(cudnnGetConvolutionForwardAlgorithm_v7(handle_, nhwc.x, nhwc.w, nhwc.conv, nhwc.y, 32,
                                                   &count, fwd_perf.data()),
            CUDNN_STATUS_SUCCESS);
  for (int i = 0; i < count; ++i)
    EXPECT_EQ(fwd_perf[i].status == CUDNN_STATUS_SUCCESS,
              fwd_perf[i].algo == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM ||
                  fwd_perf[i].algo == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM)
        << fwd_perf[i].algo;
  std::vector<cudnnConvolutionBwdDataAlgoPerf_t> data_perf(32);
  ASSERT_EQ(cudnnGetConvolutionBackwardDataAlgorithm_v7(handle_, nhwc.w, nhwc.y, nhwc.conv, nhwc.x,
                                                        32, &count, data_perf.data()),
            CUDNN_STATUS_SUCCESS);
  for (int i = 0; i < count; ++i)
    EXPECT_EQ(data_perf[i].status == CUDNN_STATUS_SUCCESS,
              data_perf[i].algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_0 ||
                  data_perf[i].algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_1)
        << data_perf[i].algo;
  std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> filter_perf(32);
  ASSERT_EQ(cudnnGetConvolutionBackwardFilterAlgorithm_v7(handle_, nhwc.x, nhwc.y, nhwc.conv,
                                                          nhwc.w, 32, &count, filter_perf.data()),
            CUDNN_STATUS_SUCCESS);
  for (int i = 0; i < count; ++i)
    EXPECT_EQ(filter_perf[i].status == CUDNN_STATUS_SUCCESS,
              filter_perf[i].algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 ||
                  filter_perf[i].algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1)
        << filter_perf[i].algo;
}

}  // namespace
