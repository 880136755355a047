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
#pragma once

#if KILN_CUDA_SIM
#include "engine/cuda/sim/runtime.h"
#define KILN_DYNAMIC_SHARED(T, name) T* name = static_cast<T*>(::kiln::sim::dynamic_shared_memory())
#else
#include <cuda_runtime.h>
// One untyped array for every kernel (a typed `extern __shared__ T s[]` in a template clashes
// between instantiations), 16-byte aligned so any T fits.
#define KILN_DYNAMIC_SHARED(T, name)                                   \
  extern __shared__ __align__(16) unsigned char kiln_dynamic_shared_[]; \
  T* name = reinterpret_cast<T*>(kiln_dynamic_shared_)
#endif
