// ops_cuda.h: CUDA kernels of the core ops, the twins of engine/ops_cpu.h.
//
// Same names, same arguments, same meaning as kiln::cpu::... (the first argument is
// cuda::Backend instead of cpu::Backend, so an op calls either unqualified: engine/dispatch.h),
// but every pointer is device memory of the current device, and the work is queued on
// cuda::current_stream() (the call returns before the kernel has run; later work on the same
// stream sees its result). The caller (engine/ops_*.cpp) holds a cuda::DeviceGuard for the
// tensors' device.
// Definitions: engine/cuda/kernels/{elementwise,reduce,gemm,gemm_lowp,transpose,softmax}.cu,
// and unscale_and_check in optim.cu beside the optimizers' updates; each file opens with how
// its kernels divide the work among threads.
#pragma once

#include <cstdint>

#include "engine/backend.h"
#include "engine/dtype.h"
#include "engine/elementwise_ops.h"

namespace kiln::cuda {

// out[i] = a[i] op b[j(i)], a and out have n elements; b has n (Same), 1 (Scalar) or
// `row` elements (Row: b is repeated every `row` elements of a).
template <typename T>
void binary(Backend, BinaryOp op, Broadcast kind, const T* a, const T* b, T* out, int64_t n,
            int64_t row);

// out[i] = f(x[i]); `scalar` is the operand of AddScalar / MulScalar.
template <typename T>
void unary(Backend, UnaryOp op, const T* x, T* out, int64_t n, compute_t<T> scalar);

// grad_x[i] = grad_y[i] if y[i] > 0 else 0.
template <typename T>
void relu_backward(Backend, const T* grad_y, const T* y, T* grad_x, int64_t n);

// x viewed as (outer, len, inner); out is (outer, inner) = sum over len. A 16-bit x (Half,
// BFloat16) is summed in f32 into an f32 out (compute_t); f32 and f64 sum in their own type. Deterministic: the
// same inputs give the same bits on every run (a fixed reduction tree, no atomics).
template <typename T>
void sum_dim(Backend, const T* x, compute_t<T>* out, int64_t outer, int64_t len,
             int64_t inner);
// The adjoint of sum_dim: out (outer, len, inner)[o, l, i] = g (outer, inner)[o, i] * scale,
// g and scale in compute_t<T>, the product rounded once to T.
template <typename T>
void expand_dim(Backend, const compute_t<T>* g, T* out, int64_t outer, int64_t len,
                int64_t inner, compute_t<T> scale);
// out (outer, inner) = argmax over len of x (outer, len, inner); ties go to the lowest index,
// as on the CPU.
template <typename T>
void argmax_dim(Backend, const T* x, int64_t* out, int64_t outer, int64_t len,
                int64_t inner);

// C (M,N) = op(A) op(B) + beta C, row-major; op(A) is (M,K), op(B) is (K,N). With beta == 0,
// C is not read (it may hold garbage). Our own GEMM: the fastest step below that applies
// (RegisterBlocked for float, Tiled for double). gemm_vendor is the cuBLAS twin; the op picks
// one (engine/ops_matmul.cpp, with gemm_impl of engine/impl.h).
template <typename T>
void gemm(Backend, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const T* a,
          const T* b, T* c, T beta = T(0));
// cuBLAS (FP32, or TF32 when enabled in engine/cuda/blas.h); the simulated cuBLAS under the
// simulator (engine/cuda/sim/cublas.h). Same contract as gemm.
template <typename T>
void gemm_vendor(Backend, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const T* a,
                 const T* b, T* c, T beta = T(0));

// The steps of our own GEMM, from naive to fast (engine/cuda/kernels/gemm.cu explains each).
// All are kept, tested and benchmarked (apps/gemm_bench): a later step must beat an earlier
// one to earn its complexity. The fourth, on tensor cores, takes 16-bit inputs and has its own
// function (gemm_tensor_core, below), as does the fifth, for Hopper (gemm_sm90).
enum class GemmKernel {
  Naive,            // one thread per C element, operands straight from global memory
  Tiled,            // 16x16 shared-memory tiles: each operand element read once per tile
  RegisterBlocked,  // 128x128 block tile, 8x8 per thread in registers, double-buffered (float)
};
const char* gemm_kernel_name(GemmKernel kernel);  // "naive" | "tiled" | "regblock"
// The hand GEMM with a chosen step. RegisterBlocked is float only (an Error for double).
template <typename T>
void gemm_hand(GemmKernel kernel, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
               const T* a, const T* b, T* c, T beta = T(0));
// Step 4 of our GEMM (engine/cuda/kernels/gemm_tensor_core.cu): tensor cores. C (M,N) f32 =
// op(A) op(B), A and B bf16 or f16 bit patterns (`in`), f32 accumulation.
void gemm_tensor_core(DType in, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                      const uint16_t* a, const uint16_t* b, float* c);
// Whether the current device has the bf16/f16 tensor cores gemm_tensor_core needs (8.0+).
bool tensor_cores_available();
// Steps 5-7 of our GEMM, for Hopper (compute capability exactly 9.0): TMA copies, mbarriers and
// warpgroup MMA. Same contract as gemm_tensor_core. The kernels read both operands K-major
// (A (M,K), B stored (N,K), i.e. trans_a false and trans_b true) with 16-byte aligned rows;
// other layouts are first copied into a workspace (transposed and/or padded).
enum class Sm90Step {
  Pipelined,        // step 5 (gemm_sm90.cu): one warpgroup, 128x128 tile, 4-stage TMA ring
  WarpSpecialized,  // step 6 (gemm_sm90_ws.cu): a producer warpgroup issues the TMA copies,
                    // two consumer warpgroups the wgmma, 128x256 tile, full/empty barriers
  Persistent,       // step 7 (gemm_sm90_ws.cu): step 6 with one block per SM looping over the
                    // tiles in an L2-friendly order
};
const char* sm90_step_name(Sm90Step step);  // "pipelined" | "warp-specialized" | "persistent"
// blocks: for Persistent, how many blocks loop over the tiles (0: one per SM); else ignored.
void gemm_sm90(DType in, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
               const uint16_t* a, const uint16_t* b, float* c,
               Sm90Step step = Sm90Step::Persistent, int blocks = 0);
// Whether gemm_sm90 can run on the current device: compute capability 9.0 and a build holding
// the kernels' sm_90a code (every nvcc build of Kiln; the simulator too).
bool sm90_gemm_available();

// Mixed precision: C (M,N) f32 = op(A) op(B), A and B bf16 or f16 bit patterns (`in` is
// DType::BF16 or DType::F16), products summed in f32; row-major and shaped like gemm above
// (beta 0: C is written, never read). engine/cuda/kernels/gemm_lowp.cu; the CPU twins are in
// engine/gemm_lowp_cpu.h.
//   gemm_lowp         ours: step 4 (gemm_tensor_core) on devices with bf16/f16 tensor cores;
//                     elsewhere A and B converted to f32 on the device (copy.h's convert) into
//                     scratch memory, then the fastest hand f32 GEMM step.
//   gemm_lowp_vendor  cublasGemmEx: CUDA_R_16BF / CUDA_R_16F inputs, CUDA_R_32F output,
//                     CUBLAS_COMPUTE_32F (tensor cores where the GPU has them).
void gemm_lowp(Backend, DType in, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
               const uint16_t* a, const uint16_t* b, float* c);
void gemm_lowp_vendor(Backend, DType in, bool trans_a, bool trans_b, int64_t m, int64_t n,
                      int64_t k, const uint16_t* a, const uint16_t* b, float* c);

// out = x with dims d0 and d1 swapped; x has shape dims[0..rank) (dims is a HOST array).
template <typename T>
void transpose(Backend, const T* x, T* out, const int64_t* dims, int64_t rank, int64_t d0,
               int64_t d1);

// Softmax / log-softmax of x (outer, len, inner) over len.
template <typename T>
void softmax(Backend, const T* x, T* y, int64_t outer, int64_t len, int64_t inner, bool log);
// Backward of softmax (log=false: y is softmax) or log-softmax (log=true: y is log-softmax).
template <typename T>
void softmax_backward(Backend, const T* grad_y, const T* y, T* grad_x, int64_t outer,
                      int64_t len, int64_t inner, bool log);

// Loss scaling's fused unscale-and-check: g[i] = g[i] / T(*scale) (scale: one f32 of DEVICE
// memory), and *found_inf = 1 (a DEVICE int32) if any result is inf or NaN, else *found_inf
// untouched: the caller zeroes the flag once, runs this over every gradient of the device, and
// reads the flag once (or hands it to the optimizer's step(skip) without reading it).
template <typename T>
void unscale_and_check(Backend, T* g, int64_t n, const float* scale, int32_t* found_inf);

}  // namespace kiln::cuda
