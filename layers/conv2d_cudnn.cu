// conv2d_cudnn.cu: the vendor CUDA path of Conv2d (cuda::conv2d_forward_vendor,
// conv2d_backward_vendor and their _lowp_ forms), through cuDNN 9's convolution API (the
// "legacy" descriptor API: cudnnConvolutionForward / BackwardData / BackwardFilter). Under the
// CUDA simulator cuDNN is its simulated subset (engine/cuda/sim/cudnn.h).
//
// cuDNN describes a convolution with descriptors (tensor shapes and layouts, filter, padding,
// stride, math type) and offers many algorithms per pass (implicit GEMM, precomputed-index
// GEMM, FFT, Winograd, ...), whose speed depends on the shape. We choose once per shape and
// pass, the first time it runs, with cudnnFind*AlgorithmEx: cuDNN runs every candidate on our
// real buffers and reports them sorted by time. We keep the fastest that is
//   - deterministic (some backward algorithms add partial results with atomics, so their bits
//     change from run to run; Kiln's kernels are deterministic, and the cost is small), and
//   - of the allowed math: FP32 convolutions must not use TF32 tensor cores (inputs rounded to
//     10 mantissa bits) unless TF32 is switched on (engine/cuda/blas.h, env KILN_TF32=1): the
//     descriptor says CUDNN_FMA_MATH, the same rule as our cuBLAS GEMMs.
// The choice, with the descriptors and the workspace size it needs, is cached in a map keyed
// by the geometry (its layouts included), the dtype, the device and the TF32 switch, for the
// life of the process.
//
// Workspace: the algorithms need scratch memory, up to kMaxWorkspace per call. It is a device
// Tensor allocated per call: the caching allocator hands back the same block every step, and
// returns it to the pool when the tensor dies, ordered after the queued cuDNN kernels (they
// run on this thread's current_stream(), which cudnn_handle() binds).
//
// Bias: forward adds it with cudnnAddTensor (broadcast of a (1, K, 1, 1) tensor); backward
// sums dy per channel with cudnnConvolutionBackwardBias.
//
// Layouts: our plain NCHW activations with KCRS weights, or channels-last activations
// (g.x_nhwc, g.y_nhwc: CUDNN_TENSOR_NHWC descriptors) with the weight channels-last too, KRSC
// (g.w_nhwc: an NHWC filter descriptor); cuDNN reads both as they are, no reorders. Why KRSC:
// the API reference's tables of supported configurations (cudnnConvolutionForward,
// ...BackwardData, ...BackwardFilter; https://docs.nvidia.com/deeplearning/cudnn/api/) do accept
// NHWC tensors with an NCHW filter (except for FFT), but the kernels that make NHWC worth having,
// the implicit-GEMM tensor-core kernels, read the filter NHWC: given a KCRS filter, cuDNN
// transforms the operands itself before calling them ("padding, folding, and NCHW-to-NHWC
// transformations", Legacy API, Tensor Core "Data and Filter Formats":
// https://docs.nvidia.com/deeplearning/cudnn/latest/developer/legacy-api.html), once per call.
// So the cuDNN path gets the weight in x's format, as PyTorch gives cuDNN its weight in the
// input's memory format: a model moved with Module::to(MemoryFormat::ChannelsLast) has KRSC
// weights already; otherwise conv2d.cpp hands over a copy (w.to(x's format), small, counted;
// none for 1x1 filters, whose two orders coincide) and brings dw back. With an NHWC filter
// cuDNN runs only its implicit-GEMM algorithms; the search below picks among them.
//
// Mixed precision (conv2d_forward_lowp_vendor, conv2d_backward_lowp_vendor): x, w and dy in bf16
// or f16, summed in float on the tensor cores: cuDNN's PSEUDO_HALF_CONFIG and
// PSEUDO_BFLOAT16_CONFIG (CUDNN_DATA_HALF or CUDNN_DATA_BFLOAT16 descriptors, compute type
// FLOAT, CUDNN_TENSOR_OP_MATH; cuDNN API reference, cudnnConvolutionForward's table of
// supported configurations). The legacy API writes the output in the inputs' type, so y, dx and
// dw land in 16-bit scratch (each element rounded once from its float sum) and are widened into
// the caller's f32 buffers (engine/cuda/kernels/copy.h); the bias is added in f32 on FLOAT
// descriptors, and db sums dy widened exactly to f32. Their plans share the cache, keyed by the
// 16-bit type, and their algorithms are chosen by the same rule (any math type is allowed).
// They take channels-last activations and KRSC weights as the f32 path does: the widening
// copies are element-wise, the same order in and out.
#include "engine/cuda/runtime.h"

