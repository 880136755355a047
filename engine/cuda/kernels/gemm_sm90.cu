// gemm_sm90.cu: step 5 of the GPU GEMM, for Hopper (compute capability 9.0) only. Steps 1-3 are
// in gemm.cu and step 4 in gemm_tensor_core.cu, whose conventions it shares: row-major, op(A)
// (M,K), op(B) (K,N), C (M,N) f32, 16-bit inputs passed as their bit patterns. Tested against a
// double-precision product (tests/cuda/gemm_sm90_test.cpp), timed by apps/gemm_bench, explained
// in docs/cuda.md.
//
// Step 5, gemm_sm90_kernel (bf16 or f16 in, f32 out): the Tensor Memory Accelerator, mbarriers
// and warpgroup MMA.
//   What it fixes over step 4. WMMA compiles to mma.sync: every warp loads its fragments from
//   shared memory into registers (load_matrix_sync, i.e. ldmatrix) before each product, so the
//   tensor cores wait on shared-memory loads, register-file bandwidth and instruction issue,
//   and the loads of global memory into shared memory go through registers as well. On an H100
//   mma.sync reaches about 65% of the tensor cores' peak at best (Luo et al., "Benchmarking and
//   Dissecting the Nvidia Hopper GPU Architecture", https://arxiv.org/abs/2402.13499). Hopper
//   adds the instructions that feed them without registers:
//   - TMA (cp.async.bulk.tensor). One thread hands the copy engine a 2-D box (here 128 rows x
//     64 elements) of a matrix described once on the host by a tensor map (base, sizes, row
//     stride, box, swizzle: sm90/tma.h). The engine computes the addresses, writes the box into
//     shared memory already swizzled for the MMA, and writes zeros for the part of the box
//     outside the matrix: edge tiles need no bounds checks, and M, N, K need not be multiples
//     of the tile. It needs 16-byte aligned bases and row strides (see the host side).
//   - mbarrier. A barrier object in shared memory that counts arrivals *and* transaction bytes
//     (sm90/mbarrier.h). The thread that issues a stage's loads arrives once announcing the
//     bytes to expect (arrive_expect_tx); each TMA copy completes its bytes on the barrier; the
//     phase completes when both counts reach zero, and threads waiting on it wake. Each
//     completion flips the phase: a thread waits for a phase by its parity, 0, 1, 0, ... for a
//     barrier's 1st, 2nd, 3rd use, so stage st is waited on with parity (slice / kStages) % 2.
//   - wgmma (wgmma.mma_async). The four warps of a warpgroup (128 threads) issue together one
//     64 x N x 16 product whose A and B come straight from shared memory through descriptors
//     (address, strides, swizzle: sm90/wgmma.h); only the f32 accumulator lives in registers,
//     spread over the 128 threads. It is asynchronous: wgmma_commit_group closes a group of
//     issued products, wgmma_wait_group<N> waits until at most N groups are still running.
//     The pattern of the CUTLASS Hopper kernels (https://github.com/NVIDIA/cutlass),
//     ThunderKittens (https://github.com/HazyResearch/ThunderKittens) and of the kernels of
//     pranjalssh's "Outperforming cuBLAS on H100: a Worklog"
//     (https://cudaforfun.substack.com/p/outperforming-cublas-on-h100-a-worklog), which walks
//     from this step to cuBLAS's speed.
//   The kernel. One warpgroup per block computes a 128x128 tile of C as two m64n128k16 products
//   per 16 of k (rows 0-63 and 64-127 of the tile share B's 128x16 slice): 2 x 64 f32
//   accumulators per thread. K is walked in slices of 64 elements, 128 bytes of bf16 or f16:
//   exactly one row of the 128-byte swizzle, so each operand's slice is one TMA box of 128 x 64
//   (16 KiB) and wgmma reads it with the 128-byte swizzle and no bank conflicts. A ring of
//   kStages = 4 stages (each A's box and B's box, 32 KiB, aligned to the swizzle's 1024-byte
//   atom) holds slices s .. s+3: while the tensor cores work on slice s, the copies of the next
//   three are in flight. Per stage:
//     bytes loaded   (128 + 128) x 64 x 2 B          = 32 KiB
//     FLOPs          2 x 128 x 128 x 64              = 2.1 MFLOP (8 wgmma of 262144 FLOPs)
//     intensity      2.1 MFLOP / 32 KiB              = 64 FLOP per byte loaded
//   An H100 SXM's 989 dense bf16 TFLOP/s over 132 SMs is 7.5 TFLOP/s per SM, which at 64
//   FLOP/B needs 117 GB/s of loads per SM (about 64 bytes per clock): the reason for the
//   square tile (BM = 64, BN = 256 loads (64 + 256) x 64 x 2 B = 40 KiB per stage for the same
//   FLOPs: 51 FLOP/B) and the reason later steps grow it (128 x 256: 85 FLOP/B), which one
//   warpgroup cannot: 256 accumulators per thread exceed the 255 registers a thread may have.
//   Why a wait before a refill. The stage that slice s+3 goes to held slice s-1. Its loads may
//   only be issued once no wgmma still reads it: after issuing slice s's products each thread
//   calls wgmma_wait_group<1>, which returns when at most one group (slice s's) is running, so
//   the group of slice s-1 has finished reading shared memory. A group is one operation of the
//   whole warpgroup (each of its products waits for all four warps to issue it), so once thread
//   0's own wait returns, no warp reads the stage any more and thread 0 may issue the copies:
//   no __syncthreads is needed (CUTLASS's pipelines, too, release a stage from one thread per
//   warpgroup). Waiting with <0> would be correct too, but would leave the tensor cores idle
//   while the next products are issued; <1> keeps one group running across the refill.
//   Epilogue. Each thread holds, per 64-row half, d[i] = C(row, col) with row = 16 w + l/4 +
//   8 ((i/2)%2), col = 8 (i/4) + 2 (l%4) + i%2 (warp w, lane l: the wgmma accumulator layout,
//   sm90/wgmma.h): pairs of adjacent columns, stored as one float2 where C allows it, each
//   bounds-checked against M and N.
//   What limits it next: one warpgroup does everything. Thread 0 issues the copies between the
//   products, so the copies of slice s+3 start only after slice s's products were issued and
//   slice s-1's finished, and every warp waits on the same barriers in lockstep. Step 6
//   specialises warps: a producer warpgroup only issues TMA copies (with few registers, setmaxnreg_dec) and two
//   consumer warpgroups only issue wgmma (a 128 x 256 tile, "empty" barriers handing stages
//   back). Step 7 makes the blocks persistent (one per SM, looping over tiles), so one tile's
//   epilogue overlaps the next tile's loads. apps/gemm_bench measures the gap on a GPU.
//   wgmma and TMA exist on sm_90a only (the "a": architecture-specific features that later
//   GPUs do not have), so the build compiles this file for sm_90a alone (engine/CMakeLists.txt:
//   an image that only a 9.0 device loads); the host refuses other devices with an error.
#include "engine/cuda/runtime.h"

