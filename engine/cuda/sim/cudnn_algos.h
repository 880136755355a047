// sim/cudnn_algos.h: the convolution algorithms the simulated cuDNN offers: what
// cudnnGetConvolution*Algorithm_v7 and cudnnFindConvolution*AlgorithmEx report, and what running
// one of them requires (workspace) and changes (TF32 rounding).
// Follows the cuDNN API reference's cudnnConvolution*Algo_t and cudnnMathType_t
// (https://docs.nvidia.com/deeplearning/cudnn/api/, "cudnn_cnn" and "cudnn_ops").
//
// A model, not cuDNN's behaviour on any one GPU. It keeps the documented shape of the answers:
//   - every algorithm of the pass is listed, with a status: CUDNN_STATUS_NOT_SUPPORTED where cuDNN
//     documents a restriction (FWD_ALGO_DIRECT and BWD_FILTER_ALGO_WINOGRAD are not implemented;
//     FFT and Winograd need stride 1, no dilation, float (the model offers them for FLOAT data
//     only, though cuDNN runs some on half); Winograd 3x3 filters, or 5x5 nonfused);
//   - for float, half and bfloat16, the GEMM-like algorithms are listed a second time as
//     CUDNN_TENSOR_OP_MATH (the tensor-core kernels: TF32 for float); the others report
//     CUDNN_FMA_MATH when the descriptor asks for it, CUDNN_DEFAULT_MATH otherwise. The list
//     does not depend on the descriptor's math type: the caller filters on mathType (as Kiln's
//     strict-FP32 rule does);
//   - layouts (sim/cudnn_layout.h) as the tables of supported configurations list them: an
//     NCHW filter takes NCHW or NHWC tensors (FFT: NCHW only); an NHWC filter takes NHWC
//     tensors, and only the implicit-GEMM algorithms (forward IMPLICIT_GEMM and
//     IMPLICIT_PRECOMP_GEMM, backward ALGO_0 and ALGO_1) run with it;
//   - BWD_DATA_ALGO_0, BWD_FILTER_ALGO_0 and _3 are CUDNN_NON_DETERMINISTIC, as documented;
//   - workspace sizes follow what each algorithm stores (an index table, one image's im2col,
//     transformed tiles), and time is a fixed cost per multiply-add per algorithm, tensor-op
//     kernels fastest: the order is plausible, the numbers are not measurements.
// Running an algorithm checks that the workspace offered is at least what it reports
// (CUDNN_STATUS_BAD_PARAM otherwise), and a tensor-op algorithm on float data with a math type
// other than CUDNN_FMA_MATH rounds its inputs to TF32 (16-bit inputs need no rounding: their
// products are exact in float). Every algorithm computes through the same
// host im2col + GEMM (cudnn_compute.h): their own summation orders are not simulated.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "engine/cuda/sim/cudnn.h"
#include "engine/cuda/sim/cudnn_compute.h"

namespace kiln::sim {

enum class ConvPass { Forward, BackwardData, BackwardFilter };

struct ConvAlgoPerf {
  int algo;  // cudnnConvolutionFwdAlgo_t, ...BwdDataAlgo_t or ...BwdFilterAlgo_t
  cudnnStatus_t status;
  float time;  // modelled milliseconds; -1 when not supported
  size_t memory;
  cudnnDeterminism_t determinism;
  cudnnMathType_t math;
};

// The heuristics' list for this convolution, best first, the unsupported ones last.
std::vector<ConvAlgoPerf> conv_algorithms(ConvPass pass, const ConvShape& g,
                                          cudnnDataType_t data_type, cudnnMathType_t desc_math);
// The longest list conv_algorithms returns for the pass (Get*AlgorithmMaxCount).
int conv_algorithm_max_count(ConvPass pass);

// What running `algo` needs: CUDNN_STATUS_BAD_PARAM for a value that is no algorithm of the
// pass, CUDNN_STATUS_NOT_SUPPORTED where the list says so (`why` says which); otherwise the
// workspace it needs and whether it rounds its inputs to TF32.
cudnnStatus_t conv_algorithm_needs(ConvPass pass, int algo, const ConvShape& g,
                                   cudnnDataType_t data_type, cudnnMathType_t desc_math,
                                   size_t* workspace, bool* tf32, std::string* why);

}  // namespace kiln::sim