#include <algorithm>
#include <array>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "engine/cuda/blas.h"
#include "engine/cuda/context.h"
#include "engine/cuda/dnn.h"
#include "engine/cuda/kernels/copy.h"
#include "engine/error.h"
#include "engine/tensor.h"
#include "layers/conv2d_kernels.h"

namespace kiln::cuda {

namespace {

constexpr size_t kMaxWorkspace = size_t(512) << 20;  // bytes offered to the algorithm search

std::string geometry_str(const ConvGeometry& g) {
  return detail::str("input [", g.n, ", ", g.c, ", ", g.h, ", ", g.w, "]",
                     g.x_nhwc ? " channels-last" : "", ", weight [", g.k, ", ", g.c, ", ", g.r,
                     ", ", g.s, "]", g.w_nhwc ? " KRSC" : "", ", stride ", g.stride, ", padding ",
                     g.pad);
}

template <typename T>
constexpr cudnnDataType_t cudnn_dtype() {
  return std::is_same_v<T, float> ? CUDNN_DATA_FLOAT : CUDNN_DATA_DOUBLE;
}

bool is_16bit(cudnnDataType_t dt) { return dt == CUDNN_DATA_HALF || dt == CUDNN_DATA_BFLOAT16; }

// The cuDNN type of a 16-bit Kiln dtype; an Error for the others.
cudnnDataType_t cudnn_lowp_dtype(DType in, const char* who) {
  KILN_CHECK(is_low_precision(in), who, ": x, w (and dy) must be bf16 or f16, not ",
             dtype_name(in), " (conv2d_forward_vendor / conv2d_backward_vendor take f32 and f64)");
  return in == DType::BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
}

// cuDNN's scaling factors: double for DOUBLE data, float for the others.
const void* scalar_one(cudnnDataType_t dt) {
  static const double d = 1;
  static const float f = 1;
  return dt == CUDNN_DATA_DOUBLE ? static_cast<const void*>(&d) : &f;
}
const void* scalar_zero(cudnnDataType_t dt) {
  static const double d = 0;
  static const float f = 0;
  return dt == CUDNN_DATA_DOUBLE ? static_cast<const void*>(&d) : &f;
}

// One pass (forward, backward-data or backward-filter) of a cached plan: its own convolution
// descriptor (the math type belongs to the chosen algorithm), the algorithm and its workspace.
template <typename Algo>
struct Pass {
  cudnnConvolutionDescriptor_t conv = nullptr;
  Algo algo{};
  size_t workspace = 0;
  bool chosen = false;
};

// Everything cuDNN needs for one convolution shape. Created once, never moved or destroyed
// while the process runs (the map owns it through a unique_ptr).
struct Plan {
  cudnnDataType_t type = CUDNN_DATA_FLOAT;  // of x, w and y (and dx, dw, dy)
  cudnnTensorDescriptor_t x = nullptr, y = nullptr, bias = nullptr;
  // 16-bit plans: y (N, K, P, Q) in FLOAT, the f32 output the bias is added to and the f32 dy
  // the bias gradient sums; bias is FLOAT there too. Null for FLOAT and DOUBLE plans.
  cudnnTensorDescriptor_t y_f32 = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  bool fp32_strict = false;  // FP32 without TF32: only CUDNN_FMA_MATH algorithms
  Pass<cudnnConvolutionFwdAlgo_t> fwd;
  Pass<cudnnConvolutionBwdDataAlgo_t> bwd_data;
  Pass<cudnnConvolutionBwdFilterAlgo_t> bwd_filter;

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    for (auto* c : {fwd.conv, bwd_data.conv, bwd_filter.conv})
      if (c) (void)cudnnDestroyConvolutionDescriptor(c);
    if (w) (void)cudnnDestroyFilterDescriptor(w);
    for (auto* t : {x, y, bias, y_f32})
      if (t) (void)cudnnDestroyTensorDescriptor(t);
  }
};

// `compute`: the type cuDNN sums in (the data type, or FLOAT for 16-bit data).
void make_conv_descriptor(cudnnConvolutionDescriptor_t* conv, const ConvGeometry& g,
                          cudnnDataType_t compute, cudnnMathType_t math) {
  KILN_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(conv));
  KILN_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(
      *conv, static_cast<int>(g.pad), static_cast<int>(g.pad), static_cast<int>(g.stride),
      static_cast<int>(g.stride), 1, 1, CUDNN_CROSS_CORRELATION, compute));
  KILN_CUDNN_CHECK(cudnnSetConvolutionMathType(*conv, math));
}

