// conv2d_cudnn.cu: the vendor CUDA path of Conv2d, through cuDNN 9's convolution API (the
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
// by the geometry, the dtype, the device and the TF32 switch, for the life of the process.
//
// Workspace: the algorithms need scratch memory, up to kMaxWorkspace per call. It is a device
// Tensor allocated per call: the caching allocator hands back the same block every step, and
// returns it to the pool when the tensor dies, ordered after the queued cuDNN kernels (they
// run on this thread's current_stream(), which cudnn_handle() binds).
//
// Bias: forward adds it with cudnnAddTensor (broadcast of a (1, K, 1, 1) tensor); backward
// sums dy per channel with cudnnConvolutionBackwardBias. Layouts are our plain NCHW and KCRS:
// cuDNN takes them as they are, no reorders.
#include "engine/cuda/runtime.h"

#include <algorithm>
#include <array>
#include <climits>
#include <map>
#include <memory>
#include <mutex>
#include <type_traits>
#include <vector>

#include "engine/cuda/blas.h"
#include "engine/cuda/context.h"
#include "engine/cuda/dnn.h"
#include "engine/error.h"
#include "engine/tensor.h"
#include "layers/conv2d_kernels.h"

namespace kiln::cuda {

namespace {

constexpr size_t kMaxWorkspace = size_t(512) << 20;  // bytes offered to the algorithm search

std::string geometry_str(const ConvGeometry& g) {
  return detail::str("input [", g.n, ", ", g.c, ", ", g.h, ", ", g.w, "], weight [", g.k, ", ",
                     g.c, ", ", g.r, ", ", g.s, "], stride ", g.stride, ", padding ", g.pad);
}

template <typename T>
constexpr cudnnDataType_t cudnn_dtype() {
  return std::is_same_v<T, float> ? CUDNN_DATA_FLOAT : CUDNN_DATA_DOUBLE;
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
  cudnnTensorDescriptor_t x = nullptr, y = nullptr, bias = nullptr;
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
    for (auto* t : {x, y, bias})
      if (t) (void)cudnnDestroyTensorDescriptor(t);
  }
};

template <typename T>
void make_conv_descriptor(cudnnConvolutionDescriptor_t* conv, const ConvGeometry& g,
                          cudnnMathType_t math) {
  KILN_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(conv));
  KILN_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(
      *conv, static_cast<int>(g.pad), static_cast<int>(g.pad), static_cast<int>(g.stride),
      static_cast<int>(g.stride), 1, 1, CUDNN_CROSS_CORRELATION, cudnn_dtype<T>()));
  KILN_CUDNN_CHECK(cudnnSetConvolutionMathType(*conv, math));
}

template <typename T>
std::unique_ptr<Plan> make_plan(const ConvGeometry& g, bool tf32) {
  auto plan = std::make_unique<Plan>();
  const cudnnDataType_t dt = cudnn_dtype<T>();
  const auto i = [](int64_t v) { return static_cast<int>(v); };
  KILN_CUDNN_CHECK(cudnnCreateTensorDescriptor(&plan->x));
  KILN_CUDNN_CHECK(cudnnSetTensor4dDescriptor(plan->x, CUDNN_TENSOR_NCHW, dt, i(g.n), i(g.c),
                                              i(g.h), i(g.w)));
  KILN_CUDNN_CHECK(cudnnCreateTensorDescriptor(&plan->y));
  KILN_CUDNN_CHECK(cudnnSetTensor4dDescriptor(plan->y, CUDNN_TENSOR_NCHW, dt, i(g.n), i(g.k),
                                              i(g.p), i(g.q)));
  KILN_CUDNN_CHECK(cudnnCreateTensorDescriptor(&plan->bias));
  KILN_CUDNN_CHECK(
      cudnnSetTensor4dDescriptor(plan->bias, CUDNN_TENSOR_NCHW, dt, 1, i(g.k), 1, 1));
  KILN_CUDNN_CHECK(cudnnCreateFilterDescriptor(&plan->w));
  KILN_CUDNN_CHECK(cudnnSetFilter4dDescriptor(plan->w, dt, CUDNN_TENSOR_NCHW, i(g.k), i(g.c),
                                              i(g.r), i(g.s)));
  plan->fp32_strict = std::is_same_v<T, float> && !tf32;
  plan->math = plan->fp32_strict ? CUDNN_FMA_MATH : CUDNN_DEFAULT_MATH;
  make_conv_descriptor<T>(&plan->fwd.conv, g, plan->math);
  make_conv_descriptor<T>(&plan->bwd_data.conv, g, plan->math);
  make_conv_descriptor<T>(&plan->bwd_filter.conv, g, plan->math);
  return plan;
}

// The cache. Choosing an algorithm happens under the lock too: it runs once per shape.
using Key = std::array<int64_t, 12>;
std::mutex g_plans_mutex;
std::map<Key, std::unique_ptr<Plan>> g_plans;

template <typename T>
Key plan_key(const ConvGeometry& g, bool tf32) {
  return {g.n, g.c, g.h, g.w, g.k, g.r, g.s, g.stride, g.pad,
          static_cast<int64_t>(cudnn_dtype<T>()), current_device(), tf32 ? 1 : 0};
}

// A device workspace of `bytes` (none for 0), alive as long as the returned tensor.
Tensor workspace_tensor(size_t bytes) {
  if (bytes == 0) return Tensor();
  return Tensor::empty({static_cast<int64_t>(bytes)}, DType::U8,
                       Device(DeviceType::CUDA, current_device()));
}
void* ptr(const Tensor& t) { return t.defined() ? t.raw_data() : nullptr; }

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

