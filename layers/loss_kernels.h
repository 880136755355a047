// loss_kernels.h: CPU kernels of the losses (layers/loss_cpu.cpp).
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
