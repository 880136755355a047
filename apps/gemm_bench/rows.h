// rows.h: gemm_bench's two sets of measurements, one per device, and what they share.
//   cuda_rows.cpp  our CUDA GEMM steps (f32, and bf16 / f16 on tensor cores) vs cuBLAS (built with
//                  a CUDA backend only)
//   cpu_rows.cpp   bf16 / f16 products with f32 sums (cpu::gemm_lowp's paths) vs f32 OpenBLAS
// Each prints one line per size and kernel, appends the same to `results` (JSON), and returns
// false when a kernel's result was wrong.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "engine/tensor.h"

namespace kiln::apps::gemm_bench {

// The --kernels words per device (cuda_kernels.h and cpu_rows.cpp say what each runs).
inline const std::vector<std::string> kCudaKernels = {
    "naive", "tiled", "regblock",                             // steps 1-3, f32
    "tc_bf16", "tc_f16",                                      // step 4
    "sm90_bf16", "sm90_f16", "sm90ws_bf16", "sm90ws_f16",     // steps 5 and 6
    "sm90p_bf16", "sm90p_f16",                                // step 7
    "hand", "vendor", "vendor_bf16"};
inline const std::vector<std::string> kCpuKernels = {"blas", "hand", "vendor", "convert"};

struct Options {
  std::vector<int64_t> sizes;         // N of the N x N x N products
  std::vector<std::string> kernels;   // per device: see gemm_bench.cpp
  std::vector<std::string> dtypes;    // CPU: bf16, fp16 (--precision)
  int iters = 10, warmup = 2;
};

// An N x N f32 matrix of uniform values in [-1, 1) from `seed`.
Tensor random_matrix(int64_t n, uint32_t seed);

// max |got - want| / max |want| (NaN if any element is NaN).
double rel_error(const std::vector<float>& got, const std::vector<float>& want);

// `ratios` gets {size, "x_over_y": ratio} (CPU rows add dtype) per size where both kernels ran:
// hand_over_vendor, tc_bf16_over_vendor_bf16, ...
bool cuda_rows(const Options& o, nlohmann::json& results, nlohmann::json& ratios);
bool cpu_rows(const Options& o, nlohmann::json& results, nlohmann::json& ratios);

}  // namespace kiln::apps::gemm_bench