#include <cstddef>
#include <cstdint>

#include "engine/cuda/context.h"
#include "engine/cuda/kernels/common.h"
#include "engine/cuda/kernels/gemm_shape.h"
#include "engine/cuda/kernels/gemm_sm90_common.h"
#include "engine/cuda/launch.h"
#include "engine/cuda/kernels/copy.h"
#include "engine/cuda/mma.h"
#include "engine/cuda/sm90/mbarrier.h"
#include "engine/cuda/sm90/swizzle.h"
#include "engine/cuda/sm90/tma.h"
#include "engine/cuda/sm90/wgmma.h"
#include "engine/error.h"
#include "engine/ops_cuda.h"
#include "engine/tensor.h"

namespace kiln::cuda {

namespace {

using sm90_gemm::KMajor;
using sm90_gemm::kBK;
using sm90_gemm::kMmaK;
using sm90_gemm::kMmaM;
using sm90_gemm::kSwizzle;

constexpr int kSm90BM = 128;      // block tile: rows of C
constexpr int kSm90BN = 128;      // block tile: columns of C (the N of each wgmma)
constexpr int kSm90Stages = 4;    // slices in flight in the ring
constexpr int kSm90Threads = 128;  // one warpgroup
constexpr uint32_t kSm90TileBytes = sm90_gemm::box_bytes(kSm90BM);  // one operand's box: 16 KiB
static_assert(kSm90BM == kSm90BN, "A's and B's boxes share one shape and one byte count");
static_assert(kSm90TileBytes % sm90::swizzle_atom_bytes(kSwizzle) == 0,
              "every box starts on a swizzle atom");

// The dynamic shared memory: the ring, then one "full" barrier per stage. Its base is rounded up
// to the 1024-byte swizzle atom in the kernel (the launch guarantees 16 bytes only), hence the
// slack in kSm90SharedBytes.
struct alignas(1024) Sm90Shared {
  uint16_t a[kSm90Stages][kSm90BM * kBK];
  uint16_t b[kSm90Stages][kSm90BN * kBK];
  sm90::Mbarrier full[kSm90Stages];
};
constexpr size_t kSm90SharedBytes = sizeof(Sm90Shared) + 1024;


// C (m x n) = A B^T with A (m x k) and B (n x k) both K-major, described by the tensor maps
// (boxes of 128 x 64, 128-byte swizzle). E: __nv_bfloat16 or __half, how wgmma reads the bits.
template <typename E>
__global__ void __launch_bounds__(kSm90Threads)
    gemm_sm90_kernel(const __grid_constant__ CUtensorMap map_a,
                     const __grid_constant__ CUtensorMap map_b, float* __restrict__ c, int m, int n,
                     int k, bool vec_c) {
#if KILN_SM90_BODY
  KILN_DYNAMIC_SHARED(unsigned char, raw);
  auto& s = sm90_gemm::atom_aligned<Sm90Shared>(raw);
  const int m0 = blockIdx.y * kSm90BM, n0 = blockIdx.x * kSm90BN;
  const int slices = (k + kBK - 1) / kBK;
  const bool issuer = threadIdx.x == 0;

  if (issuer) {
    // One arrival per phase: the issuer's arrive_expect_tx; the rest is the copies' bytes.
    for (int st = 0; st < kSm90Stages; ++st) sm90::mbarrier_init(&s.full[st], 1);
    sm90::fence_mbarrier_init();  // the initialised barriers, visible to the TMA unit
  }
  __syncthreads();  // sm90 init: every thread sees initialised barriers before waiting on them

  // Slice `slice` into its stage: A's box at (m0, k0), B's at (n0, k0), both counted on the
  // stage's barrier (2 x 16 KiB, out-of-bounds parts included: the TMA writes them as zeros).
  auto issue = [&](int slice) {
    const int st = slice % kSm90Stages, k0 = slice * kBK;
    sm90::mbarrier_arrive_expect_tx(&s.full[st], 2 * kSm90TileBytes);
    sm90::tma_load_2d(s.a[st], &map_a, m0, k0, &s.full[st]);
    sm90::tma_load_2d(s.b[st], &map_b, n0, k0, &s.full[st]);
  };
  // Prologue: the first kStages - 1 slices; the main loop keeps that many ahead.
  if (issuer)
    for (int slice = 0; slice < kSm90Stages - 1 && slice < slices; ++slice) issue(slice);

  float d0[kSm90BN / 2], d1[kSm90BN / 2];  // rows 0-63 and 64-127 of the tile
  KILN_UNROLL
  for (int i = 0; i < kSm90BN / 2; ++i) d0[i] = d1[i] = 0.0f;

  for (int slice = 0; slice < slices; ++slice) {
    const int st = slice % kSm90Stages;
    sm90::mbarrier_wait(&s.full[st], static_cast<uint32_t>((slice / kSm90Stages) % 2));
    sm90::wgmma_fence_operand(d0);  // the compiler keeps accumulator accesses on their side
    sm90::wgmma_fence_operand(d1);
    sm90::wgmma_fence();  // the accumulators' registers are ready for wgmma
    KILN_UNROLL
    for (int kk = 0; kk < kBK; kk += kMmaK) {
      const uint64_t desc_b = sm90_gemm::slice_desc(s.b[st], kk);
      sm90::wgmma_m64k16<kSm90BN, E>(d0, sm90_gemm::slice_desc(s.a[st], kk), desc_b, true);
      sm90::wgmma_m64k16<kSm90BN, E>(d1, sm90_gemm::slice_desc(s.a[st] + kMmaM * kBK, kk), desc_b,
                                     true);
    }
    sm90::wgmma_commit_group();
    // Slice slice-1's group is done, for the whole warpgroup (file comment, "Why a wait before a
    // refill"): its stage may be refilled with slice slice+3.
    sm90::wgmma_wait_group<1>();
    sm90::wgmma_fence_operand(d0);
    sm90::wgmma_fence_operand(d1);
    const int next = slice + kSm90Stages - 1;
    if (issuer && next < slices) issue(next);
  }
  sm90::wgmma_wait_group<0>();  // the last group's accumulators are final
  sm90::wgmma_fence_operand(d0);
  sm90::wgmma_fence_operand(d1);

  sm90_gemm::store_rows<kSm90BN>(d0, c, m, n, m0, n0, vec_c, threadIdx.x);
  sm90_gemm::store_rows<kSm90BN>(d1, c, m, n, m0 + kMmaM, n0, vec_c, threadIdx.x);
#else
  __trap();  // compiled without sm_90a's wgmma and TMA (the host refuses such devices first)
#endif
}

// Copies a rows x cols matrix of 16-bit elements with leading dimension ld_in into one with
// leading dimension ld_out (>= cols), the gaps untouched: what gives an operand the 16-byte
// row stride the TMA needs. One thread per element, consecutive threads along a row.
__global__ void sm90_pad_rows_kernel(const uint16_t* __restrict__ in, int64_t ld_in,
                                     uint16_t* __restrict__ out, int64_t ld_out, int64_t rows,
                                     int64_t cols) {
  const int64_t total = rows * cols, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const int64_t r = i / cols, col = i % cols;
    out[r * ld_out + col] = in[r * ld_in + col];
  }
}

// ---- Host side -----------------------------------------------------------------------------

// Whether this translation unit holds sm_90a code for the kernel (engine/CMakeLists.txt
// defines KILN_GEMM_SM90A where it adds the sm_90a target); the simulator runs the body on
// the CPU.
constexpr bool kHasSm90aCode =
#if KILN_CUDA_SIM || KILN_GEMM_SM90A
    true;
#else
    false;
#endif

struct Capability {
  int major = 0, minor = 0;
  bool is_9_0() const { return major == 9 && minor == 0; }
};

Capability capability_of(int device) {
  Capability c;
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&c.major, cudaDevAttrComputeCapabilityMajor, device));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&c.minor, cudaDevAttrComputeCapabilityMinor, device));
  return c;
}

