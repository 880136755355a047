// sim_kernel_test.cpp: kernels on the CUDA simulator (engine/cuda/sim): indices in 1D/2D/3D,
// __syncthreads and shared memory (in order and under the debug shuffle, which must expose a
// missing barrier), warp shuffles / votes including partial warps, atomics from many blocks,
// dynamic shared memory and its limits, launch-configuration errors, barrier divergence,
// kernel exceptions and pointer-argument checks. Also times two 1M-element kernels (SIMULATED).
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "engine/cuda/kernels/common.h"
#include "engine/cuda/launch.h"
#include "engine/cuda/runtime.h"
#include "sim_test_kernels.h"

namespace {

using kiln::cuda::blocks_for;
using kiln::cuda::launch;
using kiln::cuda::LaunchConfig;
using namespace kiln::sim_test;

// Runs each test in order mode on device 0; tests that want the shuffle turn it on.
class SimKernel : public ::testing::Test {
 protected:
  void SetUp() override {
    was_shuffled_ = kiln::sim::shuffle_enabled();
    kiln::sim::set_shuffle(false);
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  }
  void TearDown() override { kiln::sim::set_shuffle(was_shuffled_, 1); }
  bool was_shuffled_ = false;
};

// The message of the kiln::Error `f` throws ("" if it does not throw).
template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const kiln::Error& e) {
    return e.what();
  }
  return "";
}

// A fault inside a running kernel is asynchronous, as on a GPU: the launch returns, and the
// next synchronising call reports the device's sticky error. Returns the fault's text and
// clears it (cudaDeviceReset).
template <typename F>
std::string fault_of(F launch_it) {
  launch_it();
  const cudaError_t e = cudaDeviceSynchronize();
  EXPECT_EQ(e, cudaErrorLaunchFailure);
  const std::string text = kiln::sim::fault_message();
  EXPECT_EQ(cudaDeviceReset(), cudaSuccess);
  EXPECT_EQ(kiln::sim::fault_message(), "");
  return text;
}

// Two block reductions in a row on one scratch array, as kernels do (softmax: a max, then a
// sum): the barrier at the start of each call keeps a fast warp from overwriting partials a
// slow warp has not read yet. out = {max of v, max of -v, sum of v, sum of 2v}.
__global__ void two_reductions_kernel(const float* v, float* out) {
  KILN_SHARED(float, scratch, [kiln::cuda::kWarpSize]);
  const float x = v[threadIdx.x];
  const float m1 = kiln::cuda::block_max(x, scratch);
  const float m2 = kiln::cuda::block_max(-x, scratch);
  const float s1 = kiln::cuda::block_sum(x, scratch);
  const float s2 = kiln::cuda::block_sum(2 * x, scratch);
  if (threadIdx.x == 0) out[0] = m1, out[1] = m2, out[2] = s1, out[3] = s2;
}

// The maximum and the minimum each sit in one warp only (the last and the first), so a partial
// overwritten too early changes the result; several shuffle seeds give several warp orders.
TEST_F(SimKernel, BlockReductionsBackToBackOnOneScratch) {
  std::vector<float> v(256);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) - 100.0f;
  const float max = *std::max_element(v.begin(), v.end());
  const float min = *std::min_element(v.begin(), v.end());
  const float sum = std::accumulate(v.begin(), v.end(), 0.0f);
  for (uint64_t seed = 0; seed <= 8; ++seed) {  // seed 0: in order
    kiln::sim::set_shuffle(seed != 0, seed);
    DeviceBuffer<float> in(v), out(4);
    launch(two_reductions_kernel, LaunchConfig{1, 256, 0, nullptr}, in.get(), out.get());
    const std::vector<float> r = out.to_host();
    EXPECT_EQ(r[0], max) << "shuffle seed " << seed;
    EXPECT_EQ(r[1], -min) << "shuffle seed " << seed;
    EXPECT_EQ(r[2], sum) << "shuffle seed " << seed;
    EXPECT_EQ(r[3], 2 * sum) << "shuffle seed " << seed;
  }
}

TEST_F(SimKernel, VectorAddOddSize) {
  const int n = 10007;
  std::vector<float> a(n), b(n);
  for (int i = 0; i < n; ++i) a[i] = static_cast<float>(i), b[i] = 2.0f * static_cast<float>(i);
  DeviceBuffer<float> da(a), db(b), dc(n);
  launch(vector_add_kernel, LaunchConfig{blocks_for(n, 256), 256, 0, nullptr}, da.get(), db.get(),
         dc.get(), n);
  const std::vector<float> c = dc.to_host();
  for (int i = 0; i < n; ++i) ASSERT_EQ(c[i], 3.0f * static_cast<float>(i)) << i;
}

