// sim_wgmma_test.cpp: the simulator's warpgroup MMA (engine/cuda/sm90/wgmma.h over
// engine/cuda/sim/sm90_wgmma.cpp). One warpgroup computes 64 x BN x 16 and 64 x BN x 64 (four
// k16 steps advancing the descriptors) products for BN 64/128/256, bf16 and f16, from operands
// written into shared memory in each swizzle mode, against a double-precision reference (and bit
// for bit against the documented f32 order); then the asynchrony as a GPU shows it (NaN
// accumulators before the wait, wait_group<1> leaving the newest group pending, mmas chained on
// one accumulator across groups), the dynamic shared memory's atom alignment, and the rules
// as faults (an operand overwritten before the wait, a missing fence, partial or broken
// warpgroups, bad descriptors, groups left pending at exit). Then the warpgroup-wide completion
// a warp-specialised kernel relies on (one thread's wait frees the operands for the whole
// warpgroup) and setmaxnreg's register pool (a producer's .dec pays for the consumers' .inc;
// the counts' direction and an .inc the pool can never meet are faults).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "engine/cuda/launch.h"
#include "engine/cuda/mma.h"
#include "engine/cuda/runtime.h"
#include "engine/cuda/sm90/mbarrier.h"
#include "engine/cuda/sm90/swizzle.h"
#include "engine/cuda/sm90/wgmma.h"
#include "engine/host_device.h"
#include "sim_test_kernels.h"

