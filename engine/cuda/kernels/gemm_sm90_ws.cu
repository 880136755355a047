// gemm_sm90_ws.cu: steps 6 and 7 of the GPU GEMM, for Hopper (compute capability 9.0) only.
// Step 5 (gemm_sm90.cu) is read first: the TMA, the mbarriers, wgmma, the 128-byte swizzle and
// the slice of 64 k are the same here. Same contract: C (M,N) f32 = A B^T from K-major A (M,K)
// and B (N,K), bf16 or f16, any M, N, K (the host, gemm_sm90.cu, brings other layouts to this
// one). Tested against a double-precision product (tests/cuda/gemm_sm90_test.cpp), timed by
// apps/gemm_bench, explained in docs/cuda.md.
//
// Step 6, warp specialisation (gemm_ws_kernel<E, false>).
//   What limits step 5. One warpgroup does everything in turn: it waits for a slice, issues
//   its products, waits for the previous products, meets at a __syncthreads, and only then
//   does thread 0 issue the next copies. The copies and the products overlap only as far as
//   the ring lets them, and every stall of one warp stalls all four. And its tile is 128 x 128
//   because one warpgroup cannot hold more accumulators (a 128 x 256 tile is 256 f32 per
//   thread, over the 255 registers a thread may have).
//   The fix: give each job its own warps, and let them meet only at barriers in shared memory.
//   A block has three warpgroups (384 threads):
//   - the producer (warpgroup 0): one of its threads walks the K slices issuing TMA copies
//     into the ring; it waits for nothing but a free stage;
//   - two consumers (warpgroups 1 and 2): each computes 64 rows of a 128 x 256 tile with one
//     m64n256k16 wgmma per 16 k (128 f32 accumulators per thread); they wait for nothing but
//     a full stage.
//   Two barriers per stage carry the hand-offs. full[st], as in step 5: the producer's
//   arrive_expect_tx and the copies' bytes complete it, the consumers wait on it. empty[st]:
//   each consumer warpgroup arrives once (one thread, after its wgmma_wait_group: a wgmma
//   group's completion is the whole warpgroup's) when it no longer reads the stage; the
//   producer waits on it before refilling the stage. No __syncthreads after the start.
//   Phases. Producer and consumers walk the same sequence of slices, counted by `it` across
//   all the block's tiles: slice `it` goes to stage it % kStages, whose use number is
//   u = it / kStages. The consumers wait for full's phase u (parity u % 2); the producer, for
//   u >= 1, waits for empty's phase u - 1 (both consumers released the stage's previous use).
//   Registers. A kernel of 384 threads gets at most 65536 / 384 = 170, rounded down to 168,
//   registers per thread, and 168 cannot hold a consumer's 128 accumulators plus its
//   addresses. setmaxnreg moves them (PTX ISA, "setmaxnreg"): the producer gives its
//   warpgroup's back down to 40, the consumers take theirs up to 232; 128 x (40 + 232 + 232)
//   = 64512 of the SM's 65536 (the split of CUTLASS's sm90 warp-specialised kernels).
//   The arithmetic per stage (A's box 128 x 64, B's box 256 x 64):
//     bytes loaded   (128 + 256) x 64 x 2 B          = 48 KiB
//     FLOPs          2 x 128 x 256 x 64              = 4.2 MFLOP
//     intensity      4.2 MFLOP / 48 KiB              = 85 FLOP per byte (step 5: 64)
//   so 7.5 TFLOP/s per SM (an H100 SXM's 989 bf16 TFLOP/s over 132 SMs) needs 88 GB/s of
//   loads per SM instead of 117. Four stages are 192 KiB of the 227 KiB a block may have.
//   Consumers release one slice late. After issuing slice s's products, a consumer calls
//   wgmma_wait_group<1>: slice s-1's group is done, so it releases s-1's stage and keeps s's
//   products running while it waits for slice s+1 (waiting with <0> would leave the tensor
//   cores idle between slices). At a tile's end it waits with <0> and releases the last stage.
//   What limits it next: each block does one tile, then the SM waits for the block to end
//   (the consumers' epilogue, storing 128 x 256 floats, runs while no copy is in flight) and
//   for the next block to start (barrier set-up, the prologue's first copies).
//
// Step 7, persistent tiles (gemm_ws_kernel<E, true>).
//   The grid is one block per SM (or `blocks`), and each block loops over the tiles
//   blockIdx.x, blockIdx.x + gridDim.x, ... The ring and its barriers live on across tiles
//   (`it` keeps counting), so while the consumers store one tile the producer already loads
//   the next tile's slices into the stages they have released: the epilogue and the start-up
//   are hidden. The launch and barrier set-up are paid once per SM rather than once per tile.
//   Tile order for L2. At any moment the blocks work on about gridDim.x consecutive tiles (a
//   "wave"), whose operands should stay in the 50 MB L2. In row-major order a wave of 132 tiles
//   of 128 x 256 at N = 8192 is 4 tile rows x 32 tile columns: it reads 4 x 128 rows of A but
//   all 8192 rows of B. Grouping tile rows in bands of kGroupRows = 16 (walking down a band's
//   16 rows before moving right, the "grouped ordering" of Triton's matrix multiplication
//   tutorial, https://triton-lang.org/main/getting-started/tutorials/03-matrix-multiplication.html)
//   makes the wave 16 x 8: 2048 rows of A and 2112 of B, under half the bytes. 16 minimises
//   G x 128 + (132 / G) x 256, the rows of A plus B a wave of 132 tiles touches.
//   What could come next, left out here: thread-block clusters with TMA multicast (two SMs
//   share one copy of the operand they have in common; the worklog below measures a few
//   percent), an epilogue through shared memory and TMA stores, and a tile scheduler that
//   balances the last wave. pranjalssh, "Outperforming cuBLAS on H100: a Worklog"
//   (https://cudaforfun.substack.com/p/outperforming-cublas-on-h100-a-worklog) measures each
//   of these steps on an H100; CUTLASS's sm90 "warpspecialized persistent" kernels
//   (https://github.com/NVIDIA/cutlass) are the production form.
#include "engine/cuda/runtime.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "engine/cuda/context.h"
#include "engine/cuda/kernels/common.h"
#include "engine/cuda/kernels/gemm_sm90_common.h"
#include "engine/cuda/launch.h"
#include "engine/cuda/sm90/mbarrier.h"
#include "engine/cuda/sm90/swizzle.h"
#include "engine/cuda/sm90/tma.h"
#include "engine/cuda/sm90/wgmma.h"
#include "engine/error.h"

