// sim_tma_test.cpp: the simulator's Hopper mbarriers and TMA (engine/cuda/sm90/mbarrier.h,
// tma.h; the model: engine/cuda/sim/sm90_mbarrier.h, sm90_tma.h): a box lands where
// swizzle_address says for every swizzle mode, out-of-bounds elements are zero, the box reads
// NaN until the phase completes, a phase with two loads completes only after both, a ring of
// stages alternates its parities, and misuse (an uninitialised barrier, a deadlock, count
// underflow and overflow, a misaligned destination, the encoder's rules) fails naming the rule.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/cuda/launch.h"
#include "engine/cuda/runtime.h"
#include "engine/cuda/sm90/mbarrier.h"
#include "engine/cuda/sm90/swizzle.h"
#include "engine/cuda/sm90/tma.h"
#include "engine/error.h"
#include "sim_test_kernels.h"

namespace {

using kiln::cuda::launch;
using kiln::cuda::LaunchConfig;
using kiln::sim_test::DeviceBuffer;
namespace sm90 = kiln::cuda::sm90;
using sm90::Mbarrier;
using sm90::Swizzle;

constexpr uint16_t kNaN = 0xFFFF;  // what shared memory holds before a copy lands

// The dynamic shared memory rounded up to 1024 bytes (the B128 swizzle atom); launches ask for
// 1024 bytes of slack.
__device__ unsigned char* aligned_shared(unsigned char* smem) {
  return reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem) + 1023) &
                                          ~uintptr_t{1023});
}

// A rows x cols tensor (row stride `stride` elements) whose element (r, c) is value(r, c).
uint16_t value(int r, int c) { return static_cast<uint16_t>(1 + r * 1000 + c); }
std::vector<uint16_t> make_tensor(int rows, int cols, int stride) {
  std::vector<uint16_t> t(static_cast<size_t>(rows) * stride, 0);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) t[static_cast<size_t>(r) * stride + c] = value(r, c);
  return t;
}

// Loads one box at (row, col) and copies the shared-memory bytes as they lie (swizzled) to
// `out`; with read_early, also what the box held between issuing the copy and the wait.
__global__ void load_box_kernel(const __grid_constant__ CUtensorMap map, int row, int col,
                                int box_elems, uint16_t* out, uint16_t* early) {
  KILN_DYNAMIC_SHARED(unsigned char, smem);
  KILN_SHARED(Mbarrier, bar, [1]);
  auto* tile = reinterpret_cast<uint16_t*>(aligned_shared(smem));
  if (threadIdx.x == 0) {
    sm90::mbarrier_init(&bar[0], 1);
    sm90::fence_mbarrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    sm90::mbarrier_arrive_expect_tx(&bar[0], static_cast<uint32_t>(box_elems * 2));
    sm90::tma_load_2d(tile, &map, row, col, &bar[0]);
  }
  __syncthreads();
  if (early != nullptr)
    for (int i = threadIdx.x; i < box_elems; i += blockDim.x) early[i] = tile[i];
  __syncthreads();
  sm90::mbarrier_wait(&bar[0], 0);
  for (int i = threadIdx.x; i < box_elems; i += blockDim.x) out[i] = tile[i];
}

struct BoxCase {
  Swizzle swizzle;
  int box_cols;  // the swizzle row: 16 bytes for None is the minimum, here 64 bytes
};

class SimTmaSwizzle : public ::testing::TestWithParam<BoxCase> {};

