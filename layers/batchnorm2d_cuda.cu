// batchnorm2d_cuda.cu: CUDA kernels of 2-D batch normalisation; the formulas are in
// batchnorm2d_kernels.h, the CPU twins in batchnorm2d_cpu.cpp (the specification).
//
// How the work is split:
//   - Per-channel reductions (the batch statistics, and the two sums of the backward pass):
//     ONE BLOCK PER CHANNEL. Channel ch owns M = N * HW values in N strided slabs; the block's
//     threads walk them as one flat range k = 0..M-1 (element k is slab k / HW, position
//     k % HW), thread t taking k = t, t + blockDim, ... . A flat range keeps every thread busy
//     whatever the shape: with 1x1 images the slabs are one value long, and a thread per slab
//     position would leave all but one thread idle. Each thread sums its values in double (as
//     the CPU does), then the block combines the partial sums: a butterfly of warp shuffles
//     inside each warp, one value per warp through shared memory, and a second butterfly.
//     The order of every addition is fixed by (M, blockDim), so the result is bit-for-bit
//     reproducible; no atomics. The variance is two-pass like the CPU's: the mean first, then
//     the sum of squared deviations from it (no E[x^2] - E[x]^2 cancellation).
//     One block per channel fills an H100 (132 SMs) once C >= ~132; with fewer channels a
//     split reduction (several blocks per channel, then a second pass) would be faster. BN
//     layers of CNNs have C >= 32, so the simple, deterministic form is kept.
//   - Element-wise passes (y = x * scale + shift, and grad_x): one thread per element over the
//     flattened (N, C, HW) tensor with a grid-stride loop; the channel of element i is
//     (i / HW) % C, and the per-channel constants come from small (C) arrays that stay in
//     cache.
//   - Per-channel O(C) work (invstd, the running-stat update): one thread per channel.
//   - hw == 1 (each channel a column of an (N, C) matrix: how channels-last activations come,
//     layers/batchnorm2d.cpp): the reductions of batchnorm2d_rows_cuda.cu, whose warps read
//     32 neighbouring channels of a row instead of one channel's values C apart.
// Every kernel launches on cuda::current_stream(); nothing here synchronises.
//
// 16-bit activations (T = Half or BFloat16): the same kernels, with the per-channel arrays
// (mean, var, invstd, weight, bias, coef, the gradients of weight and bias) in P = compute_t<T>
// (f32). An element widens to P on load (exact) and the result rounds once on store, so a
// 16-bit kernel computes what the f32 kernel computes on the widened inputs, in its order. The
// element-wise passes then give each thread 8 neighbouring elements, read and written with
// 16-byte accesses (a warp moves 512 contiguous bytes), when every pointer is 16-byte aligned;
// the last total % 8 elements, and unaligned views, go one per thread. Each element's
// arithmetic is the same device function either way.
//
// Rounding: the fused BN+ReLU and BN followed by a separate ReLU run these same kernels on the
// same values (relu_y null or not), and the parity table holds them to the same bits
// (tests/parity/parity_layers.cpp). A compiler may compile the two cases as two copies of a
// loop (unswitching on relu_y), and nvcc and the simulator's host compiler each choose by their
// own rules which multiply-adds of a copy to contract; so the multiply-adds of the forward and
// backward kernels are spelled out: fma_t (one rounding) or mul_rn (the product rounded, then
// the add; engine/cuda/kernels/common.h): fma_t where nvcc's PTX for the plain expressions had a fused
// multiply-add, mul_rn where it kept a multiply and an add (which ptxas was still free to fuse:
// PTX ISA, "mul": mul/add sequences without a rounding modifier may become fused multiply-adds).
#include "engine/cuda/runtime.h"

#include <cmath>
#include <cstdint>
#include <initializer_list>

#include "engine/cuda/context.h"
#include "engine/cuda/kernels/common.h"
#include "engine/cuda/launch.h"
#include "engine/dtype.h"
#include "engine/host_device.h"
#include "layers/batchnorm2d_kernels.h"
#include "layers/batchnorm2d_rows_cuda.cuh"

