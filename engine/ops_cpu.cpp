// ops_cpu.cpp: the CPU kernels of the core ops. Plain loops over contiguous buffers, OpenMP
// across elements (or rows) when there is enough work to pay for waking the threads.
//
// 16-bit elements (Half, BFloat16) in the elementwise kernels: g++ -O3 -march=native
// vectorises the one-element-at-a-time loop `out[i] = convert_elem<T>(f(widen(a[i])))` for
// bf16 (its conversions are a shift and an integer add) but not for f16 (the subnormal loop of
// f16_to_f32), so both run in blocks instead: a block of each operand is widened to f32 with
// the vector conversions of engine/convert_cpu.h (AVX-512 / F16C, the same bits as the scalar
// rule, and the scalar rule where -march has neither), the f32 loop runs on the block, and the
// results are narrowed once (Lp16Block below). The f32 and f64 loops are unchanged.
#include "engine/ops_cpu.h"

#include "engine/convert_cpu.h"
#include "engine/host_device.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace kiln::cpu {

// Below this many elements a parallel region costs more than it saves.
constexpr int64_t kParallelGrain = 1 << 15;

template <typename T>
static T apply_binary(BinaryOp op, T a, T b) {
  switch (op) {
    case BinaryOp::Add: return a + b;
    case BinaryOp::Sub: return a - b;
    case BinaryOp::Mul: return a * b;
    case BinaryOp::Div: return a / b;
    case BinaryOp::AddRelu: {
      const T v = a + b;
      return v > T(0) ? v : T(0);
    }
  }
  return T(0);
}

// ---- 16-bit elementwise: widen a block, the f32 loop, narrow once ------------------------------

// Elements per block: three f32 buffers of it (two operands, the result) stay in L1.
constexpr int64_t kLp16Block = 1024;

inline void widen_block(const Half* src, float* dst, int64_t n) {
  convert_f16_to_f32_serial(src, dst, n);
}
inline void widen_block(const BFloat16* src, float* dst, int64_t n) {
  convert_bf16_to_f32_serial(src, dst, n);
}
inline void narrow_block(const float* src, Half* dst, int64_t n) {
  convert_f32_to_f16_serial(src, dst, n);
}
inline void narrow_block(const float* src, BFloat16* dst, int64_t n) {
  convert_f32_to_bf16_serial(src, dst, n);
}

// out[i] = f(a[i], b[i]) for 16-bit a, b, out, computed in f32: f(wa, wb, wo, len) runs the f32
// loop over one block (b may be null: a unary map). Blocks are split over the threads.
template <typename T, typename F>
void map16(const T* a, const T* b, T* out, int64_t n, F f) {
  const int64_t blocks = (n + kLp16Block - 1) / kLp16Block;
#pragma omp parallel for if (n > kParallelGrain)
  for (int64_t k = 0; k < blocks; ++k) {
    const int64_t begin = k * kLp16Block, len = std::min(kLp16Block, n - begin);
    float wa[kLp16Block], wb[kLp16Block], wo[kLp16Block];
    widen_block(a + begin, wa, len);
    if (b != nullptr) widen_block(b + begin, wb, len);
    f(wa, wb, wo, len);
    narrow_block(wo, out + begin, len);
  }
}