// Every element of the box is where swizzle_address puts it; those outside the tensor are 0.
TEST_P(SimTmaSwizzle, EveryElementLandsAtItsSwizzledAddressAndOutOfBoundsIsZero) {
  const BoxCase p = GetParam();
  constexpr int kRows = 40, kCols = 100, kStride = 112, kBoxRows = 16;
  DeviceBuffer<uint16_t> tensor(make_tensor(kRows, kCols, kStride));
  CUtensorMap map;
  sm90::encode_tma_2d(&map, tensor.get(), kRows, kCols, kStride * 2, kBoxRows, p.box_cols,
                      p.swizzle);
  const int box_elems = kBoxRows * p.box_cols;
  // Inside; over the bottom-right edge; over the top-left edge (negative coordinates).
  const int corners[3][2] = {{8, 16}, {kRows - 6, kCols - p.box_cols / 2}, {-4, -8}};
  for (const auto& corner : corners) {
    DeviceBuffer<uint16_t> out(box_elems);
    launch(load_box_kernel, LaunchConfig{1, 64, static_cast<size_t>(box_elems * 2 + 1024), nullptr},
           map, corner[0], corner[1], box_elems, out.get(), static_cast<uint16_t*>(nullptr));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<uint16_t> got = out.to_host();
    int outside = 0;
    for (int r = 0; r < kBoxRows; ++r)
      for (int c = 0; c < p.box_cols; ++c) {
        const int gr = corner[0] + r, gc = corner[1] + c;
        const bool in = gr >= 0 && gr < kRows && gc >= 0 && gc < kCols;
        outside += !in;
        const uint32_t at = sm90::swizzle_address(p.swizzle, static_cast<uint32_t>((r * p.box_cols + c) * 2)) / 2;
        ASSERT_EQ(got[at], in ? value(gr, gc) : 0)
            << "box element (" << r << ", " << c << ") at (" << corner[0] << ", " << corner[1] << ")";
      }
    if (corner[0] != 8) {
      EXPECT_GT(outside, 0);  // the edge cases do cross the edge
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, SimTmaSwizzle,
                         ::testing::Values(BoxCase{Swizzle::None, 32}, BoxCase{Swizzle::B32, 16},
                                           BoxCase{Swizzle::B64, 32}, BoxCase{Swizzle::B128, 64}),
                         [](const auto& info) {
                           const Swizzle s = info.param.swizzle;
                           return std::string(s == Swizzle::None  ? "None"
                                              : s == Swizzle::B32 ? "B32"
                                              : s == Swizzle::B64 ? "B64"
                                                                  : "B128");
                         });

// The race a GPU punishes: reading the box between issuing the copy and the wait reads NaN here.
TEST(SimTma, TheBoxReadsNaNUntilThePhaseCompletes) {
  constexpr int kRows = 16, kCols = 64;
  DeviceBuffer<uint16_t> tensor(make_tensor(kRows, kCols, kCols));
  CUtensorMap map;
  sm90::encode_tma_2d(&map, tensor.get(), kRows, kCols, kCols * 2, kRows, kCols, Swizzle::B128);
  DeviceBuffer<uint16_t> out(kRows * kCols), early(kRows * kCols);
  launch(load_box_kernel, LaunchConfig{1, 64, kRows * kCols * 2 + 1024, nullptr}, map, 0, 0,
         kRows * kCols, out.get(), early.get());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (uint16_t v : early.to_host()) ASSERT_EQ(v, kNaN);
  for (uint16_t v : out.to_host()) ASSERT_NE(v, kNaN);
}

// One phase, two loads, expect_tx of their sum: after the first has landed the phase is still
// open (flags[0]); after the second it completes (flags[1]) and both boxes are there.
__global__ void two_loads_kernel(const __grid_constant__ CUtensorMap map, int box_elems,
                                 uint16_t* out, int* flags) {
  KILN_DYNAMIC_SHARED(unsigned char, smem);
  KILN_SHARED(Mbarrier, bar, [1]);
  auto* tiles = reinterpret_cast<uint16_t*>(aligned_shared(smem));
  if (threadIdx.x == 0) {
    sm90::mbarrier_init(&bar[0], 1);
    sm90::fence_mbarrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    sm90::mbarrier_arrive_expect_tx(&bar[0], static_cast<uint32_t>(2 * box_elems * 2));
    sm90::tma_load_2d(tiles, &map, 0, 0, &bar[0]);
  }
  __syncthreads();
  const bool after_one = sm90::mbarrier_try_wait(&bar[0], 0);  // lands the first load
  if (threadIdx.x == 0) flags[0] = after_one;
  __syncthreads();
  if (threadIdx.x == 0) sm90::tma_load_2d(tiles + box_elems, &map, 16, 0, &bar[0]);
  __syncthreads();
  sm90::mbarrier_wait(&bar[0], 0);
  if (threadIdx.x == 0) flags[1] = sm90::mbarrier_try_wait(&bar[0], 0);
  for (int i = threadIdx.x; i < 2 * box_elems; i += blockDim.x) out[i] = tiles[i];
}

TEST(SimTma, APhaseWithTwoLoadsCompletesOnlyAfterBoth) {
  constexpr int kRows = 32, kCols = 64, kBoxRows = 16;
  DeviceBuffer<uint16_t> tensor(make_tensor(kRows, kCols, kCols));
  CUtensorMap map;
  sm90::encode_tma_2d(&map, tensor.get(), kRows, kCols, kCols * 2, kBoxRows, kCols, Swizzle::None);
  DeviceBuffer<uint16_t> out(kRows * kCols);
  DeviceBuffer<int> flags(std::vector<int>{-1, -1});
  launch(two_loads_kernel, LaunchConfig{1, 64, kRows * kCols * 2 + 1024, nullptr}, map,
         kBoxRows * kCols, out.get(), flags.get());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<int> f = flags.to_host();
  EXPECT_EQ(f[0], 0) << "the phase completed with half its transaction bytes";
  EXPECT_EQ(f[1], 1);
  const std::vector<uint16_t> got = out.to_host();
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < kCols; ++c) ASSERT_EQ(got[r * kCols + c], value(r, c)) << r << ", " << c;
}

// A two-stage ring over six tiles along the columns: thread 0 produces (waits for the stage to
// be empty, expect_tx, load), every thread consumes (waits for the stage to be full, sums its
// column of the tile, arrives on empty). Each stage goes through three phases, parities 0, 1, 0.
constexpr int kStages = 2, kTiles = 6, kTileRows = 16, kTileCols = 64;
__global__ void ring_kernel(const __grid_constant__ CUtensorMap map, uint32_t* sums) {
  KILN_DYNAMIC_SHARED(unsigned char, smem);
  KILN_SHARED(Mbarrier, full, [kStages]);
  KILN_SHARED(Mbarrier, empty, [kStages]);
  auto* stages = reinterpret_cast<uint16_t*>(aligned_shared(smem));
  constexpr int kTileElems = kTileRows * kTileCols;
  constexpr uint32_t kTileBytes = kTileElems * 2;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      sm90::mbarrier_init(&full[s], 1);
      sm90::mbarrier_init(&empty[s], blockDim.x);
    }
    sm90::fence_mbarrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0)
    for (int k = 0; k < kStages; ++k) {
      sm90::mbarrier_arrive_expect_tx(&full[k], kTileBytes);
      sm90::tma_load_2d(stages + k * kTileElems, &map, 0, k * kTileCols, &full[k]);
    }
  for (int k = 0; k < kTiles; ++k) {
    const int s = k % kStages;
    const uint32_t parity = (k / kStages) & 1;
    sm90::mbarrier_wait(&full[s], parity);
    uint32_t sum = 0;
    for (int r = 0; r < kTileRows; ++r) sum += stages[s * kTileElems + r * kTileCols + threadIdx.x];
    sums[k * kTileCols + threadIdx.x] = sum;
    sm90::mbarrier_arrive(&empty[s]);
    if (threadIdx.x == 0 && k + kStages < kTiles) {
      sm90::mbarrier_wait(&empty[s], parity);
      sm90::mbarrier_arrive_expect_tx(&full[s], kTileBytes);
      sm90::tma_load_2d(stages + s * kTileElems, &map, 0, (k + kStages) * kTileCols, &full[s]);
    }
  }
}