namespace kiln::cuda::sm90_gemm {

namespace {

constexpr int kBM = 128;        // block tile: rows of C, 64 per consumer warpgroup
constexpr int kBN = 256;        // block tile: columns of C (the N of each wgmma)
constexpr int kStages = 4;      // slices in the ring
constexpr int kThreads = 384;   // producer warpgroup + two consumer warpgroups
constexpr int kGroupRows = 16;  // step 7's band of tile rows (file comment, "Tile order")
constexpr int kProducerRegs = 40, kConsumerRegs = 232;
constexpr uint32_t kStageBytes = box_bytes(kBM) + box_bytes(kBN);  // 48 KiB
static_assert(box_bytes(kBM) % sm90::swizzle_atom_bytes(kSwizzle) == 0 &&
                  box_bytes(kBN) % sm90::swizzle_atom_bytes(kSwizzle) == 0,
              "every box starts on a swizzle atom");
static_assert(128 * (kProducerRegs + 2 * kConsumerRegs) <= 65536,
              "the three warpgroups' registers fit in the SM's 64K");

struct alignas(1024) Shared {
  uint16_t a[kStages][kBM * kBK];
  uint16_t b[kStages][kBN * kBK];
  sm90::Mbarrier full[kStages];   // the stage holds its slice (the producer's copies landed)
  sm90::Mbarrier empty[kStages];  // both consumers are done reading the stage
};
// With the slack atom_aligned needs.
constexpr size_t kSharedBytes = sizeof(Shared) + 1024;

// Tile `tile` of tiles_m x tiles_n as (tile row, tile column): row-major for step 6 (the order
// in which the hardware starts blocks); for step 7, down bands of kGroupRows tile rows.
__device__ __forceinline__ void tile_coords(int tile, int tiles_m, int tiles_n, bool grouped,
                                            int& tm, int& tn) {
  if (!grouped) {
    tm = tile / tiles_n, tn = tile % tiles_n;
    return;
  }
  const int band = tile / (kGroupRows * tiles_n);
  const int first = band * kGroupRows;
  const int rows = tiles_m - first < kGroupRows ? tiles_m - first : kGroupRows;
  const int in_band = tile % (kGroupRows * tiles_n);
  tm = first + in_band % rows, tn = in_band / rows;
}

template <typename E, bool Persistent>
__global__ void __launch_bounds__(kThreads, 1)
    gemm_ws_kernel(const __grid_constant__ CUtensorMap map_a,
                   const __grid_constant__ CUtensorMap map_b, float* __restrict__ c, int m, int n,
                   int k, bool vec_c, int tiles_m, int tiles_n) {
#if KILN_SM90_BODY
  KILN_DYNAMIC_SHARED(unsigned char, raw);
  auto& s = atom_aligned<Shared>(raw);
  const int slices = (k + kBK - 1) / kBK, tiles = tiles_m * tiles_n;
  const int warpgroup = threadIdx.x / 128, t = threadIdx.x % 128;
  // Step 6: this block's one tile. Step 7: every gridDim.x-th tile from blockIdx.x.
  const int first_tile = blockIdx.x, tile_stride = Persistent ? gridDim.x : tiles;

  if (threadIdx.x == 0) {
    for (int st = 0; st < kStages; ++st) {
      sm90::mbarrier_init(&s.full[st], 1);   // the producer's arrive_expect_tx (+ the bytes)
      sm90::mbarrier_init(&s.empty[st], 2);  // one arrival per consumer warpgroup
    }
    sm90::fence_mbarrier_init();
  }
  __syncthreads();  // sm90 ws init: the barriers exist before anyone waits on them

  if (warpgroup == 0) {
    // ---- Producer: one thread issues every copy; its warpgroup's registers go back.
    sm90::setmaxnreg_dec<kProducerRegs>();
    if (t != 0) return;
    int it = 0;
    for (int tile = first_tile; tile < tiles; tile += tile_stride) {
      int tm, tn;
      tile_coords(tile, tiles_m, tiles_n, Persistent, tm, tn);
      for (int slice = 0; slice < slices; ++slice, ++it) {
        const int st = it % kStages, use = it / kStages;
        // The stage's previous use must be released by both consumers.
        if (use > 0) sm90::mbarrier_wait(&s.empty[st], static_cast<uint32_t>((use - 1) % 2));
        sm90::mbarrier_arrive_expect_tx(&s.full[st], kStageBytes);
        sm90::tma_load_2d(s.a[st], &map_a, tm * kBM, slice * kBK, &s.full[st]);
        sm90::tma_load_2d(s.b[st], &map_b, tn * kBN, slice * kBK, &s.full[st]);
      }
    }
    return;
  }

  // ---- Consumers: warpgroup 1 computes rows 0-63 of each tile, warpgroup 2 rows 64-127.
  sm90::setmaxnreg_inc<kConsumerRegs>();
  const int half = warpgroup - 1;
  const bool releaser = t == 0;  // arrives on empty[] for its warpgroup
  int it = 0;
  for (int tile = first_tile; tile < tiles; tile += tile_stride) {
    int tm, tn;
    tile_coords(tile, tiles_m, tiles_n, Persistent, tm, tn);
    float d[kBN / 2];
    KILN_UNROLL
    for (int i = 0; i < kBN / 2; ++i) d[i] = 0.0f;
    for (int slice = 0; slice < slices; ++slice, ++it) {
      const int st = it % kStages;
      sm90::mbarrier_wait(&s.full[st], static_cast<uint32_t>((it / kStages) % 2));
      sm90::wgmma_fence_operand(d);
      sm90::wgmma_fence();
      KILN_UNROLL
      for (int kk = 0; kk < kBK; kk += kMmaK)
        sm90::wgmma_m64k16<kBN, E>(d, slice_desc(s.a[st] + half * kMmaM * kBK, kk),
                                   slice_desc(s.b[st], kk), true);
      sm90::wgmma_commit_group();
      sm90::wgmma_wait_group<1>();  // the previous slice's products are done
      sm90::wgmma_fence_operand(d);
      if (releaser && slice > 0) sm90::mbarrier_arrive(&s.empty[(it - 1) % kStages]);
    }
    sm90::wgmma_wait_group<0>();  // the tile's last products are done: d is final
    sm90::wgmma_fence_operand(d);
    if (releaser) sm90::mbarrier_arrive(&s.empty[(it - 1) % kStages]);
    store_rows<kBN>(d, c, m, n, tm * kBM + half * kMmaM, tn * kBN, vec_c, t);
  }
#else
  __trap();  // compiled without sm_90a's wgmma and TMA (the host refuses such devices first)
#endif
}

template <typename E, bool Persistent>
void launch_ws(int m, int n, int k, const KMajor& a, const KMajor& b, float* c, int blocks) {
  const int64_t tiles_m = blocks_for(m, kBM), tiles_n = blocks_for(n, kBN);  // m, n >= 1
  KILN_CHECK(tiles_m * tiles_n <= INT32_MAX, "gemm_sm90: ", m, " x ", n,
             " has more than 2^31 - 1 tiles of 128 x 256");
  const int tiles = static_cast<int>(tiles_m * tiles_n);
  int grid = tiles;
  if (Persistent) {
    int sms = blocks;
    if (sms == 0)
      KILN_CUDA_CHECK(
          cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, current_device()));
    grid = std::min(tiles, sms);
  }
  CUtensorMap map_a, map_b;
  sm90::encode_tma_2d(&map_a, a.data, m, k, a.ld * 2, kBM, kBK, kSwizzle);
  sm90::encode_tma_2d(&map_b, b.data, n, k, b.ld * 2, kBN, kBK, kSwizzle);
  KILN_CUDA_CHECK(cudaFuncSetAttribute(gemm_ws_kernel<E, Persistent>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(kSharedBytes)));
  const bool vec_c = reinterpret_cast<uintptr_t>(c) % 8 == 0 && n % 2 == 0;
  launch(gemm_ws_kernel<E, Persistent>,
         LaunchConfig{dim3(grid), dim3(kThreads), kSharedBytes, current_stream()}, map_a, map_b,
         c, m, n, k, vec_c, static_cast<int>(tiles_m), static_cast<int>(tiles_n));
}

}  // namespace

void launch_warp_specialized(DType in, int m, int n, int k, const KMajor& a, const KMajor& b,
                             float* c, bool persistent, int blocks) {
  if (in == DType::BF16) {
    if (persistent) launch_ws<__nv_bfloat16, true>(m, n, k, a, b, c, blocks);
    else launch_ws<__nv_bfloat16, false>(m, n, k, a, b, c, blocks);
  } else {
    if (persistent) launch_ws<__half, true>(m, n, k, a, b, c, blocks);
    else launch_ws<__half, false>(m, n, k, a, b, c, blocks);
  }
}

}  // namespace kiln::cuda::sm90_gemm