TEST_F(SimKernel, IndicesIn2DAnd3D) {
  const dim3 grid(3, 2, 2), block(4, 3, 2);  // 12 blocks of 24 threads
  const int total = 3 * 2 * 2 * 4 * 3 * 2;
  DeviceBuffer<int> ids(std::vector<int>(total, -1));
  DeviceBuffer<unsigned> dims(8);
  launch(index_kernel, LaunchConfig{grid, block, 0, nullptr}, ids.get(), dims.get());
  const std::vector<int> got = ids.to_host();
  for (int i = 0; i < total; ++i) EXPECT_EQ(got[i], i) << "every thread writes its own slot";
  EXPECT_EQ(dims.to_host(), (std::vector<unsigned>{4, 3, 2, 3, 2, 2, 32, 0}));
}

TEST_F(SimKernel, SharedMemoryReductionInOrderAndShuffled) {
  const int n = 100003;
  std::vector<int> x(n);
  for (int i = 0; i < n; ++i) x[i] = i % 1000 - 400;
  const long long want = std::accumulate(x.begin(), x.end(), 0LL);
  for (bool shuffle : {false, true}) {
    kiln::sim::set_shuffle(shuffle, 7);
    DeviceBuffer<int> dx(x);
    DeviceBuffer<unsigned long long> sum(std::vector<unsigned long long>{0});
    launch(block_sum_kernel, LaunchConfig{blocks_for(n, 256), 256, 0, nullptr}, dx.get(), n,
           sum.get());
    EXPECT_EQ(static_cast<long long>(sum.to_host()[0]), want) << "shuffle " << shuffle;
  }
}

TEST_F(SimKernel, ShuffleChangesTheExecutionOrder) {
  auto order = [](bool shuffle, uint64_t seed) {
    kiln::sim::set_shuffle(shuffle, seed);
    DeviceBuffer<int> out(std::vector<int>(96, -1));
    DeviceBuffer<int> counter(std::vector<int>{0});
    launch(record_order_kernel, LaunchConfig{1, 96, 0, nullptr}, out.get(), counter.get());
    return out.to_host();
  };
  std::vector<int> identity(96);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_EQ(order(false, 0), identity);  // in order: thread 0, 1, 2, ...
  const std::vector<int> a = order(true, 1), b = order(true, 2);
  EXPECT_NE(a, identity);
  EXPECT_NE(a, b);  // the seed matters
  std::vector<int> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, identity);  // still every thread exactly once
}

TEST_F(SimKernel, ShuffleExposesAMissingSyncthreads) {
#if KILN_SANITIZE_THREAD
  GTEST_SKIP() << "a deliberate race, which ThreadSanitizer reports (sim_race_detection checks "
                  "that it does)";
#endif
  const int threads = 256;
  auto wrong_values = [&](bool with_barrier, int epoch) {
    DeviceBuffer<int> out(threads);
    launch(neighbour_kernel, LaunchConfig{1, threads, 0, nullptr}, out.get(), epoch,
           with_barrier ? 1 : 0);
    const std::vector<int> got = out.to_host();
    int wrong = 0;
    for (int t = 0; t < threads; ++t) wrong += got[t] != (t == 0 ? -1 : epoch * 1000 + t - 1);
    return wrong;
  };
  // In order, thread t-1 always runs before t: the bug hides.
  EXPECT_EQ(wrong_values(false, 1), 0);
  kiln::sim::set_shuffle(true, 3);
  EXPECT_GT(wrong_values(false, 2), 0) << "the shuffle should expose the missing barrier";
  EXPECT_EQ(wrong_values(true, 3), 0) << "with the barrier the shuffle is harmless";
}

TEST_F(SimKernel, SyncthreadsCountAndOr) {
  DeviceBuffer<int> out(3);
  launch(sync_count_kernel, LaunchConfig{1, 100, 0, nullptr}, out.get());
  EXPECT_EQ(out.to_host(), (std::vector<int>{34, 0, 1}));  // 34 multiples of 3 in 0..99
}

