// conv2d_cpu.cpp: the hand CPU kernels of Conv2d, im2col + GEMM: cpu::conv2d_forward,
// conv2d_backward_data and conv2d_backward_weight (layers/conv2d_kernels.h; the family's map is
// in layers/conv2d.h).
//
// The idea (Chellapilla et al. 2006; Caffe made it famous). A convolution output pixel is a
// dot product between the K filters and the C*R*S input values under the filter window. If we
// copy, for one image, every window into a column of a matrix
//
//     col[(c*R + r)*S + s][p*Q + q] = x[c][p*stride - pad + r][q*stride - pad + s]   (0 outside)
//
// (C*R*S rows, P*Q columns), then the whole convolution of that image is one matrix product:
//
//     y[n] (K, P*Q) = w (K, C*R*S) * col (C*R*S, P*Q)            forward
//     dw   (K, C*R*S) += dy[n] (K, P*Q) * col^T (P*Q, C*R*S)      backward-weight
//     dcol (C*R*S, P*Q) = w^T (C*R*S, K) * dy[n] (K, P*Q)         backward-data, then
//     dx[n] = col2im(dcol): each column entry is added back to the pixel it was copied from.
//
// The copy costs memory traffic (every input pixel is copied R*S times), but it turns the
// convolution into a GEMM, the most optimised routine there is: OpenBLAS runs it near the
// machine's peak, which no readable direct loop nest does.
//
// Parallelism: OpenMP over the images of the batch. Each thread owns its column buffer
// (thread_local, kept alive across calls so its pages are not faulted in every step) and makes
// single-threaded BLAS calls (OpenBLAS built for OpenMP sees omp_in_parallel() and does not
// spawn threads of its own: one thread pool, no oversubscription).
//
// backward-weight sums over images, so threads would race on dw: each thread sums its own
// images into a private partial, and the partials are added in thread order at the end, so
// the result is bit-identical from run to run for a fixed thread count.
//
// Special cases. A 1x1 kernel with stride 1 and no padding needs no im2col at all (col is x).
// The first layer of an image model (C = 1, e.g. 1->32 3x3 on MNIST) has only C*R*S = 9 rows
// of col: its GEMMs are thin, but it is ~2% of the CNN's convolution FLOPs, and its input (the
// images) needs no gradient, so conv2d() never runs backward-data for it.
//
// Channels-last (g.x_nhwc: x, dx, y, dy in (N, H, W, C) byte order, docs/memory_format.md). The
// same product, transposed so that the channels run fastest in every matrix. One row of col per
// output pixel (p, q), one column per (r, s, c), c fastest:
//
//     col[p*Q + q][(r*S + s)*C + c] = x[p*stride - pad + r][q*stride - pad + s][c]  (0 outside)
//
//     y[n]  (P*Q, K)     = col (P*Q, R*S*C) * w^T (R*S*C, K)      forward: y lands in NHWC
//     dw    (K, R*S*C)  += dy[n]^T (K, P*Q) * col (P*Q, R*S*C)      backward-weight
//     dcol  (P*Q, R*S*C) = dy[n] (P*Q, K) * w (K, R*S*C)            backward-data, then col2im
//
// with w as (K, R*S*C), i.e. KRSC, and db the column sums of dy (N*P*Q, K). Why NHWC suits
// im2col: in NCHW a window's values are scattered over C planes, one copy per (c, r, s); in NHWC
// the C values of a pixel are adjacent, and the S pixels of one window row are adjacent pixels
// of one image row, so each (p, q, r) is ONE contiguous run of S*C values (shorter where the
// window hangs over the border): im2col becomes R copies per output pixel, col2im R adds. A
// weight in the other order (KCRS) is repacked into a small KRSC scratch first, and dw written
// back in the caller's order (g.w_nhwc says which), so every combination works; the same for
// KRSC weights with NCHW activations.
//
// Where the time goes (seed conv2, 32->64 3x3 on 26x26, batch 128, forward + backward, one
// Zen 5 core): the three GEMMs run at ~105 GFLOP/s (this OpenBLAS is pinned to its AVX2 Haswell
// kernels), ~77 ms; im2col (twice), col2im and the bias sums bring it to ~98 ms (84 GFLOP/s;
// 51 ms on two cores). oneDNN's AVX-512 direct kernels take ~48 ms (conv2d_dnnl.cpp).
// Measure with: build/apps/conv_bench --threads 1 (and 2).
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "layers/conv2d_kernels.h"

