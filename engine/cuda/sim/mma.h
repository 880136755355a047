// sim/mma.h: the CUDA simulator's stand-in for <mma.h>: the warp matrix functions
// (nvcuda::wmma) that Kiln's tensor-core GEMM uses, run on the CPU (docs/cuda_simulator.md).
//
//   fragment<matrix_a | matrix_b, 16, 16, 16, __half | __nv_bfloat16, row_major | col_major>
//   fragment<accumulator, 16, 16, 16, float>          (also the 32x8x16 and 8x32x16 shapes)
//   fill_fragment, load_matrix_sync, mma_sync, store_matrix_sync, mem_row_major / mem_col_major
//
// Semantics, from the CUDA C++ Programming Guide, "Warp Matrix Functions"
// (https://docs.nvidia.com/cuda/cuda-c-programming-guide/#wmma): the *_sync functions are
// collective: all 32 lanes of the warp call them with the same arguments, and each waits until
// every lane has arrived. A fragment's elements are spread over the warp's registers in an
// unspecified way; the pointer of a load or store is 256-bit (32-byte) aligned, and ldm, the
// leading dimension in elements, is a multiple of 16 bytes (8 for 16-bit elements, 4 for float).
//
// The simulator's model, simple and correct where CUDA leaves things unspecified:
//   - every lane holds the whole tile: element (r, c) is x[r * cols + c], and num_elements is
//     rows * cols (a loop over x[0..num_elements) still touches each element once per lane, so
//     element-wise code written for a GPU stays correct here);
//   - load_matrix_sync and mma_sync: each lane reads the whole tile / computes the whole
//     product (32 times the work of a GPU; the simulator does not claim speed);
//   - store_matrix_sync: each lane writes only its share, 8 of the 256 elements of a 16x16 tile,
//     so lanes never write the same address. The share is the one the hardware's m16n8k16 mma
//     gives the accumulator: lane l holds rows l/4 and l/4 + 8, columns 2(l%4), 2(l%4) + 1 and
//     the same plus 8 (element (r, c) belongs to lane (r % 8) * 4 + (c % 8) / 2). A kernel
//     whose lanes read back another lane's share without __syncwarp reads stale memory here,
//     as it may on a GPU;
//   - every *_sync call starts with a warp barrier (__syncwarp: all lanes must arrive), then
//     does its memory access: writes before the call are visible to the call's loads, and a
//     store's writes are not visible to other lanes until they meet at a later barrier;
//   - products of two 16-bit inputs are exact in f32; each output sums its 16 (k) products in
//     order k = 0..15 onto the accumulator, rounding after every add. Tensor cores add in an
//     unspecified order (and may round differently): results can differ in the last bits;
//   - checked, each a fault of the running kernel naming the rule: the pointer alignment, ldm
//     (a multiple of 16 bytes and at least the tile's row or column length), and every lane of
//     the warp present (a wmma call from a warp that has exited lanes).
// Not modelled: the f16 accumulator, the sub-byte, double, tf32 and int8 types, the other
// shapes' element layouts beyond the share rule above, and wmma's performance.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "engine/cuda/sim/fp16.h"
#include "engine/cuda/sim/runtime.h"  // __syncwarp, the running lane
#include "engine/error.h"

namespace nvcuda::wmma {

// What a fragment holds (the first template argument).
struct matrix_a {};     // the left operand, m x k
struct matrix_b {};     // the right operand, k x n
struct accumulator {};  // the product, m x n
// How an operand tile is laid out in memory (the fragment's last template argument).
struct row_major {};
struct col_major {};
// How an accumulator tile is laid out in memory (an argument of its load and store).
enum layout_t { mem_row_major, mem_col_major };

namespace detail {

template <typename Use, int M, int N, int K>
struct Dims;
template <int M, int N, int K>
struct Dims<matrix_a, M, N, K> {
  static constexpr int rows = M, cols = K;
};
template <int M, int N, int K>
struct Dims<matrix_b, M, N, K> {
  static constexpr int rows = K, cols = N;
};
template <int M, int N, int K>
struct Dims<accumulator, M, N, K> {
  static constexpr int rows = M, cols = N;
};

template <typename T>
inline constexpr bool is_16bit_float_v =
    std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;

inline float widen(__half h) { return __half2float(h); }
inline float widen(__nv_bfloat16 b) { return __bfloat162float(b); }

// A broken rule of the API: a fault of the running kernel (the scheduler catches it).
[[noreturn]] inline void fail(const char* fn, const std::string& what) {
  throw kiln::Error(std::string("nvcuda::wmma::") + fn + ": " + what);
}

// The start of every *_sync call: all 32 lanes must be there, then they wait for each other.
// The check comes before the barrier: a lane that has exited by then can never make this call
// (after it, a lane that has finished its last call may already have exited, legitimately).
inline void enter_collective(const char* fn) {
  if (::kiln::sim::detail::active_mask() != 0xffffffffu)
    fail(fn, "every lane of the warp must take part, but some have exited (a warp of fewer "
             "than 32 threads, or an early return)");
  __syncwarp();
}

// The checks every load and store makes (see the file comment).
inline void check_call(const char* fn, const void* ptr, unsigned ldm, size_t elem_bytes,
                       int min_ldm) {
  if (reinterpret_cast<uintptr_t>(ptr) % 32 != 0)
    fail(fn, "the pointer must be 256-bit (32-byte) aligned");
  if ((ldm * elem_bytes) % 16 != 0)
    fail(fn, "ldm = " + std::to_string(ldm) + " elements is not a multiple of 16 bytes");
  if (static_cast<int>(ldm) < min_ldm)
    fail(fn, "ldm = " + std::to_string(ldm) + " is shorter than a row (or column) of the tile, " +
                 std::to_string(min_ldm));
}

// The lane that stores element (r, c) of an accumulator (the file comment's share rule).
inline unsigned owner_lane(int r, int c) { return static_cast<unsigned>((r % 8) * 4 + (c % 8) / 2); }

}  // namespace detail

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
class fragment {
  static_assert((M == 16 && N == 16 && K == 16) || (M == 32 && N == 8 && K == 16) ||
                    (M == 8 && N == 32 && K == 16),
                "wmma (simulator): the shapes of 16-bit inputs are 16x16x16, 32x8x16, 8x32x16");
  static_assert(std::is_same_v<Use, accumulator> ? std::is_same_v<T, float>
                                                 : detail::is_16bit_float_v<T>,
                "wmma (simulator): operands are __half or __nv_bfloat16, the accumulator float");
  static_assert(std::is_same_v<Use, accumulator> ? std::is_void_v<Layout>
                                                 : std::is_same_v<Layout, row_major> ||
                                                       std::is_same_v<Layout, col_major>,
                "wmma: an operand fragment names row_major or col_major; an accumulator none");