template <BinaryOp Op, typename T>
void binary_loop16(Broadcast kind, const T* a, const T* b, T* out, int64_t n, int64_t row) {
  switch (kind) {
    case Broadcast::Same:
      return map16(a, b, out, n, [](const float* x, const float* y, float* o, int64_t len) {
        for (int64_t i = 0; i < len; ++i) o[i] = apply_binary(Op, x[i], y[i]);
      });
    case Broadcast::Scalar: {
      const float bv = widen(b[0]);
      return map16(a, static_cast<const T*>(nullptr), out, n,
                   [bv](const float* x, const float*, float* o, int64_t len) {
                     for (int64_t i = 0; i < len; ++i) o[i] = apply_binary(Op, x[i], bv);
                   });
    }
    case Broadcast::Row: {
      // The row widened once; then each row of a is a map against it.
      std::vector<float> wrow(static_cast<size_t>(row));
      for (int64_t j = 0; j < row; ++j) wrow[static_cast<size_t>(j)] = widen(b[j]);
      const int64_t rows = n / row;
#pragma omp parallel for if (n > kParallelGrain)
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t j0 = 0; j0 < row; j0 += kLp16Block) {
          const int64_t len = std::min(kLp16Block, row - j0);
          float wa[kLp16Block], wo[kLp16Block];
          widen_block(a + r * row + j0, wa, len);
          const float* wb = wrow.data() + j0;
          for (int64_t i = 0; i < len; ++i) wo[i] = apply_binary(Op, wa[i], wb[i]);
          narrow_block(wo, out + r * row + j0, len);
        }
      }
      return;
    }
  }
}

// The operation and the broadcast are fixed per call: each (op, kind) pair gets its own loop,
// so the per-element body is one operation the compiler vectorises (this loop also sums the
// gradients of every tensor used twice, e.g. a residual block's input, in backward).
template <BinaryOp Op, typename T>
void binary_loop(Broadcast kind, const T* a, const T* b, T* out, int64_t n, int64_t row) {
  switch (kind) {
    case Broadcast::Same:
#pragma omp parallel for simd if (n > kParallelGrain)
      for (int64_t i = 0; i < n; ++i) out[i] = apply_binary(Op, a[i], b[i]);
      return;
    case Broadcast::Scalar: {
      const T bv = b[0];
#pragma omp parallel for simd if (n > kParallelGrain)
      for (int64_t i = 0; i < n; ++i) out[i] = apply_binary(Op, a[i], bv);
      return;
    }
    case Broadcast::Row: {
      const int64_t rows = n / row;
#pragma omp parallel for if (n > kParallelGrain)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < row; ++j)
          out[r * row + j] = apply_binary(Op, a[r * row + j], b[j]);
      return;
    }
  }
}

template <typename T>
void binary(Backend, BinaryOp op, Broadcast kind, const T* a, const T* b, T* out, int64_t n,
            int64_t row) {
  if constexpr (is_low_precision_v<T>) {
    switch (op) {
      case BinaryOp::Add: return binary_loop16<BinaryOp::Add>(kind, a, b, out, n, row);
      case BinaryOp::Sub: return binary_loop16<BinaryOp::Sub>(kind, a, b, out, n, row);
      case BinaryOp::Mul: return binary_loop16<BinaryOp::Mul>(kind, a, b, out, n, row);
      case BinaryOp::Div: return binary_loop16<BinaryOp::Div>(kind, a, b, out, n, row);
      case BinaryOp::AddRelu: return binary_loop16<BinaryOp::AddRelu>(kind, a, b, out, n, row);
    }
  } else {
    switch (op) {
      case BinaryOp::Add: return binary_loop<BinaryOp::Add>(kind, a, b, out, n, row);
      case BinaryOp::Sub: return binary_loop<BinaryOp::Sub>(kind, a, b, out, n, row);
      case BinaryOp::Mul: return binary_loop<BinaryOp::Mul>(kind, a, b, out, n, row);
      case BinaryOp::Div: return binary_loop<BinaryOp::Div>(kind, a, b, out, n, row);
      case BinaryOp::AddRelu: return binary_loop<BinaryOp::AddRelu>(kind, a, b, out, n, row);
    }
  }
}

