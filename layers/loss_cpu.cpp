// loss_cpu.cpp: CPU kernels of the fused softmax-cross-entropy.
#include <cmath>
#include <cstdint>

#include "layers/loss_kernels.h"

namespace kiln::cpu {

template <typename T>
void cross_entropy_forward(Backend, const T* logits, const int64_t* targets, T* probs, T* loss,
                           int64_t* bad_row, double* /*row_loss*/, int64_t n, int64_t c) {
  double total = 0;
  int64_t bad = -1;
#pragma omp parallel for reduction(+ : total) if (n * c > (1 << 14))
  for (int64_t i = 0; i < n; ++i) {
    const T* row = logits + i * c;
    T* p = probs + i * c;
    T mx = row[0];
    for (int64_t j = 1; j < c; ++j) mx = row[j] > mx ? row[j] : mx;
    T sum = 0;
    for (int64_t j = 0; j < c; ++j) {
      p[j] = std::exp(row[j] - mx);
      sum += p[j];
    }
    for (int64_t j = 0; j < c; ++j) p[j] /= sum;
    int64_t t = targets[i];
    if (t < 0 || t >= c) {
#pragma omp critical
      bad = i;
      continue;
    }
    // -log softmax[t] = log(sum) + mx - row[t]
    total += static_cast<double>(std::log(sum) + mx - row[t]);
  }
  *bad_row = bad;
  *loss = static_cast<T>(total / static_cast<double>(n));
}

template <typename T>
void cross_entropy_backward(Backend, const T* probs, const int64_t* targets, T* grad_logits,
                            int64_t n, int64_t c, const T* grad_loss) {
  T scale = *grad_loss / static_cast<T>(n);
#pragma omp parallel for if (n * c > (1 << 14))
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < c; ++j) {
      T onehot = j == targets[i] ? T(1) : T(0);
      grad_logits[i * c + j] = (probs[i * c + j] - onehot) * scale;
    }
  }
}

template void cross_entropy_forward<float>(Backend, const float*, const int64_t*, float*, float*,
                                           int64_t*, double*, int64_t, int64_t);
template void cross_entropy_forward<double>(Backend, const double*, const int64_t*, double*,
                                            double*, int64_t*, double*, int64_t, int64_t);
template void cross_entropy_backward<float>(Backend, const float*, const int64_t*, float*, int64_t,
                                            int64_t, const float*);
template void cross_entropy_backward<double>(Backend, const double*, const int64_t*, double*,
                                             int64_t, int64_t, const double*);

}  // namespace kiln::cpu
