// loss_cuda.cu: CUDA kernels of the losses: the fused softmax-cross-entropy and the mean
// squared error, forward and backward (declared in loss_kernels.h; the CPU cross-entropy in
// loss_cpu.cpp is the specification).
//
// Cross-entropy forward, two kernels:
//   1. ONE WARP PER ROW (8 rows per 256-thread block). The 32 lanes stride over the row's C
//      logits three times: the max (a shuffle butterfly gives every lane the row max), the sum
//      of exp(x - max) (written into probs as it goes; another butterfly), and probs /= sum.
//      Subtracting the max keeps exp from overflowing, so the loss of a row is finite for any
//      finite logits: -log softmax[t] = log(sum) + max - x[t]. Lane 0 writes it to row_loss.
//      A warp per row suits classification heads (C = 10 .. 1000: each lane holds a few
//      values) and needs no shared memory or barriers; rows are independent, so a batch of N
//      rows is N / 8 blocks.
//   2. ONE BLOCK adds the N row losses in double, in a fixed order (thread t takes rows t,
//      t + 256, ...; then a shuffle + shared-memory tree), divides by N and writes the loss
//      scalar; in the same sweep it finds the first row whose target is outside [0, C).
//      Deterministic, no atomics; the loss stays on the device.
// The CPU op throws on a bad target. Detecting it on the device costs nothing extra (kernel 2
// reads every target anyway): it writes the first bad row, and makes the loss NaN so that a bad
// target never goes unseen. The op copies that row back asynchronously and reads it later,
// without waiting (loss.cpp): checking on the host before launch would instead copy all N
// targets to the host and stall the stream, and reading the row back at once would make every
// call (every training step) wait for the device.
//
// Cross-entropy backward: one thread per logit (grid-stride), grad = (p - onehot) * g / N, with
// g read from the device scalar the autograd engine passes in.
//
// MSE forward: per-block partial sums of (a - b)^2 in double over a grid-stride loop, written
// to a workspace (one double per block; the grid size depends only on n), then one block adds
// the partials in order. MSE backward: one thread per element. All deterministic.
#include "engine/cuda/runtime.h"

#include <cmath>
#include <cstdint>

#include "engine/cuda/context.h"
#include "engine/cuda/kernels/common.h"
#include "engine/cuda/launch.h"
#include "layers/loss_kernels.h"

namespace kiln::cuda {

namespace {

constexpr int kRowsPerBlock = 8;                     // cross-entropy: a warp per row
constexpr int kRowThreads = kRowsPerBlock * kWarpSize;   // 256
constexpr int kThreads = 256;                        // every other kernel
constexpr unsigned kMaxBlocks = 1024;                // grid-stride beyond 256K threads

// exp_t / log_t (T's precision, not the fast __expf approximations): kernels/common.h.

// warp_sum / warp_max / block_sum (fixed-order butterfly reductions, every lane gets the
// result): engine/cuda/kernels/common.h. The minimum of a long long is only needed here.
__device__ __forceinline__ long long warp_min(long long v) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    const long long o = __shfl_xor_sync(kFullMask, v, offset);
    v = o < v ? o : v;
  }
  return v;
}

// The minimum over a block (block_sum's scheme); `scratch` is a shared long long[32].
__device__ long long block_min(long long v, long long* scratch) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  v = warp_min(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = warp_min(lane < static_cast<int>(blockDim.x / kWarpSize) ? scratch[lane] : v);
  __syncthreads();
  return v;
}

unsigned capped_blocks(int64_t work) { return grid_stride_blocks_1d(work, kThreads, kMaxBlocks); }

// ---- Cross-entropy --------------------------------------------------------------------------