TEST(SimTma, ARingOfStagesAlternatesItsPhaseParities) {
  constexpr int kCols = kTiles * kTileCols;
  DeviceBuffer<uint16_t> tensor(make_tensor(kTileRows, kCols, kCols));
  CUtensorMap map;
  sm90::encode_tma_2d(&map, tensor.get(), kTileRows, kCols, kCols * 2, kTileRows, kTileCols,
                      Swizzle::None);
  DeviceBuffer<uint32_t> sums(kTiles * kTileCols);
  launch(ring_kernel, LaunchConfig{1, kTileCols, kStages * kTileRows * kTileCols * 2 + 1024, nullptr},
         map, sums.get());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<uint32_t> got = sums.to_host();
  for (int k = 0; k < kTiles; ++k)
    for (int c = 0; c < kTileCols; ++c) {
      uint32_t want = 0;
      for (int r = 0; r < kTileRows; ++r) want += value(r, k * kTileCols + c);
      ASSERT_EQ(got[k * kTileCols + c], want) << "tile " << k << " column " << c;
    }
}

// A warp operation waits for a lane that polls an mbarrier: lane 0 of warp 0 waits for warp 1's
// arrival, then writes `flag`; its warp's other lanes meet it at __syncwarp and read the flag.
__global__ void warp_waits_for_poller_kernel(int* out) {
  KILN_SHARED(Mbarrier, bar, [1]);
  KILN_SHARED(int, flag, [1]);
  if (threadIdx.x == 0) sm90::mbarrier_init(&bar[0], 1);
  __syncthreads();
  if (threadIdx.x == 32) {
    sm90::mbarrier_arrive(&bar[0]);
  } else if (threadIdx.x == 0) {
    sm90::mbarrier_wait(&bar[0], 0);
    flag[0] = 7;
  }
  if (threadIdx.x < 32) {
    __syncwarp();
    out[threadIdx.x] = flag[0];
  }
}