TEST_F(SimKernel, WarpShuffleReductions) {
  for (bool shuffle : {false, true}) {
    kiln::sim::set_shuffle(shuffle, 11);
    DeviceBuffer<int> out(64 * 5);
    launch(warp_ops_kernel, LaunchConfig{1, 64, 0, nullptr}, out.get());
    const std::vector<int> r = out.to_host();
    for (int t = 0; t < 64; ++t) {
      const int lane = t % 32, warp = t / 32;
      const int base = warp * 100;  // lane values are base + lane
      const int warp_sum = 32 * base + 31 * 32 / 2;
      EXPECT_EQ(r[t * 5 + 0], lane == 0 ? warp_sum : r[t * 5 + 0]) << "down, lane 0 has the sum";
      EXPECT_EQ(r[t * 5 + 1], warp_sum) << "xor: every lane has the sum";
      EXPECT_EQ(r[t * 5 + 2], base + 7) << "broadcast of lane 7";
      int prefix = 0;
      for (int l = 0; l <= lane; ++l) prefix += base + l;
      EXPECT_EQ(r[t * 5 + 3], prefix) << "inclusive scan with __shfl_up_sync, lane " << lane;
      const int seg = lane / 16 * 16;  // width 16: sums over half warps
      EXPECT_EQ(r[t * 5 + 4], 16 * (base + seg) + 15 * 16 / 2) << "xor within width 16";
    }
  }
}

TEST_F(SimKernel, PartialWarpShufflesAndVotes) {
  // 40 threads: warp 1 has only lanes 0..7.
  DeviceBuffer<unsigned> out(40 * 4);
  launch(partial_warp_kernel, LaunchConfig{1, 40, 0, nullptr}, out.get());
  const std::vector<unsigned> r = out.to_host();
  for (int t = 0; t < 40; ++t) {
    const bool partial = t >= 32;
    const unsigned lanes = partial ? 0xffu : 0xffffffffu;
    EXPECT_EQ(r[t * 4 + 0], partial ? 8u * 9u / 2u + 8u * 32u : 32u * 33u / 2u)
        << "guarded reduction (sum of t+1 over the warp), thread " << t;
    EXPECT_EQ(r[t * 4 + 1], lanes & 0x55555555u) << "ballot of even lanes";
    EXPECT_EQ(r[t * 4 + 2], lanes) << "__activemask";
    // The simulator's rule: a source lane that does not exist gives the caller's own value.
    // Lane+16 exists only for lanes 0..15 of the full warp.
    const bool exists = t % 32 + 16 < (partial ? 8 : 32);
    EXPECT_EQ(r[t * 4 + 3], exists ? t + 16u : static_cast<unsigned>(t)) << t;
  }
}

TEST_F(SimKernel, AnyAllVotes) {
  DeviceBuffer<int> out(4);
  launch(vote_kernel, LaunchConfig{1, 32, 0, nullptr}, out.get());
  EXPECT_EQ(out.to_host(), (std::vector<int>{1, 0, 1, 1}));
}

TEST_F(SimKernel, AtomicsFromManyBlocksAreExact) {
  const int n = 200000;
  DeviceBuffer<unsigned long long> sum(std::vector<unsigned long long>{0});
  DeviceBuffer<int> mx(std::vector<int>{-1}), mn(std::vector<int>{1 << 30}), count(std::vector<int>{0});
  DeviceBuffer<float> fsum(std::vector<float>{0.0f});
  DeviceBuffer<double> dsum(std::vector<double>{0.0});
  launch(atomics_kernel, LaunchConfig{blocks_for(n, 128), 128, 0, nullptr}, n, sum.get(), mx.get(),
         mn.get(), count.get(), fsum.get(), dsum.get());
  EXPECT_EQ(sum.to_host()[0], static_cast<unsigned long long>(n) * (n + 1) / 2);  // 1 + ... + n
  EXPECT_EQ(mx.to_host()[0], n);
  EXPECT_EQ(mn.to_host()[0], 1);
  EXPECT_EQ(count.to_host()[0], n);  // atomicCAS increments
  EXPECT_EQ(fsum.to_host()[0], static_cast<float>(n));  // exact: n < 2^24
  EXPECT_EQ(dsum.to_host()[0], 0.5 * n);
}