namespace {

namespace sm90 = kiln::cuda::sm90;
using kiln::cuda::launch;
using kiln::cuda::LaunchConfig;
using kiln::sim_test::DeviceBuffer;
using sm90::Swizzle;

// A K-major tile of `rows` x k_total 16-bit elements in the canonical layout of `mode`: panels
// of `row_bytes / 2` k (16 bytes, 8 k, without swizzle), each `rows` x row_bytes, one after the
// other; within a panel 8-row groups of 8 * row_bytes; element (r, k) at the swizzled offset.
struct Tile {
  Swizzle mode;
  int rows, k_total;
  uint32_t row_bytes() const { return sm90::swizzle_row_bytes(mode); }
  uint32_t k_per_panel() const { return row_bytes() / 2; }
  uint32_t panel_bytes() const { return static_cast<uint32_t>(rows) * row_bytes(); }
  // Whole panels: with fewer k than a swizzled row holds, the rows keep their full length.
  uint32_t bytes() const {
    return panel_bytes() * ((static_cast<uint32_t>(k_total) + k_per_panel() - 1) / k_per_panel());
  }
  uint32_t offset(int r, int k) const {
    const uint32_t kb = static_cast<uint32_t>(k) / k_per_panel(), kk = static_cast<uint32_t>(k) % k_per_panel();
    return sm90::swizzle_address(mode, kb * panel_bytes() + static_cast<uint32_t>(r) * row_bytes() + kk * 2);
  }
  // The descriptor fields of k16 step j: start offset (from the tile), LBO, SBO.
  uint32_t start(int j) const {
    const uint32_t k0 = 16u * static_cast<uint32_t>(j);
    return k0 / k_per_panel() * panel_bytes() + k0 % k_per_panel() * 2;
  }
  uint32_t lbo() const { return mode == Swizzle::None ? panel_bytes() : 16u; }
  uint32_t sbo() const { return 8u * row_bytes(); }
};

struct Params {
  Swizzle mode;
  int k_steps;
  uint32_t a_bytes, b_bytes;       // A at 0, B at a_bytes in dynamic shared memory
  uint32_t a_start[4], b_start[4];  // per k step
  uint32_t a_lbo, a_sbo, b_lbo, b_sbo;
  float init;                      // d before the first step
  bool first_accumulate;           // the first step's accumulate
};

// The accumulator layout of common use: d[i] of warpgroup thread t.
__host__ __device__ inline int acc_row(int t, int i) { return 16 * (t / 32) + (t % 32) / 4 + 8 * ((i / 2) % 2); }
__host__ __device__ inline int acc_col(int t, int i) { return 8 * (i / 4) + 2 * (t % 4) + (i % 2); }

template <int BN, typename E>
__global__ void product_kernel(const uint16_t* a_img, const uint16_t* b_img, Params p, float* out) {
  KILN_DYNAMIC_SHARED(unsigned char, smem);
  auto* s16 = reinterpret_cast<uint16_t*>(smem);
  for (uint32_t i = threadIdx.x; i < p.a_bytes / 2; i += blockDim.x) s16[i] = a_img[i];
  for (uint32_t i = threadIdx.x; i < p.b_bytes / 2; i += blockDim.x) s16[p.a_bytes / 2 + i] = b_img[i];
  __syncthreads();
  float d[BN / 2];
  for (float& v : d) v = p.init;
  sm90::wgmma_fence();
  for (int j = 0; j < p.k_steps; ++j) {
    const uint64_t da = sm90::make_smem_desc(smem + p.a_start[j], p.mode, p.a_lbo, p.a_sbo);
    const uint64_t db = sm90::make_smem_desc(smem + p.a_bytes + p.b_start[j], p.mode, p.b_lbo, p.b_sbo);
    sm90::wgmma_m64k16<BN, E>(d, da, db, j > 0 || p.first_accumulate);
  }
  sm90::wgmma_commit_group();
  sm90::wgmma_wait_group<0>();
  const int t = static_cast<int>(threadIdx.x);
  for (int i = 0; i < BN / 2; ++i) out[acc_row(t, i) * BN + acc_col(t, i)] = d[i];
}

template <typename E>
uint16_t to_bits(float v) {
  return std::is_same_v<E, __nv_bfloat16> ? kiln::f32_to_bf16(v) : kiln::f32_to_f16(v);
}
template <typename E>
float from_bits(uint16_t b) {
  return std::is_same_v<E, __nv_bfloat16> ? kiln::bf16_to_f32(b) : kiln::f16_to_f32(b);
}

// Runs one product and checks it; returns the number of elements checked.
template <int BN, typename E>
void check_product(Swizzle mode, int k_steps, float init, bool first_accumulate) {
  const int K = 16 * k_steps;
  const Tile ta{mode, 64, K}, tb{mode, BN, K};
  std::mt19937 rng(static_cast<unsigned>(BN * 131 + K * 7 + static_cast<int>(mode)));
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  std::vector<float> a(64 * K), b(BN * K);  // a[r * K + k], b[n * K + k], already rounded
  std::vector<uint16_t> a_img(ta.bytes() / 2, 0), b_img(tb.bytes() / 2, 0);
  for (int r = 0; r < 64; ++r)
    for (int k = 0; k < K; ++k) {
      const uint16_t bits = to_bits<E>(dist(rng));
      a[r * K + k] = from_bits<E>(bits);
      a_img[ta.offset(r, k) / 2] = bits;
    }
  for (int n = 0; n < BN; ++n)
    for (int k = 0; k < K; ++k) {
      const uint16_t bits = to_bits<E>(dist(rng));
      b[n * K + k] = from_bits<E>(bits);
      b_img[tb.offset(n, k) / 2] = bits;
    }
  Params p{};
  p.mode = mode;
  p.k_steps = k_steps;
  p.a_bytes = ta.bytes();
  p.b_bytes = tb.bytes();
  for (int j = 0; j < k_steps; ++j) {
    p.a_start[j] = ta.start(j);
    p.b_start[j] = tb.start(j);
  }
  p.a_lbo = ta.lbo();
  p.a_sbo = ta.sbo();
  p.b_lbo = tb.lbo();
  p.b_sbo = tb.sbo();
  p.init = init;
  p.first_accumulate = first_accumulate;
  DeviceBuffer<uint16_t> da(a_img), db(b_img);
  DeviceBuffer<float> dout(std::vector<float>(64 * BN, -1.0f));
  launch(product_kernel<BN, E>, LaunchConfig{1, 128, p.a_bytes + p.b_bytes, nullptr}, da.get(),
         db.get(), p, dout.get());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << kiln::sim::fault_message();
  const std::vector<float> got = dout.to_host();
  const char* type = std::is_same_v<E, __nv_bfloat16> ? "bf16" : "f16";
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < BN; ++n) {
      const double c = first_accumulate ? init : 0.0;
      double want = c, magnitude = std::fabs(c);
      float ordered = static_cast<float>(c);  // the documented order: k = 0, 1, ... in f32
      for (int k = 0; k < K; ++k) {
        const double prod = static_cast<double>(a[m * K + k]) * b[n * K + k];
        want += prod;
        magnitude += std::fabs(prod);
        ordered += a[m * K + k] * b[n * K + k];
      }
      // f32 accumulation of exact products: at most K + 1 roundings of partial sums.
      const double tol = (K + 1) * std::ldexp(1.0, -24) * magnitude;
      const float g = got[m * BN + n];
      ASSERT_NEAR(g, want, tol) << type << " BN " << BN << " K " << K << " swizzle "
                                << static_cast<int>(mode) << " at (" << m << ", " << n << ")";
      ASSERT_EQ(g, ordered) << type << " BN " << BN << " K " << K << " at (" << m << ", " << n << ")";
    }
}

