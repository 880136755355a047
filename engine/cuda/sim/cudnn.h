// sim/cudnn.h: the CUDA simulator's stand-in for <cudnn.h>: the subset of cuDNN 9's legacy
// convolution API that Kiln calls, with cuDNN's own names, signatures and enum values
// (docs/cuda_simulator.md, "Vendor libraries"). engine/cuda/dnn.h includes it under
// KILN_CUDA_SIM.
//
// Semantics follow the cuDNN API reference (https://docs.nvidia.com/deeplearning/cudnn/api/,
// "cudnn_ops" and "cudnn_cnn"): out = alpha op(in) + beta out with host scaling factors (double
// for DOUBLE data, float for the others), out not read when beta is 0, descriptors checked
// against each other (CUDNN_STATUS_BAD_PARAM). The convolutions are computed on the host
// (sim/cudnn_compute.cpp) and queued on the handle's stream. What is simulated of the
// algorithms (their list, workspace, math type) is described in sim/cudnn_algos.h.
//
// Subset: 4-d packed tensors and filters, NCHW or NHWC (a filter KCRS or KRSC; the layouts each
// algorithm takes: sim/cudnn_algos.h), of FLOAT, DOUBLE, HALF or BFLOAT16, 2-d convolutions
// (padding, stride, dilation, convolution or cross-correlation, group count 1). The data type
// and the convolution's compute type form one of cuDNN's documented configurations: FLOAT data
// computed in FLOAT, DOUBLE in DOUBLE, HALF or BFLOAT16 in FLOAT (x, w and y of one type; the
// 16-bit values are widened exactly, the sums run in float and each result is rounded once to
// the data type, nearest even). Other formats and types are CUDNN_STATUS_NOT_SUPPORTED when set;
// another pairing of data and compute type is CUDNN_STATUS_NOT_SUPPORTED when used.
#pragma once

#include <cstddef>

#include "engine/cuda/sim/api.h"
#include "engine/cuda/sim/library_error.h"  // IWYU pragma: export

// The enums have a fixed underlying type (int): any int converted to one is then a valid value,
// which the simulator checks and rejects as cuDNN does (an out-of-range value of an enum
// without one would be undefined behaviour, reported by UBSan before the check could run).
enum cudnnStatus_t : int {
  CUDNN_STATUS_SUCCESS = 0,
  CUDNN_STATUS_NOT_INITIALIZED = 1001,
  CUDNN_STATUS_BAD_PARAM = 2000,
  CUDNN_STATUS_BAD_PARAM_NULL_POINTER = 2002,
  CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH = 2008,
  CUDNN_STATUS_NOT_SUPPORTED = 3000,
  CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE = 3003,
  CUDNN_STATUS_NOT_SUPPORTED_LAYOUT = 3004,
  CUDNN_STATUS_INTERNAL_ERROR = 4000,
  CUDNN_STATUS_EXECUTION_FAILED = 5000,
};

enum cudnnDataType_t : int {
  CUDNN_DATA_FLOAT = 0,
  CUDNN_DATA_DOUBLE = 1,
  CUDNN_DATA_HALF = 2,       // IEEE binary16, computed in FLOAT (PSEUDO_HALF_CONFIG)
  CUDNN_DATA_BFLOAT16 = 9,   // bfloat16, computed in FLOAT
};

enum cudnnTensorFormat_t : int {
  CUDNN_TENSOR_NCHW = 0,
  CUDNN_TENSOR_NHWC = 1,  // channels last: (n, c, h, w) at ((n H + h) W + w) C + c
  // CUDNN_TENSOR_NCHW_VECT_C = 2 (vectorised INT8 types) is not simulated.
};

enum cudnnMathType_t : int {
  CUDNN_DEFAULT_MATH = 0,  // FP32: tensor cores (TF32) allowed
  CUDNN_TENSOR_OP_MATH = 1,
  CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION = 2,
  CUDNN_FMA_MATH = 3,  // FMA instructions only: no TF32
};

enum cudnnDeterminism_t : int {
  CUDNN_NON_DETERMINISTIC = 0,
  CUDNN_DETERMINISTIC = 1,
};

enum cudnnConvolutionMode_t : int {
  CUDNN_CONVOLUTION = 0,  // the filter is flipped
  CUDNN_CROSS_CORRELATION = 1,
};

