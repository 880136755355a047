// sim_test_kernels.h: small kernels exercising one simulator feature each, and DeviceBuffer,
// a RAII device array for the tests. Included by sim_kernel_test.cpp only.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <vector>

#include "engine/cuda/check.h"
#include "engine/cuda/runtime.h"

namespace kiln::sim_test {

// A device array on the current device, filled from / copied back to a std::vector.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) { KILN_CUDA_CHECK(cudaMalloc(&p_, n * sizeof(T))); }
  explicit DeviceBuffer(const std::vector<T>& v) : DeviceBuffer(v.size()) {
    KILN_CUDA_CHECK(cudaMemcpy(p_, v.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { (void)cudaFree(p_); }
  T* get() const { return p_; }
  std::vector<T> to_host() const {
    std::vector<T> v(n_);
    KILN_CUDA_CHECK(cudaMemcpy(v.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
  }

 private:
  size_t n_;
  T* p_ = nullptr;
};

constexpr unsigned kFull = 0xffffffffu;

__global__ void vector_add_kernel(const float* __restrict__ a, const float* __restrict__ b,
                                  float* __restrict__ c, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}

// Each thread writes its global linear id at that id; thread 0 of block 0 records the dims.
__global__ void index_kernel(int* ids, unsigned* dims) {
  const unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const unsigned thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const unsigned id = block * (blockDim.x * blockDim.y * blockDim.z) + thread;
  ids[id] = static_cast<int>(id);
  if (id == 0) {
    const unsigned v[8] = {blockDim.x, blockDim.y, blockDim.z, gridDim.x, gridDim.y, gridDim.z,
                           static_cast<unsigned>(warpSize), 0};
    for (int i = 0; i < 8; ++i) dims[i] = v[i];
  }
}

// The classic shared-memory tree reduction (blockDim.x = 256), one atomicAdd per block.
// Negative partial sums wrap in unsigned long long; the total comes out right modulo 2^64.
__global__ void block_sum_kernel(const int* x, int n, unsigned long long* sum) {
  KILN_SHARED(int, s, [256]);
  const int t = threadIdx.x, i = blockIdx.x * blockDim.x + t;
  s[t] = i < n ? x[i] : 0;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (t < stride) s[t] += s[t + stride];
    __syncthreads();
  }
  if (t == 0) atomicAdd(sum, static_cast<unsigned long long>(static_cast<long long>(s[0])));
}

// Float sum with warp shuffles, then shared memory across the 8 warps of a 256-thread block.
__global__ void float_block_sum_kernel(const float* x, int n, float* sum) {
  KILN_SHARED(float, warp_sums, [32]);
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float v = i < n ? x[i] : 0.0f;
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(kFull, v, offset);
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < static_cast<int>(blockDim.x / 32) ? warp_sums[lane] : 0.0f;
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(kFull, v, offset);
    if (lane == 0) atomicAdd(sum, v);
  }
}

// The order threads run in: each takes the next slot of a counter.
__global__ void record_order_kernel(int* out, int* counter) {
  out[atomicAdd(counter, 1)] = static_cast<int>(threadIdx.x);
}

// Thread t reads what thread t-1 wrote to shared memory: correct only with the barrier.
// `epoch` makes every launch write different values (shared memory is not cleared).
__global__ void neighbour_kernel(int* out, int epoch, int with_barrier) {
  KILN_SHARED(int, s, [256]);
  const int t = threadIdx.x;
  s[t] = epoch * 1000 + t;
  if (with_barrier) __syncthreads();  // uniform across the block: legal
  out[t] = t == 0 ? -1 : s[t - 1];
}

__global__ void sync_count_kernel(int* out) {
  const int t = threadIdx.x;
  const int count = __syncthreads_count(t % 3 == 0);
  const int all = __syncthreads_and(t < 50);
  const int any = __syncthreads_or(t == 99);
  if (t == 0) out[0] = count, out[1] = all, out[2] = any;
}

// Five warp patterns per thread: reduce down, butterfly (xor), broadcast, scan (up), and a
// butterfly with width 16. Lane values are warp * 100 + lane.
__global__ void warp_ops_kernel(int* out) {
  const int t = threadIdx.x, lane = t % 32;
  const int v = (t / 32) * 100 + lane;
  int down = v, x = v, scan = v, half = v;
  for (int o = 16; o > 0; o /= 2) down += __shfl_down_sync(kFull, down, o);
  for (int o = 16; o > 0; o /= 2) x += __shfl_xor_sync(kFull, x, o);
  const int bcast = __shfl_sync(kFull, v, 7);
  for (int o = 1; o < 32; o *= 2) {
    const int up = __shfl_up_sync(kFull, scan, o);
    if (lane >= o) scan += up;
  }
  for (int o = 8; o > 0; o /= 2) half += __shfl_xor_sync(kFull, half, o, 16);
  out[t * 5 + 0] = down, out[t * 5 + 1] = x, out[t * 5 + 2] = bcast, out[t * 5 + 3] = scan;
  out[t * 5 + 4] = half;
}

// A block of 40 threads: warp 1 is partial (8 lanes). Four results per thread.
__global__ void partial_warp_kernel(unsigned* out) {
  const unsigned t = threadIdx.x, lane = t % 32;
  const unsigned lanes = blockDim.x - t / 32 * 32 < 32 ? blockDim.x - t / 32 * 32 : 32;
  const unsigned mask = lanes == 32 ? kFull : (1u << lanes) - 1;
  // The reduction that is correct on a GPU for a partial warp: add only lanes that exist.
  unsigned s = t + 1;
  for (unsigned o = 16; o > 0; o /= 2) {
    const unsigned other = __shfl_down_sync(mask, s, o);
    if (lane + o < lanes) s += other;
  }
  out[t * 4 + 0] = __shfl_sync(mask, s, 0);
  out[t * 4 + 1] = __ballot_sync(mask, lane % 2 == 0);
  out[t * 4 + 2] = __activemask();
  out[t * 4 + 3] = __shfl_down_sync(kFull, t, 16);  // from lane+16: may not exist
}

__global__ void vote_kernel(int* out) {
  const int lane = threadIdx.x % 32;
  const int any = __any_sync(kFull, lane == 5);
  const int all_low = __all_sync(kFull, lane < 31);
  const int all = __all_sync(kFull, 1);
  int half = -1;
  if (lane < 16) half = __all_sync(0x0000ffffu, lane < 16);  // lanes 16..31 do not take part
  if (lane == 0) out[0] = any, out[1] = all_low, out[2] = all, out[3] = half;
}

// Thread i (< n) adds i + 1 in several ways.
__global__ void atomics_kernel(int n, unsigned long long* sum, int* mx, int* mn, int* count,
                               float* fsum, double* dsum) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  atomicAdd(sum, static_cast<unsigned long long>(i + 1));
  atomicMax(mx, i + 1);
  atomicMin(mn, i + 1);
  int old = atomicAdd(count, 0), assumed;
  do {  // an increment built from compare-and-swap
    assumed = old;
    old = atomicCAS(count, assumed, assumed + 1);
  } while (old != assumed);
  atomicAdd(fsum, 1.0f);
  atomicAdd(dsum, 0.5);
}

// Two arrays of blockDim.x floats in dynamic shared memory, read back reversed.
__global__ void dynamic_shared_kernel(float* out) {
  KILN_DYNAMIC_SHARED(float, buf);
  const unsigned t = threadIdx.x, n = blockDim.x;
  buf[t] = static_cast<float>(t);
  buf[n + t] = static_cast<float>(n - 1 - t);
  __syncthreads();
  if (blockIdx.x == 0) out[t] = buf[n - 1 - t] + buf[n + n - 1 - t];
}

// Copies what dynamic shared memory holds before anyone writes it (one float per thread), then
// writes it: the next block must not see these values.
__global__ void read_fresh_shared_kernel(float* out) {
  KILN_DYNAMIC_SHARED(float, buf);
  const unsigned t = threadIdx.x;
  out[blockIdx.x * blockDim.x + t] = buf[t];
  __syncthreads();
  buf[t] = 1.0f;
}

// Thread 0 loads one float4 from p (which must be 16-byte aligned) and adds its ends.
__global__ void load_float4_kernel(const float* p, float* out) {
  if (threadIdx.x == 0) {
    const float4 v = *reinterpret_cast<const float4*>(p);
    out[0] = v.x + v.w;
  }
}

// Thread 0 reads one float past the end of `n` floats of dynamic shared memory.
__global__ void shared_past_end_kernel(float* out, int n) {
  KILN_DYNAMIC_SHARED(float, buf);
  if (threadIdx.x == 0) out[0] = buf[n];
}

__global__ void fill_kernel(float* out, int value) {
  const unsigned threads = blockDim.x * blockDim.y * blockDim.z;
  const unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  out[blockIdx.x * threads + t] = static_cast<float>(value);
}

// Bug: thread 5 leaves before the barrier the others wait at.
__global__ void divergent_barrier_kernel(float* out) {
  if (threadIdx.x == 5) return;
  __syncthreads();
  out[threadIdx.x] = 1.0f;
}

// Bug: lane 3 waits at __syncthreads while the rest of its warp shuffles with a full mask.
__global__ void divergent_warp_kernel(float* out) {
  if (threadIdx.x == 3) {
    __syncthreads();
  } else {
    out[threadIdx.x] = __shfl_sync(kFull, 1.0f, 0);
  }
}

// Bug: a kernel that throws (kernels must not); the simulator reports it on the host.
__global__ void throwing_kernel(float* out) {
  if (blockIdx.x == 2 && threadIdx.x == 7) throw std::runtime_error("boom");
  out[threadIdx.x] = 1.0f;
}

}  // namespace kiln::sim_test
