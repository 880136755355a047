// sim_shared_memory_test.cpp: static shared memory (KILN_SHARED) in the CUDA simulator: every
// block starts with NaN in it (not zeros, not the previous block's values), all threads of a
// block see one copy, a write past an array's end hits a guard zone (AddressSanitizer tree),
// and static + dynamic bytes are checked against the kernel's shared-memory limit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "engine/cuda/check.h"
#include "engine/cuda/launch.h"
#include "engine/cuda/runtime.h"

namespace {

using kiln::cuda::launch;
using kiln::cuda::LaunchConfig;

// A device array filled from / copied back to a std::vector.
template <typename T>
struct Buffer {
  explicit Buffer(size_t n) : n(n) { KILN_CUDA_CHECK(cudaMalloc(&p, n * sizeof(T))); }
  ~Buffer() { (void)cudaFree(p); }
  std::vector<T> to_host() const {
    std::vector<T> v(n);
    KILN_CUDA_CHECK(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
  }
  size_t n;
  T* p = nullptr;
};

// Each thread copies out what its element held at block start, then writes it: the next
// block (on the same OS thread: a small grid runs on the launching thread) must still read NaN.
__global__ void read_before_write_kernel(float* out) {
  KILN_SHARED(float, s, [64]);
  const unsigned t = threadIdx.x;
  out[blockIdx.x * blockDim.x + t] = s[t];
  __syncthreads();
  s[t] = static_cast<float>(blockIdx.x + 1);
}

// Two variables: thread 0 writes them, all read them after the barrier (one copy per block),
// and their addresses are 16-byte aligned and distinct.
__global__ void one_copy_per_block_kernel(int* out) {
  KILN_SHARED(int, a, [3]);
  KILN_SHARED(double, b);
  if (threadIdx.x == 0) a[2] = 7, b = 0.5;
  __syncthreads();
  const auto pa = reinterpret_cast<uintptr_t>(&a[0]), pb = reinterpret_cast<uintptr_t>(&b);
  out[threadIdx.x] = a[2] + static_cast<int>(b * 2) + (pa % 16 == 0 && pb % 16 == 0 && pa != pb) * 100;
}

// Thread 0 writes element `i` of a 16-float array (i = 16: one past the end).
__global__ void static_shared_store_kernel(float* out, int i) {
  KILN_SHARED(float, s, [16]);
  if (threadIdx.x == 0) {
    s[i] = 1.0f;
    out[0] = s[i];
  }
}

// 40 KiB of static shared memory (plus the launch's dynamic bytes).
__global__ void forty_kib_kernel(float* out) {
  KILN_SHARED(float, s, [10 * 1024]);
  s[threadIdx.x] = 1.0f;
  __syncthreads();
  if (threadIdx.x == 0) out[0] = s[1];
}

class SimSharedMemory : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(cudaSetDevice(0), cudaSuccess); }
};

TEST_F(SimSharedMemory, EveryBlockStartsWithNaN) {
  const unsigned threads = 64, blocks = 3;
  Buffer<float> out(threads * blocks);
  launch(read_before_write_kernel, LaunchConfig{blocks, threads, 0, nullptr}, out.p);
  for (float v : out.to_host()) EXPECT_TRUE(std::isnan(v)) << v;
  // And the next launch of the same kernel too.
  launch(read_before_write_kernel, LaunchConfig{1, threads, 0, nullptr}, out.p);
  EXPECT_TRUE(std::isnan(out.to_host()[5]));
}

TEST_F(SimSharedMemory, OneAlignedCopyPerBlock) {
  const unsigned threads = 96;
  Buffer<int> out(threads);
  launch(one_copy_per_block_kernel, LaunchConfig{2, threads, 0, nullptr}, out.p);
  for (int v : out.to_host()) EXPECT_EQ(v, 108);
}

TEST_F(SimSharedMemory, StaticAndDynamicBytesCountAgainstTheLimit) {
  Buffer<float> out(1);
  launch(forty_kib_kernel, LaunchConfig{1, 32, 8 * 1024, nullptr}, out.p);  // 48 KiB: fits
  EXPECT_EQ(out.to_host()[0], 1.0f);
  // The static bytes are known only when a block runs: the launch returns, and the next
  // synchronising call reports the fault (cudaDeviceReset clears it).
  launch(forty_kib_kernel, LaunchConfig{1, 32, 8 * 1024 + 4, nullptr}, out.p);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
  const std::string e = kiln::sim::fault_message();
  EXPECT_EQ(cudaDeviceReset(), cudaSuccess);
  EXPECT_NE(e.find("too much shared memory: 40960 B static"), std::string::npos) << e;
  EXPECT_NE(e.find("8196 B dynamic"), std::string::npos) << e;
  EXPECT_NE(e.find("limit is 49152 B"), std::string::npos) << e;
  EXPECT_EQ(e.find("kernel threw"), std::string::npos) << "a launch error, not the kernel's: " << e;
  // With the opt-in the same launch runs, and the next launch works as before.
  ASSERT_EQ(cudaFuncSetAttribute(forty_kib_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 64 * 1024),
            cudaSuccess);
  launch(forty_kib_kernel, LaunchConfig{1, 32, 8 * 1024 + 4, nullptr}, out.p);
  EXPECT_EQ(out.to_host()[0], 1.0f);
}

TEST_F(SimSharedMemory, InBoundsStoreWorks) {
  Buffer<float> out(1);
  launch(static_shared_store_kernel, LaunchConfig{1, 32, 0, nullptr}, out.p, 15);
  EXPECT_EQ(out.to_host()[0], 1.0f);
}

#if defined(__SANITIZE_ADDRESS__)
// A guard zone follows every static shared variable: one element past the end is caught.
TEST_F(SimSharedMemory, AddressSanitizerCatchesAStorePastTheEnd) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        Buffer<float> out(1);
        launch(static_shared_store_kernel, LaunchConfig{1, 32, 0, nullptr}, out.p, 16);
      },
      // UBSan's bounds check sees the index first where it is on (the ASan + UBSan tree);
      // ASan's guard zone catches the store where only ASan is.
      "use-after-poison|index 16 out of bounds");
}
#else
TEST_F(SimSharedMemory, AddressSanitizerCatchesAStorePastTheEnd) {
  GTEST_SKIP() << "guard zones are checked by AddressSanitizer (the build-asan tree)";
}
#endif

}  // namespace
