// loss_kernels.h: kernels of the losses: CPU (layers/loss_cpu.cpp) and CUDA (loss_cuda.cu).
#pragma once

#include <cstdint>

namespace kiln::cpu {

// logits is (N, C), targets (N); writes probs (N, C) = softmax(logits) and returns the mean
// negative log-likelihood. A target outside [0, C) sets *bad_index to its row (else -1).
template <typename T>
double cross_entropy_forward(const T* logits, const int64_t* targets, T* probs, int64_t n,
                             int64_t c, int64_t* bad_index);

// grad_logits (N, C) = (probs - one_hot(targets)) * grad_loss / N.
template <typename T>
void cross_entropy_backward(const T* probs, const int64_t* targets, T* grad_logits, int64_t n,
                            int64_t c, T grad_loss);

}  // namespace kiln::cpu

// ---- CUDA (layers/loss_cuda.cu) --------------------------------------------------------------
// Device pointers throughout; kernels launch on cuda::current_stream() and do not synchronise.
// Scalars that flow between kernels (the loss, the incoming gradient of the loss, the row of a
// bad target) stay on the device: the op decides when to read one back.
namespace kiln::cuda {

// logits is (N, C), targets (N). Writes probs (N, C) = softmax(logits); *loss (a device
// scalar) = the mean over rows of -log softmax[target], summed in double in a fixed order;
// *bad_row (a device i64) = the FIRST row whose target is outside [0, C), or -1 (such rows
// add nothing to the sum). row_loss is an (N) device workspace of doubles.
template <typename T>
void cross_entropy_forward_cuda(const T* logits, const int64_t* targets, T* probs, T* loss,
                                int64_t* bad_row, double* row_loss, int64_t n, int64_t c);

// grad_logits (N, C) = (probs - one_hot(targets)) * grad_loss[0] / N, with grad_loss the
// device scalar gradient of the loss (read by the kernel: no round trip to the host).
template <typename T>
void cross_entropy_backward_cuda(const T* probs, const int64_t* targets, T* grad_logits,
                                 int64_t n, int64_t c, const T* grad_loss);

// How many doubles of workspace mse_loss_forward_cuda needs for n elements.
int64_t mse_loss_workspace_size(int64_t n);

// a, b are (n): *loss (a device scalar) = mean((a - b)^2), accumulated in double in a fixed
// order (per-block partial sums into `partials`, then one block adds them up).
template <typename T>
void mse_loss_forward_cuda(const T* a, const T* b, T* loss, double* partials, int64_t n);

// a, b, grad_a, grad_b are (n): grad_a = 2 (a - b) * grad_loss[0] / n and grad_b = -grad_a;
// either output may be null when that gradient is not wanted.
template <typename T>
void mse_loss_backward_cuda(const T* a, const T* b, const T* grad_loss, T* grad_a, T* grad_b,
                            int64_t n);

}  // namespace kiln::cuda
