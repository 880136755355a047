// sim/cudnn.cpp: the simulated cuDNN subset (sim/cudnn.h), part one: error strings, handles
// and descriptors, and the registry of live ones (sim/cudnn_objects.h). The algorithm queries
// and the computing calls are in sim/cudnn_calls.cpp. Every call checks its arguments first, as
// the cuDNN API reference lists them
// (https://docs.nvidia.com/deeplearning/cudnn/api/): null or unset descriptors, negative
// dimensions, layouts and data types outside the subset.
#include "engine/cuda/sim/cudnn.h"

#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_set>

#include "engine/cuda/sim/cudnn_objects.h"
#include "engine/cuda/sim/internal.h"
#include "engine/cuda/sim/library.h"

namespace kiln::sim::cudnn_objects {

// Never destroyed: Kiln's plan cache (a static object of another file) destroys its
// descriptors while the process exits, possibly after this file's statics would be gone.
std::mutex& live_mutex() {
  static std::mutex& m = *new std::mutex;
  return m;
}
std::unordered_set<const void*>& live_objects() {
  static std::unordered_set<const void*>& s = *new std::unordered_set<const void*>;
  return s;
}

}  // namespace kiln::sim::cudnn_objects

using namespace kiln::sim::cudnn_objects;
using kiln::sim::library_fail;

namespace {

// cudnnSetTensor4dDescriptor and cudnnSetFilter4dDescriptor take the logical dimensions in the
// same order for both formats (n, c, h, w / k, c, r, s); the format says where the packed
// elements lie: NCHW element (n, c, h, w) at ((n C + c) H + h) W + w, NHWC at
// ((n H + h) W + w) C + c (a filter: KCRS or KRSC). cuDNN also has NCHW_VECT_C, for the
// vectorised INT8 types only; it is outside the subset.
cudnnStatus_t set_4d(const char* call, cudnnDataType_t type, cudnnTensorFormat_t format, int n,
                     int c, int h, int w, bool* set, cudnnDataType_t* out_type,
                     cudnnTensorFormat_t* out_format, int64_t dims[4]) {
  if (n < 0 || c < 0 || h < 0 || w < 0)
    return library_fail(CUDNN_STATUS_BAD_PARAM, std::string(call) + ": a negative dimension");
  if (format != CUDNN_TENSOR_NCHW && format != CUDNN_TENSOR_NHWC)
    return library_fail(CUDNN_STATUS_NOT_SUPPORTED_LAYOUT,
                        std::string(call) + ": only CUDNN_TENSOR_NCHW and CUDNN_TENSOR_NHWC are "
                                            "simulated");
  if (type != CUDNN_DATA_FLOAT && type != CUDNN_DATA_DOUBLE && !is_16bit(type))
    return library_fail(CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE,
                        std::string(call) + ": data type " + std::to_string(static_cast<int>(type)) +
                            " is not simulated (FLOAT, DOUBLE, HALF and BFLOAT16 are)");
  *set = true;
  *out_type = type;
  *out_format = format;
  dims[0] = n, dims[1] = c, dims[2] = h, dims[3] = w;
  return CUDNN_STATUS_SUCCESS;
}

}  // namespace

// ---- Errors -----------------------------------------------------------------------------
const char* cudnnGetErrorString(cudnnStatus_t status) {
  switch (status) {
    case CUDNN_STATUS_SUCCESS: return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_NOT_INITIALIZED: return "CUDNN_STATUS_NOT_INITIALIZED";
    case CUDNN_STATUS_BAD_PARAM: return "CUDNN_STATUS_BAD_PARAM";
    case CUDNN_STATUS_BAD_PARAM_NULL_POINTER: return "CUDNN_STATUS_BAD_PARAM_NULL_POINTER";
    case CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH: return "CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH";
    case CUDNN_STATUS_NOT_SUPPORTED: return "CUDNN_STATUS_NOT_SUPPORTED";
    case CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE: return "CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE";
    case CUDNN_STATUS_NOT_SUPPORTED_LAYOUT: return "CUDNN_STATUS_NOT_SUPPORTED_LAYOUT";
    case CUDNN_STATUS_INTERNAL_ERROR: return "CUDNN_STATUS_INTERNAL_ERROR";
    case CUDNN_STATUS_EXECUTION_FAILED: return "CUDNN_STATUS_EXECUTION_FAILED";
  }
  return "CUDNN_STATUS_UNKNOWN";
}