// The pointers of a copy loop never alias: telling the compiler lets it vectorise freely.
#define KILN_RESTRICT __restrict__

namespace kiln::cpu {
namespace {

// ---- GEMM: one name for float and double ---------------------------------------------------------
// Row-major C (m, n) = alpha * op(A) * op(B) + beta * C, with op(A) (m, k) and op(B) (k, n).
inline void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              (int)m, (int)n, (int)k, alpha, a, (int)lda, b, (int)ldb, beta, c, (int)ldc);
}
inline void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha,
                 const double* a, int64_t lda, const double* b, int64_t ldb, double beta,
                 double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              (int)m, (int)n, (int)k, alpha, a, (int)lda, b, (int)ldb, beta, c, (int)ldc);
}

// A per-thread scratch buffer of at least `count` elements. It only grows, and lives as long
// as the thread (OpenMP keeps its worker threads), so steady-state training allocates nothing.
// Slot tells apart buffers that one thread holds at the same time.
enum class Slot { Columns, Partials, Weights };
template <typename T, Slot slot = Slot::Columns>
T* scratch(size_t count) {
  thread_local std::vector<T> buf;
  if (buf.size() < count) buf.resize(count);
  return buf.data();
}

// The output columns q whose input column iw = q*stride - pad + s falls inside [0, W):
// q in [lo, hi). Everything outside reads (or writes) the zero padding.
inline void valid_range(int64_t s, const ConvGeometry& g, int64_t& lo, int64_t& hi) {
  int64_t off = s - g.pad;  // iw = q*stride + off
  lo = off >= 0 ? 0 : (-off + g.stride - 1) / g.stride;
  hi = g.w - off <= 0 ? 0 : (g.w - off - 1) / g.stride + 1;
  lo = std::min(lo, g.q);
  hi = std::clamp(hi, lo, g.q);
}

// Sum of v[0..n). One running sum would be a chain of dependent adds (the compiler may not
// reorder float additions); 16 independent lanes vectorise, in a fixed order.
template <typename T>
T sum(const T* v, int64_t n) {
  constexpr int kLanes = 16;
  T lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) lane[j] += v[i + j];
  T acc = 0;
  for (; i < n; ++i) acc += v[i];
  for (int j = 0; j < kLanes; ++j) acc += lane[j];
  return acc;
}

// Whether a convolution is big enough to split over threads. Waking a team costs a few
// microseconds (far more when another process holds a core), which tiny convolutions, such as
// the thousands a gradient check runs, never earn back. One image never splits either: then
// OpenBLAS may thread inside the GEMM instead.
bool use_team(const ConvGeometry& g) {
  return g.n > 1 && g.n * g.k * g.c * g.r * g.s * g.p * g.q >= (int64_t(1) << 20);
}

bool is_pointwise(const ConvGeometry& g) {
  return g.r == 1 && g.s == 1 && g.stride == 1 && g.pad == 0;
}