void check_sm90(const char* who) {
  const int device = current_device();
  const auto [major, minor] = capability_of(device);
  if (!(major == 9 && minor == 0))
    throw Error(detail::str(who, ": cuda:", device, " has compute capability ", major, ".", minor,
                            "; the kernel needs exactly 9.0 (Hopper: TMA and wgmma are sm_90a "
                            "features): use the step-4 tensor-core GEMM (gemm_tensor_core) on "
                            "this device"),
                ErrorKind::Usage);
  if (!kHasSm90aCode)
    throw Error(detail::str(who, ": this build of Kiln has no sm_90a code for the kernel: "
                            "rebuild with the CUDA backend (engine/CMakeLists.txt compiles "
                            "gemm_sm90.cu for sm_90a), or use gemm_tensor_core"),
                ErrorKind::Usage);
}

int64_t round_up8(int64_t x) { return (x + 7) / 8 * 8; }

// A workspace of n 16-bit elements on the current device: the caching allocator, stream-ordered
// on the current stream, so it can go back when the call returns while the kernels reading it
// are still queued (the next user of the block queues behind them).
Tensor workspace16(int64_t n) {
  return Tensor::empty({n}, DType::BF16, Device(DeviceType::CUDA, current_device()));
}

// The operand `rows` x `k` K-major from what the caller passed: p holds it as (rows, k) with
// leading dimension k, or, when `transposed`, as (k, rows) with leading dimension rows.
// Transposed: transpose.cu's tiled transpose into a (rows, k) workspace. Then, if the row
// stride is not a multiple of 8 elements or the base is not 16-byte aligned: a copy into a
// workspace whose rows are padded to a multiple of 8 (the padding is never read: the tensor
// map says the matrix is k wide, and the TMA fills beyond it with zeros).
KMajor k_major(const uint16_t* p, bool transposed, int64_t rows, int64_t k) {
  KMajor op{p, k, Tensor()};
  if (transposed) {
    op.keep = workspace16(rows * k);
    const int64_t dims[2] = {k, rows};
    transpose<uint16_t>(Backend{}, p, static_cast<uint16_t*>(op.keep.raw_data()), dims, 2, 0, 1);
    op.data = static_cast<const uint16_t*>(op.keep.raw_data());
  }
  if (op.ld % 8 == 0 && aligned16(op.data)) return op;
  const int64_t ld = round_up8(k);
  Tensor padded = workspace16(rows * ld);
  uint16_t* out = static_cast<uint16_t*>(padded.raw_data());
  launch(sm90_pad_rows_kernel,
         LaunchConfig{dim3(elementwise_blocks(rows * k)), dim3(kElementwiseThreads), 0,
                      current_stream()},
         op.data, op.ld, out, ld, rows, k);
  op.data = out, op.ld = ld, op.keep = padded;  // the transposed workspace is freed after use
  return op;
}

