// conv2d_kernels.h: the raw kernels of Conv2d (internal to layers/; include conv2d.h to use
// convolutions, and read its top comment for the map of every conv2d file). Kernels see
// contiguous row-major buffers and a ConvGeometry; all shape and device checks happened before,
// in conv2d.cpp.
//
// Every kernel has a twin of the same name and signature in the other backend's namespace,
// whose first parameter is that namespace's Backend (engine/dispatch.h): conv2d.cpp calls them
// unqualified and the backend's type picks the twin. The hand kernels are conv2d_forward,
// conv2d_backward_data and conv2d_backward_weight; the vendor library's carry the suffix
// _vendor (oneDNN on the CPU, float only; cuDNN on CUDA, float and double), and the
// low-precision ones of mixed precision (bf16 / f16 inputs, f32 outputs) are vendor only:
// conv2d_forward_lowp_vendor, conv2d_backward_lowp_vendor.
//
// Names: x (N, C, H, W) input, w (K, C, R, S) weights, b (K) bias, y (N, K, P, Q) output,
// with P = (H + 2*pad - R) / stride + 1 and Q = (W + 2*pad - S) / stride + 1.
// dy, dx, dw, db are the gradients of y, x, w, b (same shapes).
#pragma once

#include <cstdint>

#include "engine/backend.h"
#include "engine/dtype.h"

namespace kiln {

struct ConvGeometry {
  int64_t n, c, h, w;  // input (N, C, H, W)
  int64_t k, r, s;     // weights (K, C, R, S)
  int64_t stride, pad;
  int64_t p, q;        // output spatial size (P, Q)
  // x (and dx) in the channel-blocked layout of layers/layout.h, (N, C/16, H, W, 16); y (and
  // dy) blocked, (N, K/16, P, Q, 16). The oneDNN kernels only (conv2d.cpp converts for the
  // others).
  bool x_blocked = false, y_blocked = false;
  // x (and dx) and y (and dy) channels-last: logical (N, C, H, W), bytes in (N, H, W, C) order
  // (MemoryFormat, engine/tensor.h). Honoured by the hand kernels (CPU and CUDA), oneDNN (CPU)
  // and cuDNN (f32, f64; with y_nhwc == x_nhwc).
  bool x_nhwc = false, y_nhwc = false;
  // w (and dw) channels-last, KRSC (a weight moved with Module::to(MemoryFormat::ChannelsLast)):
  // honoured by the hand kernels (CPU and CUDA; the CPU ones repack a weight in the other order
  // than they want, conv2d_cpu.cpp), oneDNN and cuDNN (conv2d_cudnn.cu), with NCHW or NHWC
  // activations; conv2d.cpp hands the CUDA kernels the filter in x's order, the CPU ones the
  // weight as it is.
  bool w_nhwc = false;
  // The _lowp_ kernels only (autocast with AutocastOutputs::LowPrecision, engine/autocast.h): y
  // and dx in the inputs' 16-bit dtype, each element rounded once from its f32 sum, instead of
  // f32. dw and db stay f32 (they update the f32 master weights).
  bool y_lowp = false;
};

}  // namespace kiln

