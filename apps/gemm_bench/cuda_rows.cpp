// cuda_rows.cpp: gemm_bench on cuda:0: our SGEMM steps (engine/cuda/kernels/gemm.cu) and cuBLAS
// on square f32 matrices (contract: rows.h). Each result is checked against a reference
// (cuBLAS when it ran, else the CPU's BLAS up to N = 2048). Time: wall clock of `iters`
// back-to-back products on the stream, after `warmup` untimed ones, divided by iters. Under
// the CUDA simulator every line says SIMULATED.
#include <algorithm>
#include <chrono>
#include <cstdio>

#include "apps/gemm_bench/rows.h"
#include "engine/cuda/blas.h"
#include "engine/cuda/context.h"
#include "engine/ops_cpu.h"
#include "engine/ops_cuda.h"

namespace kiln::apps::gemm_bench {
namespace {

const char* const kSimTag = cuda::kSimulated ? "  SIMULATED" : "";

// One product with the named kernel, queued on the current stream of cuda:0.
void run_kernel(const std::string& kernel, int64_t n, const float* a, const float* b, float* c) {
  if (kernel == "vendor") return cuda::gemm_vendor<float>(false, false, n, n, n, a, b, c);
  cuda::GemmKernel k = cuda::GemmKernel::RegisterBlocked;  // "hand" and "regblock"
  if (kernel == "naive") k = cuda::GemmKernel::Naive;
  if (kernel == "tiled") k = cuda::GemmKernel::Tiled;
  cuda::gemm_hand<float>(k, false, false, n, n, n, a, b, c);
}

// The largest acceptable max-error: float rounding, or TF32's 10-bit inputs when cuBLAS uses them.
double tolerance() { return cuda::tf32_enabled() ? 1e-2 : 1e-4; }

}  // namespace

bool cuda_rows(const Options& o, nlohmann::json& results, nlohmann::json& ratios) {
  const Device gpu(DeviceType::CUDA, 0);
  if (cuda::kSimulated)
    std::printf("gemm_bench: SIMULATED: the CUDA simulator runs the kernels on the CPU; these "
                "figures say nothing about a GPU\n");
  std::printf("gemm_bench: float32 C = A B on %s, %d timed iteration(s) after %d warm-up%s\n",
              gpu.str().c_str(), o.iters, o.warmup, kSimTag);
  bool all_ok = true;
  for (int64_t n : o.sizes) {
    const Tensor a = random_matrix(n, 1), b = random_matrix(n, 2);
    const Tensor a_d = a.to(gpu), b_d = b.to(gpu);
    // The reference result: cuBLAS when it runs, else the CPU up to 2048.
    std::vector<float> reference;
    const bool vendor_runs =
        std::find(o.kernels.begin(), o.kernels.end(), "vendor") != o.kernels.end();
    if (!vendor_runs && n <= 2048) {
      Tensor c = Tensor::empty({n, n});
      cpu::gemm<float>(false, false, n, n, n, a.data<float>(), b.data<float>(), c.data<float>());
      reference = c.to_vector<float>();
    }
    double hand_gflops = 0, vendor_gflops = 0;
    // vendor first, so its result is the reference of the others.
    std::vector<std::string> order = o.kernels;
    std::stable_partition(order.begin(), order.end(),
                          [](const std::string& k) { return k == "vendor"; });
    for (const std::string& kernel : order) {
      Tensor c_d = Tensor::empty({n, n}, DType::F32, gpu);
      double ms = 0;
      {
        cuda::DeviceGuard guard(0);
        for (int i = 0; i < o.warmup; ++i)
          run_kernel(kernel, n, a_d.data<float>(), b_d.data<float>(), c_d.data<float>());
        cuda::synchronize();
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < o.iters; ++i)
          run_kernel(kernel, n, a_d.data<float>(), b_d.data<float>(), c_d.data<float>());
        cuda::synchronize();
        ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                 .count() / o.iters;
      }
      const double gflops = 2.0 * n * n * n / (ms * 1e6);
      const std::vector<float> got = c_d.to_vector<float>();
      double err = -1;
      if (kernel == "vendor" && reference.empty()) reference = got;
      else if (!reference.empty()) err = rel_error(got, reference);
      const bool ok = !(err > tolerance());  // NaN fails
      all_ok = all_ok && ok;
      char check[64];
      if (err < 0)
        std::snprintf(check, sizeof check, "%s", kernel == "vendor" ? "reference" : "unchecked");
      else std::snprintf(check, sizeof check, "max err %.1e%s", err, ok ? "" : " WRONG");
      std::printf("N %6lld  %-8s %10.1f GFLOP/s  %9.3f ms  %s%s\n", static_cast<long long>(n),
                  kernel.c_str(), gflops, ms, check, kSimTag);
      if (kernel == "hand") hand_gflops = gflops;
      if (kernel == "vendor") vendor_gflops = gflops;
      results.push_back({{"size", n}, {"kernel", kernel}, {"ms", ms}, {"gflops", gflops},
                         {"max_rel_error", err < 0 ? nlohmann::json() : nlohmann::json(err)},
                         {"ok", ok}});
    }
    if (hand_gflops > 0 && vendor_gflops > 0) {
      std::printf("N %6lld  hand/vendor %.2f%s\n", static_cast<long long>(n),
                  hand_gflops / vendor_gflops, kSimTag);
      ratios.push_back({{"size", n}, {"hand_over_vendor", hand_gflops / vendor_gflops}});
    }
  }
  return all_ok;
}

}  // namespace kiln::apps::gemm_bench
