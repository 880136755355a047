// loss_kernels.h: kernels of the losses: CPU (layers/loss_cpu.cpp) and CUDA (loss_cuda.cu).
// The cross-entropy twins have one name and signature in cpu:: and cuda::, the backend's tag
// first (engine/dispatch.h); the fused mean squared error has CUDA kernels only (the CPU op
// composes sub, square and mean).
//
// Scalars that flow between kernels (the loss, the incoming gradient of the loss, the row of a
// bad target) live in memory of the kernel's device: on a GPU they stay there, and the op
// decides when to read one back.
#pragma once

#include <cstdint>

#include "engine/backend.h"

namespace kiln::cpu {

// logits is (N, C), targets (N). Writes probs (N, C) = softmax(logits); *loss (one element) =
// the mean over rows of -log softmax[target], summed in double; *bad_row = a row whose target is
// outside [0, C), or -1 (such rows add nothing to the sum). row_loss is the CUDA twin's
// workspace: not read here (null).
template <typename T>
void cross_entropy_forward(Backend, const T* logits, const int64_t* targets, T* probs, T* loss,
                           int64_t* bad_row, double* row_loss, int64_t n, int64_t c);

// grad_logits (N, C) = (probs - one_hot(targets)) * grad_loss[0] / N, with grad_loss the
// scalar gradient of the loss.
template <typename T>
void cross_entropy_backward(Backend, const T* probs, const int64_t* targets, T* grad_logits,
                            int64_t n, int64_t c, const T* grad_loss);

}  // namespace kiln::cpu

// ---- CUDA (layers/loss_cuda.cu) --------------------------------------------------------------
// Device pointers throughout; kernels launch on cuda::current_stream() and do not synchronise.
namespace kiln::cuda {

// As the CPU twin, on the device: *loss is summed in double in a fixed order, *bad_row is the
// FIRST bad row (or -1), and row_loss is an (N) device workspace of doubles.
template <typename T>
void cross_entropy_forward(Backend, const T* logits, const int64_t* targets, T* probs, T* loss,
                           int64_t* bad_row, double* row_loss, int64_t n, int64_t c);

// As the CPU twin; grad_loss is read by the kernel (no round trip to the host).
template <typename T>
void cross_entropy_backward(Backend, const T* probs, const int64_t* targets, T* grad_logits,
                            int64_t n, int64_t c, const T* grad_loss);

// How many doubles of workspace mse_loss_forward needs for n elements.
int64_t mse_loss_workspace_size(int64_t n);

// a, b are (n): *loss (a device scalar) = mean((a - b)^2), accumulated in double in a fixed
// order (per-block partial sums into `partials`, then one block adds them up).
template <typename T>
void mse_loss_forward(Backend, const T* a, const T* b, T* loss, double* partials, int64_t n);

// a, b, grad_a, grad_b are (n): grad_a = 2 (a - b) * grad_loss[0] / n and grad_b = -grad_a;
// either output may be null when that gradient is not wanted.
template <typename T>
void mse_loss_backward(Backend, const T* a, const T* b, const T* grad_loss, T* grad_a, T* grad_b,
                       int64_t n);

}  // namespace kiln::cuda
