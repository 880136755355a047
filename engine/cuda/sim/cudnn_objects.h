// sim/cudnn_objects.h: what the two files of the simulated cuDNN share (sim/cudnn.cpp: errors,
// handles and descriptors; sim/cudnn_calls.cpp: the algorithm queries and the computing calls):
// the objects behind cuDNN's opaque handles, the registry of live ones that turns a null,
// destroyed or foreign handle into CUDNN_STATUS_BAD_PARAM rather than a use after free, and the
// data-type helpers. Internal to the simulator.
// cuDNN's handle and descriptor rules: https://docs.nvidia.com/deeplearning/cudnn/api/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_set>

#include "engine/cuda/sim/cudnn.h"
#include "engine/cuda/sim/cudnn_compute.h"
#include "engine/cuda/sim/library.h"

struct cudnnContext {
  int device = 0;
  cudaStream_t stream = nullptr;
};
// dims are always the logical N, C, H, W (K, C, R, S for a filter), whatever the format: the
// format says only in which order the packed bytes lie (NCHW / KCRS, or NHWC / KRSC).
struct cudnnTensorStruct {
  bool set = false;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  cudnnTensorFormat_t format = CUDNN_TENSOR_NCHW;
  int64_t dims[4] = {0, 0, 0, 0};  // N, C, H, W
};
struct cudnnFilterStruct {
  bool set = false;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  cudnnTensorFormat_t format = CUDNN_TENSOR_NCHW;
  int64_t dims[4] = {0, 0, 0, 0};  // K, C, R, S
};
struct cudnnConvolutionStruct {
  bool set = false;
  int pad_h = 0, pad_w = 0, stride_h = 1, stride_w = 1, dil_h = 1, dil_w = 1;
  cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
};

#define KILN_CUDNN_SIM_TRY(expr)                           \
  do {                                                     \
    const cudnnStatus_t kiln_st_ = (expr);                 \
    if (kiln_st_ != CUDNN_STATUS_SUCCESS) return kiln_st_; \
  } while (0)

namespace kiln::sim::cudnn_objects {

// The live handles and descriptors, and the lock over them and their contents (sim/cudnn.cpp).
std::mutex& live_mutex();
std::unordered_set<const void*>& live_objects();

template <typename T>
cudnnStatus_t create(T** out, const char* call) {
  clear_library_error();
  if (out == nullptr) return library_fail(CUDNN_STATUS_BAD_PARAM, std::string(call) + ": null");
  T* p = new T;
  std::lock_guard<std::mutex> lock(live_mutex());
  live_objects().insert(p);
  *out = p;
  return CUDNN_STATUS_SUCCESS;
}

template <typename T>
cudnnStatus_t destroy(T* p, const char* call) {
  clear_library_error();
  if (p == nullptr) return CUDNN_STATUS_SUCCESS;  // as cuDNN: destroying null is a no-op
  std::lock_guard<std::mutex> lock(live_mutex());
  if (live_objects().erase(p) == 0)
    return library_fail(CUDNN_STATUS_BAD_PARAM, std::string(call) + ": not a live object");
  delete p;
  return CUDNN_STATUS_SUCCESS;
}

// A copy of a live object (handle or descriptor), or BAD_PARAM naming it.
template <typename T>
cudnnStatus_t lookup(const T* p, T* copy, const std::string& call, const char* what) {
  std::lock_guard<std::mutex> lock(live_mutex());
  if (p == nullptr || live_objects().count(p) == 0)
    return library_fail(CUDNN_STATUS_BAD_PARAM, call + ": " + what + " is null or destroyed");
  *copy = *p;
  return CUDNN_STATUS_SUCCESS;
}

// Runs `set` on a live object under the lock.
template <typename T, typename Fn>
cudnnStatus_t modify(T* p, const char* call, Fn set) {
  clear_library_error();
  std::lock_guard<std::mutex> lock(live_mutex());
  if (p == nullptr || live_objects().count(p) == 0)
    return library_fail(CUDNN_STATUS_BAD_PARAM, std::string(call) + ": null or destroyed");
  return set(*p);
}

inline cudnnStatus_t get_handle(cudnnHandle_t handle, cudnnContext* h, const std::string& call) {
  return lookup<cudnnContext>(handle, h, call, "the handle");
}

template <typename Desc>
cudnnStatus_t get_set(const Desc* p, Desc* copy, const std::string& call, const char* what) {
  KILN_CUDNN_SIM_TRY(lookup<Desc>(p, copy, call, what));
  if (!copy->set)
    return library_fail(CUDNN_STATUS_BAD_PARAM, call + ": " + what + " was never set");
  return CUDNN_STATUS_SUCCESS;
}

inline bool is_16bit(cudnnDataType_t t) { return t == CUDNN_DATA_HALF || t == CUDNN_DATA_BFLOAT16; }

inline kiln::sim::Format16 format_16(cudnnDataType_t t) {
  return t == CUDNN_DATA_HALF ? kiln::sim::Format16::Half : kiln::sim::Format16::BFloat16;
}

inline size_t element_size(cudnnDataType_t t) {
  return t == CUDNN_DATA_DOUBLE ? 8 : is_16bit(t) ? 2 : 4;
}

// The compute type cuDNN's documented configurations pair with a data type: FLOAT_CONFIG,
// DOUBLE_CONFIG, and PSEUDO_HALF_CONFIG / PSEUDO_BFLOAT16_CONFIG (16-bit data, float compute).
// TRUE_HALF_CONFIG (HALF computed in HALF) is not simulated.
inline cudnnDataType_t compute_type_for(cudnnDataType_t data) {
  return is_16bit(data) ? CUDNN_DATA_FLOAT : data;
}

inline const char* type_name(cudnnDataType_t t) {
  switch (t) {
    case CUDNN_DATA_FLOAT: return "FLOAT";
    case CUDNN_DATA_DOUBLE: return "DOUBLE";
    case CUDNN_DATA_HALF: return "HALF";
    case CUDNN_DATA_BFLOAT16: return "BFLOAT16";
  }
  return "an unknown data type";
}

inline size_t bytes_of(const int64_t dims[4], cudnnDataType_t t) {
  return static_cast<size_t>(dims[0] * dims[1] * dims[2] * dims[3]) * element_size(t);
}

inline const char* format_name(cudnnTensorFormat_t f) {
  return f == CUDNN_TENSOR_NHWC ? "NHWC" : "NCHW";
}

inline std::string dims_str(const int64_t d[4]) {
  return "(" + std::to_string(d[0]) + ", " + std::to_string(d[1]) + ", " + std::to_string(d[2]) +
         ", " + std::to_string(d[3]) + ")";
}

}  // namespace kiln::sim::cudnn_objects