TEST_F(SimKernel, DynamicSharedMemoryAndItsLimits) {
  const int threads = 128;
  DeviceBuffer<float> out(threads);
  launch(dynamic_shared_kernel, LaunchConfig{2, threads, 2 * threads * sizeof(float), nullptr},
         out.get());
  const std::vector<float> r = out.to_host();
  for (int t = 0; t < threads; ++t) EXPECT_EQ(r[t], static_cast<float>(threads - 1 - t + t));
  // 64 KiB needs the opt-in, as on a GPU.
  const size_t big = 64 * 1024;
  const std::string e = error_of(
      [&] { launch(dynamic_shared_kernel, LaunchConfig{1, threads, big, nullptr}, out.get()); });
  EXPECT_NE(e.find("too much dynamic shared memory"), std::string::npos) << e;
  EXPECT_NE(e.find("65536 B dynamic shared memory"), std::string::npos) << e;
  ASSERT_EQ(cudaFuncSetAttribute(dynamic_shared_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(big)),
            cudaSuccess);
  launch(dynamic_shared_kernel, LaunchConfig{1, threads, big, nullptr}, out.get());
  EXPECT_EQ(cudaFuncSetAttribute(dynamic_shared_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 228 * 1024),
            cudaErrorInvalidValue);  // above the 227 KiB of an H100
  (void)cudaGetLastError();
}

// Dynamic shared memory holds NaN when every block starts, as a GPU's holds garbage: a kernel
// that reads shared memory before writing it cannot pass on zeros or on the previous block's
// values (here, block 0 writes 1.0 everywhere after reading; block 1 still reads NaN).
TEST_F(SimKernel, DynamicSharedMemoryStartsEveryBlockAsNaN) {
  const int threads = 64, blocks = 3;
  DeviceBuffer<float> out(threads * blocks);
  launch(read_fresh_shared_kernel, LaunchConfig{blocks, threads, threads * sizeof(float), nullptr},
         out.get());
  for (float v : out.to_host()) EXPECT_TRUE(std::isnan(v)) << v;
}

TEST_F(SimKernel, LaunchConfigurationErrors) {
  DeviceBuffer<float> out(2048);
  auto try_launch = [&](dim3 grid, dim3 block) {
    return error_of([&] { launch(fill_kernel, LaunchConfig{grid, block, 0, nullptr}, out.get(), 0); });
  };
  std::string e = try_launch(1, 1025);
  EXPECT_NE(e.find("1025 threads per block, the limit is 1024"), std::string::npos) << e;
  EXPECT_NE(e.find("grid 1x1x1, block 1025x1x1"), std::string::npos) << e;
  EXPECT_NE(try_launch(1, dim3(1, 1, 65)).find("1024x1024x64"), std::string::npos);
  EXPECT_NE(try_launch(0, 32).find("grid dimension is 0"), std::string::npos);
  EXPECT_NE(try_launch(dim3(1, 65536), 32).find("2147483647x65535x65535"), std::string::npos);
  EXPECT_EQ(try_launch(dim3(2, 1, 1), dim3(32, 32, 1)), "");  // 1024 threads is fine
}

TEST_F(SimKernel, BarrierDivergenceIsReportedAndTheNextLaunchWorks) {
  DeviceBuffer<float> out(64);
  const std::string e = fault_of(
      [&] { launch(divergent_barrier_kernel, LaunchConfig{1, 64, 0, nullptr}, out.get()); });
  EXPECT_NE(e.find("barrier divergence"), std::string::npos) << e;
  // Warp operation whose mask includes a lane waiting at __syncthreads.
  const std::string w = fault_of(
      [&] { launch(divergent_warp_kernel, LaunchConfig{1, 32, 0, nullptr}, out.get()); });
  EXPECT_NE(w.find("warp divergence"), std::string::npos) << w;
  // The abandoned fibers are rebuilt: the same OS thread runs a correct kernel afterwards.
  launch(fill_kernel, LaunchConfig{1, 64, 0, nullptr}, out.get(), 5);
  for (float v : out.to_host()) EXPECT_EQ(v, 5.0f);
}

TEST_F(SimKernel, KernelExceptionIsRethrownOnTheHost) {
  DeviceBuffer<float> out(32);
  const std::string e =
      fault_of([&] { launch(throwing_kernel, LaunchConfig{4, 32, 0, nullptr}, out.get()); });
  EXPECT_NE(e.find("kernel threw"), std::string::npos) << e;
  EXPECT_NE(e.find("boom"), std::string::npos) << e;
  EXPECT_NE(e.find("cuda:0: kernel: grid 4x1x1, block 32x1x1"), std::string::npos) << e;
  launch(fill_kernel, LaunchConfig{1, 32, 0, nullptr}, out.get(), 2);
  EXPECT_EQ(out.to_host()[31], 2.0f);
}