// ---- Handle -----------------------------------------------------------------------------
cudnnStatus_t cudnnCreate(cudnnHandle_t* handle) {
  kiln::sim::clear_library_error();
  if (kiln::sim::configured_device_count() == 0)
    return library_fail(CUDNN_STATUS_NOT_INITIALIZED, "cudnnCreate: no CUDA device");
  KILN_CUDNN_SIM_TRY(create(handle, "cudnnCreate"));
  (*handle)->device = kiln::sim::current_device();
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroy(cudnnHandle_t handle) {
  if (handle == nullptr) return library_fail(CUDNN_STATUS_BAD_PARAM, "cudnnDestroy: null");
  return destroy(handle, "cudnnDestroy");
}
cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t stream) {
  return modify(handle, "cudnnSetStream", [&](cudnnContext& h) {
    int device = 0;
    if (!kiln::sim::stream_device(stream, &device))
      return library_fail(CUDNN_STATUS_BAD_PARAM, "cudnnSetStream: not a live stream");
    h.stream = stream;
    return CUDNN_STATUS_SUCCESS;
  });
}
cudnnStatus_t cudnnGetStream(cudnnHandle_t handle, cudaStream_t* stream) {
  kiln::sim::clear_library_error();
  cudnnContext h;
  KILN_CUDNN_SIM_TRY(get_handle(handle, &h, "cudnnGetStream"));
  if (stream == nullptr) return library_fail(CUDNN_STATUS_BAD_PARAM, "cudnnGetStream: null");
  *stream = h.stream;
  return CUDNN_STATUS_SUCCESS;
}

// ---- Descriptors --------------------------------------------------------------------------
cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t* desc) {
  return create(desc, "cudnnCreateTensorDescriptor");
}
cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t desc, cudnnTensorFormat_t format,
                                         cudnnDataType_t data_type, int n, int c, int h, int w) {
  return modify(desc, "cudnnSetTensor4dDescriptor", [&](cudnnTensorStruct& d) {
    return set_4d("cudnnSetTensor4dDescriptor", data_type, format, n, c, h, w, &d.set, &d.type,
                  &d.format, d.dims);
  });
}
cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t desc) {
  return destroy(desc, "cudnnDestroyTensorDescriptor");
}

cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t* desc) {
  return create(desc, "cudnnCreateFilterDescriptor");
}
cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t desc, cudnnDataType_t data_type,
                                         cudnnTensorFormat_t format, int k, int c, int h, int w) {
  return modify(desc, "cudnnSetFilter4dDescriptor", [&](cudnnFilterStruct& d) {
    return set_4d("cudnnSetFilter4dDescriptor", data_type, format, k, c, h, w, &d.set, &d.type,
                  &d.format, d.dims);
  });
}
cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t desc) {
  return destroy(desc, "cudnnDestroyFilterDescriptor");
}

cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t* desc) {
  return create(desc, "cudnnCreateConvolutionDescriptor");
}
cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t desc, int pad_h,
                                              int pad_w, int u, int v, int dilation_h,
                                              int dilation_w, cudnnConvolutionMode_t mode,
                                              cudnnDataType_t compute_type) {
  return modify(desc, "cudnnSetConvolution2dDescriptor", [&](cudnnConvolutionStruct& d) {
    if (pad_h < 0 || pad_w < 0 || u <= 0 || v <= 0 || dilation_h <= 0 || dilation_w <= 0 ||
        (mode != CUDNN_CONVOLUTION && mode != CUDNN_CROSS_CORRELATION))
      return library_fail(CUDNN_STATUS_BAD_PARAM,
                          "cudnnSetConvolution2dDescriptor: negative padding, a stride or "
                          "dilation below 1, or an invalid mode");
    if (compute_type != CUDNN_DATA_FLOAT && compute_type != CUDNN_DATA_DOUBLE)
      return library_fail(CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE,
                          std::string("cudnnSetConvolution2dDescriptor: compute type ") +
                              type_name(compute_type) +
                              " is not simulated (FLOAT and DOUBLE are; HALF and BFLOAT16 data "
                              "compute in FLOAT)");
    d.set = true;
    d.pad_h = pad_h, d.pad_w = pad_w, d.stride_h = u, d.stride_w = v;
    d.dil_h = dilation_h, d.dil_w = dilation_w, d.mode = mode, d.compute = compute_type;
    return CUDNN_STATUS_SUCCESS;
  });
}
cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t desc,
                                          cudnnMathType_t math_type) {
  return modify(desc, "cudnnSetConvolutionMathType", [&](cudnnConvolutionStruct& d) {
    if (math_type < CUDNN_DEFAULT_MATH || math_type > CUDNN_FMA_MATH)
      return library_fail(CUDNN_STATUS_BAD_PARAM, "cudnnSetConvolutionMathType: invalid value");
    d.math = math_type;
    return CUDNN_STATUS_SUCCESS;
  });
}
cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t desc) {
  return destroy(desc, "cudnnDestroyConvolutionDescriptor");
}