// im2col for one image: col (C*R*S, P*Q) from x (C, H, W), zeros where the window hangs over
// the border. One row of col is one (c, r, s): the input plane c shifted by (r, s); so for
// stride 1 each output row p is a contiguous copy of an input row, a memcpy.
template <typename T>
void im2col(const T* x,  // x is (C, H, W)
            T* col,      // col is (C*R*S, P*Q)
            const ConvGeometry& g) {
  const int64_t pq = g.p * g.q;
  for (int64_t c = 0; c < g.c; ++c) {
    for (int64_t r = 0; r < g.r; ++r) {
      for (int64_t s = 0; s < g.s; ++s) {
        T* row = col + ((c * g.r + r) * g.s + s) * pq;
        int64_t lo, hi;
        valid_range(s, g, lo, hi);
        const int64_t off = s - g.pad;
        for (int64_t p = 0; p < g.p; ++p) {
          T* KILN_RESTRICT out = row + p * g.q;
          const int64_t ih = p * g.stride - g.pad + r;
          if (ih < 0 || ih >= g.h) {
            std::fill(out, out + g.q, T(0));
            continue;
          }
          const T* KILN_RESTRICT in = x + (c * g.h + ih) * g.w + off;  // in[q*stride]: q's pixel
          for (int64_t q = 0; q < lo; ++q) out[q] = T(0);
          if (g.stride == 1) {
            // Rows are short (Q = 24 in the MNIST CNN): a plain loop the compiler vectorises
            // beats a memcpy call per row.
            for (int64_t q = lo; q < hi; ++q) out[q] = in[q];
          } else {
            for (int64_t q = lo; q < hi; ++q) out[q] = in[q * g.stride];
          }
          for (int64_t q = hi; q < g.q; ++q) out[q] = T(0);
        }
      }
    }
  }
}

// col2im for one image: the adjoint of im2col. Every entry of dcol is added to the input pixel
// it was copied from; entries that came from the padding are dropped. dx is overwritten.
template <typename T>
void col2im(const T* dcol,  // dcol is (C*R*S, P*Q)
            T* dx,          // dx is (C, H, W)
            const ConvGeometry& g) {
  const int64_t pq = g.p * g.q;
  std::fill(dx, dx + g.c * g.h * g.w, T(0));
  for (int64_t c = 0; c < g.c; ++c) {
    for (int64_t r = 0; r < g.r; ++r) {
      for (int64_t s = 0; s < g.s; ++s) {
        const T* row = dcol + ((c * g.r + r) * g.s + s) * pq;
        int64_t lo, hi;
        valid_range(s, g, lo, hi);
        const int64_t off = s - g.pad;
        for (int64_t p = 0; p < g.p; ++p) {
          const int64_t ih = p * g.stride - g.pad + r;
          if (ih < 0 || ih >= g.h) continue;
          const T* KILN_RESTRICT in = row + p * g.q;
          T* KILN_RESTRICT out = dx + (c * g.h + ih) * g.w + off;
          if (g.stride == 1) {
            for (int64_t q = lo; q < hi; ++q) out[q] += in[q];  // vectorises
          } else {
            for (int64_t q = lo; q < hi; ++q) out[q * g.stride] += in[q];
          }
        }
      }
    }
  }
}

// ---- weight order ----------------------------------------------------------------------------------
// Each layout's kernels want the weight in one order: KCRS for NCHW, KRSC for NHWC. The other one
// is repacked, per call: weights are small next to the activations.

// Whether the kernels for x's layout want the weight in the other order than it arrives in. A
// 1x1 filter's two orders are the same bytes.
bool weight_reordered(const ConvGeometry& g) {
  return g.w_nhwc != g.x_nhwc && g.r * g.s > 1;
}

// The index in the caller's order of element i of a weight-shaped buffer in the kernels' order
// (the identity unless weight_reordered(g)). Per filter k, KCRS and KRSC are the two orders of a
// (C, R*S) matrix.
inline int64_t caller_weight_index(int64_t i, const ConvGeometry& g) {
  const int64_t rs = g.r * g.s, crs = g.c * rs;
  const int64_t k = i / crs, j = i % crs;
  if (g.x_nhwc)  // kernels' KRSC, caller's KCRS: j = rs_i * C + c
    return k * crs + (j % g.c) * rs + j / g.c;
  return k * crs + (j % rs) * g.c + j / rs;  // kernels' KCRS, caller's KRSC: j = c * RS + rs_i
}