// Until the sticky error is cleared, the device runs nothing more: later launches fail naming
// the earlier fault, synchronising calls return it, and the work queued behind the fault is
// skipped.
TEST_F(SimKernel, AFaultIsStickyUntilReset) {
  DeviceBuffer<float> out(32);
  launch(fill_kernel, LaunchConfig{1, 32, 0, nullptr}, out.get(), 1);
  launch(throwing_kernel, LaunchConfig{4, 32, 0, nullptr}, out.get());
  try {
    launch(fill_kernel, LaunchConfig{1, 32, 0, nullptr}, out.get(), 3);  // may be skipped
  } catch (const kiln::Error& e) {
    EXPECT_NE(std::string(e.what()).find("after an earlier fault"), std::string::npos) << e.what();
  }
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
  EXPECT_EQ(cudaStreamSynchronize(nullptr), cudaErrorLaunchFailure);
  const std::string e = error_of([&] { launch(fill_kernel, LaunchConfig{1, 32, 0, nullptr}, out.get(), 4); });
  EXPECT_NE(e.find("after an earlier fault"), std::string::npos) << e;
  EXPECT_NE(e.find("boom"), std::string::npos) << e;
  ASSERT_EQ(cudaDeviceReset(), cudaSuccess);
  EXPECT_EQ(out.to_host()[0], 1.0f);  // the fill queued after the fault never ran
  launch(fill_kernel, LaunchConfig{1, 32, 0, nullptr}, out.get(), 5);
  EXPECT_EQ(out.to_host()[0], 5.0f);
}

TEST_F(SimKernel, PointerArgumentsAreChecked) {
  std::vector<float> host(16);
  std::string e = error_of(
      [&] { launch(fill_kernel, LaunchConfig{1, 16, 0, nullptr}, host.data(), 1); });
  EXPECT_NE(e.find("is not device memory"), std::string::npos) << e;
  float* freed = nullptr;
  ASSERT_EQ(cudaMalloc(&freed, 64), cudaSuccess);
  ASSERT_EQ(cudaFree(freed), cudaSuccess);
  e = error_of([&] { launch(fill_kernel, LaunchConfig{1, 16, 0, nullptr}, freed, 1); });
  EXPECT_NE(e.find("is not device memory"), std::string::npos) << e;
  // A buffer of device 0 used by a kernel launched on device 1.
  DeviceBuffer<float> on0(16);
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  e = error_of([&] { launch(fill_kernel, LaunchConfig{1, 16, 0, nullptr}, on0.get(), 1); });
  EXPECT_NE(e.find("points to memory of cuda:0 but the kernel runs on cuda:1"), std::string::npos) << e;
  // And a stream of device 0 from device 1.
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  cudaStream_t s0 = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s0), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  DeviceBuffer<float> on1(16);
  e = error_of([&] { launch(fill_kernel, LaunchConfig{1, 16, 0, s0}, on1.get(), 1); });
  EXPECT_NE(e.find("the stream belongs to cuda:0"), std::string::npos) << e;
  launch(fill_kernel, LaunchConfig{1, 16, 0, nullptr}, on1.get(), 3);  // device 1 works
  EXPECT_EQ(on1.to_host()[15], 3.0f);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(s0), cudaSuccess);
}

// The intrinsics are plain host functions in the simulator: test them directly.
TEST(SimIntrinsics, BitsCastsMathAndMinMax) {
  EXPECT_EQ(__popc(0xf0f0u), 8);
  EXPECT_EQ(__popcll(~0ull), 64);
  EXPECT_EQ(__clz(0), 32);
  EXPECT_EQ(__clz(1), 31);
  EXPECT_EQ(__clzll(1), 63);
  EXPECT_EQ(__ffs(0), 0);
  EXPECT_EQ(__ffs(8), 4);
  EXPECT_EQ(__brev(1u), 0x80000000u);
  EXPECT_EQ(__float_as_int(1.0f), 0x3f800000);
  EXPECT_EQ(__int_as_float(0x40000000), 2.0f);
  EXPECT_EQ(__uint_as_float(__float_as_uint(-3.5f)), -3.5f);
  EXPECT_EQ(__longlong_as_double(__double_as_longlong(0.25)), 0.25);
  EXPECT_EQ(__saturatef(1.5f), 1.0f);
  EXPECT_EQ(__saturatef(-0.5f), 0.0f);
  EXPECT_EQ(__saturatef(NAN), 0.0f);
  EXPECT_FLOAT_EQ(rsqrtf(4.0f), 0.5f);
  EXPECT_FLOAT_EQ(__fdividef(1.0f, 4.0f), 0.25f);
  EXPECT_FLOAT_EQ(__expf(0.0f), 1.0f);
  EXPECT_EQ(min(3, -2), -2);
  EXPECT_EQ(max(3u, 7u), 7u);
  EXPECT_EQ(max(int64_t{1} << 40, int64_t{5}), int64_t{1} << 40);
  EXPECT_EQ(min(2.5f, -1.0f), -1.0f);
  EXPECT_EQ(max(2.5, 3.0), 3.0);
  EXPECT_EQ(max(1.0f, NAN), 1.0f);  // like fmaxf
  const float x = 2.0f;
  EXPECT_EQ(__ldg(&x), 2.0f);
  EXPECT_EQ(sqrt(4.0f), 2.0f);  // the float overload, in the global namespace
  EXPECT_GT(FLT_MAX, 1e38f);
  EXPECT_TRUE(std::isinf(INFINITY));
  const dim3 d = 7;  // dim3 from unsigned, the other dimensions 1
  EXPECT_EQ(d.x * d.y * d.z, 7u);
}