template <typename T>
Plan& plan_for(const ConvGeometry& g) {
  const bool tf32 = std::is_same_v<T, float> && tf32_enabled();
  const Key key = plan_key<T>(g, tf32);
  auto it = g_plans.find(key);
  if (it == g_plans.end()) it = g_plans.emplace(key, make_plan<T>(g, tf32)).first;
  return *it->second;
}

}  // namespace

template <typename T>
void conv2d_forward_cudnn(const T* x, const T* w, const T* b, T* y, const ConvGeometry& g) {
  if (g.n == 0) return;
  cudnnHandle_t handle = cudnn_handle();
  std::unique_lock<std::mutex> lock(g_plans_mutex);
  Plan& plan = plan_for<T>(g);
  if (!plan.fwd.chosen) {
    int max_count = 0, count = 0;
    KILN_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(handle, &max_count));
    std::vector<cudnnConvolutionFwdAlgoPerf_t> perf(static_cast<size_t>(std::max(max_count, 1)));
    KILN_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(
        handle, plan.x, plan.w, plan.fwd.conv, plan.y, max_count, &count, perf.data()));
    const size_t bytes = search_workspace(perf, count);
    Tensor ws = workspace_tensor(bytes);
    KILN_CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithmEx(
        handle, plan.x, x, plan.w, w, plan.fwd.conv, plan.y, y, max_count, &count, perf.data(),
        ptr(ws), bytes));
    choose(plan.fwd, plan, perf, count, bytes, "forward", g);
  }
  const Pass<cudnnConvolutionFwdAlgo_t> pass = plan.fwd;
  lock.unlock();  // the plan never changes again for this pass, and never moves

  Tensor ws = workspace_tensor(pass.workspace);
  const T one = 1, zero = 0;
  KILN_CUDNN_CHECK(cudnnConvolutionForward(handle, &one, plan.x, x, plan.w, w, pass.conv,
                                           pass.algo, ptr(ws), pass.workspace, &zero, plan.y, y));
  if (b) KILN_CUDNN_CHECK(cudnnAddTensor(handle, &one, plan.bias, b, &one, plan.y, y));
}

template <typename T>
void conv2d_backward_cudnn(const T* x, const T* dy, const T* w, T* dx, T* dw, T* db,
                           const ConvGeometry& g) {
  if (g.n == 0) return;  // the op zeroes dw and db of an empty batch itself
  cudnnHandle_t handle = cudnn_handle();
  std::unique_lock<std::mutex> lock(g_plans_mutex);
  Plan& plan = plan_for<T>(g);
  if (dx && !plan.bwd_data.chosen) {
    int max_count = 0, count = 0;
    KILN_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(handle, &max_count));
    std::vector<cudnnConvolutionBwdDataAlgoPerf_t> perf(
        static_cast<size_t>(std::max(max_count, 1)));
    KILN_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(
        handle, plan.w, plan.y, plan.bwd_data.conv, plan.x, max_count, &count, perf.data()));
    const size_t bytes = search_workspace(perf, count);
    Tensor ws = workspace_tensor(bytes);
    KILN_CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithmEx(
        handle, plan.w, w, plan.y, dy, plan.bwd_data.conv, plan.x, dx, max_count, &count,
        perf.data(), ptr(ws), bytes));
    choose(plan.bwd_data, plan, perf, count, bytes, "backward-data", g);
  }
  if (dw && !plan.bwd_filter.chosen) {
    int max_count = 0, count = 0;
    KILN_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(handle, &max_count));
    std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> perf(
        static_cast<size_t>(std::max(max_count, 1)));
    KILN_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
        handle, plan.x, plan.y, plan.bwd_filter.conv, plan.w, max_count, &count, perf.data()));
    const size_t bytes = search_workspace(perf, count);
    Tensor ws = workspace_tensor(bytes);
    KILN_CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithmEx(
        handle, plan.x, x, plan.y, dy, plan.bwd_filter.conv, plan.w, dw, max_count, &count,
        perf.data(), ptr(ws), bytes));
    choose(plan.bwd_filter, plan, perf, count, bytes, "backward-filter", g);
  }
  const Pass<cudnnConvolutionBwdDataAlgo_t> data = plan.bwd_data;
  const Pass<cudnnConvolutionBwdFilterAlgo_t> filter = plan.bwd_filter;
  lock.unlock();

  const T one = 1, zero = 0;
  if (dx) {
    Tensor ws = workspace_tensor(data.workspace);
    KILN_CUDNN_CHECK(cudnnConvolutionBackwardData(handle, &one, plan.w, w, plan.y, dy, data.conv,
                                                  data.algo, ptr(ws), data.workspace, &zero,
                                                  plan.x, dx));
  }
  if (dw) {
    Tensor ws = workspace_tensor(filter.workspace);
    KILN_CUDNN_CHECK(cudnnConvolutionBackwardFilter(handle, &one, plan.x, x, plan.y, dy,
                                                    filter.conv, filter.algo, ptr(ws),
                                                    filter.workspace, &zero, plan.w, dw));
  }
  if (db)
    KILN_CUDNN_CHECK(cudnnConvolutionBackwardBias(handle, &one, plan.y, dy, &zero, plan.bias, db));
}

template void conv2d_forward_cudnn<float>(const float*, const float*, const float*, float*,
                                          const ConvGeometry&);
template void conv2d_forward_cudnn<double>(const double*, const double*, const double*, double*,
                                           const ConvGeometry&);
template void conv2d_backward_cudnn<float>(const float*, const float*, const float*, float*,
                                           float*, float*, const ConvGeometry&);
template void conv2d_backward_cudnn<double>(const double*, const double*, const double*,
                                            double*, double*, double*, const ConvGeometry&);

}  // namespace kiln::cuda
