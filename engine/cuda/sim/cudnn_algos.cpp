// sim/cudnn_algos.cpp: the simulated cuDNN's algorithm model (see cudnn_algos.h).
// cuDNN's algorithm lists as its API reference documents them
// (https://docs.nvidia.com/deeplearning/cudnn/api/, "cudnn_cnn").
#include "engine/cuda/sim/cudnn_algos.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kiln::sim {
namespace {

// Where cuDNN documents that an algorithm applies.
enum class Support { Always, Never, Fft, Winograd3x3, WinogradNonfused };
// What the workspace holds.
enum class Workspace { None, IndexTable, Im2col, Fft, FftTiling, WinogradTiles, FilterCopy };

struct Candidate {
  ConvPass pass;
  int algo;
  bool tensor_op;  // also offered as a tensor-core kernel (float as TF32, half, bfloat16)
  bool deterministic;
  float cost;  // modelled nanoseconds per 1000 multiply-adds (FMA kernel)
  Support support;
  Workspace workspace;
};

constexpr float kTensorOpSpeedup = 4;  // tensor cores (TF32, or 16-bit inputs) vs FP32 FMA, roughly

// Data types with tensor-core kernels: FLOAT (as TF32) and the 16-bit types.
bool has_tensor_op(cudnnDataType_t dt) {
  return dt == CUDNN_DATA_FLOAT || dt == CUDNN_DATA_HALF || dt == CUDNN_DATA_BFLOAT16;
}

constexpr Candidate kCandidates[] = {
    {ConvPass::Forward, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, true, true, 1.0f,
     Support::Always, Workspace::IndexTable},
    {ConvPass::Forward, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, false, true, 1.6f,
     Support::Always, Workspace::None},
    {ConvPass::Forward, CUDNN_CONVOLUTION_FWD_ALGO_GEMM, false, true, 2.0f, Support::Always,
     Workspace::Im2col},
    {ConvPass::Forward, CUDNN_CONVOLUTION_FWD_ALGO_DIRECT, false, true, 4.0f, Support::Never,
     Workspace::None},
    {ConvPass::Forward, CUDNN_CONVOLUTION_FWD_ALGO_FFT, false, true, 2.5f, Support::Fft,
     Workspace::Fft},
    {ConvPass::Forward, CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING, false, true, 1.2f, Support::Fft,
     Workspace::FftTiling},
    {ConvPass::Forward, CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD, false, true, 0.8f,
     Support::Winograd3x3, Workspace::None},
    {ConvPass::Forward, CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED, false, true, 0.6f,
     Support::WinogradNonfused, Workspace::WinogradTiles},

    {ConvPass::BackwardData, CUDNN_CONVOLUTION_BWD_DATA_ALGO_0, false, false, 0.8f,
     Support::Always, Workspace::None},
    {ConvPass::BackwardData, CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, true, true, 1.0f,
     Support::Always, Workspace::IndexTable},
    {ConvPass::BackwardData, CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT, false, true, 2.5f, Support::Fft,
     Workspace::Fft},
    {ConvPass::BackwardData, CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING, false, true, 1.3f,
     Support::Fft, Workspace::FftTiling},
    {ConvPass::BackwardData, CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD, false, true, 1.1f,
     Support::Winograd3x3, Workspace::None},
    {ConvPass::BackwardData, CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED, false, true, 0.9f,
     Support::WinogradNonfused, Workspace::WinogradTiles},

    {ConvPass::BackwardFilter, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0, false, false, 0.7f,
     Support::Always, Workspace::None},
    {ConvPass::BackwardFilter, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, true, true, 1.0f,
     Support::Always, Workspace::FilterCopy},
    {ConvPass::BackwardFilter, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT, false, true, 2.6f,
     Support::Fft, Workspace::Fft},
    {ConvPass::BackwardFilter, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3, false, false, 0.9f,
     Support::Always, Workspace::FilterCopy},
    {ConvPass::BackwardFilter, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD, false, true, 1.0f,
     Support::Never, Workspace::None},
    {ConvPass::BackwardFilter, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED, false, true,
     1.1f, Support::WinogradNonfused, Workspace::WinogradTiles},
    {ConvPass::BackwardFilter, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING, false, true, 1.4f,
     Support::Fft, Workspace::FftTiling},
};

int algo_count(ConvPass pass) {
  switch (pass) {
    case ConvPass::Forward: return CUDNN_CONVOLUTION_FWD_ALGO_COUNT;
    case ConvPass::BackwardData: return CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT;
    case ConvPass::BackwardFilter: return CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT;
  }
  return 0;
}

const Candidate* find_candidate(ConvPass pass, int algo) {
  for (const Candidate& c : kCandidates)
    if (c.pass == pass && c.algo == algo) return &c;
  return nullptr;
}

// The implicit-GEMM kernels: forward IMPLICIT_GEMM and IMPLICIT_PRECOMP_GEMM, backward ALGO_0
// and ALGO_1 (data and filter).
bool implicit_gemm(const Candidate& c) {
  switch (c.pass) {
    case ConvPass::Forward:
      return c.algo == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM ||
             c.algo == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
    case ConvPass::BackwardData:
      return c.algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_0 ||
             c.algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
    case ConvPass::BackwardFilter:
      return c.algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 ||
             c.algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1;
  }
  return false;
}

// Empty when the algorithm takes these layouts, else why not. The API reference's tables of
// supported configurations (cudnnConvolutionForward, ...BackwardData, ...BackwardFilter) are
// split by the filter's format: with an NCHW (KCRS) filter, x and y may each be NCHW or NHWC,
// except for the FFT algorithms, which want NCHW tensors; with an NHWC (KRSC) filter, x and y
// must be NHWC too, and only the implicit-GEMM kernels run.
std::string layout_unsupported(const Candidate& c, const ConvShape& g) {
  if (g.w_nhwc) {
    if (!g.x_nhwc || !g.y_nhwc) return "an NHWC filter needs NHWC input and output tensors";
    if (!implicit_gemm(c)) return "with an NHWC filter only the implicit-GEMM algorithms run";
    return "";
  }
  const bool fft = c.support == Support::Fft;
  if (fft && (g.x_nhwc || g.y_nhwc)) return "FFT needs NCHW input and output tensors";
  return "";
}

// Empty when the algorithm applies, else why not.
std::string unsupported(const Candidate& c, const ConvShape& g, cudnnDataType_t dt) {
  if (std::string why = layout_unsupported(c, g); !why.empty()) return why;
  const bool unit = g.stride_h == 1 && g.stride_w == 1 && g.dil_h == 1 && g.dil_w == 1;
  switch (c.support) {
    case Support::Always: return "";
    case Support::Never: return "not implemented by cuDNN";
    case Support::Fft:
      if (!unit || dt != CUDNN_DATA_FLOAT || g.pad_h >= g.r || g.pad_w >= g.s)
        return "FFT needs float, stride 1, no dilation, padding smaller than the filter";
      return "";
    case Support::Winograd3x3:
      if (!unit || dt != CUDNN_DATA_FLOAT || g.r != 3 || g.s != 3)
        return "Winograd needs float, a 3x3 filter, stride 1, no dilation";
      return "";
    case Support::WinogradNonfused:
      if (!unit || dt != CUDNN_DATA_FLOAT || g.r != g.s || (g.r != 3 && g.r != 5))
        return "nonfused Winograd needs float, a 3x3 or 5x5 filter, stride 1, no dilation";
      return "";
  }
  return "";
}

int64_t next_pow2(int64_t v) {
  int64_t p = 1;
  while (p < v) p *= 2;
  return p;
}

size_t workspace_bytes(const Candidate& c, const ConvShape& g, cudnnDataType_t dt) {
  const int64_t es = dt == CUDNN_DATA_DOUBLE ? 8 : dt == CUDNN_DATA_FLOAT ? 4 : 2;
  const int64_t crs = g.c * g.r * g.s;
  const int64_t maps = g.n * g.c + g.k * g.c + g.n * g.k;  // feature maps and filters
  int64_t bytes = 0;
  switch (c.workspace) {
    case Workspace::None: bytes = 0; break;
    case Workspace::IndexTable: bytes = crs * 4; break;
    case Workspace::Im2col: bytes = crs * g.p * g.q * es; break;
    case Workspace::Fft:  // complex spectra of every map, padded to powers of two
      bytes = maps * next_pow2(g.h + 2 * g.pad_h) * (next_pow2(g.w + 2 * g.pad_w) / 2 + 1) * 8;
      break;
    case Workspace::FftTiling: bytes = maps * 32 * 17 * 8; break;  // 32x32 tiles
    case Workspace::WinogradTiles: {
      const int64_t tiles = ((g.p + 3) / 4) * ((g.q + 3) / 4);
      bytes = (g.n * g.c * tiles + g.k * g.c + g.n * g.k * tiles) * 36 * es;
      break;
    }
    case Workspace::FilterCopy: bytes = g.k * crs * es; break;
  }
  return static_cast<size_t>(bytes);
}

}  // namespace

