// sim/cudnn_calls.cpp: the simulated cuDNN subset (sim/cudnn.h), part two: the algorithm
// queries and the computing calls (handles and descriptors: sim/cudnn.cpp). Every call checks
// its arguments first, as the cuDNN API reference lists them
// (https://docs.nvidia.com/deeplearning/cudnn/api/) (null or unset descriptors,
// shapes that disagree, data types that differ: CUDNN_STATUS_BAD_PARAM; outside the subset:
// CUDNN_STATUS_NOT_SUPPORTED), and, beyond cuDNN, that every tensor it will touch lies inside
// one live allocation of the handle's device. Then it copies what the work needs (shapes,
// scalars, pointers) into a closure and queues it on the handle's stream; the descriptors may
// be destroyed as soon as the call returns. The arithmetic is in cudnn_compute.cpp, the
// algorithm model in cudnn_algos.cpp.
#include "engine/cuda/sim/cudnn.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "engine/cuda/sim/cudnn_algos.h"
#include "engine/cuda/sim/cudnn_compute.h"
#include "engine/cuda/sim/cudnn_layout.h"
#include "engine/cuda/sim/cudnn_objects.h"
#include "engine/cuda/sim/internal.h"
#include "engine/cuda/sim/library.h"

using namespace kiln::sim::cudnn_objects;

namespace {

using kiln::sim::ConvAlgoPerf;
using kiln::sim::ConvPass;
using kiln::sim::ConvShape;
using kiln::sim::library_fail;

// The convolution the descriptors describe, checked against each other.
struct ConvProblem {
  ConvShape shape;
  cudnnDataType_t type;
  cudnnMathType_t math;
  size_t x_bytes, w_bytes, y_bytes;
};

// What the API reference calls each role's descriptor and buffer in this pass.
struct RoleNames {
  const char *x, *w, *y;
};
RoleNames role_names(ConvPass pass) {
  switch (pass) {
    case ConvPass::Forward: return {"x", "w", "y"};
    case ConvPass::BackwardData: return {"dx", "w", "dy"};
    case ConvPass::BackwardFilter: return {"x", "dw", "dy"};
  }
  return {"x", "w", "y"};
}

cudnnStatus_t describe(const std::string& call, ConvPass pass, cudnnTensorDescriptor_t x_desc,
                       cudnnFilterDescriptor_t w_desc, cudnnConvolutionDescriptor_t conv_desc,
                       cudnnTensorDescriptor_t y_desc, ConvProblem* out) {
  cudnnTensorStruct x, y;
  cudnnFilterStruct w;
  cudnnConvolutionStruct conv;
  const RoleNames names = role_names(pass);
  KILN_CUDNN_SIM_TRY(get_set(x_desc, &x, call, (std::string(names.x) + "Desc").c_str()));
  KILN_CUDNN_SIM_TRY(get_set(w_desc, &w, call, (std::string(names.w) + "Desc").c_str()));
  KILN_CUDNN_SIM_TRY(get_set(conv_desc, &conv, call, "convDesc"));
  KILN_CUDNN_SIM_TRY(get_set(y_desc, &y, call, (std::string(names.y) + "Desc").c_str()));
  auto bad = [&](const std::string& why) {
    return library_fail(CUDNN_STATUS_BAD_PARAM, call + ": " + why);
  };
  if (x.type != w.type || x.type != y.type) return bad("the tensors' data types differ");
  if (conv.compute != compute_type_for(x.type))
    return library_fail(CUDNN_STATUS_NOT_SUPPORTED,
                        call + ": " + type_name(x.type) + " data with compute type " +
                            type_name(conv.compute) + " is not a simulated configuration (FLOAT "
                            "and DOUBLE compute in their own type, HALF and BFLOAT16 in FLOAT)");
  if (x.dims[1] != w.dims[1])
    return bad("input channels " + std::to_string(x.dims[1]) + " != the filter's " +
               std::to_string(w.dims[1]));
  ConvShape g{};
  g.n = x.dims[0], g.c = x.dims[1], g.h = x.dims[2], g.w = x.dims[3];
  g.k = w.dims[0], g.r = w.dims[2], g.s = w.dims[3];
  g.pad_h = conv.pad_h, g.pad_w = conv.pad_w;
  g.stride_h = conv.stride_h, g.stride_w = conv.stride_w;
  g.dil_h = conv.dil_h, g.dil_w = conv.dil_w;
  g.flip = conv.mode == CUDNN_CONVOLUTION;
  g.x_nhwc = x.format == CUDNN_TENSOR_NHWC;
  g.w_nhwc = w.format == CUDNN_TENSOR_NHWC;
  g.y_nhwc = y.format == CUDNN_TENSOR_NHWC;
  const int64_t span_h = (g.r - 1) * g.dil_h + 1, span_w = (g.s - 1) * g.dil_w + 1;
  if (span_h > g.h + 2 * g.pad_h || span_w > g.w + 2 * g.pad_w)
    return bad("the dilated filter is larger than the padded input");
  g.p = (g.h + 2 * g.pad_h - span_h) / g.stride_h + 1;
  g.q = (g.w + 2 * g.pad_w - span_w) / g.stride_w + 1;
  const int64_t want[4] = {g.n, g.k, g.p, g.q};
  if (!std::equal(want, want + 4, y.dims))
    return bad("the output tensor is " + dims_str(y.dims) + ", the convolution gives " +
               dims_str(want));
  out->shape = g;
  out->type = x.type;
  out->math = conv.math;
  out->x_bytes = bytes_of(x.dims, x.type);
  out->w_bytes = bytes_of(w.dims, w.type);
  out->y_bytes = bytes_of(y.dims, y.type);
  return CUDNN_STATUS_SUCCESS;
}

// Each operand's range in one live allocation of the handle's device (CUDNN_STATUS_BAD_PARAM).
struct Range {
  const char* what;
  const void* p;
  size_t bytes;
};
cudnnStatus_t check_ranges(const std::string& call, int device, std::initializer_list<Range> rs) {
  for (const Range& r : rs) {
    std::string why;
    if (r.bytes > 0 && r.p == nullptr)
      return library_fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, call + ": " + r.what + " is null");
    if (!kiln::sim::device_range_ok(r.what, r.p, r.bytes, device, &why))
      return library_fail(CUDNN_STATUS_BAD_PARAM, call + ": " + why);
  }
  return CUDNN_STATUS_SUCCESS;
}