enum cudnnConvolutionFwdAlgo_t : int {
  CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM = 0,
  CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM = 1,
  CUDNN_CONVOLUTION_FWD_ALGO_GEMM = 2,
  CUDNN_CONVOLUTION_FWD_ALGO_DIRECT = 3,
  CUDNN_CONVOLUTION_FWD_ALGO_FFT = 4,
  CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING = 5,
  CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD = 6,
  CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED = 7,
  CUDNN_CONVOLUTION_FWD_ALGO_COUNT = 8,
};

enum cudnnConvolutionBwdDataAlgo_t : int {
  CUDNN_CONVOLUTION_BWD_DATA_ALGO_0 = 0,  // non-deterministic
  CUDNN_CONVOLUTION_BWD_DATA_ALGO_1 = 1,
  CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT = 2,
  CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING = 3,
  CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD = 4,
  CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED = 5,
  CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT = 6,
};

enum cudnnConvolutionBwdFilterAlgo_t : int {
  CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 = 0,  // non-deterministic
  CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1 = 1,
  CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT = 2,
  CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3 = 3,  // non-deterministic
  CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD = 4,  // not implemented by cuDNN
  CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED = 5,
  CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING = 6,
  CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT = 7,
};

// One algorithm as the heuristics (Get*_v7) or the search (Find*Ex) report it.
struct cudnnConvolutionFwdAlgoPerf_t {
  cudnnConvolutionFwdAlgo_t algo;
  cudnnStatus_t status;
  float time;     // milliseconds (-1 when not run)
  size_t memory;  // workspace bytes it needs
  cudnnDeterminism_t determinism;
  cudnnMathType_t mathType;
  int reserved[3];
};
struct cudnnConvolutionBwdDataAlgoPerf_t {
  cudnnConvolutionBwdDataAlgo_t algo;
  cudnnStatus_t status;
  float time;
  size_t memory;
  cudnnDeterminism_t determinism;
  cudnnMathType_t mathType;
  int reserved[3];
};
struct cudnnConvolutionBwdFilterAlgoPerf_t {
  cudnnConvolutionBwdFilterAlgo_t algo;
  cudnnStatus_t status;
  float time;
  size_t memory;
  cudnnDeterminism_t determinism;
  cudnnMathType_t mathType;
  int reserved[3];
};

struct cudnnContext;
struct cudnnTensorStruct;
struct cudnnFilterStruct;
struct cudnnConvolutionStruct;
using cudnnHandle_t = cudnnContext*;
using cudnnTensorDescriptor_t = cudnnTensorStruct*;
using cudnnFilterDescriptor_t = cudnnFilterStruct*;
using cudnnConvolutionDescriptor_t = cudnnConvolutionStruct*;

const char* cudnnGetErrorString(cudnnStatus_t status);  // "CUDNN_STATUS_BAD_PARAM"

// ---- Handle: the device current at creation, the legacy default stream until set ----------
cudnnStatus_t cudnnCreate(cudnnHandle_t* handle);
cudnnStatus_t cudnnDestroy(cudnnHandle_t handle);
cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t stream);
cudnnStatus_t cudnnGetStream(cudnnHandle_t handle, cudaStream_t* stream);

// ---- Descriptors -----------------------------------------------------------------------
cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t* desc);
cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t desc, cudnnTensorFormat_t format,
                                         cudnnDataType_t data_type, int n, int c, int h, int w);
cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t desc);

cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t* desc);
cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t desc, cudnnDataType_t data_type,
                                         cudnnTensorFormat_t format, int k, int c, int h, int w);
cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t desc);

cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t* desc);
cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t desc, int pad_h,
                                              int pad_w, int u, int v, int dilation_h,
                                              int dilation_w, cudnnConvolutionMode_t mode,
                                              cudnnDataType_t compute_type);
cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t desc,
                                          cudnnMathType_t math_type);
cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t desc);

// ---- Algorithm choice (sim/cudnn_algos.h: the modelled list) ---------------------------------
cudnnStatus_t cudnnGetConvolutionForwardAlgorithmMaxCount(cudnnHandle_t handle, int* count);
cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(
    cudnnHandle_t handle, cudnnTensorDescriptor_t x_desc, cudnnFilterDescriptor_t w_desc,
    cudnnConvolutionDescriptor_t conv_desc, cudnnTensorDescriptor_t y_desc, int requested,
    int* returned, cudnnConvolutionFwdAlgoPerf_t* perf);