template <typename T>
void unary(Backend, UnaryOp op, const T* x, T* out, int64_t n, compute_t<T> scalar) {
  using C = compute_t<T>;
  // f32/f64: one loop over the elements; 16-bit: the same f32 body over widened blocks.
  auto run = [&](auto f) {
    if constexpr (is_low_precision_v<T>) {
      map16(x, static_cast<const T*>(nullptr), out, n,
            [&f](const float* v, const float*, float* o, int64_t len) {
              for (int64_t i = 0; i < len; ++i) o[i] = f(v[i]);
            });
    } else {
#pragma omp parallel for if (n > kParallelGrain)
      for (int64_t i = 0; i < n; ++i) out[i] = f(x[i]);
    }
  };
  switch (op) {
    case UnaryOp::Neg: return run([](C v) { return -v; });
    case UnaryOp::Exp: return run([](C v) { return std::exp(v); });
    case UnaryOp::Log: return run([](C v) { return std::log(v); });
    case UnaryOp::Square: return run([](C v) { return v * v; });
    case UnaryOp::Relu: return run([](C v) { return v > C(0) ? v : C(0); });
    case UnaryOp::AddScalar: return run([scalar](C v) { return v + scalar; });
    case UnaryOp::MulScalar: return run([scalar](C v) { return v * scalar; });
  }
}

// y > 0 on the bits of a 16-bit float: positive (sign clear), nonzero, and at most +inf (NaN
// is not > 0): bits - 1 below inf's bits, as unsigned. Integer code: the loop vectorises, and
// the gradient's bits pass through unconverted.
inline bool positive16(Half v) { return static_cast<uint16_t>(v.bits - 1u) < 0x7c00u; }
inline bool positive16(BFloat16 v) { return static_cast<uint16_t>(v.bits - 1u) < 0x7f80u; }

template <typename T>
void relu_backward(Backend, const T* grad_y, const T* y, T* grad_x, int64_t n) {
  if constexpr (is_low_precision_v<T>) {
#pragma omp parallel for simd if (n > kParallelGrain)
    for (int64_t i = 0; i < n; ++i) grad_x[i].bits = positive16(y[i]) ? grad_y[i].bits : uint16_t{0};
  } else {
#pragma omp parallel for simd if (n > kParallelGrain)
    for (int64_t i = 0; i < n; ++i) grad_x[i] = y[i] > T(0) ? grad_y[i] : T(0);
  }
}

template <typename T>
void sum_dim(Backend, const T* x, compute_t<T>* out, int64_t outer, int64_t len, int64_t inner) {
  using C = compute_t<T>;
  // Each output element is owned by one thread, and summed in a fixed order: reproducible.
#pragma omp parallel for collapse(2) if (outer * len * inner > kParallelGrain)
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      C acc = 0;
      for (int64_t l = 0; l < len; ++l) acc += convert_elem<C>(x[(o * len + l) * inner + i]);
      out[o * inner + i] = acc;
    }
  }
}

template <typename T>
void expand_dim(Backend, const compute_t<T>* g, T* out, int64_t outer, int64_t len,
                int64_t inner, compute_t<T> scale) {
#pragma omp parallel for collapse(2) if (outer * len * inner > kParallelGrain)
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t l = 0; l < len; ++l)
      for (int64_t i = 0; i < inner; ++i)
        out[(o * len + l) * inner + i] = convert_elem<T>(g[o * inner + i] * scale);
}

template <typename T>
void argmax_dim(Backend, const T* x, int64_t* out, int64_t outer, int64_t len, int64_t inner) {
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      int64_t best = 0;
      for (int64_t l = 1; l < len; ++l)
        if (x[(o * len + l) * inner + i] > x[(o * len + best) * inner + i]) best = l;
      out[o * inner + i] = best;
    }
  }
}

template <>
void gemm<float>(Backend, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a,
                 const float* b, float* c, float beta) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1.0f, a,
              static_cast<int>(ta ? m : k), b, static_cast<int>(tb ? k : n), beta, c,
              static_cast<int>(n));
}

template <>
void gemm<double>(Backend, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const double* a,
                  const double* b, double* c, double beta) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1.0, a,
              static_cast<int>(ta ? m : k), b, static_cast<int>(tb ? k : n), beta, c,
              static_cast<int>(n));
}