template <int BN, typename E>
void check_all_modes() {
  for (Swizzle mode : {Swizzle::None, Swizzle::B32, Swizzle::B64, Swizzle::B128})
    for (int k_steps : {1, 4}) check_product<BN, E>(mode, k_steps, 12345.0f, false);
}

TEST(SimWgmma, Bf16ProductsMatchTheReferenceInEverySwizzleMode) {
  check_all_modes<64, __nv_bfloat16>();
  check_all_modes<128, __nv_bfloat16>();
  check_all_modes<256, __nv_bfloat16>();
}

TEST(SimWgmma, F16ProductsMatchTheReferenceInEverySwizzleMode) {
  check_all_modes<64, __half>();
  check_all_modes<128, __half>();
  check_all_modes<256, __half>();
}

TEST(SimWgmma, AccumulateAddsTheOldAccumulatorAndFalseIgnoresIt) {
  // check_all_modes starts from d = 12345 with accumulate false: the product alone came out.
  check_product<64, __nv_bfloat16>(Swizzle::B128, 2, 3.5f, true);
  check_product<128, __half>(Swizzle::None, 1, -1.25f, true);
}

// A broken rule faults the kernel, naming it (the text of the device's sticky fault).
template <typename F>
std::string fault_of(F launch_it) {
  launch_it();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
  const std::string text = kiln::sim::fault_message();
  EXPECT_EQ(cudaDeviceReset(), cudaSuccess);
  return text;
}
bool contains(const std::string& text, const char* what) { return text.find(what) != std::string::npos; }

// A 64 x 16 A and 64 x 16 B without swizzle (core matrices: LBO 1024, SBO 128), filled with 1.
enum class Misuse { None, ReadBeforeWait, OverwriteA, OverwriteB, NoFence, NoWait, NoCommit,
                    MisalignedSwizzle, PastSharedMemory, EarlyExit, TwoGroups, BadRegs,
                    ChainAcrossGroups, StaticShared, OtherDescriptor, SkippedMma };

