// multi_tensor.h: one launch for the optimizer step of many parameters on CUDA (the design of
// apex's multi_tensor_apply, https://github.com/NVIDIA/apex/blob/master/csrc/multi_tensor_apply.cuh,
// and of PyTorch's torch._foreach_* / fused=True optimizers).
//
// Stepping each parameter with its own kernels costs two launches per parameter (a one-thread
// *_prepare, then the fused update; optim_kernels.h): 322 of a ResNet-50 step's launches for its
// 161 parameter tensors, most of them tiny. Here the whole step is
//   - one *_prepare_multi launch, one thread per parameter running the very *_prepare rule of
//     the per-parameter path (its step count and its coefficients, in double), and
//   - one *_step_multi launch over a table of chunks: every parameter is cut into chunks of
//     kChunkElems elements, and block b updates chunk b of the table with the optimizer's
//     per-element rule (sgd_update / adam_update), reading its tensor's coefficients.
// Same rule, same coefficients computed the same way: the parameters and state come out bit
// for bit as on the per-parameter path.
//
// The tables travel as kernel arguments (by value: plain structs of pointers and counts), not
// in device memory: gradients are new tensors every step, so their pointers would have to be
// uploaded every step anyway, and an argument is part of the launch (a CUDA graph captures
// it). Kernel arguments are limited to 4 KB (the CUDA C++ Programming Guide, "Function
// Parameters": https://docs.nvidia.com/cuda/cuda-c-programming-guide/#function-parameters;
// 32 KB from CUDA 12.1 on Volta and later, not relied on here), so a table holds at most
// kMaxTensors tensors and kMaxChunks chunks; more parameters take several launches, each with
// as many as fit.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/backend.h"

namespace kiln {

namespace multi_tensor {

inline constexpr int kMaxTensors = 48;         // tensors of one update launch
inline constexpr int kMaxChunks = 256;         // chunks (= blocks) of one update launch
inline constexpr int64_t kChunkElems = 65536;  // elements of a chunk: 256 per thread
inline constexpr int kMaxPrepare = 240;        // parameters of one *_prepare_multi launch

// One parameter of an update launch: p, g and up to two state buffers (null when unused), all
// of n elements of the launch's dtype, and its coefficients (written by *_prepare_multi).
struct TensorArgs {
  void* p;
  const void* g;
  void* s1;  // SGD: momentum_buffer (null without momentum); Adam: exp_avg
  void* s2;  // Adam: exp_avg_sq
  const double* coefs;
  int64_t n;
};

// The kernel argument of an update launch: the tensors (arrays of each field, so that the
// struct packs without padding) and, for each chunk = block, its tensor and its index there.
struct UpdateTable {
  void* p[kMaxTensors];
  const void* g[kMaxTensors];
  void* s1[kMaxTensors];
  void* s2[kMaxTensors];
  const double* coefs[kMaxTensors];
  int64_t n[kMaxTensors];
  int32_t chunk[kMaxChunks];
  uint8_t tensor[kMaxChunks];
};

// One parameter of a prepare launch: its step count and its coefficient scratch.
struct PrepareArgs {
  int64_t* step;
  double* coefs;
};

// The kernel argument of a prepare launch: thread i prepares parameter i (i < count).
struct PrepareTable {
  int64_t* step[kMaxPrepare];
  double* coefs[kMaxPrepare];
  int32_t count;
};

// With the other arguments of the kernels (a few pointers and scalars), both stay within 4 KB.
static_assert(sizeof(UpdateTable) <= 3840, "UpdateTable must fit the 4 KB of kernel arguments");
static_assert(sizeof(PrepareTable) <= 3904, "PrepareTable must fit the 4 KB of kernel arguments");

}  // namespace multi_tensor

// The CUDA kernels (engine/cuda/kernels/optim_multi.cu): every parameter of `params` on the
// current device, of element type T, updated in as few launches as the tables allow. The CPU
// steps its parameters one by one (optim_kernels.h), so these have no CPU twins; the
// optimizers call them for CUDA parameters only (Optimizer::update_all).
namespace cuda {

void sgd_prepare_multi(Backend, const std::vector<multi_tensor::PrepareArgs>& params,
                       const double* lr, const int32_t* skip);
template <typename T>
void sgd_step_multi(Backend, const std::vector<multi_tensor::TensorArgs>& params,
                    const int32_t* skip, T momentum, T dampening, T wd, bool nesterov);
void adam_prepare_multi(Backend, const std::vector<multi_tensor::PrepareArgs>& params,
                        const double* lr, const int32_t* skip, double beta1, double beta2,
                        double decoupled_wd);
template <typename T>
void adam_step_multi(Backend, const std::vector<multi_tensor::TensorArgs>& params,
                     const int32_t* skip, T beta1, T beta2, T eps, T wd_l2);

}  // namespace cuda

}  // namespace kiln