namespace kiln::cpu {

// ---- hand kernels (conv2d_cpu.cpp): im2col + GEMM (OpenBLAS), float and double ---------------
// x, dx, y, dy may be channels-last (g.x_nhwc, g.y_nhwc, which must be equal) and w, dw KRSC
// (g.w_nhwc), in any combination: the shapes below are logical, the byte orders g's.
// y = conv(x, w) + b. b may be null (no bias). y is written, never read.
template <typename T>
void conv2d_forward(Backend,
                    const T* x,  // x is (N, C, H, W)
                    const T* w,  // w is (K, C, R, S)
                    const T* b,  // b is (K) or null
                    T* y,        // y is (N, K, P, Q)
                    const ConvGeometry& g);

// dx = conv_transpose(dy, w). dx is written, never read.
template <typename T>
void conv2d_backward_data(Backend,
                          const T* dy,  // dy is (N, K, P, Q)
                          const T* w,   // w is (K, C, R, S)
                          T* dx,        // dx is (N, C, H, W)
                          const ConvGeometry& g);

// dw = sum over images of dy[n] * im2col(x[n])^T; db = sum of dy over (N, P, Q).
// dw or db may be null when that gradient is not needed. Both are written, never read.
// Bit-reproducible for a fixed thread count (partial sums reduced in thread order).
template <typename T>
void conv2d_backward_weight(Backend,
                            const T* x,   // x is (N, C, H, W)
                            const T* dy,  // dy is (N, K, P, Q)
                            T* dw,        // dw is (K, C, R, S) or null
                            T* db,        // db is (K) or null
                            const ConvGeometry& g);

// ---- vendor kernels (conv2d_dnnl.cpp): oneDNN, float only --------------------------------------
// Same contracts as the hand kernels above; x, dx and y, dy may be channel-blocked (g says).
// Backward is one call: dy is reordered into oneDNN's layout once for both gradients. dx, dw,
// db may each be null (not needed), but db only with dw: oneDNN sums the bias gradient in the
// weight pass (conv2d.cpp computes a lone db itself).
void conv2d_forward_vendor(Backend, const float* x, const float* w, const float* b, float* y,
                           const ConvGeometry& g);
void conv2d_backward_vendor(Backend,
                            const float* x,   // x is (N, C, H, W)
                            const float* dy,  // dy is (N, K, P, Q)
                            const float* w,   // w is (K, C, R, S)
                            float* dx,        // dx is (N, C, H, W) or null
                            float* dw,        // dw is (K, C, R, S) or null
                            float* db,        // db is (K) or null, and null when dw is
                            const ConvGeometry& g);

// ---- vendor kernels for mixed precision (conv2d_dnnl_lowp.cpp) ----------------------------------
// oneDNN convolution with bf16/f16 x and w, f32 bias, and y f32 or (g.y_lowp) in `in`
// (forward); dy low precision, dx f32 or (g.y_lowp) in `in`, dw/db f32 (backward). `in` is
// DType::BF16 or DType::F16, the format of the uint16_t bit patterns; y and dx are void* for
// that reason. NCHW or channels-last (g.x_blocked and g.y_blocked false). Return false, doing
// nothing, when oneDNN has no non-reference implementation for `in` on this CPU (the caller then
// converts and runs the f32 kernels). The products are exact and summed in f32.
bool conv2d_forward_lowp_vendor(Backend, DType in,
                                const uint16_t* x,  // x is (N, C, H, W)
                                const uint16_t* w,  // w is (K, C, R, S)
                                const float* b,     // b is (K) or null
                                void* y,            // y is (N, K, P, Q), written, never read
                                const ConvGeometry& g);
// dx, dw, db may each be null (not needed), db only with dw as in conv2d_backward_vendor; x may
// be null when dw and db are, w when dx is.
bool conv2d_backward_lowp_vendor(Backend, DType in,
                                 const uint16_t* x,   // x is (N, C, H, W)
                                 const uint16_t* dy,  // dy is (N, K, P, Q)
                                 const uint16_t* w,   // w is (K, C, R, S)
                                 void* dx,            // dx is (N, C, H, W) or null
                                 float* dw,           // dw is (K, C, R, S) or null
                                 float* db,           // db is (K) or null, and null when dw is
                                 const ConvGeometry& g);

}  // namespace kiln::cpu

