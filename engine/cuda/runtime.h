// runtime.h: the one CUDA header every Kiln .cu file includes first.
//
// Under nvcc it is the real CUDA runtime. Under the simulator (-DKILN_CUDA_SIM=ON) the same
// .cu files are compiled as C++ by the host compiler, and engine/cuda/sim/runtime.h provides
// the subset of the runtime Kiln uses (memory, streams, events, devices, threadIdx & co,
// __shared__, __syncthreads, warp shuffles, atomics, math intrinsics). See docs/cuda.md.
//
// The few places where CUDA syntax cannot be expressed in plain C++ have a macro here:
//   KILN_DYNAMIC_SHARED(T, name)  declares `T* name` pointing at the block's dynamic shared
//                                 memory (the `extern __shared__` array of the launch).
//   KILN_SHARED(T, name, dims)    declares a static shared variable, 16-byte aligned (or more,
//                                 when T asks for it with alignas):
//                                 KILN_SHARED(float, tile, [32][33]) is
//                                 `__shared__ __align__(16) float tile[32][33]` under nvcc. Under
//                                 the simulator `name` is a reference into the block's shared
//                                 arena: NaN-filled at block start, a guard zone after it (ASan),
//                                 counted against the kernel's shared-memory limit. `dims` may be
//                                 empty; a T with commas needs an alias (using Tiles = X<a, b>).
//                                 Plain `__shared__` still compiles in the simulator, unchecked
//                                 (docs/cuda_simulator.md): kernels use KILN_SHARED.
#pragma once

#if KILN_CUDA_SIM
#include "engine/cuda/sim/runtime.h"
#define KILN_DYNAMIC_SHARED(T, name) T* name = static_cast<T*>(::kiln::sim::dynamic_shared_memory())
// The address of a function-local static identifies the declaration (one per template
// instantiation), so every thread of the block gets the same storage.
#define KILN_SHARED(T, name, ...)                                                      \
  static char kiln_shared_key_##name;                                                   \
  ::kiln::sim::detail::Shared<T __VA_ARGS__>& name =                                    \
      *static_cast<::kiln::sim::detail::Shared<T __VA_ARGS__>*>(::kiln::sim::detail::static_shared( \
          &kiln_shared_key_##name, sizeof(::kiln::sim::detail::Shared<T __VA_ARGS__>),         \
          alignof(::kiln::sim::detail::Shared<T __VA_ARGS__>)))
#else
#include <cuda_runtime.h>
// One untyped array for every kernel (a typed `extern __shared__ T s[]` in a template clashes
// between instantiations), 16-byte aligned so any T fits.
#define KILN_DYNAMIC_SHARED(T, name)                                   \
  extern __shared__ __align__(16) unsigned char kiln_dynamic_shared_[]; \
  T* name = reinterpret_cast<T*>(kiln_dynamic_shared_)
// 16 bytes, or the type's own alignment when larger (an explicit __align__ would otherwise
// lower an alignas(32) type to 16).
#define KILN_SHARED(T, name, ...)                                                      \
  __shared__ __align__(alignof(T __VA_ARGS__) > 16 ? alignof(T __VA_ARGS__) : 16) T name \
      __VA_ARGS__
#endif
