// launch_count.h: how much work this process has queued on its GPUs, counted on the host.
//
//   const int64_t before = cuda::launch_count();
//   train_step();
//   const int64_t launches = cuda::launch_count() - before;   // kernels queued by the step
//
// A step whose kernels are each short is bound by the host's cost of queueing them (a few
// microseconds per launch on the CUDA runtime), not by the GPU; the count says how far a fused
// kernel or a CUDA graph (which replays a whole step with one launch) can take it.
//
// What counts as one launch: every kernel queued through cuda::launch() (engine/cuda/launch.h),
// and every cuBLAS or cuDNN call that queues device work (a GEMM, a convolution pass, a bias
// add; cuDNN's algorithm search counts once, though it runs several). Calls that only set up
// a handle or a descriptor do not count. A CUDA graph's replay (engine/cuda/graph.h) counts
// once: one cudaGraphLaunch, whatever the graph holds (its kernels counted when captured).
// The counts are per process, over every device and host thread, kept with relaxed atomics
// (a count, not an ordering).
//
// Every build has this header; in a build without a CUDA backend the counts stay 0.
//
// Header-only (a C++17 inline variable, one per process): launch.h counts every launch, and code
// linked against the simulator alone (tests/sim, the custom-layer example) includes launch.h
// without the engine library.
#pragma once

#include <atomic>
#include <cstdint>

namespace kiln::cuda {

// The counter itself (not a `detail` namespace here: kiln::cuda::detail would hide kiln::detail
// from the CUDA code that names it unqualified).
inline std::atomic<int64_t> g_launch_counter{0};

// Kernels and vendor library calls queued since the process started.
inline int64_t launch_count() { return g_launch_counter.load(std::memory_order_relaxed); }

// Called by the launch helper and at each vendor library call that queues work.
inline void count_launch() { g_launch_counter.fetch_add(1, std::memory_order_relaxed); }

}  // namespace kiln::cuda