TEST(SimTma, AWarpOperationWaitsForALanePollingAnMbarrier) {
  DeviceBuffer<int> out(32);
  launch(warp_waits_for_poller_kernel, LaunchConfig{1, 64, 0, nullptr}, out.get());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (int v : out.to_host()) ASSERT_EQ(v, 7);
}

// ---- Misuse ---------------------------------------------------------------------------------

// A kernel fault's text (the device's sticky error), then a reset for the next case.
template <typename F>
std::string fault_of(F launch_it) {
  launch_it();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
  const std::string text = kiln::sim::fault_message();
  EXPECT_EQ(cudaDeviceReset(), cudaSuccess);
  return text;
}

bool contains(const std::string& text, const char* what) {
  return text.find(what) != std::string::npos;
}

enum class Misuse { WaitUninitialised, WaitForever, WaitWhileOthersSync, ArriveUnderflow, TxOverflow, BadParity };

__global__ void misuse_kernel(Misuse m) {
  KILN_SHARED(Mbarrier, bar, [1]);
  if (m == Misuse::WaitUninitialised) {
    sm90::mbarrier_wait(&bar[0], 0);
    return;
  }
  if (threadIdx.x == 0) sm90::mbarrier_init(&bar[0], 1);
  __syncthreads();
  switch (m) {
    case Misuse::WaitForever: sm90::mbarrier_wait(&bar[0], 0); break;  // nobody arrives
    case Misuse::WaitWhileOthersSync:  // thread 0 waits for arrivals the others never make
      if (threadIdx.x == 0) sm90::mbarrier_wait(&bar[0], 0);
      __syncthreads();
      break;
    case Misuse::ArriveUnderflow:
      if (threadIdx.x == 0) {
        sm90::mbarrier_arrive_expect_tx(&bar[0], 256);  // bytes no copy will complete
        sm90::mbarrier_arrive(&bar[0]);
      }
      break;
    case Misuse::TxOverflow:
      if (threadIdx.x == 0) sm90::mbarrier_arrive_expect_tx(&bar[0], 1u << 20);
      break;
    case Misuse::BadParity: (void)sm90::mbarrier_try_wait(&bar[0], 2); break;
    case Misuse::WaitUninitialised: break;
  }
}