// ---- CUDA (layers/conv2d_cuda.cu, layers/conv2d_cudnn.cu) -------------------------------------
// The same contracts as the CPU kernels, with device pointers of the current device. Work is
// queued on cuda::current_stream() (the op holds a cuda::DeviceGuard) and the calls return
// without synchronising. The hand kernels are deterministic: the same inputs give the same bits
// on every run (no atomics; sums in a fixed order). The cuDNN path picks deterministic
// algorithms too, wherever cuDNN offers one for the shape (conv2d_cudnn.cu).
namespace kiln::cuda {

// ---- hand kernels (conv2d_cuda.cu): implicit GEMM, float and double ---------------------------
// x, dx, y, dy may be channels-last (g.x_nhwc, with g.y_nhwc the same), w and dw KRSC
// (g.w_nhwc), in any combination.
template <typename T>
void conv2d_forward(Backend,
                    const T* x,  // x is (N, C, H, W)
                    const T* w,  // w is (K, C, R, S)
                    const T* b,  // b is (K) or null
                    T* y,        // y is (N, K, P, Q), written, never read
                    const ConvGeometry& g);
template <typename T>
void conv2d_backward_data(Backend,
                          const T* dy,  // dy is (N, K, P, Q)
                          const T* w,   // w is (K, C, R, S)
                          T* dx,        // dx is (N, C, H, W), written, never read
                          const ConvGeometry& g);
// dw or db may be null (not needed); x may be null when dw is.
template <typename T>
void conv2d_backward_weight(Backend,
                            const T* x,   // x is (N, C, H, W)
                            const T* dy,  // dy is (N, K, P, Q)
                            T* dw,        // dw is (K, C, R, S) or null
                            T* db,        // db is (K) or null
                            const ConvGeometry& g);

// Which hand kernel runs, for the tests and benchmarks (conv2d_cuda.cu explains each step):
//   Direct        step 1: one thread per output element, plain loops (the readable reference)
//   ImplicitGemm  step 2: register-blocked tiles of the im2col GEMM, the default
enum class ConvKernel { Direct, ImplicitGemm };
// The implicit GEMM's block tile (rows of the GEMM x columns). Auto picks per shape; double
// always runs 64x64 (a forced float tile is ignored for double).
enum class ConvTile { Auto, T64x64, T64x128, T128x128 };
struct ConvCudaOptions {
  ConvKernel kernel = ConvKernel::ImplicitGemm;
  ConvTile tile = ConvTile::Auto;
  int weight_splits = 0;  // backward-weight split-K factor; 0 = chosen per shape
};
// Process-wide; tests force each launch branch with it, benchmarks compare the steps. It only
// chooses among the hand kernels: whether the hand or the vendor kernels run at all is
// conv_impl's decision (engine/impl.h). Set it while no convolution runs on another thread.
ConvCudaOptions conv2d_cuda_options();
void set_conv2d_cuda_options(const ConvCudaOptions& options);
const char* conv_kernel_name(ConvKernel kernel);  // "direct" | "implicit-gemm"

// ---- vendor kernels (conv2d_cudnn.cu): cuDNN (simulated under the simulator) ----------------
// Same contracts as the hand kernels. Backward is one call; dx, dw, db may each be null (db
// also without dw: cuDNN sums it on its own). x, dx and y, dy may be channels-last (g.x_nhwc,
// g.y_nhwc), w and dw KRSC (g.w_nhwc), here and in the _lowp_ twins.
template <typename T>
void conv2d_forward_vendor(Backend, const T* x, const T* w, const T* b, T* y,
                           const ConvGeometry& g);
template <typename T>
void conv2d_backward_vendor(Backend,
                            const T* x,   // x is (N, C, H, W), or null when dw is
                            const T* dy,  // dy is (N, K, P, Q)
                            const T* w,   // w is (K, C, R, S), or null when dx is
                            T* dx,        // dx is (N, C, H, W) or null
                            T* dw,        // dw is (K, C, R, S) or null
                            T* db,        // db is (K) or null
                            const ConvGeometry& g);

// Mixed precision through cuDNN: x, w (and dy) are bf16 or f16 bit patterns (`in` is
// DType::BF16 or DType::F16), the sums run in float on tensor cores (CUDNN_DATA_BFLOAT16 /
// CUDNN_DATA_HALF with compute type FLOAT, CUDNN_TENSOR_OP_MATH). cuDNN writes y, dx and dw in
// `in`, each rounded once from its float sum: with g.y_lowp, y (without bias) and dx are
// written in place; otherwise they land in scratch and are widened into the f32 outputs.
// b and db are f32: y = widen(conv(x, w)) + b, db = the f32 sum of widened dy. They return
// true (they always run), as the CPU twins do when oneDNN has a kernel.
bool conv2d_forward_lowp_vendor(Backend, DType in,
                                const uint16_t* x,  // x is (N, C, H, W)
                                const uint16_t* w,  // w is (K, C, R, S)
                                const float* b,     // b is (K) or null
                                void* y,            // y is (N, K, P, Q), written, never read
                                const ConvGeometry& g);
// dx, dw, db may each be null (not needed); x may be null when dw is, w when dx is.
bool conv2d_backward_lowp_vendor(Backend, DType in,
                                 const uint16_t* x,   // x is (N, C, H, W)
                                 const uint16_t* dy,  // dy is (N, K, P, Q)
                                 const uint16_t* w,   // w is (K, C, R, S)
                                 void* dx,            // dx is (N, C, H, W) or null
                                 float* dw,           // dw is (K, C, R, S) or null
                                 float* db,           // db is (K) or null
                                 const ConvGeometry& g);

}  // namespace kiln::cuda