__global__ void misuse_kernel(Misuse what, float* out) {
  KILN_DYNAMIC_SHARED(unsigned char, smem);
  auto* s16 = reinterpret_cast<uint16_t*>(smem);
  const unsigned t = threadIdx.x;
  for (unsigned i = t; i < 4096; i += blockDim.x) s16[i] = 0x3f80;  // bf16 1.0, 8 KiB
  __syncthreads();
  if (what == Misuse::EarlyExit && t >= 96) return;
  if (what == Misuse::BadRegs) kiln::sim::sm90::setmaxnreg(true, 20);
  float d[32], e[32];
  for (int i = 0; i < 32; ++i) d[i] = e[i] = 0.0f;
  if (what != Misuse::NoFence) sm90::wgmma_fence();
  const uint64_t da = sm90::make_smem_desc(smem, Swizzle::None, 1024, 128);
  uint64_t db = sm90::make_smem_desc(smem + 2048, Swizzle::None, 1024, 128);
  if (what == Misuse::StaticShared) {
    KILN_SHARED(uint16_t, tile, [1024]);
    db = sm90::make_smem_desc(tile, Swizzle::None, 1024, 128);
  }
  if (what == Misuse::MisalignedSwizzle) db = sm90::make_smem_desc(smem + 2048 + 128, Swizzle::B128, 16, 1024);
  if (what == Misuse::PastSharedMemory) db = sm90::make_smem_desc(smem + 7168, Swizzle::None, 1024, 128);
  if (what == Misuse::OtherDescriptor && t == 40) db = da;
  if (what != Misuse::SkippedMma || t / 32 != 1)  // SkippedMma: warp 1 skips it
    sm90::wgmma_m64k16<64, __nv_bfloat16>(d, da, db, false);
  // The overwrites come after a warp barrier, so only the wgmma's own read (asynchronous on a
  // GPU, at the wait here) conflicts with them, not the snapshot taken at issue (which
  // ThreadSanitizer would report as a race between lanes).
  __syncwarp();
  if (what == Misuse::OverwriteA && t == 5) s16[3] = 0x4000;
  if (what == Misuse::OverwriteB && t == 6) s16[1024 + 9] = 0x4000;
  if (what == Misuse::NoCommit) return;
  sm90::wgmma_commit_group();
  if (what == Misuse::ReadBeforeWait) out[t] = d[0];
  if (what == Misuse::TwoGroups) {
    sm90::wgmma_m64k16<64, __nv_bfloat16>(e, da, db, false);
    sm90::wgmma_commit_group();
    sm90::wgmma_wait_group<1>();
    out[2 * t] = d[5];  // the older group: done
    out[2 * t + 1] = e[5];  // the newest: still pending
  }
  if (what == Misuse::ChainAcrossGroups) {
    // A second mma accumulating onto the pending first, in a group of its own.
    sm90::wgmma_m64k16<64, __nv_bfloat16>(d, da, db, true);
    sm90::wgmma_commit_group();
    sm90::wgmma_wait_group<1>();
    out[t] = d[7];  // the first group is done, but the second still owns the registers
    sm90::wgmma_wait_group<0>();
    out[128 + t] = d[7];
  }
  if (what == Misuse::NoWait) return;
  sm90::wgmma_wait_group<0>();
  if (what == Misuse::TwoGroups) out[256 + t] = e[5];
  if (what == Misuse::None) out[t] = d[0];
  sm90::setmaxnreg_dec<40>();
  sm90::setmaxnreg_inc<232>();
}

std::vector<float> run_misuse(Misuse what, unsigned threads = 128) {
  DeviceBuffer<float> out(std::vector<float>(512, -1.0f));
  launch(misuse_kernel, LaunchConfig{1, threads, 8192, nullptr}, what, out.get());
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << kiln::sim::fault_message();
  return out.to_host();
}

TEST(SimWgmma, TheAccumulatorsAreNaNUntilTheWait) {
  const std::vector<float> done = run_misuse(Misuse::None);
  for (int t = 0; t < 128; ++t) EXPECT_EQ(done[t], 16.0f) << t;  // 16 products of 1 * 1
  const std::vector<float> early = run_misuse(Misuse::ReadBeforeWait);
  for (int t = 0; t < 128; ++t) EXPECT_TRUE(std::isnan(early[t])) << t;
}

TEST(SimWgmma, WaitGroupOneLeavesTheNewestGroupPending) {
  const std::vector<float> got = run_misuse(Misuse::TwoGroups);
  for (int t = 0; t < 128; ++t) {
    EXPECT_EQ(got[2 * t], 16.0f) << t;
    EXPECT_TRUE(std::isnan(got[2 * t + 1])) << t;
    EXPECT_EQ(got[256 + t], 16.0f) << t;
  }
}

TEST(SimWgmma, MmasOnOneAccumulatorChainAcrossGroups) {
  const std::vector<float> got = run_misuse(Misuse::ChainAcrossGroups);
  for (int t = 0; t < 128; ++t) {
    EXPECT_TRUE(std::isnan(got[t])) << t;
    EXPECT_EQ(got[128 + t], 32.0f) << t;
  }
}

// Kernels align their swizzled tiles by pointer; the simulator's descriptors use offsets into
// the dynamic shared memory: the two agree because the arena is aligned to the largest atom.
__global__ void dynamic_shared_alignment_kernel(unsigned long long* out) {
  KILN_DYNAMIC_SHARED(unsigned char, smem);
  if (threadIdx.x == 0) out[0] = reinterpret_cast<uintptr_t>(smem) % sm90::swizzle_atom_bytes(Swizzle::B128);
}