// Queues `work` on the handle's stream, from the handle's device.
cudnnStatus_t queue(const char* call, const cudnnContext& h, std::function<void()> work) {
  if (const std::string problem = kiln::sim::stream_problem(h.stream, h.device); !problem.empty())
    return library_fail(CUDNN_STATUS_EXECUTION_FAILED, std::string(call) + ": " + problem);
  const cudaError_t e = kiln::sim::enqueue(h.stream, call, std::move(work));
  if (e != cudaSuccess)
    return library_fail(CUDNN_STATUS_EXECUTION_FAILED,
                        std::string(call) + ": could not queue on the handle's stream: " +
                            cudaGetErrorName(e));
  return CUDNN_STATUS_SUCCESS;
}

// The scaling factors: double for DOUBLE data, float for the others (host memory, read now).
struct Scalars {
  double alpha, beta;
};
cudnnStatus_t read_scalars(const std::string& call, cudnnDataType_t type, const void* alpha,
                           const void* beta, Scalars* s) {
  if (alpha == nullptr || beta == nullptr)
    return library_fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, call + ": alpha or beta is null");
  if (type == CUDNN_DATA_DOUBLE) {
    s->alpha = *static_cast<const double*>(alpha);
    s->beta = *static_cast<const double*>(beta);
  } else {
    s->alpha = *static_cast<const float*>(alpha);
    s->beta = *static_cast<const float*>(beta);
  }
  return CUDNN_STATUS_SUCCESS;
}

