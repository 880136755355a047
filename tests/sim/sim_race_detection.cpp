// sim_race_detection.cpp: kernels with one deliberate data race each, for ThreadSanitizer.
//
//   sim_race_detection <case>     runs one racy kernel (cases below) on one block, in order
//                                 mode (no shuffle): the result may even look right.
//
// Under ThreadSanitizer (build-tsan/) the CUDA simulator makes every GPU thread a TSan fiber
// and models __syncthreads, warp operations and kernel boundaries as release/acquire
// (engine/cuda/sim/scheduler.cpp), so each case must end in a "data race" report naming the
// kernel and both GPU threads; sim_tests.cmake registers one test per case that passes only on
// such a report (halt_on_error=1). Without TSan it exits 77: skipped.
#include <cstdio>
#include <cstring>

#include "engine/cuda/check.h"
#include "engine/cuda/launch.h"
#include "engine/cuda/runtime.h"
#include "engine/sanitizer.h"

namespace {

using kiln::cuda::launch;
using kiln::cuda::LaunchConfig;

// syncthreads: thread t reads what thread t-1 wrote, with the __syncthreads() between missing.
__global__ void race_missing_syncthreads_kernel(int* out) {
  KILN_SHARED(int, s, [64]);
  const int t = threadIdx.x;
  s[t] = t;
  out[t] = t == 0 ? 0 : s[t - 1];
}

// generation: thread 0 writes after barrier 1, thread 32 (another warp) reads that address
// before barrier 2. The scheduler resumes warp 0 first, so thread 0 reaches barrier 2 before
// thread 32 leaves barrier 1: caught only because consecutive barriers use different sync
// objects.
__global__ void race_across_barrier_generations_kernel(int* out) {
  KILN_SHARED(int, s, [1]);
  const int t = threadIdx.x;
  if (t == 0) s[0] = 1;
  __syncthreads();
  if (t == 0) s[0] = 2;
  if (t == 32) out[0] = s[0];
  __syncthreads();
}

// warp-generation: the same between two consecutive __syncwarp() of one warp.
__global__ void race_across_syncwarp_generations_kernel(int* out) {
  KILN_SHARED(int, s, [1]);
  const int lane = threadIdx.x;
  if (lane == 0) s[0] = 1;
  __syncwarp();
  if (lane == 0) s[0] = 2;
  if (lane == 1) out[0] = s[0];
  __syncwarp();
}

// subset-mask: two half-warps synchronise separately; lane 16 reads what lane 0 wrote.
__global__ void race_between_half_warps_kernel(int* out) {
  KILN_SHARED(int, s, [1]);
  const int lane = threadIdx.x;
  if (lane == 0) s[0] = 1;
  __syncwarp(lane < 16 ? 0x0000ffffu : 0xffff0000u);
  if (lane == 16) out[0] = s[0];
}

// global: every thread of the block writes the same global element.
__global__ void race_on_global_memory_kernel(int* out) { out[0] = static_cast<int>(threadIdx.x); }

struct Case {
  const char* name;
  void (*kernel)(int*);
  unsigned threads;
};
const Case kCases[] = {
    {"syncthreads", race_missing_syncthreads_kernel, 64},
    {"generation", race_across_barrier_generations_kernel, 64},
    {"warp-generation", race_across_syncwarp_generations_kernel, 32},
    {"subset-mask", race_between_half_warps_kernel, 32},
    {"global", race_on_global_memory_kernel, 32},
};

}  // namespace

int main(int argc, char** argv) {
#if !KILN_TSAN
  (void)argc;
  (void)argv;
  std::printf("skipped: race detection needs the ThreadSanitizer tree (build-tsan)\n");
  return 77;
#else
  for (const Case& c : kCases) {
    if (argc != 2 || std::strcmp(argv[1], c.name) != 0) continue;
    int* out = nullptr;
    KILN_CUDA_CHECK(cudaMalloc(&out, 64 * sizeof(int)));
    launch(c.kernel, LaunchConfig{1, c.threads, 0, nullptr}, out);
    KILN_CUDA_CHECK(cudaFree(out));
    std::printf("%s: no race reported\n", c.name);
    return 0;
  }
  std::fprintf(stderr, "usage: sim_race_detection <case>\n");
  return 2;
#endif
}