// The logical (n, c, h, w), packed as NCHW or, with `nhwc`, NHWC (channels-last).
void make_tensor(cudnnTensorDescriptor_t* t, cudnnDataType_t dt, int64_t n, int64_t c, int64_t h,
                 int64_t w, bool nhwc = false) {
  const auto i = [](int64_t v) { return static_cast<int>(v); };
  const cudnnTensorFormat_t format = nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
  KILN_CUDNN_CHECK(cudnnCreateTensorDescriptor(t));
  KILN_CUDNN_CHECK(cudnnSetTensor4dDescriptor(*t, format, dt, i(n), i(c), i(h), i(w)));
}

// The math type the algorithms may use:
//   FLOAT   CUDNN_FMA_MATH without TF32 (strict FP32), else CUDNN_DEFAULT_MATH (TF32 allowed);
//   DOUBLE  CUDNN_DEFAULT_MATH;
//   16-bit  CUDNN_TENSOR_OP_MATH: 16-bit inputs, products exact in the float accumulator.
std::unique_ptr<Plan> make_plan(const ConvGeometry& g, cudnnDataType_t dt, bool tf32) {
  auto plan = std::make_unique<Plan>();
  const bool lowp = is_16bit(dt);
  const cudnnDataType_t f32_or_dt = lowp ? CUDNN_DATA_FLOAT : dt;  // bias, compute type
  plan->type = dt;
  make_tensor(&plan->x, dt, g.n, g.c, g.h, g.w, g.x_nhwc);
  make_tensor(&plan->y, dt, g.n, g.k, g.p, g.q, g.y_nhwc);
  make_tensor(&plan->bias, f32_or_dt, 1, g.k, 1, 1);  // (1, K, 1, 1): the same in both formats
  if (lowp) make_tensor(&plan->y_f32, CUDNN_DATA_FLOAT, g.n, g.k, g.p, g.q, g.y_nhwc);
  const auto i = [](int64_t v) { return static_cast<int>(v); };
  KILN_CUDNN_CHECK(cudnnCreateFilterDescriptor(&plan->w));
  KILN_CUDNN_CHECK(cudnnSetFilter4dDescriptor(plan->w, dt,
                                              g.w_nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW,
                                              i(g.k), i(g.c), i(g.r), i(g.s)));
  plan->fp32_strict = dt == CUDNN_DATA_FLOAT && !tf32;
  plan->math = plan->fp32_strict ? CUDNN_FMA_MATH
               : lowp            ? CUDNN_TENSOR_OP_MATH
                                 : CUDNN_DEFAULT_MATH;
  make_conv_descriptor(&plan->fwd.conv, g, f32_or_dt, plan->math);
  make_conv_descriptor(&plan->bwd_data.conv, g, f32_or_dt, plan->math);
  make_conv_descriptor(&plan->bwd_filter.conv, g, f32_or_dt, plan->math);
  return plan;
}