// The three convolutions. Roles: x (N,C,H,W), w (K,C,R,S), y (N,K,P,Q); the pass says which of
// them is written (y forward, x backward-data, w backward-filter).
cudnnStatus_t convolve(const char* call, ConvPass pass, cudnnHandle_t handle, const void* alpha,
                       cudnnTensorDescriptor_t x_desc, const void* x,
                       cudnnFilterDescriptor_t w_desc, const void* w,
                       cudnnTensorDescriptor_t y_desc, const void* y,
                       cudnnConvolutionDescriptor_t conv_desc, int algo, void* workspace,
                       size_t workspace_bytes, const void* beta) {
  kiln::sim::clear_library_error();
  const std::string name(call);
  cudnnContext h;
  KILN_CUDNN_SIM_TRY(get_handle(handle, &h, name));
  ConvProblem cp;
  KILN_CUDNN_SIM_TRY(describe(name, pass, x_desc, w_desc, conv_desc, y_desc, &cp));
  Scalars s;
  KILN_CUDNN_SIM_TRY(read_scalars(name, cp.type, alpha, beta, &s));
  size_t need = 0;
  bool tf32 = false;
  std::string why;
  const cudnnStatus_t st = kiln::sim::conv_algorithm_needs(pass, algo, cp.shape, cp.type, cp.math,
                                                           &need, &tf32, &why);
  if (st != CUDNN_STATUS_SUCCESS) return library_fail(st, name + ": " + why);
  if (workspace_bytes < need)
    return library_fail(CUDNN_STATUS_BAD_PARAM,
                        name + ": algorithm " + std::to_string(algo) + " needs " +
                            std::to_string(need) + " workspace bytes, " +
                            std::to_string(workspace_bytes) + " given");
  const RoleNames names = role_names(pass);
  const char *xn = names.x, *wn = names.w, *yn = names.y;
  KILN_CUDNN_SIM_TRY(check_ranges(name, h.device,
                                  {{xn, x, cp.x_bytes}, {wn, w, cp.w_bytes}, {yn, y, cp.y_bytes},
                                   {"workSpace", workspace, need}}));
  const ConvShape g = cp.shape;
  const cudnnDataType_t type = cp.type;
  const int device = h.device;
  const size_t xb = cp.x_bytes, wb = cp.w_bytes, yb = cp.y_bytes;
  return queue(call, h, [=] {
    kiln::sim::require_device_range(call, xn, x, xb, device);
    kiln::sim::require_device_range(call, wn, w, wb, device);
    kiln::sim::require_device_range(call, yn, y, yb, device);
    kiln::sim::require_device_range(call, "workSpace", workspace, need, device);
    // The algorithm owns its workspace for the duration: scribble over it, so a caller that
    // frees or reuses it too early reads garbage.
    if (need > 0) std::memset(workspace, 0xFF, need);
    auto run = [&](auto tag, const void* xv, const void* wv, const void* yv) {
      using T = decltype(tag);
      const T a = static_cast<T>(s.alpha), b = static_cast<T>(s.beta);
      // NHWC operands as NCHW copies (sim/cudnn_layout.h); the written one is stored back.
      const int64_t xd[4] = {g.n, g.c, g.h, g.w}, wd[4] = {g.k, g.c, g.r, g.s};
      const int64_t yd[4] = {g.n, g.k, g.p, g.q};
      kiln::sim::NchwOperand<T> xo(g.x_nhwc, xd, const_cast<T*>(static_cast<const T*>(xv)));
      kiln::sim::NchwOperand<T> wo(g.w_nhwc, wd, const_cast<T*>(static_cast<const T*>(wv)));
      kiln::sim::NchwOperand<T> yo(g.y_nhwc, yd, const_cast<T*>(static_cast<const T*>(yv)));
      T *xp = xo.data(), *wp = wo.data(), *yp = yo.data();
      switch (pass) {
        case ConvPass::Forward:
          kiln::sim::conv_forward_host<T>(g, a, xp, wp, b, yp, tf32);
          yo.store();
          break;
        case ConvPass::BackwardData:
          kiln::sim::conv_backward_data_host<T>(g, a, wp, yp, b, xp, tf32);
          xo.store();
          break;
        case ConvPass::BackwardFilter:
          kiln::sim::conv_backward_filter_host<T>(g, a, xp, yp, b, wp, tf32);
          wo.store();
          break;
      }
    };
    if (type == CUDNN_DATA_DOUBLE) {
      run(double{}, x, w, y);
    } else if (is_16bit(type)) {
      // In float on widened copies (the written one too: beta may blend it), then the written
      // one rounded back once.
      const kiln::sim::Format16 f = format_16(type);
      std::vector<float> xf = kiln::sim::widen_16(f, x, g.n * g.c * g.h * g.w);
      std::vector<float> wf = kiln::sim::widen_16(f, w, g.k * g.c * g.r * g.s);
      std::vector<float> yf = kiln::sim::widen_16(f, y, g.n * g.k * g.p * g.q);
      run(float{}, xf.data(), wf.data(), yf.data());
      switch (pass) {
        case ConvPass::Forward: kiln::sim::narrow_16(f, yf, const_cast<void*>(y)); break;
        case ConvPass::BackwardData: kiln::sim::narrow_16(f, xf, const_cast<void*>(x)); break;
        case ConvPass::BackwardFilter: kiln::sim::narrow_16(f, wf, const_cast<void*>(w)); break;
      }
    } else {
      run(float{}, x, w, y);
    }
  });
}