TEST(SimTmaMisuse, MbarrierRulesAreFaultsNamingTheRule) {
  auto run = [](Misuse m) {
    return fault_of([&] { launch(misuse_kernel, LaunchConfig{1, 32, 0, nullptr}, m); });
  };
  std::string f = run(Misuse::WaitUninitialised);
  EXPECT_TRUE(contains(f, "mbarrier_wait") && contains(f, "not initialised")) << f;
  f = run(Misuse::WaitForever);
  EXPECT_TRUE(contains(f, "deadlock") && contains(f, "mbarrier") && contains(f, "1 of 1 arrivals missing"))
      << f;
  f = run(Misuse::WaitWhileOthersSync);
  EXPECT_TRUE(contains(f, "deadlock") && contains(f, "thread (0,0,0)") &&
              contains(f, "31 at __syncthreads()"))
      << f;
  f = run(Misuse::ArriveUnderflow);
  EXPECT_TRUE(contains(f, "mbarrier_arrive") && contains(f, "underflow")) << f;
  f = run(Misuse::TxOverflow);
  EXPECT_TRUE(contains(f, "transaction count")) << f;
  f = run(Misuse::BadParity);
  EXPECT_TRUE(contains(f, "not 0 or 1")) << f;
}

// A destination off the swizzle atom: B128 needs 1024-byte alignment, 128 bytes are not enough.
__global__ void misaligned_load_kernel(const __grid_constant__ CUtensorMap map) {
  KILN_DYNAMIC_SHARED(unsigned char, smem);
  KILN_SHARED(Mbarrier, bar, [1]);
  if (threadIdx.x == 0) {
    sm90::mbarrier_init(&bar[0], 1);
    sm90::mbarrier_arrive_expect_tx(&bar[0], 16 * 128);
    sm90::tma_load_2d(aligned_shared(smem) + 128, &map, 0, 0, &bar[0]);
  }
}

TEST(SimTmaMisuse, AMisalignedDestinationIsAFault) {
  DeviceBuffer<uint16_t> tensor(make_tensor(16, 64, 64));
  CUtensorMap map;
  sm90::encode_tma_2d(&map, tensor.get(), 16, 64, 128, 16, 64, Swizzle::B128);
  const std::string f = fault_of(
      [&] { launch(misaligned_load_kernel, LaunchConfig{1, 32, 4096, nullptr}, map); });
  EXPECT_TRUE(contains(f, "tma_load_2d") && contains(f, "1024-byte aligned")) << f;
}

TEST(SimTmaMisuse, TheEncoderRefusesWhatCuTensorMapEncodeTiledRefuses) {
  DeviceBuffer<uint16_t> tensor(64 * 64 + 16);
  CUtensorMap map;
  auto usage_error = [&](const void* base, uint64_t stride, uint32_t box_rows, uint32_t box_cols,
                         Swizzle s) -> std::string {
    try {
      sm90::encode_tma_2d(&map, base, 64, 64, stride, box_rows, box_cols, s);
    } catch (const kiln::Error& e) {
      EXPECT_EQ(e.kind(), kiln::ErrorKind::Usage);
      return e.what();
    }
    return "no error";
  };
  EXPECT_TRUE(contains(usage_error(tensor.get() + 1, 128, 16, 64, Swizzle::None), "16-byte aligned"));
  EXPECT_TRUE(contains(usage_error(tensor.get(), 136, 16, 64, Swizzle::None), "multiple of 16"));
  EXPECT_TRUE(contains(usage_error(tensor.get(), 112, 16, 56, Swizzle::None), "shorter than a row"));
  EXPECT_TRUE(contains(usage_error(tensor.get(), 128, 300, 64, Swizzle::None), "[1, 256]"));
  EXPECT_TRUE(contains(usage_error(tensor.get(), 128, 16, 4, Swizzle::None), "multiple of 16 bytes"));
  EXPECT_TRUE(contains(usage_error(tensor.get(), 128, 16, 64, Swizzle::B64), "swizzle span"));
  EXPECT_EQ(usage_error(tensor.get(), 128, 16, 64, Swizzle::B128), "no error");
}

}  // namespace