TEST(SimWgmma, DynamicSharedMemoryStartsOnTheSwizzleAtom) {
  for (unsigned bytes : {16u, 4096u, 40000u}) {
    DeviceBuffer<unsigned long long> out(std::vector<unsigned long long>{99});
    launch(dynamic_shared_alignment_kernel, LaunchConfig{1, 32, bytes, nullptr}, out.get());
    EXPECT_EQ(out.to_host()[0], 0u) << bytes;
  }
}

TEST(SimWgmma, TheRulesAreFaults) {
  const auto fault = [](Misuse what, unsigned threads = 128) {
    return fault_of([&] {
      DeviceBuffer<float> out(512);
      launch(misuse_kernel, LaunchConfig{1, threads, 8192, nullptr}, what, out.get());
      (void)cudaDeviceSynchronize();  // the buffer is freed after the kernel ran
    });
  };
  std::string f = fault(Misuse::OverwriteA);
  EXPECT_TRUE(contains(f, "written before wgmma.wait_group") && contains(f, "operand A")) << f;
  f = fault(Misuse::OverwriteB);
  EXPECT_TRUE(contains(f, "written before wgmma.wait_group") && contains(f, "operand B")) << f;
  f = fault(Misuse::NoFence);
  EXPECT_TRUE(contains(f, "without a wgmma_fence()")) << f;
  f = fault(Misuse::NoWait);
  EXPECT_TRUE(contains(f, "never waited for")) << f;
  f = fault(Misuse::NoCommit);
  EXPECT_TRUE(contains(f, "never committed")) << f;
  f = fault(Misuse::MisalignedSwizzle);
  EXPECT_TRUE(contains(f, "1024-byte atom boundary")) << f;
  f = fault(Misuse::PastSharedMemory);
  EXPECT_TRUE(contains(f, "past the block's 8192 bytes")) << f;
  f = fault(Misuse::EarlyExit);
  EXPECT_TRUE(contains(f, "made different warpgroup calls")) << f;
  // A thread whose mma differs from the warpgroup's faults at its issue, one that skips an mma
  // when the group executes, both before any thread exits.
  f = fault(Misuse::OtherDescriptor);
  EXPECT_TRUE(contains(f, "made different warpgroup calls") &&
              contains(f, "mma 0 of wgmma group 0") && contains(f, "in thread 40")) << f;
  f = fault(Misuse::SkippedMma);
  EXPECT_TRUE(contains(f, "made different warpgroup calls") &&
              contains(f, "issued 1 mmas in wgmma group 0, thread 32 0")) << f;
  f = fault(Misuse::None, 64);
  EXPECT_TRUE(contains(f, "all 128 threads of an aligned warpgroup")) << f;
  f = fault(Misuse::None, 160);
  EXPECT_TRUE(contains(f, "all 128 threads of an aligned warpgroup")) << f;
  f = fault(Misuse::StaticShared);
  EXPECT_TRUE(contains(f, "not in the block's dynamic shared memory")) << f;
  f = fault(Misuse::BadRegs);
  EXPECT_TRUE(contains(f, "multiple of 8 in [24, 256]")) << f;
  // Two whole warpgroups are fine.
  const std::vector<float> two = run_misuse(Misuse::None, 256);
  EXPECT_EQ(two[200], 16.0f);
}

// Issues one m64n64k16 of the all-ones tiles the stage kernels below store at smem (A, no
// swizzle) and smem + 2048 (B) into d, zeroed first (the group is left open).
__device__ void issue_ones_mma(unsigned char* smem, float (&d)[32]) {
  for (float& v : d) v = 0.0f;
  sm90::wgmma_fence();
  const uint64_t da = sm90::make_smem_desc(smem, Swizzle::None, 1024, 128);
  const uint64_t db = sm90::make_smem_desc(smem + 2048, Swizzle::None, 1024, 128);
  sm90::wgmma_m64k16<64, __nv_bfloat16>(d, da, db, false);
}