// w in the kernels' order: w itself, or a copy in this thread's scratch. Call it outside the
// parallel region: the threads then read the calling thread's buffer.
template <typename T>
const T* weight_for_kernels(const T* w, const ConvGeometry& g) {
  if (!weight_reordered(g)) return w;
  const int64_t rs = g.r * g.s;
  T* out = scratch<T, Slot::Weights>(static_cast<size_t>(g.k * g.c * rs));
  for (int64_t k = 0; k < g.k; ++k) {
    for (int64_t c = 0; c < g.c; ++c) {
      for (int64_t j = 0; j < rs; ++j) {
        const int64_t kcrs = (k * g.c + c) * rs + j, krsc = (k * rs + j) * g.c + c;
        if (g.x_nhwc)
          out[krsc] = w[kcrs];
        else
          out[kcrs] = w[krsc];
      }
    }
  }
  return out;
}

// ---- channels-last im2col / col2im -----------------------------------------------------------------
// The window row (p, q, r) reads the input pixels iw = q*stride - pad + s for s in [lo, hi);
// the filter columns outside read the zero padding. One contiguous run of (hi - lo) * C values.
inline void window_columns(int64_t q, const ConvGeometry& g, int64_t& lo, int64_t& hi) {
  const int64_t iw0 = q * g.stride - g.pad;
  lo = std::clamp<int64_t>(-iw0, 0, g.s);
  hi = std::clamp<int64_t>(g.w - iw0, lo, g.s);
}

// im2col for one channels-last image: col (P*Q, R*S*C) from x (H, W, C).
template <typename T>
void im2col_nhwc(const T* x,  // x is (H, W, C)
                 T* col,      // col is (P*Q, R*S*C)
                 const ConvGeometry& g) {
  const int64_t sc = g.s * g.c, rsc = g.r * sc;
  for (int64_t p = 0; p < g.p; ++p) {
    for (int64_t q = 0; q < g.q; ++q) {
      T* row = col + (p * g.q + q) * rsc;
      int64_t lo, hi;
      window_columns(q, g, lo, hi);
      const int64_t iw0 = q * g.stride - g.pad;
      for (int64_t r = 0; r < g.r; ++r) {
        T* KILN_RESTRICT out = row + r * sc;
        const int64_t ih = p * g.stride - g.pad + r;
        if (ih < 0 || ih >= g.h) {
          std::fill(out, out + sc, T(0));
          continue;
        }
        // The window row's first pixel inside the image, and its C-vectors up to the last.
        const T* KILN_RESTRICT in = x + (ih * g.w + iw0 + lo) * g.c;
        std::fill(out, out + lo * g.c, T(0));
        std::copy(in, in + (hi - lo) * g.c, out + lo * g.c);
        std::fill(out + hi * g.c, out + sc, T(0));
      }
    }
  }
}

// col2im for one channels-last image, the adjoint of im2col_nhwc: every row segment of dcol is
// added back to the pixels it was copied from, in a fixed order (p, q, r). dx is overwritten.
template <typename T>
void col2im_nhwc(const T* dcol,  // dcol is (P*Q, R*S*C)
                 T* dx,          // dx is (H, W, C)
                 const ConvGeometry& g) {
  const int64_t sc = g.s * g.c, rsc = g.r * sc;
  std::fill(dx, dx + g.h * g.w * g.c, T(0));
  for (int64_t p = 0; p < g.p; ++p) {
    for (int64_t q = 0; q < g.q; ++q) {
      const T* row = dcol + (p * g.q + q) * rsc;
      int64_t lo, hi;
      window_columns(q, g, lo, hi);
      const int64_t iw0 = q * g.stride - g.pad;
      for (int64_t r = 0; r < g.r; ++r) {
        const int64_t ih = p * g.stride - g.pad + r;
        if (ih < 0 || ih >= g.h) continue;
        const T* KILN_RESTRICT in = row + (r * g.s + lo) * g.c;
        T* KILN_RESTRICT out = dx + (ih * g.w + iw0 + lo) * g.c;
        for (int64_t i = 0; i < (hi - lo) * g.c; ++i) out[i] += in[i];  // vectorises
      }
    }
  }
}