namespace kiln::cuda {

namespace {

constexpr int kReduceThreads = 256;  // per-channel reduction blocks (a multiple of 32)
constexpr int kElementThreads = 256;
constexpr unsigned kMaxElementBlocks = 4096;  // grid-stride beyond 1M threads

// warp_sum / block_sum (fixed-order butterfly reductions): engine/cuda/kernels/common.h.

// An element in the per-channel type P (a 16-bit value widens exactly).
template <typename T>
__device__ __forceinline__ compute_t<T> in(T v) {
  return convert_elem<compute_t<T>>(v);
}

// Offset of value k (0 <= k < N * HW) of channel ch in the (N, C, HW) tensor.
__device__ __forceinline__ int64_t channel_offset(int64_t k, int64_t ch, int64_t c, int64_t hw) {
  const int64_t b = k / hw;
  return (b * c + ch) * hw + (k - b * hw);
}

unsigned element_blocks(int64_t total) {
  return grid_stride_blocks_1d(total, kElementThreads, kMaxElementBlocks);
}

// Elements per thread and step of the element-wise passes: 8 (16 bytes) for 16-bit elements
// when every pointer given is 16-byte aligned (null ones count as aligned), else 1.
template <typename T>
int element_lanes(std::initializer_list<const T*> ptrs) {
  if constexpr (is_low_precision_v<T>) {
    for (const T* p : ptrs)
      if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return 1;
    return 8;
  } else {
    (void)ptrs;
    return 1;
  }
}

// ---- Kernels --------------------------------------------------------------------------------

// grid = C blocks, block = kReduceThreads. x is (N, C, HW); writes mean[ch] and the biased
// var[ch] of channel ch = blockIdx.x.
template <typename T, typename P = compute_t<T>>
__global__ void __launch_bounds__(kReduceThreads)
    batch_norm2d_stats_kernel(const T* __restrict__ x, P* __restrict__ mean,
                              P* __restrict__ var, int64_t n, int64_t c, int64_t hw) {
  KILN_SHARED(double, scratch, [kWarpSize]);
  const int64_t ch = blockIdx.x;
  const int64_t m = n * hw;
  // Pass 1: the mean.
  double s = 0;
  for (int64_t k = threadIdx.x; k < m; k += blockDim.x)
    s += static_cast<double>(in(x[channel_offset(k, ch, c, hw)]));
  const double mu = block_sum(s, scratch) / static_cast<double>(m);
  // Pass 2: the sum of squared deviations (the values are re-read, mostly from L2).
  double ss = 0;
  for (int64_t k = threadIdx.x; k < m; k += blockDim.x) {
    const double d = static_cast<double>(in(x[channel_offset(k, ch, c, hw)])) - mu;
    ss += d * d;
  }
  ss = block_sum(ss, scratch);
  if (threadIdx.x == 0) {
    mean[ch] = static_cast<P>(mu);
    var[ch] = static_cast<P>(ss / static_cast<double>(m));
  }
}

// One thread per channel: invstd = 1 / sqrt(var + eps), in double as on the CPU.
template <typename T>  // T: the per-channel type (f32 for 16-bit activations)
__global__ void batch_norm2d_invstd_kernel(const T* __restrict__ var, T* __restrict__ invstd,
                                           int64_t c, double eps) {
  const int64_t ch = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (ch < c) invstd[ch] = static_cast<T>(1.0 / ::sqrt(static_cast<double>(var[ch]) + eps));
}

// One thread per channel: running = (1 - momentum) * running + momentum * batch, the variance
// made unbiased by m / (m - 1).
template <typename T>
__global__ void batch_norm2d_update_running_kernel(const T* __restrict__ mean,
                                                   const T* __restrict__ var,
                                                   T* __restrict__ running_mean,
                                                   T* __restrict__ running_var, int64_t c,
                                                   double unbias, double momentum) {
  const int64_t ch = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (ch >= c) return;
  running_mean[ch] = static_cast<T>((1 - momentum) * running_mean[ch] + momentum * mean[ch]);
  running_var[ch] =
      static_cast<T>((1 - momentum) * running_var[ch] + momentum * var[ch] * unbias);
}

// Grid-stride over the N * C * HW elements: y = x * scale + shift, with the CPU's per-channel
// scale = invstd * weight and shift = bias - mean * scale (in P, as on the CPU); relu: max(y, 0).
template <typename T, typename P>
__device__ __forceinline__ T forward_elem(T x, int64_t ch, const P* __restrict__ mean,
                                          const P* __restrict__ invstd,
                                          const P* __restrict__ weight,
                                          const P* __restrict__ bias, bool relu) {
  const P scale = invstd[ch] * (weight ? weight[ch] : P(1));
  const P shift = (bias ? bias[ch] : P(0)) - mul_rn(mean[ch], scale);
  const P v = fma_t(in(x), scale, shift);
  return convert_elem<T>(relu && !(v > P(0)) ? P(0) : v);
}

// V = 1: element i per step. V = 8 (16-bit, aligned pointers): elements 8g .. 8g + 7 per step,
// then the last total % 8 one by one.
template <typename T, int V, typename P = compute_t<T>>
__global__ void batch_norm2d_forward_kernel(const T* __restrict__ x, const P* __restrict__ mean,
                                            const P* __restrict__ invstd,
                                            const P* __restrict__ weight,
                                            const P* __restrict__ bias, T* __restrict__ y,
                                            int64_t total, int64_t c, int64_t hw, bool relu) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t groups = total / V;
  for (int64_t g = first; g < groups; g += stride) {
    const Lanes<T, V> xs = load_lanes<V>(x + g * V);
    Lanes<T, V> ys;
    for (int j = 0; j < V; ++j)
      ys.v[j] = forward_elem(xs.v[j], (g * V + j) / hw % c, mean, invstd, weight, bias, relu);
    store_lanes<V>(y + g * V, ys);
  }
  for (int64_t i = groups * V + first; i < total; i += stride)
    y[i] = forward_elem(x[i], (i / hw) % c, mean, invstd, weight, bias, relu);
}

// The gradient reaching the normalisation: grad_y, or 0 where the fused ReLU's output is not
// positive (relu_y is null without a fused ReLU).
template <typename T, typename P = compute_t<T>>
__device__ __forceinline__ P masked_grad(const T* __restrict__ grad_y, const T* __restrict__ relu_y,
                                         int64_t off) {
  return relu_y && !(in(relu_y[off]) > P(0)) ? P(0) : in(grad_y[off]);
}

// grid = C blocks, block = kReduceThreads. For channel ch = blockIdx.x: the sums
// sum(grad_y) (= grad_bias) and sum(grad_y * xhat) (= grad_weight), written where wanted, and
// when grad_x is wanted the constants of grad_x = k * grad_y - a * (x - mean) + d into
// coef[ch], coef[C + ch], coef[2C + ch] (write_backward_reduction, batchnorm2d_rows_cuda.cuh).
template <typename T, typename P = compute_t<T>>
__global__ void __launch_bounds__(kReduceThreads) batch_norm2d_backward_reduce_kernel(
    BatchNormMode mode, const T* __restrict__ grad_y, const T* __restrict__ x,
    const P* __restrict__ mean, const P* __restrict__ invstd, const P* __restrict__ weight,
    const T* __restrict__ relu_y, P* __restrict__ grad_weight, P* __restrict__ grad_bias,
    P* __restrict__ coef, bool need_sums, int64_t n, int64_t c, int64_t hw) {
  KILN_SHARED(double, scratch, [kWarpSize]);
  const int64_t ch = blockIdx.x;
  const int64_t m = n * hw;
  const double mu = static_cast<double>(mean[ch]);
  double sum_gy = 0, sum_gy_xc = 0;
  if (need_sums) {  // the same for the whole block: the barriers inside are reached by all
    for (int64_t k = threadIdx.x; k < m; k += blockDim.x) {
      const int64_t off = channel_offset(k, ch, c, hw);
      const double gy = static_cast<double>(masked_grad(grad_y, relu_y, off));
      sum_gy += gy;
      sum_gy_xc = fma_t(gy, static_cast<double>(in(x[off])) - mu, sum_gy_xc);
    }
    sum_gy = block_sum(sum_gy, scratch);
    sum_gy_xc = block_sum(sum_gy_xc, scratch);
  }
  if (threadIdx.x != 0) return;
  write_backward_reduction(mode, sum_gy, sum_gy_xc, invstd, weight, grad_weight, grad_bias, coef,
                           ch, m, c);
}

// Grid-stride over the N * C * HW elements: grad_x = k * grad_y - a * (x - mean) + d.
// V as in batch_norm2d_forward_kernel.
template <typename T, typename P>
__device__ __forceinline__ T backward_input_elem(P gy, T x, int64_t ch,
                                                 const P* __restrict__ mean,
                                                 const P* __restrict__ coef, int64_t c) {
  return convert_elem<T>(mul_rn(coef[ch], gy) - mul_rn(coef[c + ch], in(x) - mean[ch]) +
                         coef[2 * c + ch]);
}
template <typename T, int V, typename P = compute_t<T>>
__global__ void batch_norm2d_backward_input_kernel(const T* __restrict__ grad_y,
                                                   const T* __restrict__ relu_y,
                                                   const T* __restrict__ x,
                                                   const P* __restrict__ mean,
                                                   const P* __restrict__ coef,
                                                   T* __restrict__ grad_x, int64_t total,
                                                   int64_t c, int64_t hw) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t groups = total / V;
  for (int64_t g = first; g < groups; g += stride) {
    const Lanes<T, V> gs = load_lanes<V>(grad_y + g * V), xs = load_lanes<V>(x + g * V);
    Lanes<T, V> ys{}, out;
    if (relu_y) ys = load_lanes<V>(relu_y + g * V);
    for (int j = 0; j < V; ++j) {
      const P gy = relu_y && !(in(ys.v[j]) > P(0)) ? P(0) : in(gs.v[j]);
      out.v[j] = backward_input_elem(gy, xs.v[j], (g * V + j) / hw % c, mean, coef, c);
    }
    store_lanes<V>(grad_x + g * V, out);
  }
  for (int64_t i = groups * V + first; i < total; i += stride)
    grad_x[i] = backward_input_elem(masked_grad(grad_y, relu_y, i), x[i], (i / hw) % c, mean,
                                    coef, c);
}

}  // namespace