// Get*_v7 and Find*Ex: the model's list, the first `requested` entries.
template <typename Perf>
cudnnStatus_t report(const std::string& call, std::vector<ConvAlgoPerf> list, int requested,
                     int* returned, Perf* perf) {
  if (requested <= 0 || returned == nullptr || perf == nullptr)
    return library_fail(CUDNN_STATUS_BAD_PARAM,
                        call + ": requestedAlgoCount <= 0, or a null output");
  const int count = std::min<int>(requested, static_cast<int>(list.size()));
  for (int i = 0; i < count; ++i) {
    const ConvAlgoPerf& p = list[static_cast<size_t>(i)];
    perf[i] = Perf{};
    perf[i].algo = static_cast<decltype(perf[i].algo)>(p.algo);
    perf[i].status = p.status;
    perf[i].time = p.time;
    perf[i].memory = p.memory;
    perf[i].determinism = p.determinism;
    perf[i].mathType = p.math;
  }
  *returned = count;
  return CUDNN_STATUS_SUCCESS;
}

template <typename Perf>
cudnnStatus_t heuristics(const char* call, ConvPass pass, cudnnHandle_t handle,
                         cudnnTensorDescriptor_t x_desc, cudnnFilterDescriptor_t w_desc,
                         cudnnTensorDescriptor_t y_desc, cudnnConvolutionDescriptor_t conv_desc,
                         int requested, int* returned, Perf* perf) {
  kiln::sim::clear_library_error();
  const std::string name(call);
  cudnnContext h;
  KILN_CUDNN_SIM_TRY(get_handle(handle, &h, name));
  ConvProblem cp;
  KILN_CUDNN_SIM_TRY(describe(name, pass, x_desc, w_desc, conv_desc, y_desc, &cp));
  return report(name, kiln::sim::conv_algorithms(pass, cp.shape, cp.type, cp.math), requested,
                returned, perf);
}

