// sim/cudnn_layout.h: the simulated cuDNN's two 4-d layouts (cudnnTensorFormat_t). A tensor
// descriptor always takes the logical dimensions (N, C, H, W), a filter descriptor (K, C, R, S);
// the format says in which order their packed elements lie:
//   CUDNN_TENSOR_NCHW  (n, c, h, w) at ((n C + c) H + h) W + w     a filter: KCRS
//   CUDNN_TENSOR_NHWC  (n, c, h, w) at ((n H + h) W + w) C + c     a filter: KRSC
// (cuDNN API reference, cudnnTensorFormat_t: https://docs.nvidia.com/deeplearning/cudnn/api/).
// The host arithmetic (cudnn_compute.h) reads NCHW only: an NHWC operand is gathered into an
// NCHW copy, computed as if NCHW, and the written one scattered back. The sums therefore run in
// the same order for both layouts, and an NHWC result is the NCHW one permuted, bit for bit.
// (Real cuDNN runs other kernels on NHWC data, with their own summation order; the simulator
// does not model that, as it does not model each algorithm's.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kiln::sim {

// Packed (d0, d1, d2, d3) in NCHW order <-> the same elements in NHWC order (d0, d2, d3, d1).
template <typename T>
void nhwc_to_nchw(const int64_t dims[4], const T* nhwc, T* nchw);
template <typename T>
void nchw_to_nhwc(const int64_t dims[4], const T* nchw, T* nhwc);

// One operand of a call, seen as NCHW: the buffer itself when it is NCHW, otherwise an NCHW
// copy gathered from it; store() scatters the copy back (for the operand the call writes).
template <typename T>
class NchwOperand {
 public:
  NchwOperand(bool nhwc, const int64_t dims[4], T* p) : nhwc_(nhwc), p_(p) {
    for (int i = 0; i < 4; ++i) dims_[i] = dims[i];
    if (nhwc_) {
      copy_.resize(static_cast<size_t>(dims[0] * dims[1] * dims[2] * dims[3]));
      nhwc_to_nchw(dims_, p_, copy_.data());
    }
  }
  T* data() { return nhwc_ ? copy_.data() : p_; }
  void store() {
    if (nhwc_) nchw_to_nhwc(dims_, copy_.data(), p_);
  }

 private:
  bool nhwc_;
  T* p_;
  int64_t dims_[4];
  std::vector<T> copy_;
};

}  // namespace kiln::sim
