// sim/cudnn_layout.cpp: NCHW <-> NHWC copies for the simulated cuDNN (see cudnn_layout.h).
#include "engine/cuda/sim/cudnn_layout.h"

#include <cstdint>

namespace kiln::sim {

template <typename T>
void nhwc_to_nchw(const int64_t d[4], const T* nhwc, T* nchw) {
  const int64_t c_count = d[1], hw = d[2] * d[3];
  for (int64_t n = 0; n < d[0]; ++n)
    for (int64_t c = 0; c < c_count; ++c)
      for (int64_t i = 0; i < hw; ++i)  // i = h W + w
        nchw[(n * c_count + c) * hw + i] = nhwc[(n * hw + i) * c_count + c];
}

template <typename T>
void nchw_to_nhwc(const int64_t d[4], const T* nchw, T* nhwc) {
  const int64_t c_count = d[1], hw = d[2] * d[3];
  for (int64_t n = 0; n < d[0]; ++n)
    for (int64_t i = 0; i < hw; ++i)
      for (int64_t c = 0; c < c_count; ++c)
        nhwc[(n * hw + i) * c_count + c] = nchw[(n * c_count + c) * hw + i];
}

template void nhwc_to_nchw<float>(const int64_t[4], const float*, float*);
template void nhwc_to_nchw<double>(const int64_t[4], const double*, double*);
template void nchw_to_nhwc<float>(const int64_t[4], const float*, float*);
template void nchw_to_nhwc<double>(const int64_t[4], const double*, double*);

}  // namespace kiln::sim
