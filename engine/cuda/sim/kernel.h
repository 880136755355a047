// sim/kernel.h: the builtins a kernel body uses (included by sim/runtime.h).
//
//   threadIdx, blockIdx, blockDim, gridDim, warpSize
//   __syncthreads (+ _count/_and/_or), __syncwarp, __shfl*_sync, __ballot_sync, __any_sync,
//   __all_sync, __activemask, atomics, __threadfence, kiln::sim::dynamic_shared_memory()
//
// Semantics from the CUDA C++ Programming Guide
// (https://docs.nvidia.com/cuda/cuda-c-programming-guide/), sections "Built-in Variables",
// "Synchronization Functions", "Warp Vote Functions", "Warp Shuffle Functions", "Atomic
// Functions" and "Memory Fence Functions".
//
// How they work: each GPU thread of a block is a fiber (a user-space context with its own
// stack) on one OS thread, and the fiber scheduler (scheduler.cpp) runs the fibers one after
// another. A fiber runs until it reaches a barrier (__syncthreads, or a warp operation), where
// it switches back to the scheduler; when every fiber that must meet there has arrived, the
// scheduler resumes them. threadIdx, blockIdx, blockDim and gridDim are thread_local globals
// of the OS thread, which the scheduler sets before it resumes a fiber: only one fiber runs at a
// time per OS thread, so they always hold the running GPU thread's values. (Plain variables,
// not macros, so host code may still name a local `blockDim`. Writable here, read-only on a GPU.)
//
// Warp operations of lanes that are not taking part (their bit is not in the mask, they have
// exited, or the warp is partial and the lane does not exist) read back the caller's own
// value: a shuffle from such a lane returns `var` unchanged. On a GPU that read is undefined.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "engine/cuda/sim/vector_types.h"

namespace kiln::sim {

// What the builtins need to know about the running simulated thread (one per fiber).
struct ThreadState {
  uint3 thread_idx;
  unsigned int linear;  // x + y * blockDim.x + z * blockDim.x * blockDim.y
  unsigned int lane;    // linear % 32: lanes are consecutive linear ids, as on a GPU
};

// What they need to know about the block the current OS thread is running.
struct BlockState {
  void* dynamic_shared;  // the launch's dynamic shared memory for this block
  size_t dynamic_shared_bytes;
  uint64_t serial;  // distinct for every block an OS thread runs (per-block state keys on it)
};

namespace detail {
// The running fiber and block of this OS thread, set by the scheduler before it resumes a fiber.
// Fibers never move between OS threads, so thread_local is exactly "the current one".
inline thread_local ThreadState* t_thread = nullptr;
inline thread_local BlockState t_block = {};

// The barriers, in scheduler.cpp. block_barrier returns how many threads passed a non-zero
// predicate. warp_exchange is the one primitive behind every warp operation: each
// participating lane posts a 64-bit value and the lane it wants to read (-1: none), waits for
// the others, and gets back the value it asked for (or, for Ballot/All, the vote).
int block_barrier(int predicate);
enum class WarpOp { Sync, Shuffle, Ballot, All };
uint64_t warp_exchange(WarpOp op, unsigned int mask, uint64_t value, int src_lane);
unsigned int active_mask();
// The running block's storage for the static shared variable identified by `key` (KILN_SHARED,
// engine/cuda/runtime.h): allocated, NaN-filled and guarded by the first thread to ask; aligned
// to max(16, align) bytes (align: the type's alignof, at most 64).
void* static_shared(const void* key, size_t bytes, size_t align);
template <typename T>
using Shared = T;  // names an array type in a declaration: Shared<float[4]>& r

template <typename T>
inline uint64_t to_bits(T v) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "shuffle of a type > 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  return bits;
}
template <typename T>
inline T from_bits(uint64_t bits) {
  T v;
  std::memcpy(&v, &bits, sizeof(T));
  return v;
}
}  // namespace detail

// The block's dynamic shared memory (KILN_DYNAMIC_SHARED): 1024-byte aligned, exactly the
// launch's shared_bytes long (so ASan catches a read past its end).
inline void* dynamic_shared_memory() { return detail::t_block.dynamic_shared; }

}  // namespace kiln::sim

