// sim/cudnn_compute.cpp: the simulated cuDNN's arithmetic (see cudnn_compute.h). Convolutions
// are lowered per image to im2col + one GEMM (OpenBLAS), the textbook scheme of cuDNN's GEMM
// algorithm; every algorithm the simulated cuDNN offers computes through it, so only the
// summation order distinguishes it from the CPU's convolution (docs/cuda_simulator.md).
// cuDNN API reference: https://docs.nvidia.com/deeplearning/cudnn/api/.
#include "engine/cuda/sim/cudnn_compute.h"

#include <cblas.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "engine/cuda/sim/library.h"
#include "engine/host_device.h"

namespace kiln::sim {
namespace {

template <typename T>
T read(const T* p, int64_t i, bool tf32) {
  if constexpr (std::is_same_v<T, float>)
    if (tf32) return round_tf32(p[i]);
  return p[i];
}

// C (m x n) = op(A) op(B) + beta C, row-major, beta 0 or 1.
template <typename T>
void gemm_rm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda,
             const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  const CBLAS_TRANSPOSE opa = ta ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE opb = tb ? CblasTrans : CblasNoTrans;
  const auto i = [](int64_t v) { return static_cast<int>(v); };
  if constexpr (std::is_same_v<T, float>)
    cblas_sgemm(CblasRowMajor, opa, opb, i(m), i(n), i(k), 1.0f, a, i(lda), b, i(ldb), beta, c,
                i(ldc));
  else
    cblas_dgemm(CblasRowMajor, opa, opb, i(m), i(n), i(k), 1.0, a, i(lda), b, i(ldb), beta, c,
                i(ldc));
}

// The input row of filter tap r (flipped for true convolution), for output row p.
inline int64_t in_row(const ConvShape& g, int64_t p, int64_t r) {
  return p * g.stride_h - g.pad_h + (g.flip ? g.r - 1 - r : r) * g.dil_h;
}
inline int64_t in_col(const ConvShape& g, int64_t q, int64_t s) {
  return q * g.stride_w - g.pad_w + (g.flip ? g.s - 1 - s : s) * g.dil_w;
}

// col (C*R*S, P*Q) of one image x (C, H, W): col[(c, r, s), (p, q)] = x[c, in_row, in_col],
// 0 in the padding.
template <typename T>
void im2col(const ConvShape& g, const T* x, T* col, bool tf32) {
  const int64_t pq = g.p * g.q;
  for (int64_t c = 0; c < g.c; ++c)
    for (int64_t r = 0; r < g.r; ++r)
      for (int64_t s = 0; s < g.s; ++s) {
        T* row = col + ((c * g.r + r) * g.s + s) * pq;
        for (int64_t p = 0; p < g.p; ++p) {
          const int64_t h = in_row(g, p, r);
          for (int64_t q = 0; q < g.q; ++q) {
            const int64_t w = in_col(g, q, s);
            const bool inside = h >= 0 && h < g.h && w >= 0 && w < g.w;
            row[p * g.q + q] = inside ? read(x, (c * g.h + h) * g.w + w, tf32) : T(0);
          }
        }
      }
}

// The adjoint of im2col: dx (C, H, W) += col scattered back.
template <typename T>
void col2im_add(const ConvShape& g, const T* col, T* dx) {
  const int64_t pq = g.p * g.q;
  for (int64_t c = 0; c < g.c; ++c)
    for (int64_t r = 0; r < g.r; ++r)
      for (int64_t s = 0; s < g.s; ++s) {
        const T* row = col + ((c * g.r + r) * g.s + s) * pq;
        for (int64_t p = 0; p < g.p; ++p) {
          const int64_t h = in_row(g, p, r);
          if (h < 0 || h >= g.h) continue;
          for (int64_t q = 0; q < g.q; ++q) {
            const int64_t w = in_col(g, q, s);
            if (w >= 0 && w < g.w) dx[(c * g.h + h) * g.w + w] += row[p * g.q + q];
          }
        }
      }
}

// out[i] = alpha v[i] + beta out[i], out not read when beta is 0.
template <typename T>
void blend(int64_t count, T alpha, const T* v, T beta, T* out) {
  for (int64_t i = 0; i < count; ++i)
    out[i] = beta == T(0) ? alpha * v[i] : alpha * v[i] + beta * out[i];
}

template <typename T>
std::vector<T> copy_of(const T* p, int64_t count, bool tf32) {
  std::vector<T> v(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) v[static_cast<size_t>(i)] = read(p, i, tf32);
  return v;
}

}  // namespace

std::vector<float> widen_16(Format16 format, const void* p, int64_t count) {
  const uint16_t* bits = static_cast<const uint16_t*>(p);
  std::vector<float> v(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i)
    v[static_cast<size_t>(i)] =
        format == Format16::Half ? kiln::f16_to_f32(bits[i]) : kiln::bf16_to_f32(bits[i]);
  return v;
}

void narrow_16(Format16 format, const std::vector<float>& v, void* p) {
  uint16_t* bits = static_cast<uint16_t*>(p);
  for (size_t i = 0; i < v.size(); ++i)
    bits[i] = format == Format16::Half ? kiln::f32_to_f16(v[i]) : kiln::f32_to_bf16(v[i]);
}