// ---- the channels-last kernels ---------------------------------------------------------------------
// The same threading as the NCHW kernels below: images over threads, per-thread partials of dw
// and db reduced in thread order. w is in KRSC order here (weight_for_kernels).

template <typename T>
void forward_nhwc(const T* x, const T* w, const T* b, T* y, const ConvGeometry& g) {
  const int64_t rsc = g.r * g.s * g.c, pq = g.p * g.q, hwc = g.h * g.w * g.c;
  const bool pointwise = is_pointwise(g);
#pragma omp parallel for schedule(static) if (use_team(g))
  for (int64_t n = 0; n < g.n; ++n) {
    const T* xn = x + n * hwc;  // (H, W, C)
    T* yn = y + n * pq * g.k;   // (P, Q, K)
    const T* col = xn;          // 1x1/stride 1/no pad: x already is the column matrix (HW, C)
    if (!pointwise) {
      T* buf = scratch<T>(static_cast<size_t>(pq * rsc));
      im2col_nhwc(xn, buf, g);
      col = buf;
    }
    // Every row of y starts as the bias (or zero); the GEMM accumulates into it (beta = 1).
    for (int64_t i = 0; i < pq; ++i) {
      T* row = yn + i * g.k;
      if (b)
        std::copy(b, b + g.k, row);
      else
        std::fill(row, row + g.k, T(0));
    }
    // y[n] (PQ, K) += col (PQ, RSC) * w^T (RSC, K)
    gemm(false, true, pq, g.k, rsc, T(1), col, rsc, w, rsc, T(1), yn, g.k);
  }
}

template <typename T>
void backward_data_nhwc(const T* dy, const T* w, T* dx, const ConvGeometry& g) {
  const int64_t rsc = g.r * g.s * g.c, pq = g.p * g.q, hwc = g.h * g.w * g.c;
  const bool pointwise = is_pointwise(g);
#pragma omp parallel for schedule(static) if (use_team(g))
  for (int64_t n = 0; n < g.n; ++n) {
    const T* dyn = dy + n * pq * g.k;  // (P, Q, K)
    T* dxn = dx + n * hwc;             // (H, W, C)
    // dcol (PQ, RSC) = dy[n] (PQ, K) * w (K, RSC); for 1x1 convs dcol is dx[n] itself.
    T* dcol = pointwise ? dxn : scratch<T>(static_cast<size_t>(pq * rsc));
    gemm(false, false, pq, rsc, g.k, T(1), dyn, g.k, w, rsc, T(0), dcol, rsc);
    if (!pointwise) col2im_nhwc(dcol, dxn, g);
  }
}