// ---- Indices ------------------------------------------------------------------------------
// Set by the scheduler (see the top of this file); kernels only read them.
inline thread_local uint3 threadIdx = {0, 0, 0};
inline thread_local uint3 blockIdx = {0, 0, 0};
inline thread_local dim3 blockDim;
inline thread_local dim3 gridDim;
constexpr int warpSize = 32;

// ---- Block barriers -----------------------------------------------------------------------
// Every thread of the block must reach the same barrier. If some wait while others have
// exited, the launch fails with kiln::Error (on a GPU it would hang or be undefined).
inline void __syncthreads() { (void)::kiln::sim::detail::block_barrier(1); }
inline int __syncthreads_count(int predicate) {
  return ::kiln::sim::detail::block_barrier(predicate != 0);
}
inline int __syncthreads_and(int predicate) {
  const dim3 b = blockDim;
  return ::kiln::sim::detail::block_barrier(predicate != 0) == static_cast<int>(b.x * b.y * b.z);
}
inline int __syncthreads_or(int predicate) {
  return ::kiln::sim::detail::block_barrier(predicate != 0) > 0;
}

// ---- Warp operations ----------------------------------------------------------------------
// `width` (a power of two <= 32) splits the warp into segments, as in CUDA: the source lane
// is taken within the caller's segment, and a source outside it gives the caller's own value.
inline void __syncwarp(unsigned int mask = 0xffffffffu) {
  (void)::kiln::sim::detail::warp_exchange(::kiln::sim::detail::WarpOp::Sync, mask, 0, -1);
}
namespace kiln::sim::detail {
template <typename T>
inline T shuffle(unsigned int mask, T var, int src_lane) {
  return from_bits<T>(warp_exchange(WarpOp::Shuffle, mask, to_bits(var), src_lane));
}
inline int segment_base(int width) { return static_cast<int>(t_thread->lane) & ~(width - 1); }
}  // namespace kiln::sim::detail

template <typename T>
inline T __shfl_sync(unsigned int mask, T var, int src_lane, int width = warpSize) {
  const int src = ::kiln::sim::detail::segment_base(width) + (src_lane & (width - 1));
  return ::kiln::sim::detail::shuffle(mask, var, src);
}
template <typename T>
inline T __shfl_up_sync(unsigned int mask, T var, unsigned int delta, int width = warpSize) {
  const int base = ::kiln::sim::detail::segment_base(width);
  const int src = static_cast<int>(::kiln::sim::detail::t_thread->lane) - static_cast<int>(delta);
  return ::kiln::sim::detail::shuffle(mask, var, src >= base ? src : -1);
}
template <typename T>
inline T __shfl_down_sync(unsigned int mask, T var, unsigned int delta, int width = warpSize) {
  const int base = ::kiln::sim::detail::segment_base(width);
  const int src = static_cast<int>(::kiln::sim::detail::t_thread->lane + delta);
  return ::kiln::sim::detail::shuffle(mask, var, src < base + width ? src : -1);
}
template <typename T>
inline T __shfl_xor_sync(unsigned int mask, T var, int lane_mask, int width = warpSize) {
  const int base = ::kiln::sim::detail::segment_base(width);
  const int src = static_cast<int>(::kiln::sim::detail::t_thread->lane) ^ lane_mask;
  return ::kiln::sim::detail::shuffle(mask, var, src >= base && src < base + width ? src : -1);
}
// Bit i set when lane i takes part and its predicate is non-zero.
inline unsigned int __ballot_sync(unsigned int mask, int predicate) {
  return static_cast<unsigned int>(::kiln::sim::detail::warp_exchange(
      ::kiln::sim::detail::WarpOp::Ballot, mask, predicate != 0, -1));
}
inline int __any_sync(unsigned int mask, int predicate) {
  return __ballot_sync(mask, predicate) != 0;
}
inline int __all_sync(unsigned int mask, int predicate) {
  return static_cast<int>(::kiln::sim::detail::warp_exchange(::kiln::sim::detail::WarpOp::All,
                                                             mask, predicate != 0, -1));
}
// The lanes of the caller's warp that have not exited (the simulator cannot see divergence:
// lanes in another branch count as active).
inline unsigned int __activemask() { return ::kiln::sim::detail::active_mask(); }