namespace {

// out = each of `batch` (rows x cols) matrices of x transposed, in 32 x 32 tiles: a tile's
// reads and writes stay within a few cache lines each, where walking the output in order would
// read each source row once per output element (a cache line per element). The batches and
// tiles are split over the threads.
template <typename T>
void transpose_matrices(const T* x, T* out, int64_t batch, int64_t rows, int64_t cols) {
  constexpr int64_t kTile = 32;
  const int64_t row_tiles = (rows + kTile - 1) / kTile, col_tiles = (cols + kTile - 1) / kTile;
  const int64_t tiles = batch * row_tiles * col_tiles;
#pragma omp parallel for schedule(static) if (batch * rows * cols >= (1 << 16))
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t b = t / (row_tiles * col_tiles), rt = t / col_tiles % row_tiles,
                  ct = t % col_tiles;
    const T* xb = x + b * rows * cols;
    T* ob = out + b * rows * cols;
    const int64_t r_end = std::min(rows, (rt + 1) * kTile), c_end = std::min(cols, (ct + 1) * kTile);
    for (int64_t r = rt * kTile; r < r_end; ++r)
      for (int64_t c = ct * kTile; c < c_end; ++c) ob[c * rows + r] = xb[r * cols + c];
  }
}

}  // namespace

template <typename T>
void transpose(Backend, const T* x, T* out, const int64_t* dims, int64_t rank, int64_t d0,
               int64_t d1) {
  if (d0 > d1) std::swap(d0, d1);
  if (d0 + 1 == d1 && d1 == rank - 1) {  // the last two dims: a batch of matrix transposes
    int64_t batch = 1;
    for (int64_t d = 0; d < d0; ++d) batch *= dims[d];
    transpose_matrices(x, out, batch, dims[d0], dims[d1]);
    return;
  }
  // Walk the output in order; find each element's source through the swapped strides.
  std::vector<int64_t> in_stride(static_cast<size_t>(rank)), out_dims(dims, dims + rank);
  int64_t s = 1;
  for (int64_t d = rank - 1; d >= 0; --d) {
    in_stride[static_cast<size_t>(d)] = s;
    s *= dims[d];
  }
  std::swap(out_dims[static_cast<size_t>(d0)], out_dims[static_cast<size_t>(d1)]);
  std::vector<int64_t> src_stride = in_stride;
  std::swap(src_stride[static_cast<size_t>(d0)], src_stride[static_cast<size_t>(d1)]);
  int64_t n = s;
  std::vector<int64_t> idx(static_cast<size_t>(rank), 0);
  for (int64_t i = 0; i < n; ++i) {
    int64_t src = 0;
    for (int64_t d = 0; d < rank; ++d) src += idx[static_cast<size_t>(d)] * src_stride[static_cast<size_t>(d)];
    out[i] = x[src];
    for (int64_t d = rank - 1; d >= 0; --d) {  // odometer increment of the output index
      if (++idx[static_cast<size_t>(d)] < out_dims[static_cast<size_t>(d)]) break;
      idx[static_cast<size_t>(d)] = 0;
    }
  }
}

template <typename T>
void softmax(Backend, const T* x, T* y, int64_t outer, int64_t len, int64_t inner, bool log) {
#pragma omp parallel for collapse(2) if (outer * len * inner > kParallelGrain)
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      const T* xr = x + o * len * inner + i;
      T* yr = y + o * len * inner + i;
      // Subtract the max first: exp never overflows, the result is unchanged.
      T mx = xr[0];
      for (int64_t l = 1; l < len; ++l) mx = std::max(mx, xr[l * inner]);
      T total = 0;
      for (int64_t l = 0; l < len; ++l) total += std::exp(xr[l * inner] - mx);
      if (log) {
        T lse = mx + std::log(total);
        for (int64_t l = 0; l < len; ++l) yr[l * inner] = xr[l * inner] - lse;
      } else {
        for (int64_t l = 0; l < len; ++l) yr[l * inner] = std::exp(xr[l * inner] - mx) / total;
      }
    }
  }
}