// The stage release of warp-specialised kernels (CUTLASS's sm90 pipelines): warpgroup 0
// multiplies an all-ones tile, and once its group is done one thread arrives on `freed`, after
// which warpgroup 1 overwrites operand A (row 0, k 3: 1 -> 2) and arrives on `refilled`.
// Warps 1-3 of warpgroup 0 reach their own wait only after that, as a GPU allows: the
// group completed warpgroup-wide when thread 0's wait returned. With `early`, all of warpgroup
// 0 arrives right after the commit and waits for the overwrite before its wait_group: the
// operand changed under a running group, a fault.
__global__ void stage_release_kernel(bool early, float* out) {
  KILN_DYNAMIC_SHARED(unsigned char, smem);
  KILN_SHARED(sm90::Mbarrier, bars, [2]);
  sm90::Mbarrier& freed = bars[0];
  sm90::Mbarrier& refilled = bars[1];
  auto* s16 = reinterpret_cast<uint16_t*>(smem);
  const unsigned t = threadIdx.x;
  for (unsigned i = t; i < 4096; i += blockDim.x) s16[i] = 0x3f80;  // bf16 1.0: A, then B
  if (t == 0) {
    sm90::mbarrier_init(&freed, early ? 128 : 1);
    sm90::mbarrier_init(&refilled, 1);
    sm90::fence_mbarrier_init();
  }
  __syncthreads();
  if (t >= 128) {  // warpgroup 1: one thread refills the stage
    if (t == 128) {
      sm90::mbarrier_wait(&freed, 0);
      s16[3] = 0x4000;  // A (0, 3) = 2 (the core-matrix layout: row 0's k 0-7 come first)
      sm90::mbarrier_arrive(&refilled);
    }
    return;
  }
  float d[32];
  issue_ones_mma(smem, d);
  sm90::wgmma_commit_group();
  if (early) {
    sm90::mbarrier_arrive(&freed);
    sm90::mbarrier_wait(&refilled, 0);
  } else if (t >= 32) {
    sm90::mbarrier_wait(&refilled, 0);
  }
  sm90::wgmma_wait_group<0>();
  if (!early && t == 0) sm90::mbarrier_arrive(&freed);
  for (int i = 0; i < 32; ++i) out[t * 32 + i] = d[i];
}

TEST(SimWgmma, OneThreadsWaitCompletesTheGroupForItsWarpgroup) {
  DeviceBuffer<float> out(std::vector<float>(128 * 32, -1.0f));
  launch(stage_release_kernel, LaunchConfig{1, 256, 8192, nullptr}, false, out.get());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << kiln::sim::fault_message();
  const std::vector<float> got = out.to_host();
  // 16 products of 1 * 1 everywhere: the group read A before the overwrite (row 0 would be 17).
  for (int t = 0; t < 128; ++t)
    for (int i = 0; i < 32; ++i)
      ASSERT_EQ(got[t * 32 + i], 16.0f) << "thread " << t << " d[" << i << "]";
}

__global__ void plain_kernel(float* out) { out[threadIdx.x] = 1.0f; }

// The per-block state resets between blocks whatever ran in between: the exits of a kernel
// without wgmma do not count as early exits in the next wgmma kernel (whose warp 0 waits while
// warps 1-3 have yet to commit).
TEST(SimWgmma, ExitsOfAKernelWithoutWgmmaDoNotLeakIntoTheNext) {
  DeviceBuffer<float> out(std::vector<float>(128 * 32, -1.0f));
  for (int run = 0; run < 2; ++run) {
    launch(stage_release_kernel, LaunchConfig{1, 256, 8192, nullptr}, false, out.get());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << kiln::sim::fault_message();
    launch(plain_kernel, LaunchConfig{1, 256, 0, nullptr}, out.get());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << kiln::sim::fault_message();
  }
}

TEST(SimWgmma, AnOperandOverwrittenBeforeTheWarpgroupsFirstWaitFaults) {
  const std::string f = fault_of([] {
    DeviceBuffer<float> out(128 * 32);
    launch(stage_release_kernel, LaunchConfig{1, 256, 8192, nullptr}, true, out.get());
    (void)cudaDeviceSynchronize();
  });
  EXPECT_TRUE(contains(f, "written before wgmma.wait_group") && contains(f, "operand A") &&
              contains(f, "element (0, 3)"))
      << f;
}