// block = kRowThreads: warp w of block b owns row b * kRowsPerBlock + w. logits, probs are
// (N, C), targets (N); row_loss[row] = -log softmax(row)[target], or 0 for a bad target.
template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    cross_entropy_rows_kernel(const T* __restrict__ logits, const int64_t* __restrict__ targets,
                              T* __restrict__ probs, double* __restrict__ row_loss, int64_t n,
                              int64_t c) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarpSize;
  if (row >= n) return;  // the whole warp leaves together: the shuffles below stay complete
  const T* x = logits + row * c;
  T* p = probs + row * c;
  T mx = -INFINITY;
  for (int64_t j = lane; j < c; j += kWarpSize) mx = x[j] > mx ? x[j] : mx;
  mx = warp_max(mx);
  T sum = 0;
  for (int64_t j = lane; j < c; j += kWarpSize) {
    const T e = exp_t(x[j] - mx);
    p[j] = e;
    sum += e;
  }
  sum = warp_sum(sum);
  for (int64_t j = lane; j < c; j += kWarpSize) p[j] /= sum;  // this lane's own writes: no sync
  if (lane == 0) {
    const int64_t t = targets[row];
    row_loss[row] = (t >= 0 && t < c) ? static_cast<double>(log_t(sum) + mx - x[t]) : 0.0;
  }
}

// One block of kThreads: *loss = sum(row_loss) / N in double (NaN when a target is bad),
// *bad_row = the first row with a target outside [0, C), or -1.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_finish_kernel(const double* __restrict__ row_loss,
                                const int64_t* __restrict__ targets, T* __restrict__ loss,
                                int64_t* __restrict__ bad_row, int64_t n, int64_t c) {
  KILN_SHARED(double, sum_scratch, [kWarpSize]);
  KILN_SHARED(long long, min_scratch, [kWarpSize]);
  constexpr long long kNone = 0x7fffffffffffffffLL;
  double s = 0;
  long long first_bad = kNone;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    s += row_loss[i];
    const int64_t t = targets[i];
    if ((t < 0 || t >= c) && i < first_bad) first_bad = i;
  }
  s = block_sum(s, sum_scratch);
  first_bad = block_min(first_bad, min_scratch);
  if (threadIdx.x == 0) {
    const double mean = s / static_cast<double>(n);  // n == 0: NaN, like the CPU
    *loss = static_cast<T>(first_bad == kNone ? mean : static_cast<double>(NAN));
    *bad_row = first_bad == kNone ? -1 : static_cast<int64_t>(first_bad);
  }
}

// Grid-stride over the N * C logits: grad = (p - onehot(target)) * grad_loss / N.
template <typename T>
__global__ void cross_entropy_backward_kernel(const T* __restrict__ probs,
                                              const int64_t* __restrict__ targets,
                                              T* __restrict__ grad_logits, int64_t n, int64_t c,
                                              const T* __restrict__ grad_loss) {
  const T scale = grad_loss[0] / static_cast<T>(n);
  const int64_t total = n * c;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += stride) {
    const int64_t i = idx / c, j = idx - i * c;
    const T onehot = j == targets[i] ? T(1) : T(0);
    grad_logits[idx] = (probs[idx] - onehot) * scale;
  }
}

// ---- Mean squared error ---------------------------------------------------------------------

// Grid-stride: partials[block] = sum over this block's elements of (a - b)^2, in double.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    mse_loss_partial_kernel(const T* __restrict__ a, const T* __restrict__ b,
                            double* __restrict__ partials, int64_t n) {
  KILN_SHARED(double, scratch, [kWarpSize]);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  double s = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const double d = static_cast<double>(a[i] - b[i]);  // the difference in T, as sub() does
    s += d * d;
  }
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

// One block: *loss = sum(partials[0..count)) / n.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    mse_loss_finish_kernel(const double* __restrict__ partials, int64_t count,
                           T* __restrict__ loss, int64_t n) {
  KILN_SHARED(double, scratch, [kWarpSize]);
  double s = 0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) s += partials[i];
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) *loss = static_cast<T>(s / static_cast<double>(n));
}