// ---- Host wrappers (declared in batchnorm2d_kernels.h) --------------------------------------

template <typename T>
void batch_norm2d_stats(Backend, const T* x, compute_t<T>* mean, compute_t<T>* var, int64_t n,
                        int64_t c, int64_t hw) {
  if (c == 0) return;  // a grid of 0 blocks is an invalid launch
  if (hw == 1) {
    batch_norm2d_stats_rows(x, mean, var, n, c);
    return;
  }
  launch(batch_norm2d_stats_kernel<T>,
         LaunchConfig{dim3(static_cast<unsigned>(c)), dim3(kReduceThreads), 0, current_stream()},
         x, mean, var, n, c, hw);
}

template <typename T>
void batch_norm2d_invstd(Backend, const T* var, T* invstd, int64_t c, double eps) {
  if (c == 0) return;
  launch(batch_norm2d_invstd_kernel<T>,
         LaunchConfig{dim3(blocks_for(c, kElementThreads)), dim3(kElementThreads), 0,
                      current_stream()},
         var, invstd, c, eps);
}

template <typename T>
void batch_norm2d_update_running(Backend, const T* mean, const T* var, T* running_mean,
                                 T* running_var, int64_t c, int64_t m, double momentum) {
  if (c == 0) return;
  const double unbias = static_cast<double>(m) / static_cast<double>(m - 1);
  launch(batch_norm2d_update_running_kernel<T>,
         LaunchConfig{dim3(blocks_for(c, kElementThreads)), dim3(kElementThreads), 0,
                      current_stream()},
         mean, var, running_mean, running_var, c, unbias, momentum);
}