template <typename E>
void launch_sm90(int m, int n, int k, const KMajor& a, const KMajor& b, float* c) {
  const dim3 grid(blocks_for(n, kSm90BN), blocks_for(m, kSm90BM));
  KILN_CHECK(grid.y <= 65535, "gemm_sm90: M = ", m, " needs more than 65535 block rows");
  CUtensorMap map_a, map_b;
  sm90::encode_tma_2d(&map_a, a.data, m, k, a.ld * 2, kSm90BM, kBK, kSwizzle);
  sm90::encode_tma_2d(&map_b, b.data, n, k, b.ld * 2, kSm90BN, kBK, kSwizzle);
  // Above 48 KiB of dynamic shared memory a kernel must opt in, once per kernel and device
  // (cheap to repeat: it sets an attribute).
  KILN_CUDA_CHECK(cudaFuncSetAttribute(gemm_sm90_kernel<E>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(kSm90SharedBytes)));
  const bool vec_c = reinterpret_cast<uintptr_t>(c) % 8 == 0 && n % 2 == 0;
  launch(gemm_sm90_kernel<E>,
         LaunchConfig{grid, dim3(kSm90Threads), kSm90SharedBytes, current_stream()}, map_a,
         map_b, c, m, n, k, vec_c);
}

}  // namespace