// Grid-stride: grad_a = (a - b) * 2 g / n, grad_b = -grad_a (either may be null).
template <typename T>
__global__ void mse_loss_backward_kernel(const T* __restrict__ a, const T* __restrict__ b,
                                         const T* __restrict__ grad_loss,
                                         T* __restrict__ grad_a, T* __restrict__ grad_b,
                                         int64_t n) {
  const T scale = T(2) * (grad_loss[0] / static_cast<T>(n));
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const T g = (a[i] - b[i]) * scale;
    if (grad_a) grad_a[i] = g;
    if (grad_b) grad_b[i] = -g;
  }
}

}  // namespace

// ---- Host wrappers (declared in loss_kernels.h) ---------------------------------------------

template <typename T>
void cross_entropy_forward(Backend, const T* logits, const int64_t* targets, T* probs, T* loss,
                           int64_t* bad_row, double* row_loss, int64_t n, int64_t c) {
  cudaStream_t stream = current_stream();
  if (n > 0)
    launch(cross_entropy_rows_kernel<T>,
           LaunchConfig{dim3(blocks_for(n, kRowsPerBlock)), dim3(kRowThreads), 0, stream},
           logits, targets, probs, row_loss, n, c);
  launch(cross_entropy_finish_kernel<T>, LaunchConfig{dim3(1), dim3(kThreads), 0, stream},
         row_loss, targets, loss, bad_row, n, c);
}

template <typename T>
void cross_entropy_backward(Backend, const T* probs, const int64_t* targets, T* grad_logits,
                            int64_t n, int64_t c, const T* grad_loss) {
  if (n * c == 0) return;
  launch(cross_entropy_backward_kernel<T>,
         LaunchConfig{dim3(capped_blocks(n * c)), dim3(kThreads), 0, current_stream()}, probs,
         targets, grad_logits, n, c, grad_loss);
}

int64_t mse_loss_workspace_size(int64_t n) { return capped_blocks(n); }

template <typename T>
void mse_loss_forward(Backend, const T* a, const T* b, T* loss, double* partials, int64_t n) {
  cudaStream_t stream = current_stream();
  const unsigned blocks = capped_blocks(n);  // == mse_loss_workspace_size(n)
  launch(mse_loss_partial_kernel<T>, LaunchConfig{dim3(blocks), dim3(kThreads), 0, stream}, a,
         b, partials, n);
  launch(mse_loss_finish_kernel<T>, LaunchConfig{dim3(1), dim3(kThreads), 0, stream}, partials,
         static_cast<int64_t>(blocks), loss, n);
}

template <typename T>
void mse_loss_backward(Backend, const T* a, const T* b, const T* grad_loss, T* grad_a, T* grad_b,
                       int64_t n) {
  if (n == 0 || (!grad_a && !grad_b)) return;
  launch(mse_loss_backward_kernel<T>,
         LaunchConfig{dim3(capped_blocks(n)), dim3(kThreads), 0, current_stream()}, a, b,
         grad_loss, grad_a, grad_b, n);
}

#define KILN_INSTANTIATE_LOSS_CUDA(T)                                                        \
  template void cross_entropy_forward<T>(Backend, const T*, const int64_t*, T*, T*, int64_t*, \
                                         double*, int64_t, int64_t);                         \
  template void cross_entropy_backward<T>(Backend, const T*, const int64_t*, T*, int64_t,     \
                                          int64_t, const T*);                                \
  template void mse_loss_forward<T>(Backend, const T*, const T*, T*, double*, int64_t);      \
  template void mse_loss_backward<T>(Backend, const T*, const T*, const T*, T*, T*, int64_t);
KILN_INSTANTIATE_LOSS_CUDA(float)
KILN_INSTANTIATE_LOSS_CUDA(double)
#undef KILN_INSTANTIATE_LOSS_CUDA

}  // namespace kiln::cuda