// dw in the caller's order (caller_weight_index): the partials are KRSC.
template <typename T>
void backward_weight_nhwc(const T* x, const T* dy, T* dw, T* db, const ConvGeometry& g) {
  const int64_t rsc = g.r * g.s * g.c, pq = g.p * g.q, hwc = g.h * g.w * g.c;
  const int64_t krsc = g.k * rsc;
  const bool pointwise = is_pointwise(g), reordered = weight_reordered(g);
  const int nt = use_team(g) ? static_cast<int>(std::min<int64_t>(omp_get_max_threads(), g.n)) : 1;
  // partial[t] = (dw_t (K, RSC), db_t (K)): thread t's sums over its own images.
  const int64_t part = krsc + g.k;
  T* partial = scratch<T, Slot::Partials>(static_cast<size_t>(nt * part));
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num();
    T* dw_t = partial + t * part;
    T* db_t = dw_t + krsc;
    std::fill(db_t, db_t + g.k, T(0));
    bool first = true;  // the first image overwrites dw_t (beta = 0): no zeroing pass
#pragma omp for schedule(static)
    for (int64_t n = 0; n < g.n; ++n) {
      const T* dyn = dy + n * pq * g.k;  // (PQ, K)
      if (dw) {
        const T* xn = x + n * hwc;
        const T* col = xn;
        if (!pointwise) {
          T* buf = scratch<T>(static_cast<size_t>(pq * rsc));
          im2col_nhwc(xn, buf, g);
          col = buf;
        }
        // dw_t (K, RSC) += dy[n]^T (K, PQ) * col (PQ, RSC)
        gemm(true, false, g.k, rsc, pq, T(1), dyn, g.k, col, rsc, first ? T(0) : T(1), dw_t,
             rsc);
      }
      if (db) {  // the column sums of dy[n], row after row: contiguous, vectorises over K
        for (int64_t i = 0; i < pq; ++i) {
          const T* KILN_RESTRICT row = dyn + i * g.k;
          for (int64_t k = 0; k < g.k; ++k) db_t[k] += row[k];
        }
      }
      first = false;
    }
    if (first) std::fill(dw_t, dw_t + krsc, T(0));  // a thread that got no image
#pragma omp barrier
    // Reduce the partials in thread order (0, 1, ...), element ranges split over the threads.
#pragma omp for schedule(static)
    for (int64_t i = 0; i < part; ++i) {
      T acc = partial[i];
      for (int u = 1; u < nt; ++u) acc += partial[u * part + i];
      if (i < krsc) {
        if (dw) dw[reordered ? caller_weight_index(i, g) : i] = acc;
      } else if (db) {
        db[i - krsc] = acc;
      }
    }
  }
}

}  // namespace

// ---- forward ---------------------------------------------------------------------------------------
template <typename T>
void conv2d_forward(Backend, const T* x, const T* w, const T* b, T* y, const ConvGeometry& g) {
  w = weight_for_kernels(w, g);
  if (g.x_nhwc) return forward_nhwc(x, w, b, y, g);
  const int64_t crs = g.c * g.r * g.s, pq = g.p * g.q, chw = g.c * g.h * g.w;
  const bool pointwise = is_pointwise(g);
#pragma omp parallel for schedule(static) if (use_team(g))
  for (int64_t n = 0; n < g.n; ++n) {
    const T* xn = x + n * chw;  // (C, H, W)
    T* yn = y + n * g.k * pq;   // (K, P, Q)
    const T* col = xn;          // 1x1/stride 1/no pad: x already is the column matrix
    if (!pointwise) {
      T* buf = scratch<T>(static_cast<size_t>(crs * pq));
      im2col(xn, buf, g);
      col = buf;
    }
    // Start y from the bias (or zero) and let the GEMM accumulate into it (beta = 1): the bias
    // costs no extra pass over y, and OpenBLAS skips its own pass that scales C by beta.
    for (int64_t k = 0; k < g.k; ++k) std::fill(yn + k * pq, yn + (k + 1) * pq, b ? b[k] : T(0));
    // y[n] (K, PQ) += w (K, CRS) * col (CRS, PQ)
    gemm(false, false, g.k, pq, crs, T(1), w, crs, col, pq, T(1), yn, pq);
  }
}