 public:
  static constexpr int rows = detail::Dims<Use, M, N, K>::rows;
  static constexpr int cols = detail::Dims<Use, M, N, K>::cols;
  static constexpr int num_elements = rows * cols;
  T x[num_elements];  // element (r, c) at x[r * cols + c], in every lane
};

template <typename Use, int M, int N, int K, typename T, typename Layout>
inline void fill_fragment(fragment<Use, M, N, K, T, Layout>& f, const T& v) {
  for (T& e : f.x) e = v;
}

// An operand tile: row_major reads element (r, c) at ptr[r * ldm + c], col_major at
// ptr[c * ldm + r].
template <typename Use, int M, int N, int K, typename T, typename Layout>
inline void load_matrix_sync(fragment<Use, M, N, K, T, Layout>& f, const T* ptr, unsigned ldm) {
  using F = fragment<Use, M, N, K, T, Layout>;
  static_assert(!std::is_same_v<Use, accumulator>, "an accumulator's load names its layout_t");
  constexpr bool row = std::is_same_v<Layout, row_major>;
  detail::enter_collective("load_matrix_sync");
  detail::check_call("load_matrix_sync", ptr, ldm, sizeof(T), row ? F::cols : F::rows);
  for (int r = 0; r < F::rows; ++r)
    for (int c = 0; c < F::cols; ++c)
      std::memcpy(&f.x[r * F::cols + c], ptr + (row ? r * ldm + c : c * ldm + r), sizeof(T));
}

template <int M, int N, int K>
inline void load_matrix_sync(fragment<accumulator, M, N, K, float>& f, const float* ptr,
                             unsigned ldm, layout_t layout) {
  using F = fragment<accumulator, M, N, K, float>;
  const bool row = layout == mem_row_major;
  detail::enter_collective("load_matrix_sync");
  detail::check_call("load_matrix_sync", ptr, ldm, sizeof(float), row ? F::cols : F::rows);
  for (int r = 0; r < F::rows; ++r)
    for (int c = 0; c < F::cols; ++c) f.x[r * F::cols + c] = ptr[row ? r * ldm + c : c * ldm + r];
}

// Only the calling lane's share of the tile is written (see the file comment).
template <int M, int N, int K>
inline void store_matrix_sync(float* ptr, const fragment<accumulator, M, N, K, float>& f,
                              unsigned ldm, layout_t layout) {
  using F = fragment<accumulator, M, N, K, float>;
  const bool row = layout == mem_row_major;
  detail::enter_collective("store_matrix_sync");
  detail::check_call("store_matrix_sync", ptr, ldm, sizeof(float), row ? F::cols : F::rows);
  const unsigned lane = ::kiln::sim::detail::t_thread->lane;
  for (int r = 0; r < F::rows; ++r)
    for (int c = 0; c < F::cols; ++c)
      if (detail::owner_lane(r, c) == lane) ptr[row ? r * ldm + c : c * ldm + r] = f.x[r * F::cols + c];
}

// d = a b + c, in f32 (d may be c).
template <int M, int N, int K, typename T, typename LayoutA, typename LayoutB>
inline void mma_sync(fragment<accumulator, M, N, K, float>& d,
                     const fragment<matrix_a, M, N, K, T, LayoutA>& a,
                     const fragment<matrix_b, M, N, K, T, LayoutB>& b,
                     const fragment<accumulator, M, N, K, float>& c) {
  detail::enter_collective("mma_sync");
  float fa[M * K], fb[K * N], out[M * N];  // the inputs widened once (exactly)
  for (int e = 0; e < M * K; ++e) fa[e] = detail::widen(a.x[e]);
  for (int e = 0; e < K * N; ++e) fb[e] = detail::widen(b.x[e]);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      float acc = c.x[i * N + j];
      for (int p = 0; p < K; ++p) acc += fa[i * K + p] * fb[p * N + j];
      out[i * N + j] = acc;
    }
  std::memcpy(d.x, out, sizeof out);
}

}  // namespace nvcuda::wmma