template <typename T>
void conv_forward_host(const ConvShape& g, T alpha, const T* x, const T* w, T beta, T* y,
                       bool tf32) {
  const int64_t crs = g.c * g.r * g.s, pq = g.p * g.q;
  const std::vector<T> wm = copy_of(w, g.k * crs, tf32);  // (K, CRS)
  std::vector<T> col(static_cast<size_t>(crs * pq)), out(static_cast<size_t>(g.k * pq));
  for (int64_t n = 0; n < g.n; ++n) {
    im2col(g, x + n * g.c * g.h * g.w, col.data(), tf32);
    gemm_rm(false, false, g.k, pq, crs, wm.data(), crs, col.data(), pq, T(0), out.data(), pq);
    blend(g.k * pq, alpha, out.data(), beta, y + n * g.k * pq);
  }
}

template <typename T>
void conv_backward_data_host(const ConvShape& g, T alpha, const T* w, const T* dy, T beta, T* dx,
                             bool tf32) {
  const int64_t crs = g.c * g.r * g.s, pq = g.p * g.q, chw = g.c * g.h * g.w;
  const std::vector<T> wm = copy_of(w, g.k * crs, tf32);
  std::vector<T> col(static_cast<size_t>(crs * pq)), img(static_cast<size_t>(chw));
  for (int64_t n = 0; n < g.n; ++n) {
    const std::vector<T> dyn = copy_of(dy + n * g.k * pq, g.k * pq, tf32);
    // col (CRS, PQ) = W^T (CRS, K) dy_n (K, PQ), then scattered back onto the image.
    gemm_rm(true, false, crs, pq, g.k, wm.data(), crs, dyn.data(), pq, T(0), col.data(), pq);
    std::fill(img.begin(), img.end(), T(0));
    col2im_add(g, col.data(), img.data());
    blend(chw, alpha, img.data(), beta, dx + n * chw);
  }
}

template <typename T>
void conv_backward_filter_host(const ConvShape& g, T alpha, const T* x, const T* dy, T beta,
                               T* dw, bool tf32) {
  const int64_t crs = g.c * g.r * g.s, pq = g.p * g.q;
  std::vector<T> col(static_cast<size_t>(crs * pq)), acc(static_cast<size_t>(g.k * crs), T(0));
  for (int64_t n = 0; n < g.n; ++n) {
    im2col(g, x + n * g.c * g.h * g.w, col.data(), tf32);
    const std::vector<T> dyn = copy_of(dy + n * g.k * pq, g.k * pq, tf32);
    // acc (K, CRS) += dy_n (K, PQ) col^T (PQ, CRS).
    gemm_rm(false, true, g.k, crs, pq, dyn.data(), pq, col.data(), pq, T(1), acc.data(), crs);
  }
  blend(g.k * crs, alpha, acc.data(), beta, dw);
}

template <typename T>
void conv_backward_bias_host(int64_t n, int64_t k, int64_t pq, T alpha, const T* dy, T beta,
                             T* db) {
  for (int64_t kk = 0; kk < k; ++kk) {
    T sum = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < pq; ++j) sum += dy[(i * k + kk) * pq + j];
    db[kk] = beta == T(0) ? alpha * sum : alpha * sum + beta * db[kk];
  }
}

template <typename T>
void add_tensor_host(const int64_t ad[4], T alpha, const T* a, const int64_t cd[4], T beta,
                     T* c) {
  // The index of a that c[i0, i1, i2, i3] reads: 0 along a's broadcast (size 1) dimensions.
  auto at = [&](int d, int64_t i) { return ad[d] == 1 ? 0 : i; };
  int64_t i = 0;
  for (int64_t i0 = 0; i0 < cd[0]; ++i0)
    for (int64_t i1 = 0; i1 < cd[1]; ++i1)
      for (int64_t i2 = 0; i2 < cd[2]; ++i2)
        for (int64_t i3 = 0; i3 < cd[3]; ++i3, ++i) {
          const T v = a[((at(0, i0) * ad[1] + at(1, i1)) * ad[2] + at(2, i2)) * ad[3] + at(3, i3)];
          c[i] = beta == T(0) ? alpha * v : alpha * v + beta * c[i];
        }
}

#define KILN_SIM_CUDNN_INSTANTIATE(T)                                                          \
  template void conv_forward_host<T>(const ConvShape&, T, const T*, const T*, T, T*, bool);     \
  template void conv_backward_data_host<T>(const ConvShape&, T, const T*, const T*, T, T*,      \
                                           bool);                                               \
  template void conv_backward_filter_host<T>(const ConvShape&, T, const T*, const T*, T, T*,    \
                                             bool);                                             \
  template void conv_backward_bias_host<T>(int64_t, int64_t, int64_t, T, const T*, T, T*);      \
  template void add_tensor_host<T>(const int64_t[4], T, const T*, const int64_t[4], T, T*);
KILN_SIM_CUDNN_INSTANTIATE(float)
KILN_SIM_CUDNN_INSTANTIATE(double)
#undef KILN_SIM_CUDNN_INSTANTIATE

}  // namespace kiln::sim
