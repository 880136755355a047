// optim_multi.cu: the optimizer step of many parameters in few launches (declared in
// engine/optim/multi_tensor.h, which explains the design).
//
// Prepare: one thread per parameter, each running the per-parameter path's rule
// (optim_device.h) on its own step count and coefficients: the parameters are independent,
// so no thread waits for another.
// Update: block b takes chunk b of the table, elements [chunk * kChunkElems, +kChunkElems) of
// one tensor clipped to its size, and its 256 threads stride through them, each element
// through the optimizer's per-element rule in the loop the per-parameter kernels run
// (sgd_elements / adam_elements, optim_device.h, calling sgd_update / adam_update as the CPU
// loop does). A set skip flag makes every block return at once.
#include "engine/cuda/runtime.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/cuda/context.h"
#include "engine/cuda/kernels/common.h"
#include "engine/cuda/kernels/optim_device.h"
#include "engine/cuda/launch.h"
#include "engine/optim/adam.h"
#include "engine/optim/multi_tensor.h"
#include "engine/optim/optim_kernels.h"
#include "engine/optim/sgd.h"

namespace kiln::cuda {

namespace {

using multi_tensor::kChunkElems;
using multi_tensor::PrepareArgs;
using multi_tensor::PrepareTable;
using multi_tensor::TensorArgs;
using multi_tensor::UpdateTable;

constexpr int kPrepareThreads = 128;

__global__ void sgd_prepare_multi_kernel(PrepareTable table, const double* lr,
                                         const int32_t* skip) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < table.count) sgd_prepare_one(lr, table.step[i], skip, table.coefs[i]);
}

__global__ void adam_prepare_multi_kernel(PrepareTable table, const double* lr,
                                          const int32_t* skip, double beta1, double beta2,
                                          double decoupled_wd) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < table.count)
    adam_prepare_one(lr, table.step[i], skip, beta1, beta2, decoupled_wd, table.coefs[i]);
}

// The element range [begin, end) of this block's chunk, and its tensor's index k.
struct Chunk {
  int k;
  int64_t begin, end;
};

__device__ __forceinline__ Chunk chunk_of_block(const UpdateTable& table) {
  const int k = table.tensor[blockIdx.x];
  const int64_t begin = static_cast<int64_t>(table.chunk[blockIdx.x]) * kChunkElems;
  const int64_t end = begin + kChunkElems < table.n[k] ? begin + kChunkElems : table.n[k];
  return Chunk{k, begin, end};
}

template <typename T>
__global__ void sgd_step_multi_kernel(UpdateTable table, const int32_t* skip, T momentum,
                                      T dampening, T wd, bool nesterov) {
  if (skip && *skip != 0) return;
  const Chunk c = chunk_of_block(table);
  sgd_elements<T>(static_cast<T*>(table.p[c.k]), static_cast<const T*>(table.g[c.k]),
                  static_cast<T*>(table.s1[c.k]), c.begin + threadIdx.x, c.end, blockDim.x,
                  table.coefs[c.k], momentum, dampening, wd, nesterov);
}

template <typename T>
__global__ void adam_step_multi_kernel(UpdateTable table, const int32_t* skip, T beta1, T beta2,
                                       T eps, T wd_l2) {
  if (skip && *skip != 0) return;
  const Chunk c = chunk_of_block(table);
  adam_elements<T>(static_cast<T*>(table.p[c.k]), static_cast<const T*>(table.g[c.k]),
                   static_cast<T*>(table.s1[c.k]), static_cast<T*>(table.s2[c.k]),
                   c.begin + threadIdx.x, c.end, blockDim.x, table.coefs[c.k], beta1, beta2, eps,
                   wd_l2);
}

// Calls launch_one(table) for each prepare table of `params`, in order.
template <typename Fn>
void for_each_prepare_table(const std::vector<PrepareArgs>& params, Fn&& launch_one) {
  for (size_t first = 0; first < params.size(); first += multi_tensor::kMaxPrepare) {
    PrepareTable table{};
    const size_t count = std::min<size_t>(multi_tensor::kMaxPrepare, params.size() - first);
    for (size_t i = 0; i < count; ++i) {
      table.step[i] = params[first + i].step;
      table.coefs[i] = params[first + i].coefs;
    }
    table.count = static_cast<int32_t>(count);
    launch_one(table, LaunchConfig{dim3(blocks_for(table.count, kPrepareThreads)),
                                   dim3(kPrepareThreads), 0, current_stream()});
  }
}