// The cache. Choosing an algorithm happens under the lock too: it runs once per shape.
using Key = std::array<int64_t, 13>;
std::mutex g_plans_mutex;
std::map<Key, std::unique_ptr<Plan>> g_plans;

Key plan_key(const ConvGeometry& g, cudnnDataType_t dt, bool tf32) {
  const int64_t layouts = g.x_nhwc * 4 + g.y_nhwc * 2 + g.w_nhwc;
  return {g.n, g.c, g.h, g.w, g.k, g.r, g.s, g.stride, g.pad,
          static_cast<int64_t>(dt), current_device(), tf32 ? 1 : 0, layouts};
}

// A device workspace of `bytes` (none for 0), alive as long as the returned tensor.
Tensor workspace_tensor(size_t bytes) {
  if (bytes == 0) return Tensor();
  return Tensor::empty({static_cast<int64_t>(bytes)}, DType::U8,
                       Device(DeviceType::CUDA, current_device()));
}
void* ptr(const Tensor& t) { return t.defined() ? t.raw_data() : nullptr; }

// A device tensor of `count` elements of `dtype` on the current device (caching allocator).
Tensor scratch_tensor(int64_t count, DType dtype) {
  return Tensor::empty({count}, dtype, Device(DeviceType::CUDA, current_device()));
}

// The search workspace: the most that any candidate the heuristics list as runnable asks for,
// up to kMaxWorkspace (algorithms that need more are not tried).
template <typename Perf>
size_t search_workspace(const std::vector<Perf>& heuristics, int count) {
  size_t bytes = 0;
  for (int i = 0; i < count; ++i)
    if (heuristics[i].status == CUDNN_STATUS_SUCCESS && heuristics[i].memory <= kMaxWorkspace)
      bytes = std::max(bytes, heuristics[i].memory);
  return bytes;
}

// From the timed results (fastest first): the fastest deterministic algorithm of the allowed
// math that fits the workspace, else the fastest of the allowed math.
template <typename Perf, typename Algo>
void choose(Pass<Algo>& pass, const Plan& plan, const std::vector<Perf>& found, int count,
            size_t workspace, const char* what, const ConvGeometry& g) {
  auto usable = [&](const Perf& p) {
    return p.status == CUDNN_STATUS_SUCCESS && p.memory <= workspace &&
           (!plan.fp32_strict || p.mathType == CUDNN_FMA_MATH);
  };
  const Perf* best = nullptr;
  for (int i = 0; i < count && !best; ++i)
    if (usable(found[i]) && found[i].determinism == CUDNN_DETERMINISTIC) best = &found[i];
  for (int i = 0; i < count && !best; ++i)
    if (usable(found[i])) best = &found[i];
  if (!best)
    throw Error(detail::str("cuDNN offers no ", what, " algorithm for ", geometry_str(g),
                            plan.fp32_strict ? " in FP32 without TF32: allow TF32 (KILN_TF32=1) "
                                               "or use the hand kernels (KILN_KERNELS=hand)"
                                             : ": use the hand kernels (KILN_KERNELS=hand)"));
  pass.algo = best->algo;
  pass.workspace = best->memory;
  // The algorithm was timed with this math type; it must run with it.
  KILN_CUDNN_CHECK(cudnnSetConvolutionMathType(pass.conv, best->mathType));
  pass.chosen = true;
}

// The plan for this geometry and data type, made on first use. Call under g_plans_mutex.
Plan& plan_for(const ConvGeometry& g, cudnnDataType_t dt) {
  const bool tf32 = dt == CUDNN_DATA_FLOAT && tf32_enabled();
  const Key key = plan_key(g, dt, tf32);
  auto it = g_plans.find(key);
  if (it == g_plans.end()) it = g_plans.emplace(key, make_plan(g, dt, tf32)).first;
  return *it->second;
}