// ---- backward-data ---------------------------------------------------------------------------------
template <typename T>
void conv2d_backward_data(Backend, const T* dy, const T* w, T* dx, const ConvGeometry& g) {
  w = weight_for_kernels(w, g);
  if (g.x_nhwc) return backward_data_nhwc(dy, w, dx, g);
  const int64_t crs = g.c * g.r * g.s, pq = g.p * g.q, chw = g.c * g.h * g.w;
  const bool pointwise = is_pointwise(g);
#pragma omp parallel for schedule(static) if (use_team(g))
  for (int64_t n = 0; n < g.n; ++n) {
    const T* dyn = dy + n * g.k * pq;  // (K, P, Q)
    T* dxn = dx + n * chw;             // (C, H, W)
    // dcol (CRS, PQ) = w^T (CRS, K) * dy[n] (K, PQ); for 1x1 convs dcol is dx[n] itself.
    T* dcol = pointwise ? dxn : scratch<T>(static_cast<size_t>(crs * pq));
    gemm(true, false, crs, pq, g.k, T(1), w, crs, dyn, pq, T(0), dcol, pq);
    if (!pointwise) col2im(dcol, dxn, g);
  }
}

// ---- backward-weight -------------------------------------------------------------------------------
template <typename T>
void conv2d_backward_weight(Backend, const T* x, const T* dy, T* dw, T* db, const ConvGeometry& g) {
  if (g.x_nhwc) return backward_weight_nhwc(x, dy, dw, db, g);
  const int64_t crs = g.c * g.r * g.s, pq = g.p * g.q, chw = g.c * g.h * g.w;
  const int64_t kcrs = g.k * crs;
  const bool pointwise = is_pointwise(g), reordered = weight_reordered(g);
  const int nt = use_team(g) ? static_cast<int>(std::min<int64_t>(omp_get_max_threads(), g.n)) : 1;
  // partial[t] = (dw_t (K, CRS), db_t (K)): thread t's sums over its own images.
  const int64_t part = kcrs + g.k;
  T* partial = scratch<T, Slot::Partials>(static_cast<size_t>(nt * part));
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num();
    T* dw_t = partial + t * part;
    T* db_t = dw_t + kcrs;
    std::fill(db_t, db_t + g.k, T(0));
    bool first = true;  // the first image overwrites dw_t (beta = 0): no zeroing pass
#pragma omp for schedule(static)
    for (int64_t n = 0; n < g.n; ++n) {
      const T* dyn = dy + n * g.k * pq;
      if (dw) {
        const T* xn = x + n * chw;
        const T* col = xn;
        if (!pointwise) {
          T* buf = scratch<T>(static_cast<size_t>(crs * pq));
          im2col(xn, buf, g);
          col = buf;
        }
        // dw_t (K, CRS) += dy[n] (K, PQ) * col^T (PQ, CRS)
        gemm(false, true, g.k, crs, pq, T(1), dyn, pq, col, pq, first ? T(0) : T(1), dw_t, crs);
      }
      if (db) {
        for (int64_t k = 0; k < g.k; ++k) db_t[k] += sum(dyn + k * pq, pq);
      }
      first = false;
    }
    if (first) std::fill(dw_t, dw_t + kcrs, T(0));  // a thread that got no image
#pragma omp barrier
    // Reduce the partials in thread order (0, 1, ...), element ranges split over the threads.
#pragma omp for schedule(static)
    for (int64_t i = 0; i < part; ++i) {
      T acc = partial[i];
      for (int u = 1; u < nt; ++u) acc += partial[u * part + i];
      if (i < kcrs) {
        if (dw) dw[reordered ? caller_weight_index(i, g) : i] = acc;
      } else if (db) {
        db[i - kcrs] = acc;
      }
    }
  }
}

#define KILN_INSTANTIATE_CONV(T)                                                             \
  template void conv2d_forward<T>(Backend, const T*, const T*, const T*, T*,                 \
                                  const ConvGeometry&);                                      \
  template void conv2d_backward_data<T>(Backend, const T*, const T*, T*, const ConvGeometry&); \
  template void conv2d_backward_weight<T>(Backend, const T*, const T*, T*, T*,               \
                                          const ConvGeometry&);
KILN_INSTANTIATE_CONV(float)
KILN_INSTANTIATE_CONV(double)
#undef KILN_INSTANTIATE_CONV

}  // namespace kiln::cpu
