// sim/cudnn_compute.h: the host arithmetic behind the simulated cuDNN calls (sim/cudnn_calls.cpp
// checks the arguments and queues these on the handle's stream). Plain NCHW / KCRS buffers;
// every function computes out = alpha op(...) + beta out and never reads out when beta is 0.
// The results of cudnnConvolutionForward, cudnnConvolutionBackwardData/Filter/Bias and
// cudnnAddTensor as the cuDNN API reference defines them
// (https://docs.nvidia.com/deeplearning/cudnn/api/).
#pragma once

#include <cstdint>
#include <vector>

namespace kiln::sim {

// The 16-bit data types (HALF, BFLOAT16) are computed in float: their buffers are widened
// (exactly) into float copies, the float functions below run, and the written buffer is rounded
// back (nearest even), with the conversion rules of engine/host_device.h.
enum class Format16 { Half, BFloat16 };
std::vector<float> widen_16(Format16 format, const void* p, int64_t count);
void narrow_16(Format16 format, const std::vector<float>& v, void* p);  // v.size() elements

// A 2-d convolution: x (N, C, H, W), w (K, C, R, S), y (N, K, P, Q) with
//   P = (H + 2 pad_h - ((R - 1) dil_h + 1)) / stride_h + 1, and likewise Q;
// y[n,k,p,q] = sum over c, r, s of w[k,c,r,s] x[n, c, p stride_h - pad_h + r' dil_h, ...] where
// r' = r for cross-correlation and R-1-r for convolution (the filter flipped), likewise s.
struct ConvShape {
  int64_t n, c, h, w;
  int64_t k, r, s;
  int64_t p, q;
  int64_t pad_h, pad_w, stride_h, stride_w, dil_h, dil_w;
  bool flip;  // CUDNN_CONVOLUTION
  // The descriptors' formats (sim/cudnn_layout.h), for the algorithm model (cudnn_algos.h):
  // the functions below read and write NCHW / KCRS buffers only, whatever these say.
  bool x_nhwc = false, w_nhwc = false, y_nhwc = false;
};

// `tf32`: round x, w and dy to TF32 first (float only), as tensor cores read them.
template <typename T>
void conv_forward_host(const ConvShape& g, T alpha, const T* x, const T* w, T beta, T* y,
                       bool tf32);
template <typename T>
void conv_backward_data_host(const ConvShape& g, T alpha, const T* w, const T* dy, T beta, T* dx,
                             bool tf32);
template <typename T>
void conv_backward_filter_host(const ConvShape& g, T alpha, const T* x, const T* dy, T beta,
                               T* dw, bool tf32);
// db (K) = alpha sum over n, p, q of dy (N, K, P, Q) + beta db.
template <typename T>
void conv_backward_bias_host(int64_t n, int64_t k, int64_t pq, T alpha, const T* dy, T beta,
                             T* db);
// c (4-d, dims cd) = alpha a + beta c, a (4-d, dims ad) broadcast where ad[i] == 1.
template <typename T>
void add_tensor_host(const int64_t ad[4], T alpha, const T* a, const int64_t cd[4], T beta, T* c);

}  // namespace kiln::sim