// Find*Ex: the same list, "timed" with the model's times (the simulator has no GPU clock);
// algorithms needing more workspace than offered are not run (NOT_SUPPORTED, time -1). The
// output buffer is overwritten with arbitrary values, as documented: here NaN.
template <typename Perf>
cudnnStatus_t search(const char* call, ConvPass pass, cudnnHandle_t handle,
                     cudnnTensorDescriptor_t x_desc, const void* x,
                     cudnnFilterDescriptor_t w_desc, const void* w,
                     cudnnTensorDescriptor_t y_desc, const void* y,
                     cudnnConvolutionDescriptor_t conv_desc, int requested, int* returned,
                     Perf* perf, void* workspace, size_t workspace_bytes) {
  kiln::sim::clear_library_error();
  const std::string name(call);
  cudnnContext h;
  KILN_CUDNN_SIM_TRY(get_handle(handle, &h, name));
  ConvProblem cp;
  KILN_CUDNN_SIM_TRY(describe(name, pass, x_desc, w_desc, conv_desc, y_desc, &cp));
  const RoleNames names = role_names(pass);
  KILN_CUDNN_SIM_TRY(check_ranges(name, h.device,
                                  {{names.x, x, cp.x_bytes}, {names.w, w, cp.w_bytes},
                                   {names.y, y, cp.y_bytes},
                                   {"workSpace", workspace, workspace_bytes}}));
  std::vector<ConvAlgoPerf> list = kiln::sim::conv_algorithms(pass, cp.shape, cp.type, cp.math);
  for (ConvAlgoPerf& p : list)
    if (p.status == CUDNN_STATUS_SUCCESS && p.memory > workspace_bytes) {
      p.status = CUDNN_STATUS_NOT_SUPPORTED;
      p.time = -1;
    }
  std::stable_partition(list.begin(), list.end(),
                        [](const ConvAlgoPerf& p) { return p.status == CUDNN_STATUS_SUCCESS; });
  KILN_CUDNN_SIM_TRY(report(name, list, requested, returned, perf));
  void* out = const_cast<void*>(pass == ConvPass::Forward        ? y
                                : pass == ConvPass::BackwardData ? x
                                                                 : w);
  const size_t out_bytes = pass == ConvPass::Forward        ? cp.y_bytes
                           : pass == ConvPass::BackwardData ? cp.x_bytes
                                                            : cp.w_bytes;
  const int device = h.device;
  return queue(call, h, [=] {
    kiln::sim::require_device_range(call, "output", out, out_bytes, device);
    std::memset(out, 0xFF, out_bytes);
  });
}

}  // namespace

// ---- Algorithm choice ---------------------------------------------------------------------
namespace {
cudnnStatus_t max_count(const char* call, ConvPass pass, cudnnHandle_t handle, int* count) {
  kiln::sim::clear_library_error();
  cudnnContext h;
  KILN_CUDNN_SIM_TRY(get_handle(handle, &h, call));
  if (count == nullptr) return library_fail(CUDNN_STATUS_BAD_PARAM, std::string(call) + ": null");
  *count = kiln::sim::conv_algorithm_max_count(pass);
  return CUDNN_STATUS_SUCCESS;
}
}  // namespace

cudnnStatus_t cudnnGetConvolutionForwardAlgorithmMaxCount(cudnnHandle_t handle, int* count) {
  return max_count("cudnnGetConvolutionForwardAlgorithmMaxCount", ConvPass::Forward, handle,
                   count);
}
cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(
    cudnnHandle_t handle, cudnnTensorDescriptor_t x_desc, cudnnFilterDescriptor_t w_desc,
    cudnnConvolutionDescriptor_t conv_desc, cudnnTensorDescriptor_t y_desc, int requested,
    int* returned, cudnnConvolutionFwdAlgoPerf_t* perf) {
  return heuristics("cudnnGetConvolutionForwardAlgorithm_v7", ConvPass::Forward, handle, x_desc,
                    w_desc, y_desc, conv_desc, requested, returned, perf);
}
cudnnStatus_t cudnnFindConvolutionForwardAlgorithmEx(
    cudnnHandle_t handle, cudnnTensorDescriptor_t x_desc, const void* x,
    cudnnFilterDescriptor_t w_desc, const void* w, cudnnConvolutionDescriptor_t conv_desc,
    cudnnTensorDescriptor_t y_desc, void* y, int requested, int* returned,
    cudnnConvolutionFwdAlgoPerf_t* perf, void* workspace, size_t workspace_bytes) {
  return search("cudnnFindConvolutionForwardAlgorithmEx", ConvPass::Forward, handle, x_desc, x,
                w_desc, w, y_desc, y, conv_desc, requested, returned, perf, workspace,
                workspace_bytes);
}

cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithmMaxCount(cudnnHandle_t handle, int* count) {
  return max_count("cudnnGetConvolutionBackwardDataAlgorithmMaxCount", ConvPass::BackwardData,
                   handle, count);
}
cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(
    cudnnHandle_t handle, cudnnFilterDescriptor_t w_desc, cudnnTensorDescriptor_t dy_desc,
    cudnnConvolutionDescriptor_t conv_desc, cudnnTensorDescriptor_t dx_desc, int requested,
    int* returned, cudnnConvolutionBwdDataAlgoPerf_t* perf) {
  return heuristics("cudnnGetConvolutionBackwardDataAlgorithm_v7", ConvPass::BackwardData, handle,
                    dx_desc, w_desc, dy_desc, conv_desc, requested, returned, perf);
}
cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithmEx(
    cudnnHandle_t handle, cudnnFilterDescriptor_t w_desc, const void* w,
    cudnnTensorDescriptor_t dy_desc, const void* dy, cudnnConvolutionDescriptor_t conv_desc,
    cudnnTensorDescriptor_t dx_desc, void* dx, int requested, int* returned,
    cudnnConvolutionBwdDataAlgoPerf_t* perf, void* workspace, size_t workspace_bytes) {
  return search("cudnnFindConvolutionBackwardDataAlgorithmEx", ConvPass::BackwardData, handle,
                dx_desc, dx, w_desc, w, dy_desc, dy, conv_desc, requested, returned, perf,
                workspace, workspace_bytes);
}

cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(cudnnHandle_t handle,
                                                                 int* count) {
  return max_count("cudnnGetConvolutionBackwardFilterAlgorithmMaxCount",
                   ConvPass::BackwardFilter, handle, count);
}
cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(
    cudnnHandle_t handle, cudnnTensorDescriptor_t x_desc, cudnnTensorDescriptor_t dy_desc,
    cudnnConvolutionDescriptor_t conv_desc, cudnnFilterDescriptor_t dw_desc, int requested,
    int* returned, cudnnConvolutionBwdFilterAlgoPerf_t* perf) {
  return heuristics("cudnnGetConvolutionBackwardFilterAlgorithm_v7", ConvPass::BackwardFilter,
                    handle, x_desc, dw_desc, dy_desc, conv_desc, requested, returned, perf);
}
cudnnStatus_t cudnnFindConvolutionBackwardFilterAlgorithmEx(
    cudnnHandle_t handle, cudnnTensorDescriptor_t x_desc, const void* x,
    cudnnTensorDescriptor_t dy_desc, const void* dy, cudnnConvolutionDescriptor_t conv_desc,
    cudnnFilterDescriptor_t dw_desc, void* dw, int requested, int* returned,
    cudnnConvolutionBwdFilterAlgoPerf_t* perf, void* workspace, size_t workspace_bytes) {
  return search("cudnnFindConvolutionBackwardFilterAlgorithmEx", ConvPass::BackwardFilter, handle,
                x_desc, x, dw_desc, dw, dy_desc, dy, conv_desc, requested, returned, perf,
                workspace, workspace_bytes);
}

// ---- Computation --------------------------------------------------------------------------
cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t handle, const void* alpha,
                                      cudnnTensorDescriptor_t x_desc, const void* x,
                                      cudnnFilterDescriptor_t w_desc, const void* w,
                                      cudnnConvolutionDescriptor_t conv_desc,
                                      cudnnConvolutionFwdAlgo_t algo, void* workspace,
                                      size_t workspace_bytes, const void* beta,
                                      cudnnTensorDescriptor_t y_desc, void* y) {
  return convolve("cudnnConvolutionForward", ConvPass::Forward, handle, alpha, x_desc, x, w_desc,
                  w, y_desc, y, conv_desc, algo, workspace, workspace_bytes, beta);
}
cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t handle, const void* alpha,
                                           cudnnFilterDescriptor_t w_desc, const void* w,
                                           cudnnTensorDescriptor_t dy_desc, const void* dy,
                                           cudnnConvolutionDescriptor_t conv_desc,
                                           cudnnConvolutionBwdDataAlgo_t algo, void* workspace,
                                           size_t workspace_bytes, const void* beta,
                                           cudnnTensorDescriptor_t dx_desc, void* dx) {
  return convolve("cudnnConvolutionBackwardData", ConvPass::BackwardData, handle, alpha, dx_desc,
                  dx, w_desc, w, dy_desc, dy, conv_desc, algo, workspace, workspace_bytes, beta);
}
cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t handle, const void* alpha,
                                             cudnnTensorDescriptor_t x_desc, const void* x,
                                             cudnnTensorDescriptor_t dy_desc, const void* dy,
                                             cudnnConvolutionDescriptor_t conv_desc,
                                             cudnnConvolutionBwdFilterAlgo_t algo,
                                             void* workspace, size_t workspace_bytes,
                                             const void* beta, cudnnFilterDescriptor_t dw_desc,
                                             void* dw) {
  return convolve("cudnnConvolutionBackwardFilter", ConvPass::BackwardFilter, handle, alpha,
                  x_desc, x, dw_desc, dw, dy_desc, dy, conv_desc, algo, workspace,
                  workspace_bytes, beta);
}