#if defined(__SANITIZE_ADDRESS__)
// Device memory ends in a poisoned guard (sim/memory.cpp): ASan catches a kernel writing one
// past the end.
TEST_F(SimKernel, AddressSanitizerCatchesAnOutOfBoundsKernel) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        DeviceBuffer<float> out(31);
        launch(fill_kernel, LaunchConfig{1, 32, 0, nullptr}, out.get(), 1);  // writes out[31]
      },
      "use-after-poison");
}
#endif

#if defined(__SANITIZE_ADDRESS__)
// Dynamic shared memory sits between guard zones: reading past its end is caught too.
TEST_F(SimKernel, AddressSanitizerCatchesSharedMemoryPastTheEnd) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        DeviceBuffer<float> out(1);
        launch(shared_past_end_kernel, LaunchConfig{1, 32, 16 * sizeof(float), nullptr},
               out.get(), 16);
      },
      "use-after-poison");
}
#endif

// A float4 access needs a 16-byte aligned address: a GPU faults ("misaligned address"), and so
// does the simulator where UBSan's alignment check is on (the build-asan tree).
TEST_F(SimKernel, MisalignedFloat4LoadIsCaught) {
  DeviceBuffer<float> in(std::vector<float>(8, 1.0f)), out(1);
  launch(load_float4_kernel, LaunchConfig{1, 32, 0, nullptr}, in.get(), out.get());
  EXPECT_EQ(out.to_host()[0], 2.0f);
#if KILN_SANITIZE_ALIGNMENT
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // Kernels run on the stream's worker thread: synchronise so the statement waits for the fault.
  EXPECT_DEATH(
      {
        launch(load_float4_kernel, LaunchConfig{1, 32, 0, nullptr}, in.get() + 1, out.get());
        (void)cudaDeviceSynchronize();
      },
      "misaligned address .* for type 'const struct float4'");
#else
  GTEST_SKIP() << "misaligned vector accesses are caught where -fsanitize=alignment is on (the "
                  "build-asan tree)";
#endif
}

// Two 1M-element kernels, timed. These are SIMULATED figures: CPU time, nothing to do with a GPU.
TEST_F(SimKernel, MillionElementKernelsAreFastEnough) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "timings under ThreadSanitizer mean nothing (every fiber switch is a TSan event)";
#endif
  const int n = 1 << 20;
  DeviceBuffer<float> a(std::vector<float>(n, 1.0f)), b(std::vector<float>(n, 2.0f)), c(n);
  DeviceBuffer<float> sum(std::vector<float>{0.0f});
  auto seconds = [](auto f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  const double t_add = seconds([&] {
    launch(vector_add_kernel, LaunchConfig{blocks_for(n, 256), 256, 0, nullptr}, a.get(), b.get(),
           c.get(), n);
  });
  const double t_sum = seconds([&] {
    launch(float_block_sum_kernel, LaunchConfig{blocks_for(n, 256), 256, 0, nullptr}, c.get(), n,
           sum.get());
  });
  EXPECT_EQ(sum.to_host()[0], 3.0f * n);  // exact: partial sums are small integers
  std::printf("SIMULATED: elementwise add, 1M floats, 256 threads/block: %.1f ms\n", 1e3 * t_add);
  std::printf("SIMULATED: block reduction (__syncthreads + __shfl_down_sync), 1M floats: %.1f ms\n",
              1e3 * t_sum);
  EXPECT_LT(t_add + t_sum, 30.0);  // a hang-level guard only: timings depend on the machine
}

}  // namespace