template <typename T>
void batch_norm2d_forward(Backend, const T* x, const compute_t<T>* mean,
                          const compute_t<T>* invstd, const compute_t<T>* weight,
                          const compute_t<T>* bias, T* y, int64_t n, int64_t c, int64_t hw,
                          bool relu) {
  const int64_t total = n * c * hw;
  if (total == 0) return;
  if (element_lanes<T>({x, y}) == 8) {
    launch(batch_norm2d_forward_kernel<T, 8>,
           LaunchConfig{dim3(element_blocks((total + 7) / 8)), dim3(kElementThreads), 0,
                        current_stream()},
           x, mean, invstd, weight, bias, y, total, c, hw, relu);
  } else {
    launch(batch_norm2d_forward_kernel<T, 1>,
           LaunchConfig{dim3(element_blocks(total)), dim3(kElementThreads), 0, current_stream()},
           x, mean, invstd, weight, bias, y, total, c, hw, relu);
  }
}

template <typename T>
void batch_norm2d_backward(Backend, BatchNormMode mode, const T* grad_y, const T* x,
                           const compute_t<T>* mean, const compute_t<T>* invstd,
                           const compute_t<T>* weight, const compute_t<T>* /*bias*/, bool relu,
                           const T* relu_y, T* grad_x, compute_t<T>* grad_weight,
                           compute_t<T>* grad_bias, compute_t<T>* coef, int64_t n, int64_t c,
                           int64_t hw) {
  KILN_CHECK(!grad_x || coef, "batch_norm2d_backward: grad_x needs the (3 * C) workspace");
  KILN_CHECK(!relu || relu_y, "batch_norm2d_backward: a fused ReLU needs the forward's output");
  if (!relu) relu_y = nullptr;  // the kernels take a null relu_y for "no mask"
  if (c == 0) return;
  const bool need_sums = grad_weight || grad_bias || (grad_x && mode == BatchNormMode::Train);
  cudaStream_t stream = current_stream();
  if (hw == 1) {
    batch_norm2d_backward_reduce_rows(mode, grad_y, x, mean, invstd, weight, relu_y, grad_weight,
                                      grad_bias, grad_x ? coef : nullptr, need_sums, n, c);
  } else {
    launch(batch_norm2d_backward_reduce_kernel<T>,
           LaunchConfig{dim3(static_cast<unsigned>(c)), dim3(kReduceThreads), 0, stream}, mode,
           grad_y, x, mean, invstd, weight, relu_y, grad_weight, grad_bias,
           grad_x ? coef : nullptr, need_sums, n, c, hw);
  }
  const int64_t total = n * c * hw;
  if (!grad_x || total == 0) return;
  if (element_lanes<T>({grad_y, relu_y, x, grad_x}) == 8) {
    launch(batch_norm2d_backward_input_kernel<T, 8>,
           LaunchConfig{dim3(element_blocks((total + 7) / 8)), dim3(kElementThreads), 0, stream},
           grad_y, relu_y, x, mean, coef, grad_x, total, c, hw);
  } else {
    launch(batch_norm2d_backward_input_kernel<T, 1>,
           LaunchConfig{dim3(element_blocks(total)), dim3(kElementThreads), 0, stream}, grad_y,
           relu_y, x, mean, coef, grad_x, total, c, hw);
  }
}

