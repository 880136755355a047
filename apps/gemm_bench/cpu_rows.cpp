// cpu_rows.cpp: gemm_bench on the CPU: mixed-precision products, bf16 or f16 inputs with f32
// sums and output (cpu::gemm_lowp, engine/gemm_lowp_cpu.h), against f32 OpenBLAS on the same
// square sizes (contract: rows.h). Kernels:
//   blas     cpu::gemm<float> (OpenBLAS) on the f32 matrices: the yardstick
//   hand     gemm_lowp, the hand twin: the AVX-512 BF16 kernel for bf16 where the CPU has it
//   vendor   gemm_lowp_vendor: oneDNN where it has a kernel for the dtype
//   convert  the convert+f32 path forced: widen both inputs, then OpenBLAS
// Each line names the path that ran (a dtype without a hand or oneDNN kernel falls back to
// convert+f32). Low-precision results are checked against OpenBLAS on the same rounded inputs:
// max error over max |C| at most 1e-4 (f32 sums in another order). FLOPs: 2 N^3 per product;
// time: wall clock of `iters` products after `warmup`, divided by iters, on this thread's
// OpenMP budget (OMP_NUM_THREADS).
#include <omp.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "apps/gemm_bench/rows.h"
#include "engine/convert_cpu.h"
#include "engine/gemm_lowp_cpu.h"
#include "engine/ops_cpu.h"

namespace kiln::apps::gemm_bench {
namespace {

template <typename Fn>
double time_ms(const Options& o, Fn&& product) {
  for (int i = 0; i < o.warmup; ++i) product();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < o.iters; ++i) product();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() /
         o.iters;
}

DType parse_dtype(const std::string& name) { return name == "fp16" ? DType::F16 : DType::BF16; }

}  // namespace

bool cpu_rows(const Options& o, nlohmann::json& results, nlohmann::json& ratios) {
  std::printf("gemm_bench: C (f32) = A B on the CPU, %d thread(s), %d timed iteration(s) after "
              "%d warm-up\n",
              omp_get_max_threads(), o.iters, o.warmup);
  bool all_ok = true;
  for (int64_t n : o.sizes) {
    const Tensor a = random_matrix(n, 1), b = random_matrix(n, 2);
    const double flops = 2.0 * n * n * n;
    std::map<std::string, double> gflops;  // "dtype kernel" -> GFLOP/s

    for (const std::string& kernel : o.kernels) {
      if (kernel != "blas") continue;
      Tensor c = Tensor::empty({n, n});
      const double ms = time_ms(o, [&] {
        cpu::gemm<float>(cpu::Backend{}, false, false, n, n, n, a.data<float>(), b.data<float>(),
                         c.data<float>());
      });
      gflops["f32 blas"] = flops / (ms * 1e6);
      std::printf("N %6lld  f32   %-8s %-12s %10.1f GFLOP/s  %9.3f ms\n",
                  static_cast<long long>(n), "blas", "openblas", flops / (ms * 1e6), ms);
      results.push_back({{"size", n}, {"dtype", "f32"}, {"kernel", "blas"}, {"path", "openblas"},
                         {"ms", ms}, {"gflops", flops / (ms * 1e6)}, {"max_rel_error", nullptr},
                         {"ok", true}});
    }

    for (const std::string& dtype_flag : o.dtypes) {
      const DType t = parse_dtype(dtype_flag);
      // The inputs rounded to t, and the reference: OpenBLAS on exactly those values.
      Tensor a16 = a.to(t), b16 = b.to(t);
      Tensor a_wide = a16.to(DType::F32), b_wide = b16.to(DType::F32), ref = Tensor::empty({n, n});
      cpu::gemm<float>(cpu::Backend{}, false, false, n, n, n, a_wide.data<float>(),
                       b_wide.data<float>(), ref.data<float>());
      const std::vector<float> want = ref.to_vector<float>();
      const auto* ap = static_cast<const uint16_t*>(a16.raw_data());
      const auto* bp = static_cast<const uint16_t*>(b16.raw_data());

      for (const std::string& kernel : o.kernels) {
        if (kernel == "blas") continue;
        Tensor c = Tensor::empty({n, n});
        float* cp = c.data<float>();
        const char* path = "";
        double ms = 0;
        if (kernel == "convert") {
          path = cpu::lowp_gemm_path_name(cpu::LowpGemmPath::ConvertF32);
          ms = time_ms(o, [&] {
            cpu::gemm_lowp_with(cpu::LowpGemmPath::ConvertF32, t, false, false, n, n, n, ap, bp, cp);
          });
        } else {
          const Impl impl = kernel == "hand" ? Impl::Hand : Impl::Vendor;
          path = cpu::gemm_lowp_path(t, impl);
          ms = time_ms(o, [&] {
            if (impl == Impl::Vendor)
              cpu::gemm_lowp_vendor(cpu::Backend{}, t, false, false, n, n, n, ap, bp, cp);
            else
              cpu::gemm_lowp(cpu::Backend{}, t, false, false, n, n, n, ap, bp, cp);
          });
        }
        const double err = rel_error(c.to_vector<float>(), want);
        const bool ok = err <= 1e-4;  // NaN fails
        all_ok = all_ok && ok;
        gflops[dtype_flag + " " + kernel] = flops / (ms * 1e6);
        std::printf("N %6lld  %-5s %-8s %-12s %10.1f GFLOP/s  %9.3f ms  max err %.1e%s\n",
                    static_cast<long long>(n), dtype_flag.c_str(), kernel.c_str(), path,
                    flops / (ms * 1e6), ms, err, ok ? "" : " WRONG");
        results.push_back({{"size", n}, {"dtype", dtype_flag}, {"kernel", kernel}, {"path", path},
                           {"ms", ms}, {"gflops", flops / (ms * 1e6)}, {"max_rel_error", err},
                           {"ok", ok}});
      }
      // The comparisons the rows are for: the hand kernel against oneDNN and against f32 BLAS.
      const auto ratio = [&](const std::string& x, const std::string& y, const char* key) {
        if (!gflops.count(x) || !gflops.count(y)) return;
        std::printf("N %6lld  %s: %s / %s %.2f\n", static_cast<long long>(n), dtype_flag.c_str(),
                    x.c_str(), y.c_str(), gflops[x] / gflops[y]);
        ratios.push_back({{"size", n}, {"dtype", dtype_flag}, {key, gflops[x] / gflops[y]}});
      };
      ratio(dtype_flag + " hand", dtype_flag + " vendor", "hand_over_vendor");
      ratio(dtype_flag + " hand", "f32 blas", "hand_over_f32_blas");
      ratio(dtype_flag + " vendor", "f32 blas", "vendor_over_f32_blas");
    }
  }
  return all_ok;
}

}  // namespace kiln::apps::gemm_bench
