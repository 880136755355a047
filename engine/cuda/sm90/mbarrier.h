// sm90/mbarrier.h: Hopper's (compute capability 9.0) shared-memory mbarriers, the arrive/wait
// barriers that asynchronous copies (the TMA, sm90/tma.h) complete.
//
// PTX ISA, "Parallel Synchronization and Communication Instructions: mbarrier"
// (https://docs.nvidia.com/cuda/parallel-thread-execution/#parallel-synchronization-and-communication-instructions-mbarrier).
// A barrier lives in shared memory and goes through phases. A phase completes when all its
// arrivals (the count given to mbarrier_init) have arrived and its transaction count is zero:
// mbarrier_arrive_expect_tx announces bytes that asynchronous copies will complete on it. Then
// the next phase starts with the same arrival count. Waits name the phase by its parity (0 or
// 1, alternating), so a ring of stages keeps one phase bit per stage:
//
//   init:      if (threadIdx.x == 0) { mbarrier_init(&full, 1); fence_mbarrier_init(); }
//              __syncthreads();
//   producer:  mbarrier_arrive_expect_tx(&full, bytes); tma_load_2d(dst, &map, r, c, &full);
//   consumers: mbarrier_wait(&full, phase); ... read dst ...; phase ^= 1;
//
// Under nvcc these are single PTX instructions (sm_90 and later; elsewhere in device code they
// trap). Under the simulator they call engine/cuda/sim/sm90_mbarrier.h, which models the
// phases, yields a waiting thread to the others and reports misuse and deadlocks as faults.
#pragma once

#include <cstdint>

#include "engine/cuda/runtime.h"

#if KILN_CUDA_SIM
#include "engine/cuda/sim/sm90_mbarrier.h"
#endif

namespace kiln::cuda::sm90 {

struct alignas(8) Mbarrier {
  uint64_t state;
};

namespace detail {
#if !KILN_CUDA_SIM && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// The shared-window address PTX's .shared operands take.
__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
#endif
}  // namespace detail

// One thread initialises the barrier with `arrivals` arrivals per phase.
__device__ __forceinline__ void mbarrier_init(Mbarrier* bar, uint32_t arrivals) {
#if KILN_CUDA_SIM
  ::kiln::sim::sm90::mbarrier_init(bar, arrivals);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(detail::shared_address(bar)),
               "r"(arrivals)
               : "memory");
#elif defined(__CUDA_ARCH__)
  __trap();
#else
  (void)bar;
  (void)arrivals;
#endif
}

// After the inits: makes them visible to the async proxy (the TMA); __syncthreads() follows.
__device__ __forceinline__ void fence_mbarrier_init() {
#if !KILN_CUDA_SIM && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#elif !KILN_CUDA_SIM && defined(__CUDA_ARCH__)
  __trap();
#endif
}

// One arrival on the current phase.
__device__ __forceinline__ void mbarrier_arrive(Mbarrier* bar) {
#if KILN_CUDA_SIM
  ::kiln::sim::sm90::mbarrier_arrive(bar, 0);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(detail::shared_address(bar))
               : "memory");
#elif defined(__CUDA_ARCH__)
  __trap();
#else
  (void)bar;
#endif
}

// Announces tx_bytes that asynchronous copies will complete on the current phase, then arrives.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(Mbarrier* bar, uint32_t tx_bytes) {
#if KILN_CUDA_SIM
  ::kiln::sim::sm90::mbarrier_arrive(bar, tx_bytes);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(
                   detail::shared_address(bar)),
               "r"(tx_bytes)
               : "memory");
#elif defined(__CUDA_ARCH__)
  __trap();
#else
  (void)bar;
  (void)tx_bytes;
#endif
}

// True once the phase of parity phase_parity (0 or 1) has completed. May suspend the thread
// for a while before it answers false.
__device__ __forceinline__ bool mbarrier_try_wait(Mbarrier* bar, uint32_t phase_parity) {
#if KILN_CUDA_SIM
  return ::kiln::sim::sm90::mbarrier_try_wait(bar, phase_parity);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t done;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(detail::shared_address(bar)), "r"(phase_parity)
      : "memory");
  return done != 0;
#elif defined(__CUDA_ARCH__)
  __trap();
  return false;
#else
  (void)bar;
  (void)phase_parity;
  return false;
#endif
}

// Until the phase of parity phase_parity has completed.
__device__ __forceinline__ void mbarrier_wait(Mbarrier* bar, uint32_t phase_parity) {
#if KILN_CUDA_SIM
  ::kiln::sim::sm90::mbarrier_wait(bar, phase_parity);
#else
  while (!mbarrier_try_wait(bar, phase_parity)) {
  }
#endif
}

}  // namespace kiln::cuda::sm90