#define KILN_INSTANTIATE_BN_CUDA_PARAMS(P)                                                   \
  template void batch_norm2d_invstd<P>(Backend, const P*, P*, int64_t, double);                \
  template void batch_norm2d_update_running<P>(Backend, const P*, const P*, P*, P*, int64_t,   \
                                               int64_t, double);
#define KILN_INSTANTIATE_BN_CUDA(T)                                                            \
  template void batch_norm2d_stats<T>(Backend, const T*, compute_t<T>*, compute_t<T>*,         \
                                      int64_t, int64_t, int64_t);                              \
  template void batch_norm2d_forward<T>(Backend, const T*, const compute_t<T>*,                \
                                        const compute_t<T>*, const compute_t<T>*,              \
                                        const compute_t<T>*, T*, int64_t, int64_t, int64_t,    \
                                        bool);                                                 \
  template void batch_norm2d_backward<T>(Backend, BatchNormMode, const T*, const T*,           \
                                         const compute_t<T>*, const compute_t<T>*,             \
                                         const compute_t<T>*, const compute_t<T>*, bool,       \
                                         const T*, T*, compute_t<T>*, compute_t<T>*,           \
                                         compute_t<T>*, int64_t, int64_t, int64_t);
KILN_INSTANTIATE_BN_CUDA_PARAMS(float)
KILN_INSTANTIATE_BN_CUDA_PARAMS(double)
KILN_INSTANTIATE_BN_CUDA(float)
KILN_INSTANTIATE_BN_CUDA(double)
KILN_INSTANTIATE_BN_CUDA(Half)
KILN_INSTANTIATE_BN_CUDA(BFloat16)
#undef KILN_INSTANTIATE_BN_CUDA
#undef KILN_INSTANTIATE_BN_CUDA_PARAMS

}  // namespace kiln::cuda
