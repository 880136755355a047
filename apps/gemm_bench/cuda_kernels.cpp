// cuda_kernels.cpp: gemm_bench's CUDA kernels by name (cuda_kernels.h).
#include <cstdint>
#include <optional>
#include <string>

#include "apps/gemm_bench/cuda_kernels.h"
#include "engine/backend.h"
#include "engine/ops_cuda.h"

namespace kiln::apps::gemm_bench {
namespace {

struct Sm90Kernel {
  const char* name;
  DType in;
  cuda::Sm90Step step;
};
constexpr Sm90Kernel kSm90Kernels[] = {
    {"sm90_bf16", DType::BF16, cuda::Sm90Step::Pipelined},
    {"sm90_f16", DType::F16, cuda::Sm90Step::Pipelined},
    {"sm90ws_bf16", DType::BF16, cuda::Sm90Step::WarpSpecialized},
    {"sm90ws_f16", DType::F16, cuda::Sm90Step::WarpSpecialized},
    {"sm90p_bf16", DType::BF16, cuda::Sm90Step::Persistent},
    {"sm90p_f16", DType::F16, cuda::Sm90Step::Persistent},
};

const Sm90Kernel* find_sm90(const std::string& kernel) {
  for (const Sm90Kernel& k : kSm90Kernels)
    if (kernel == k.name) return &k;
  return nullptr;
}

}  // namespace

DType input_dtype(const std::string& kernel) {
  if (const Sm90Kernel* k = find_sm90(kernel)) return k->in;
  if (kernel == "tc_bf16" || kernel == "vendor_bf16") return DType::BF16;
  if (kernel == "tc_f16") return DType::F16;
  return DType::F32;
}

bool is_tensor_core(const std::string& kernel) { return kernel == "tc_bf16" || kernel == "tc_f16"; }

std::optional<cuda::Sm90Step> sm90_step(const std::string& kernel) {
  if (const Sm90Kernel* k = find_sm90(kernel)) return k->step;
  return std::nullopt;
}

void run_kernel(const std::string& kernel, int64_t n, const void* a, const void* b, float* c) {
  const DType in = input_dtype(kernel);
  if (in != DType::F32) {
    const auto* a16 = static_cast<const uint16_t*>(a);
    const auto* b16 = static_cast<const uint16_t*>(b);
    if (kernel == "vendor_bf16")
      return cuda::gemm_lowp_vendor(cuda::Backend{}, in, false, false, n, n, n, a16, b16, c);
    if (const std::optional<cuda::Sm90Step> step = sm90_step(kernel))
      return cuda::gemm_sm90(in, false, true, n, n, n, a16, b16, c, *step);
    return cuda::gemm_tensor_core(in, false, false, n, n, n, a16, b16, c);
  }
  const auto* af = static_cast<const float*>(a);
  const auto* bf = static_cast<const float*>(b);
  if (kernel == "vendor")
    return cuda::gemm_vendor<float>(cuda::Backend{}, false, false, n, n, n, af, bf, c);
  cuda::GemmKernel k = cuda::GemmKernel::RegisterBlocked;  // "hand" and "regblock"
  if (kernel == "naive") k = cuda::GemmKernel::Naive;
  if (kernel == "tiled") k = cuda::GemmKernel::Tiled;
  cuda::gemm_hand<float>(k, false, false, n, n, n, af, bf, c);
}

}  // namespace kiln::apps::gemm_bench