cudnnStatus_t cudnnConvolutionBackwardBias(cudnnHandle_t handle, const void* alpha,
                                           cudnnTensorDescriptor_t dy_desc, const void* dy,
                                           const void* beta, cudnnTensorDescriptor_t db_desc,
                                           void* db) {
  kiln::sim::clear_library_error();
  const std::string name = "cudnnConvolutionBackwardBias";
  cudnnContext h;
  KILN_CUDNN_SIM_TRY(get_handle(handle, &h, name));
  cudnnTensorStruct d, b;
  KILN_CUDNN_SIM_TRY(get_set(dy_desc, &d, name, "dyDesc"));
  KILN_CUDNN_SIM_TRY(get_set(db_desc, &b, name, "dbDesc"));
  if (d.type != b.type) return library_fail(CUDNN_STATUS_BAD_PARAM, name + ": data types differ");
  if (b.dims[0] != 1 || b.dims[1] != d.dims[1] || b.dims[2] != 1 || b.dims[3] != 1)
    return library_fail(CUDNN_STATUS_BAD_PARAM, name + ": dbDesc is " + dims_str(b.dims) +
                                                    ", dyDesc " + dims_str(d.dims) +
                                                    " needs (1, " + std::to_string(d.dims[1]) +
                                                    ", 1, 1)");
  Scalars s;
  KILN_CUDNN_SIM_TRY(read_scalars(name, d.type, alpha, beta, &s));
  const size_t dyb = bytes_of(d.dims, d.type), dbb = bytes_of(b.dims, b.type);
  KILN_CUDNN_SIM_TRY(check_ranges(name, h.device, {{"dy", dy, dyb}, {"db", db, dbb}}));
  const int64_t n = d.dims[0], k = d.dims[1], pq = d.dims[2] * d.dims[3];
  const int64_t dy_dims[4] = {d.dims[0], d.dims[1], d.dims[2], d.dims[3]};
  // db (1, K, 1, 1) lies the same in both formats; an NHWC dy is summed from an NCHW copy.
  const bool dy_nhwc = d.format == CUDNN_TENSOR_NHWC;
  const bool dbl = d.type == CUDNN_DATA_DOUBLE, half = is_16bit(d.type);
  const kiln::sim::Format16 f = format_16(d.type);
  const int device = h.device;
  return queue("cudnnConvolutionBackwardBias", h, [=] {
    kiln::sim::require_device_range("cudnnConvolutionBackwardBias", "dy", dy, dyb, device);
    kiln::sim::require_device_range("cudnnConvolutionBackwardBias", "db", db, dbb, device);
    const float alpha_f = static_cast<float>(s.alpha), beta_f = static_cast<float>(s.beta);
    auto dy_nchw = [&](auto* p) {
      using T = std::remove_const_t<std::remove_pointer_t<decltype(p)>>;
      return kiln::sim::NchwOperand<T>(dy_nhwc, dy_dims, const_cast<T*>(p));
    };
    if (dbl) {
      auto dyo = dy_nchw(static_cast<const double*>(dy));
      kiln::sim::conv_backward_bias_host<double>(n, k, pq, s.alpha, dyo.data(), s.beta,
                                                 static_cast<double*>(db));
    } else if (half) {  // in float, db rounded back once
      std::vector<float> dyf = kiln::sim::widen_16(f, dy, n * k * pq);
      auto dyo = dy_nchw(dyf.data());
      std::vector<float> dbf = kiln::sim::widen_16(f, db, k);
      kiln::sim::conv_backward_bias_host<float>(n, k, pq, alpha_f, dyo.data(), beta_f, dbf.data());
      kiln::sim::narrow_16(f, dbf, db);
    } else {
      auto dyo = dy_nchw(static_cast<const float*>(dy));
      kiln::sim::conv_backward_bias_host<float>(n, k, pq, alpha_f, dyo.data(), beta_f,
                                                static_cast<float*>(db));
    }
  });
}