std::vector<ConvAlgoPerf> conv_algorithms(ConvPass pass, const ConvShape& g,
                                          cudnnDataType_t data_type, cudnnMathType_t desc_math) {
  const double macs = static_cast<double>(g.n * g.k * g.p * g.q) * (g.c * g.r * g.s);
  const cudnnMathType_t fma_math = desc_math == CUDNN_FMA_MATH ? CUDNN_FMA_MATH : CUDNN_DEFAULT_MATH;
  std::vector<ConvAlgoPerf> supported, rest;
  for (const Candidate& c : kCandidates) {
    if (c.pass != pass) continue;
    const ConvAlgoPerf base{c.algo, CUDNN_STATUS_SUCCESS, 0, workspace_bytes(c, g, data_type),
                            c.deterministic ? CUDNN_DETERMINISTIC : CUDNN_NON_DETERMINISTIC,
                            fma_math};
    if (!unsupported(c, g, data_type).empty()) {
      ConvAlgoPerf p = base;
      p.status = CUDNN_STATUS_NOT_SUPPORTED;
      p.time = -1;
      rest.push_back(p);
      continue;
    }
    ConvAlgoPerf p = base;
    p.time = static_cast<float>(macs * c.cost * 1e-9);
    supported.push_back(p);
    if (c.tensor_op && has_tensor_op(data_type)) {
      p.math = CUDNN_TENSOR_OP_MATH;
      p.time /= kTensorOpSpeedup;
      supported.push_back(p);
    }
  }
  std::stable_sort(supported.begin(), supported.end(),
                   [](const ConvAlgoPerf& a, const ConvAlgoPerf& b) { return a.time < b.time; });
  supported.insert(supported.end(), rest.begin(), rest.end());
  return supported;
}

int conv_algorithm_max_count(ConvPass pass) {
  int count = 0;
  for (const Candidate& c : kCandidates)
    if (c.pass == pass) count += c.tensor_op ? 2 : 1;
  return count;
}

cudnnStatus_t conv_algorithm_needs(ConvPass pass, int algo, const ConvShape& g,
                                   cudnnDataType_t data_type, cudnnMathType_t desc_math,
                                   size_t* workspace, bool* tf32, std::string* why) {
  const Candidate* c = algo >= 0 && algo < algo_count(pass) ? find_candidate(pass, algo) : nullptr;
  if (!c) {
    *why = "algorithm " + std::to_string(algo) + " is not one of this pass";
    return CUDNN_STATUS_BAD_PARAM;
  }
  *why = unsupported(*c, g, data_type);
  if (!why->empty()) return CUDNN_STATUS_NOT_SUPPORTED;
  *workspace = workspace_bytes(*c, g, data_type);
  *tf32 = c->tensor_op && data_type == CUDNN_DATA_FLOAT && desc_math != CUDNN_FMA_MATH;
  return CUDNN_STATUS_SUCCESS;
}

}  // namespace kiln::sim