bool sm90_gemm_available() { return capability_of(current_device()).is_9_0() && kHasSm90aCode; }

const char* sm90_step_name(Sm90Step step) {
  switch (step) {
    case Sm90Step::Pipelined: return "pipelined";
    case Sm90Step::WarpSpecialized: return "warp-specialized";
    case Sm90Step::Persistent: return "persistent";
  }
  return "?";
}

// The kernel computes A B^T with both operands K-major; the transposes and layouts the caller
// has are brought to that first (k_major). The copies move O(MK + NK) bytes against the
// product's 2 MNK FLOPs: for N = M = K, reading and writing 2-byte elements is 4 N^2 bytes per
// operand, so at F FLOP/s and B bytes/s of memory they cost about 2F / (B N) of the product's
// time: with F = 500 TFLOP/s and B = 3 TB/s, 8% at N = 4096 and a third at N = 1024. None at
// all for the layout the kernel reads (A (M,K) and B stored (N,K), trans_b: a linear layer's
// forward with its (out, in) weight).
void gemm_sm90(DType in, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
               const uint16_t* a, const uint16_t* b, float* c, Sm90Step step, int blocks) {
  if (in != DType::BF16 && in != DType::F16)
    throw Error(detail::str("gemm_sm90: the inputs are ", dtype_name(in),
                            "; the Hopper GEMM takes bf16 or f16 (convert with Tensor::to)"),
                ErrorKind::Usage);
  if (blocks < 0)
    throw Error(detail::str("gemm_sm90: blocks is ", blocks, "; give 0 (one per SM) or more"),
                ErrorKind::Usage);
  const GemmShape s = gemm_shape("gemm_sm90", trans_a, trans_b, m, n, k);
  if (s.m == 0 || s.n == 0) return;
  check_sm90("gemm_sm90");
  if (s.k == 0) {  // an empty sum: zeros (the TMA cannot describe a matrix 0 wide)
    fill(c, DType::F32, static_cast<int64_t>(s.m) * s.n, 0.0);
    return;
  }
  // op(A) = A is (M,K) K-major as stored; op(A) = A^T comes stored (K,M). op(B) (K,N) is K-major
  // when stored (N,K), i.e. trans_b; stored (K,N) it must be transposed.
  const KMajor ka = k_major(a, trans_a, s.m, s.k);
  const KMajor kb = k_major(b, !trans_b, s.n, s.k);
  if (step != Sm90Step::Pipelined)
    return sm90_gemm::launch_warp_specialized(in, s.m, s.n, s.k, ka, kb, c,
                                              step == Sm90Step::Persistent, blocks);
  if (in == DType::BF16) launch_sm90<__nv_bfloat16>(s.m, s.n, s.k, ka, kb, c);
  else launch_sm90<__half>(s.m, s.n, s.k, ka, kb, c);
}

}  // namespace kiln::cuda