cudnnStatus_t cudnnAddTensor(cudnnHandle_t handle, const void* alpha,
                             cudnnTensorDescriptor_t a_desc, const void* A, const void* beta,
                             cudnnTensorDescriptor_t c_desc, void* C) {
  kiln::sim::clear_library_error();
  const std::string name = "cudnnAddTensor";
  cudnnContext h;
  KILN_CUDNN_SIM_TRY(get_handle(handle, &h, name));
  cudnnTensorStruct a, c;
  KILN_CUDNN_SIM_TRY(get_set(a_desc, &a, name, "aDesc"));
  KILN_CUDNN_SIM_TRY(get_set(c_desc, &c, name, "cDesc"));
  if (a.type != c.type) return library_fail(CUDNN_STATUS_BAD_PARAM, name + ": data types differ");
  for (int i = 0; i < 4; ++i)
    if (a.dims[i] != c.dims[i] && a.dims[i] != 1)
      return library_fail(CUDNN_STATUS_BAD_PARAM, name + ": A " + dims_str(a.dims) +
                                                      " does not broadcast to C " +
                                                      dims_str(c.dims));
  Scalars s;
  KILN_CUDNN_SIM_TRY(read_scalars(name, a.type, alpha, beta, &s));
  const size_t ab = bytes_of(a.dims, a.type), cb = bytes_of(c.dims, c.type);
  KILN_CUDNN_SIM_TRY(check_ranges(name, h.device, {{"A", A, ab}, {"C", C, cb}}));
  const bool dbl = a.type == CUDNN_DATA_DOUBLE, half = is_16bit(a.type);
  const kiln::sim::Format16 f = format_16(a.type);
  const int device = h.device;
  // Every format is accepted, mixed too (A NCHW, C NHWC: a bias added to an NHWC output); NHWC
  // operands are computed on NCHW copies, C stored back.
  const bool a_nhwc = a.format == CUDNN_TENSOR_NHWC, c_nhwc = c.format == CUDNN_TENSOR_NHWC;
  return queue("cudnnAddTensor", h, [=] {
    kiln::sim::require_device_range("cudnnAddTensor", "A", A, ab, device);
    kiln::sim::require_device_range("cudnnAddTensor", "C", C, cb, device);
    const float alpha_f = static_cast<float>(s.alpha), beta_f = static_cast<float>(s.beta);
    auto add = [&](auto alpha_t, auto* ap, auto* cp, auto beta_t) {
      using T = decltype(alpha_t);
      kiln::sim::NchwOperand<T> ao(a_nhwc, a.dims, const_cast<T*>(ap));
      kiln::sim::NchwOperand<T> co(c_nhwc, c.dims, cp);
      kiln::sim::add_tensor_host<T>(a.dims, alpha_t, ao.data(), c.dims, beta_t, co.data());
      co.store();
    };
    if (dbl) {
      add(s.alpha, static_cast<const double*>(A), static_cast<double*>(C), s.beta);
    } else if (half) {  // in float, C rounded back once
      std::vector<float> af = kiln::sim::widen_16(f, A, static_cast<int64_t>(ab / 2));
      std::vector<float> cf = kiln::sim::widen_16(f, C, static_cast<int64_t>(cb / 2));
      add(alpha_f, af.data(), cf.data(), beta_f);
      kiln::sim::narrow_16(f, cf, C);
    } else {
      add(alpha_f, static_cast<const float*>(A), static_cast<float*>(C), beta_f);
    }
  });
}