// Each pass's algorithm, chosen on first use: the heuristics list the candidates, Find times
// them on the real buffers (it overwrites the output: y, dx or dw), choose() keeps one. Call
// under g_plans_mutex; the returned copy stays valid (a chosen pass never changes).
Pass<cudnnConvolutionFwdAlgo_t> forward_pass(cudnnHandle_t handle, Plan& plan, const void* x,
                                             const void* w, void* y, const ConvGeometry& g) {
  if (!plan.fwd.chosen) {
    int max_count = 0, count = 0;
    KILN_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(handle, &max_count));
    std::vector<cudnnConvolutionFwdAlgoPerf_t> perf(static_cast<size_t>(std::max(max_count, 1)));
    KILN_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(
        handle, plan.x, plan.w, plan.fwd.conv, plan.y, max_count, &count, perf.data()));
    const size_t bytes = search_workspace(perf, count);
    Tensor ws = workspace_tensor(bytes);
    KILN_CUDNN_LAUNCH(cudnnFindConvolutionForwardAlgorithmEx(
        handle, plan.x, x, plan.w, w, plan.fwd.conv, plan.y, y, max_count, &count, perf.data(),
        ptr(ws), bytes));
    choose(plan.fwd, plan, perf, count, bytes, "forward", g);
  }
  return plan.fwd;
}

Pass<cudnnConvolutionBwdDataAlgo_t> backward_data_pass(cudnnHandle_t handle, Plan& plan,
                                                       const void* w, const void* dy, void* dx,
                                                       const ConvGeometry& g) {
  if (!plan.bwd_data.chosen) {
    int max_count = 0, count = 0;
    KILN_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(handle, &max_count));
    std::vector<cudnnConvolutionBwdDataAlgoPerf_t> perf(
        static_cast<size_t>(std::max(max_count, 1)));
    KILN_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(
        handle, plan.w, plan.y, plan.bwd_data.conv, plan.x, max_count, &count, perf.data()));
    const size_t bytes = search_workspace(perf, count);
    Tensor ws = workspace_tensor(bytes);
    KILN_CUDNN_LAUNCH(cudnnFindConvolutionBackwardDataAlgorithmEx(
        handle, plan.w, w, plan.y, dy, plan.bwd_data.conv, plan.x, dx, max_count, &count,
        perf.data(), ptr(ws), bytes));
    choose(plan.bwd_data, plan, perf, count, bytes, "backward-data", g);
  }
  return plan.bwd_data;
}

Pass<cudnnConvolutionBwdFilterAlgo_t> backward_filter_pass(cudnnHandle_t handle, Plan& plan,
                                                           const void* x, const void* dy,
                                                           void* dw, const ConvGeometry& g) {
  if (!plan.bwd_filter.chosen) {
    int max_count = 0, count = 0;
    KILN_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(handle, &max_count));
    std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> perf(
        static_cast<size_t>(std::max(max_count, 1)));
    KILN_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
        handle, plan.x, plan.y, plan.bwd_filter.conv, plan.w, max_count, &count, perf.data()));
    const size_t bytes = search_workspace(perf, count);
    Tensor ws = workspace_tensor(bytes);
    KILN_CUDNN_LAUNCH(cudnnFindConvolutionBackwardFilterAlgorithmEx(
        handle, plan.x, x, plan.y, dy, plan.bwd_filter.conv, plan.w, dw, max_count, &count,
        perf.data(), ptr(ws), bytes));
    choose(plan.bwd_filter, plan, perf, count, bytes, "backward-filter", g);
  }
  return plan.bwd_filter;
}

// y = conv(x, w) in the plan's data type, with the chosen algorithm.
void run_forward(cudnnHandle_t handle, const Plan& plan,
                 const Pass<cudnnConvolutionFwdAlgo_t>& pass, const void* x, const void* w,
                 void* y) {
  Tensor ws = workspace_tensor(pass.workspace);
  KILN_CUDNN_LAUNCH(cudnnConvolutionForward(handle, scalar_one(plan.type), plan.x, x, plan.w, w,
                                           pass.conv, pass.algo, ptr(ws), pass.workspace,
                                           scalar_zero(plan.type), plan.y, y));
}