cudnnStatus_t cudnnFindConvolutionForwardAlgorithmEx(
    cudnnHandle_t handle, cudnnTensorDescriptor_t x_desc, const void* x,
    cudnnFilterDescriptor_t w_desc, const void* w, cudnnConvolutionDescriptor_t conv_desc,
    cudnnTensorDescriptor_t y_desc, void* y, int requested, int* returned,
    cudnnConvolutionFwdAlgoPerf_t* perf, void* workspace, size_t workspace_bytes);

cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithmMaxCount(cudnnHandle_t handle, int* count);
cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(
    cudnnHandle_t handle, cudnnFilterDescriptor_t w_desc, cudnnTensorDescriptor_t dy_desc,
    cudnnConvolutionDescriptor_t conv_desc, cudnnTensorDescriptor_t dx_desc, int requested,
    int* returned, cudnnConvolutionBwdDataAlgoPerf_t* perf);
cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithmEx(
    cudnnHandle_t handle, cudnnFilterDescriptor_t w_desc, const void* w,
    cudnnTensorDescriptor_t dy_desc, const void* dy, cudnnConvolutionDescriptor_t conv_desc,
    cudnnTensorDescriptor_t dx_desc, void* dx, int requested, int* returned,
    cudnnConvolutionBwdDataAlgoPerf_t* perf, void* workspace, size_t workspace_bytes);

cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(cudnnHandle_t handle,
                                                                 int* count);
cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(
    cudnnHandle_t handle, cudnnTensorDescriptor_t x_desc, cudnnTensorDescriptor_t dy_desc,
    cudnnConvolutionDescriptor_t conv_desc, cudnnFilterDescriptor_t dw_desc, int requested,
    int* returned, cudnnConvolutionBwdFilterAlgoPerf_t* perf);
cudnnStatus_t cudnnFindConvolutionBackwardFilterAlgorithmEx(
    cudnnHandle_t handle, cudnnTensorDescriptor_t x_desc, const void* x,
    cudnnTensorDescriptor_t dy_desc, const void* dy, cudnnConvolutionDescriptor_t conv_desc,
    cudnnFilterDescriptor_t dw_desc, void* dw, int requested, int* returned,
    cudnnConvolutionBwdFilterAlgoPerf_t* perf, void* workspace, size_t workspace_bytes);

// ---- Computation: out = alpha op(...) + beta out ------------------------------------------
cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t handle, const void* alpha,
                                      cudnnTensorDescriptor_t x_desc, const void* x,
                                      cudnnFilterDescriptor_t w_desc, const void* w,
                                      cudnnConvolutionDescriptor_t conv_desc,
                                      cudnnConvolutionFwdAlgo_t algo, void* workspace,
                                      size_t workspace_bytes, const void* beta,
                                      cudnnTensorDescriptor_t y_desc, void* y);
cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t handle, const void* alpha,
                                           cudnnFilterDescriptor_t w_desc, const void* w,
                                           cudnnTensorDescriptor_t dy_desc, const void* dy,
                                           cudnnConvolutionDescriptor_t conv_desc,
                                           cudnnConvolutionBwdDataAlgo_t algo, void* workspace,
                                           size_t workspace_bytes, const void* beta,
                                           cudnnTensorDescriptor_t dx_desc, void* dx);
cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t handle, const void* alpha,
                                             cudnnTensorDescriptor_t x_desc, const void* x,
                                             cudnnTensorDescriptor_t dy_desc, const void* dy,
                                             cudnnConvolutionDescriptor_t conv_desc,
                                             cudnnConvolutionBwdFilterAlgo_t algo,
                                             void* workspace, size_t workspace_bytes,
                                             const void* beta, cudnnFilterDescriptor_t dw_desc,
                                             void* dw);
// db (1, K, 1, 1) = alpha sum over n, h, w of dy (N, K, H, W) + beta db.
cudnnStatus_t cudnnConvolutionBackwardBias(cudnnHandle_t handle, const void* alpha,
                                           cudnnTensorDescriptor_t dy_desc, const void* dy,
                                           const void* beta, cudnnTensorDescriptor_t db_desc,
                                           void* db);
// C = alpha A + beta C, A broadcast: each dimension of A equals C's or is 1.
cudnnStatus_t cudnnAddTensor(cudnnHandle_t handle, const void* alpha,
                             cudnnTensorDescriptor_t a_desc, const void* A, const void* beta,
                             cudnnTensorDescriptor_t c_desc, void* C);