// ---- Atomics and fences -------------------------------------------------------------------
// Blocks run in parallel on OS threads, so these are real atomic read-modify-writes on plain
// memory (GCC __atomic builtins). float/double use a compare-and-swap loop, as the GPU once did.
namespace kiln::sim::detail {
template <typename T, typename F>
inline T atomic_update(T* address, F update) {
  T old;
  __atomic_load(address, &old, __ATOMIC_RELAXED);
  T desired = update(old);
  // On failure `old` is refreshed with the current value and the update is retried.
  while (!__atomic_compare_exchange(address, &old, &desired, false, __ATOMIC_SEQ_CST,
                                    __ATOMIC_RELAXED)) {
    desired = update(old);
  }
  return old;
}
}  // namespace kiln::sim::detail

#define KILN_SIM_ATOMIC_INT_(T)                                                               \
  inline T atomicAdd(T* a, T v) { return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST); }        \
  inline T atomicExch(T* a, T v) { return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST); }      \
  inline T atomicAnd(T* a, T v) { return __atomic_fetch_and(a, v, __ATOMIC_SEQ_CST); }        \
  inline T atomicOr(T* a, T v) { return __atomic_fetch_or(a, v, __ATOMIC_SEQ_CST); }          \
  inline T atomicXor(T* a, T v) { return __atomic_fetch_xor(a, v, __ATOMIC_SEQ_CST); }        \
  inline T atomicMax(T* a, T v) {                                                             \
    return ::kiln::sim::detail::atomic_update(a, [v](T o) { return o > v ? o : v; });        \
  }                                                                                           \
  inline T atomicMin(T* a, T v) {                                                             \
    return ::kiln::sim::detail::atomic_update(a, [v](T o) { return o < v ? o : v; });        \
  }                                                                                           \
  inline T atomicCAS(T* a, T compare, T v) {                                                  \
    __atomic_compare_exchange_n(a, &compare, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);   \
    return compare; /* the old value, whether or not the swap happened */                    \
  }
KILN_SIM_ATOMIC_INT_(int)
KILN_SIM_ATOMIC_INT_(unsigned int)
KILN_SIM_ATOMIC_INT_(unsigned long long)
#undef KILN_SIM_ATOMIC_INT_
inline long long atomicMax(long long* a, long long v) {
  return ::kiln::sim::detail::atomic_update(a, [v](long long o) { return o > v ? o : v; });
}
inline long long atomicMin(long long* a, long long v) {
  return ::kiln::sim::detail::atomic_update(a, [v](long long o) { return o < v ? o : v; });
}
inline int atomicSub(int* a, int v) { return __atomic_fetch_sub(a, v, __ATOMIC_SEQ_CST); }
inline unsigned int atomicSub(unsigned int* a, unsigned int v) {
  return __atomic_fetch_sub(a, v, __ATOMIC_SEQ_CST);
}
// atomicInc/Dec wrap at `limit` like CUDA's: inc gives old >= limit ? 0 : old + 1.
inline unsigned int atomicInc(unsigned int* a, unsigned int limit) {
  return ::kiln::sim::detail::atomic_update(a, [limit](unsigned o) { return o >= limit ? 0u : o + 1; });
}
inline unsigned int atomicDec(unsigned int* a, unsigned int limit) {
  return ::kiln::sim::detail::atomic_update(
      a, [limit](unsigned o) { return (o == 0 || o > limit) ? limit : o - 1; });
}
inline float atomicAdd(float* a, float v) {
  return ::kiln::sim::detail::atomic_update(a, [v](float o) { return o + v; });
}
inline double atomicAdd(double* a, double v) {
  return ::kiln::sim::detail::atomic_update(a, [v](double o) { return o + v; });
}
inline float atomicExch(float* a, float v) {
  float old;
  __atomic_exchange(a, &v, &old, __ATOMIC_SEQ_CST);
  return old;
}

inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
