// sim_race_free_test.cpp: correctly synchronised kernels that ThreadSanitizer must NOT report
// (build-tsan: any report fails the test binary). They use every edge the simulator models:
// the launch (host writes, then kernel reads), __syncthreads across many generations, warp
// operations with full and partial masks, atomics, shared memory reused by the next block on
// the same OS thread, and blocks spread over the simulator's thread pool. In other trees they
// check the results.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "engine/cuda/check.h"
#include "engine/cuda/launch.h"
#include "engine/cuda/runtime.h"

namespace {

using kiln::cuda::launch;
using kiln::cuda::LaunchConfig;

constexpr unsigned kFull = 0xffffffffu;

// Tree reduction over 256 elements per block (8 barriers), then a warp-shuffle finish, then
// one atomicAdd per block; the shared tile is rewritten by the next block.
__global__ void block_sum_kernel(const int* x, int n, int* partial, unsigned long long* total) {
  KILN_SHARED(int, s, [256]);
  const int t = threadIdx.x, i = blockIdx.x * 256 + t;
  s[t] = i < n ? x[i] : 0;
  __syncthreads();
  for (int stride = 128; stride >= 32; stride /= 2) {
    if (t < stride) s[t] += s[t + stride];
    __syncthreads();
  }
  if (t < 32) {
    int v = s[t];
    for (int o = 16; o > 0; o /= 2) v += __shfl_down_sync(kFull, v, o);
    if (t == 0) {
      partial[blockIdx.x] = v;
      atomicAdd(total, static_cast<unsigned long long>(v));
    }
  }
}

// Half-warps exchange through shared memory, each synchronised by its own __syncwarp mask.
__global__ void half_warp_exchange_kernel(int* out) {
  KILN_SHARED(int, s, [32]);
  const int lane = threadIdx.x;
  const unsigned mask = lane < 16 ? 0x0000ffffu : 0xffff0000u;
  s[lane] = lane * 10;
  __syncwarp(mask);
  out[lane] = s[lane ^ 1];  // the neighbour in the same half
  __syncwarp(mask);
  s[lane] = 0;  // overwritten only after both halves' reads: ordered by the second __syncwarp
}

// The same global element written by one thread, read by all after the barrier; per-thread
// results then combined through dynamic shared memory (NaN-filled by the simulator).
__global__ void broadcast_kernel(int* flag, int* out) {
  KILN_DYNAMIC_SHARED(int, d);
  if (threadIdx.x == 0) flag[blockIdx.x] = static_cast<int>(blockIdx.x) + 1;
  __syncthreads();
  d[threadIdx.x] = flag[blockIdx.x];
  __syncthreads();
  if (threadIdx.x == 0) {
    int sum = 0;
    for (unsigned i = 0; i < blockDim.x; ++i) sum += d[i];
    out[blockIdx.x] = sum;
  }
}

class SimRaceFree : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(cudaSetDevice(0), cudaSuccess); }
};

TEST_F(SimRaceFree, BarrierReductionOnThePool) {
  // 64 blocks x 256 threads: enough for the simulator's thread pool to take part.
  const int n = 64 * 256 - 3;
  std::vector<int> x(n);
  std::iota(x.begin(), x.end(), -1000);
  int *dx = nullptr, *dp = nullptr;
  unsigned long long* dt = nullptr;
  KILN_CUDA_CHECK(cudaMalloc(&dx, n * sizeof(int)));
  KILN_CUDA_CHECK(cudaMalloc(&dp, 64 * sizeof(int)));
  KILN_CUDA_CHECK(cudaMalloc(&dt, sizeof(unsigned long long)));
  KILN_CUDA_CHECK(cudaMemcpy(dx, x.data(), n * sizeof(int), cudaMemcpyHostToDevice));
  KILN_CUDA_CHECK(cudaMemset(dt, 0, sizeof(unsigned long long)));
  for (int rep = 0; rep < 2; ++rep)
    launch(block_sum_kernel, LaunchConfig{64, 256, 0, nullptr}, dx, n, dp, dt);
  unsigned long long total = 0;
  KILN_CUDA_CHECK(cudaMemcpy(&total, dt, sizeof total, cudaMemcpyDeviceToHost));
  const long long expect = std::accumulate(x.begin(), x.end(), 0LL);
  EXPECT_EQ(static_cast<long long>(total), 2 * expect);
  KILN_CUDA_CHECK(cudaFree(dx));
  KILN_CUDA_CHECK(cudaFree(dp));
  KILN_CUDA_CHECK(cudaFree(dt));
}

TEST_F(SimRaceFree, PartialWarpMasks) {
  int* out = nullptr;
  KILN_CUDA_CHECK(cudaMalloc(&out, 32 * sizeof(int)));
  launch(half_warp_exchange_kernel, LaunchConfig{4, 32, 0, nullptr}, out);
  std::vector<int> got(32);
  KILN_CUDA_CHECK(cudaMemcpy(got.data(), out, 32 * sizeof(int), cudaMemcpyDeviceToHost));
  for (int lane = 0; lane < 32; ++lane) EXPECT_EQ(got[lane], (lane ^ 1) * 10);
  KILN_CUDA_CHECK(cudaFree(out));
}

TEST_F(SimRaceFree, GlobalBroadcastAfterABarrier) {
  const unsigned blocks = 40, threads = 128;
  int *flag = nullptr, *out = nullptr;
  KILN_CUDA_CHECK(cudaMalloc(&flag, blocks * sizeof(int)));
  KILN_CUDA_CHECK(cudaMalloc(&out, blocks * sizeof(int)));
  launch(broadcast_kernel, LaunchConfig{blocks, threads, threads * sizeof(int), nullptr}, flag, out);
  std::vector<int> got(blocks);
  KILN_CUDA_CHECK(cudaMemcpy(got.data(), out, blocks * sizeof(int), cudaMemcpyDeviceToHost));
  for (unsigned b = 0; b < blocks; ++b) EXPECT_EQ(got[b], static_cast<int>((b + 1) * threads));
  KILN_CUDA_CHECK(cudaFree(flag));
  KILN_CUDA_CHECK(cudaFree(out));
}

}  // namespace