// Calls launch_one(table, config) for each update table of `params`: tensors are added in order,
// chunk by chunk, and a table is launched when it has no room for the next tensor or chunk (a
// tensor may so be split across two launches). Empty tensors take no chunk.
template <typename Fn>
void for_each_update_table(const std::vector<TensorArgs>& params, Fn&& launch_one) {
  UpdateTable table{};
  int tensors = 0, chunks = 0;
  auto flush = [&] {
    if (chunks > 0)
      launch_one(table, LaunchConfig{dim3(static_cast<unsigned>(chunks)),
                                     dim3(kElementwiseThreads), 0, current_stream()});
    table = UpdateTable{};
    tensors = chunks = 0;
  };
  for (const TensorArgs& t : params) {
    const int64_t n_chunks = (t.n + kChunkElems - 1) / kChunkElems;
    for (int64_t c = 0; c < n_chunks; ++c) {
      // The tensor enters the table with its first chunk, or again after a flush.
      if (c == 0 || chunks == 0) {
        if (tensors == multi_tensor::kMaxTensors) flush();
        table.p[tensors] = t.p;
        table.g[tensors] = t.g;
        table.s1[tensors] = t.s1;
        table.s2[tensors] = t.s2;
        table.coefs[tensors] = t.coefs;
        table.n[tensors] = t.n;
        ++tensors;
      }
      table.tensor[chunks] = static_cast<uint8_t>(tensors - 1);
      table.chunk[chunks] = static_cast<int32_t>(c);
      ++chunks;
      if (chunks == multi_tensor::kMaxChunks) flush();
    }
  }
  flush();
}

}  // namespace

void sgd_prepare_multi(Backend, const std::vector<PrepareArgs>& params, const double* lr,
                       const int32_t* skip) {
  for_each_prepare_table(params, [&](const PrepareTable& table, const LaunchConfig& cfg) {
    launch(sgd_prepare_multi_kernel, cfg, table, lr, skip);
  });
}

template <typename T>
void sgd_step_multi(Backend, const std::vector<TensorArgs>& params, const int32_t* skip,
                    T momentum, T dampening, T wd, bool nesterov) {
  for_each_update_table(params, [&](const UpdateTable& table, const LaunchConfig& cfg) {
    launch(sgd_step_multi_kernel<T>, cfg, table, skip, momentum, dampening, wd, nesterov);
  });
}

void adam_prepare_multi(Backend, const std::vector<PrepareArgs>& params, const double* lr,
                        const int32_t* skip, double beta1, double beta2, double decoupled_wd) {
  for_each_prepare_table(params, [&](const PrepareTable& table, const LaunchConfig& cfg) {
    launch(adam_prepare_multi_kernel, cfg, table, lr, skip, beta1, beta2, decoupled_wd);
  });
}

template <typename T>
void adam_step_multi(Backend, const std::vector<TensorArgs>& params, const int32_t* skip,
                     T beta1, T beta2, T eps, T wd_l2) {
  for_each_update_table(params, [&](const UpdateTable& table, const LaunchConfig& cfg) {
    launch(adam_step_multi_kernel<T>, cfg, table, skip, beta1, beta2, eps, wd_l2);
  });
}

#define KILN_INSTANTIATE(T)                                                                 \
  template void sgd_step_multi<T>(Backend, const std::vector<TensorArgs>&, const int32_t*, \
                                  T, T, T, bool);                                          \
  template void adam_step_multi<T>(Backend, const std::vector<TensorArgs>&, const int32_t*, \
                                   T, T, T, T);
KILN_INSTANTIATE(float)
KILN_INSTANTIATE(double)
#undef KILN_INSTANTIATE

}  // namespace kiln::cuda