// dx = conv_transpose(dy, w).
void run_backward_data(cudnnHandle_t handle, const Plan& plan,
                       const Pass<cudnnConvolutionBwdDataAlgo_t>& pass, const void* w,
                       const void* dy, void* dx) {
  Tensor ws = workspace_tensor(pass.workspace);
  KILN_CUDNN_LAUNCH(cudnnConvolutionBackwardData(handle, scalar_one(plan.type), plan.w, w, plan.y,
                                                dy, pass.conv, pass.algo, ptr(ws), pass.workspace,
                                                scalar_zero(plan.type), plan.x, dx));
}

// dw = sum over images of dy * x.
void run_backward_filter(cudnnHandle_t handle, const Plan& plan,
                         const Pass<cudnnConvolutionBwdFilterAlgo_t>& pass, const void* x,
                         const void* dy, void* dw) {
  Tensor ws = workspace_tensor(pass.workspace);
  KILN_CUDNN_LAUNCH(cudnnConvolutionBackwardFilter(handle, scalar_one(plan.type), plan.x, x,
                                                  plan.y, dy, pass.conv, pass.algo, ptr(ws),
                                                  pass.workspace, scalar_zero(plan.type), plan.w,
                                                  dw));
}

}  // namespace

template <typename T>
void conv2d_forward_vendor(Backend, const T* x, const T* w, const T* b, T* y,
                           const ConvGeometry& g) {
  if (g.n == 0) return;
  cudnnHandle_t handle = cudnn_handle();
  std::unique_lock<std::mutex> lock(g_plans_mutex);
  Plan& plan = plan_for(g, cudnn_dtype<T>());
  const Pass<cudnnConvolutionFwdAlgo_t> pass = forward_pass(handle, plan, x, w, y, g);
  lock.unlock();  // the plan never changes again for this pass, and never moves

  run_forward(handle, plan, pass, x, w, y);
  const T one = 1;
  if (b) KILN_CUDNN_LAUNCH(cudnnAddTensor(handle, &one, plan.bias, b, &one, plan.y, y));
}

template <typename T>
void conv2d_backward_vendor(Backend, const T* x, const T* dy, const T* w, T* dx, T* dw, T* db,
                            const ConvGeometry& g) {
  if (g.n == 0) return;  // the op zeroes dw and db of an empty batch itself
  cudnnHandle_t handle = cudnn_handle();
  std::unique_lock<std::mutex> lock(g_plans_mutex);
  Plan& plan = plan_for(g, cudnn_dtype<T>());
  Pass<cudnnConvolutionBwdDataAlgo_t> data;
  Pass<cudnnConvolutionBwdFilterAlgo_t> filter;
  if (dx) data = backward_data_pass(handle, plan, w, dy, dx, g);
  if (dw) filter = backward_filter_pass(handle, plan, x, dy, dw, g);
  lock.unlock();

  if (dx) run_backward_data(handle, plan, data, w, dy, dx);
  if (dw) run_backward_filter(handle, plan, filter, x, dy, dw);
  const T one = 1, zero = 0;
  if (db)
    KILN_CUDNN_LAUNCH(cudnnConvolutionBackwardBias(handle, &one, plan.y, dy, &zero, plan.bias, db));
}