template <typename T>
void softmax_backward(Backend, const T* gy, const T* y, T* gx, int64_t outer, int64_t len,
                      int64_t inner, bool log) {
#pragma omp parallel for collapse(2) if (outer * len * inner > kParallelGrain)
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      int64_t base = o * len * inner + i;
      T dot = 0;
      for (int64_t l = 0; l < len; ++l)
        dot += log ? gy[base + l * inner] : gy[base + l * inner] * y[base + l * inner];
      for (int64_t l = 0; l < len; ++l) {
        int64_t j = base + l * inner;
        // softmax: gx = y (gy - sum(gy y));  log-softmax: gx = gy - exp(y) sum(gy)
        gx[j] = log ? gy[j] - std::exp(y[j]) * dot : y[j] * (gy[j] - dot);
      }
    }
  }
}

// One pass over the gradient: divide, and OR together "this result is not finite". The
// reduction is a plain integer OR, so the loop vectorises (and splits across threads when big).
template <typename T>
void unscale_and_check(Backend, T* g, int64_t n, const float* scale_in, int32_t* found_inf) {
  const T scale = T(*scale_in);
  int32_t bad = 0;
#pragma omp parallel for simd reduction(| : bad) if (n > kParallelGrain)
  for (int64_t i = 0; i < n; ++i) bad |= static_cast<int32_t>(unscale_elem(g[i], scale));
  if (bad) *found_inf = 1;
}

#define KILN_INSTANTIATE(T)                                                                    \
  template void binary<T>(Backend, BinaryOp, Broadcast, const T*, const T*, T*, int64_t,       \
                          int64_t);                                                            \
  template void unary<T>(Backend, UnaryOp, const T*, T*, int64_t, compute_t<T>);             \
  template void relu_backward<T>(Backend, const T*, const T*, T*, int64_t);                    \
  template void sum_dim<T>(Backend, const T*, compute_t<T>*, int64_t, int64_t, int64_t);       \
  template void expand_dim<T>(Backend, const compute_t<T>*, T*, int64_t, int64_t, int64_t,     \
                              compute_t<T>);                                                   \
  template void argmax_dim<T>(Backend, const T*, int64_t*, int64_t, int64_t, int64_t);         \
  template void softmax<T>(Backend, const T*, T*, int64_t, int64_t, int64_t, bool);            \
  template void softmax_backward<T>(Backend, const T*, const T*, T*, int64_t, int64_t, int64_t, \
                                    bool);                                                     \
  template void unscale_and_check<T>(Backend, T*, int64_t, const float*, int32_t*);
KILN_INSTANTIATE(float)
KILN_INSTANTIATE(double)
#undef KILN_INSTANTIATE

// The elementwise kernels and sum_dim / expand_dim also take 16-bit activations (f32 inside).
#define KILN_INSTANTIATE_LP(T)                                                                 \
  template void binary<T>(Backend, BinaryOp, Broadcast, const T*, const T*, T*, int64_t,       \
                          int64_t);                                                            \
  template void unary<T>(Backend, UnaryOp, const T*, T*, int64_t, compute_t<T>);             \
  template void relu_backward<T>(Backend, const T*, const T*, T*, int64_t);                    \
  template void sum_dim<T>(Backend, const T*, compute_t<T>*, int64_t, int64_t, int64_t);       \
  template void expand_dim<T>(Backend, const compute_t<T>*, T*, int64_t, int64_t, int64_t,     \
                              compute_t<T>);
KILN_INSTANTIATE_LP(Half)
KILN_INSTANTIATE_LP(BFloat16)
#undef KILN_INSTANTIATE_LP

// transpose moves bytes: one instantiation per element size serves every dtype.
template void transpose<uint8_t>(Backend, const uint8_t*, uint8_t*, const int64_t*, int64_t,
                                 int64_t, int64_t);
template void transpose<uint16_t>(Backend, const uint16_t*, uint16_t*, const int64_t*, int64_t,
                                  int64_t, int64_t);
template void transpose<uint32_t>(Backend, const uint32_t*, uint32_t*, const int64_t*, int64_t,
                                  int64_t, int64_t);
template void transpose<uint64_t>(Backend, const uint64_t*, uint64_t*, const int64_t*, int64_t,
                                  int64_t, int64_t);

}  // namespace kiln::cpu