// Warps 1-3 never commit the group warp 0 waits for (they wait on a barrier nobody arrives on).
__global__ void uncommitted_kernel(float* out) {
  KILN_DYNAMIC_SHARED(unsigned char, smem);
  KILN_SHARED(sm90::Mbarrier, never, [1]);
  auto* s16 = reinterpret_cast<uint16_t*>(smem);
  const unsigned t = threadIdx.x;
  for (unsigned i = t; i < 4096; i += blockDim.x) s16[i] = 0x3f80;
  if (t == 0) {
    sm90::mbarrier_init(never, 1);
    sm90::fence_mbarrier_init();
  }
  __syncthreads();
  float d[32];
  issue_ones_mma(smem, d);
  if (t >= 32) sm90::mbarrier_wait(never, 0);
  sm90::wgmma_commit_group();
  sm90::wgmma_wait_group<0>();
  out[t] = d[0];
}

TEST(SimWgmma, AWaitNeedsEveryThreadOfTheWarpgroupToCommit) {
  std::string f = fault_of([] {
    DeviceBuffer<float> out(128);
    launch(uncommitted_kernel, LaunchConfig{1, 128, 8192, nullptr}, out.get());
    (void)cudaDeviceSynchronize();
  });
  EXPECT_TRUE(contains(f, "deadlock") && contains(f, "wgmma group 0 of warpgroup 0") &&
              contains(f, "32 of its 128 threads have committed it, not thread 32"))
      << f;
  // Warp 3 returned before its wgmma calls: warps 0-2 wait for a group it never commits.
  f = fault_of([] {
    DeviceBuffer<float> out(512);
    launch(misuse_kernel, LaunchConfig{1, 128, 8192, nullptr}, Misuse::EarlyExit, out.get());
    (void)cudaDeviceSynchronize();
  });
  EXPECT_TRUE(contains(f, "thread 96 exited without committing")) << f;
}

// A warp-specialised block of three warpgroups (384 threads: 168 registers each to start):
// warpgroup `producer` lowers its count to P, the other two raise theirs to C.
template <int P, int C>
__global__ void registers_kernel(int producer, int* out) {
  if (static_cast<int>(threadIdx.x / 128) == producer) {
    sm90::setmaxnreg_dec<P>();
  } else {
    sm90::setmaxnreg_inc<C>();
  }
  out[threadIdx.x] = 1;
}

template <int P, int C>
void launch_registers(int producer, DeviceBuffer<int>& out) {
  launch(registers_kernel<P, C>, LaunchConfig{1, 384, 0, nullptr}, producer, out.get());
}

TEST(SimWgmma, SetmaxnregMovesRegistersFromTheProducerToTheConsumers) {
  // 128 * (24 + 240 + 240) and 128 * (40 + 232 + 232) fit the block's 65536. With the producer
  // last, the consumers' .inc waits for its .dec.
  for (int producer : {0, 2}) {
    DeviceBuffer<int> out(std::vector<int>(384, 0)), out2(std::vector<int>(384, 0));
    launch_registers<24, 240>(producer, out);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << kiln::sim::fault_message();
    launch_registers<40, 232>(producer, out2);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << kiln::sim::fault_message();
    EXPECT_EQ(out.to_host(), std::vector<int>(384, 1));
    EXPECT_EQ(out2.to_host(), std::vector<int>(384, 1));
  }
}

TEST(SimWgmma, SetmaxnregRulesAreFaults) {
  const auto fault = [](auto launch_it) {
    return fault_of([&] {
      DeviceBuffer<int> out(384);
      launch_it(out);
      (void)cudaDeviceSynchronize();
    });
  };
  // .dec above the current 168, .inc below it.
  std::string f = fault([](DeviceBuffer<int>& out) { launch_registers<176, 240>(0, out); });
  EXPECT_TRUE(contains(f, "setmaxnreg_dec") && contains(f, "to 176") && contains(f, "holds 168"))
      << f;
  f = fault([](DeviceBuffer<int>& out) { launch_registers<24, 160>(0, out); });
  EXPECT_TRUE(contains(f, "setmaxnreg_inc") && contains(f, "to 160") && contains(f, "holds 168"))
      << f;
  // 128 * (24 + 256 + 256) = 68608 > 65536: the second .inc waits forever.
  f = fault([](DeviceBuffer<int>& out) { launch_registers<24, 256>(0, out); });
  EXPECT_TRUE(contains(f, "deadlock") && contains(f, "setmaxnreg.inc") &&
              contains(f, "from 168 to 256"))
      << f;
}

}  // namespace