bool conv2d_forward_lowp_vendor(Backend, DType in, const uint16_t* x, const uint16_t* w,
                                const float* b, void* y, const ConvGeometry& g) {
  const cudnnDataType_t dt = cudnn_lowp_dtype(in, "conv2d_forward_lowp_vendor");
  if (g.n == 0) return true;
  cudnnHandle_t handle = cudnn_handle();
  // cuDNN writes y in the input type: in place for a 16-bit y without bias; otherwise into
  // scratch, widened into an f32 y (the bias is added there), rounded back for a 16-bit one.
  const int64_t y_count = g.n * g.k * g.p * g.q;
  const bool in_place = g.y_lowp && b == nullptr;
  const Tensor y16 = in_place ? Tensor() : scratch_tensor(y_count, in);
  void* y_cudnn = in_place ? y : y16.raw_data();
  std::unique_lock<std::mutex> lock(g_plans_mutex);
  Plan& plan = plan_for(g, dt);
  const Pass<cudnnConvolutionFwdAlgo_t> pass = forward_pass(handle, plan, x, w, y_cudnn, g);
  lock.unlock();

  run_forward(handle, plan, pass, x, w, y_cudnn);
  if (in_place) return true;
  const Tensor y32 = g.y_lowp ? scratch_tensor(y_count, DType::F32) : Tensor();
  void* y_f32 = g.y_lowp ? y32.raw_data() : y;
  convert(y16.raw_data(), in, y_f32, DType::F32, y_count);
  const float one = 1;
  if (b) KILN_CUDNN_LAUNCH(cudnnAddTensor(handle, &one, plan.bias, b, &one, plan.y_f32, y_f32));
  if (g.y_lowp) convert(y_f32, DType::F32, y, in, y_count);
  return true;
}

bool conv2d_backward_lowp_vendor(Backend, DType in, const uint16_t* x, const uint16_t* dy,
                                 const uint16_t* w, void* dx, float* dw, float* db,
                                 const ConvGeometry& g) {
  const cudnnDataType_t dt = cudnn_lowp_dtype(in, "conv2d_backward_lowp_vendor");
  if (g.n == 0) return true;  // as conv2d_backward_vendor: the op zeroes dw, db of an empty batch
  cudnnHandle_t handle = cudnn_handle();
  // dx and dw come out of cuDNN in the input type: into scratch, widened afterwards.
  const int64_t x_count = g.n * g.c * g.h * g.w, w_count = g.k * g.c * g.r * g.s;
  const int64_t y_count = g.n * g.k * g.p * g.q;
  // A 16-bit dx (g.y_lowp) is written in place.
  const Tensor dx16 = dx && !g.y_lowp ? scratch_tensor(x_count, in) : Tensor();
  void* dx_cudnn = g.y_lowp ? dx : ptr(dx16);
  const Tensor dw16 = dw ? scratch_tensor(w_count, in) : Tensor();
  std::unique_lock<std::mutex> lock(g_plans_mutex);
  Plan& plan = plan_for(g, dt);
  Pass<cudnnConvolutionBwdDataAlgo_t> data;
  Pass<cudnnConvolutionBwdFilterAlgo_t> filter;
  if (dx) data = backward_data_pass(handle, plan, w, dy, dx_cudnn, g);
  if (dw) filter = backward_filter_pass(handle, plan, x, dy, ptr(dw16), g);
  lock.unlock();

  if (dx) {
    run_backward_data(handle, plan, data, w, dy, dx_cudnn);
    if (!g.y_lowp) convert(ptr(dx16), in, dx, DType::F32, x_count);
  }
  if (dw) {
    run_backward_filter(handle, plan, filter, x, dy, ptr(dw16));
    convert(ptr(dw16), in, dw, DType::F32, w_count);
  }
  if (db) {  // summed in f32 from dy widened exactly, as the f32 path sums an f32 dy
    const Tensor dy32 = scratch_tensor(y_count, DType::F32);
    convert(dy, in, dy32.raw_data(), DType::F32, y_count);
    const float one = 1, zero = 0;
    KILN_CUDNN_LAUNCH(cudnnConvolutionBackwardBias(handle, &one, plan.y_f32, dy32.raw_data(), &zero,
                                                  plan.bias, db));
  }
  return true;
}

#define KILN_INSTANTIATE_CONV(T)                                                              \
  template void conv2d_forward_vendor<T>(Backend, const T*, const T*, const T*, T*,           \
                                         const ConvGeometry&);                                \
  template void conv2d_backward_vendor<T>(Backend, const T*, const T*, const T*, T*, T*, T*,  \
                                          const ConvGeometry&);
KILN_INSTANTIATE_CONV(float)
KILN_INSTANTIATE_CONV(double)
#undef KILN_INSTANTIATE_CONV

}  // namespace kiln::cuda
