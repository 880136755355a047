// cuda_rows.cpp: gemm_bench on cuda:0: the steps of our GEMM (engine/cuda/kernels/gemm.cu,
// gemm_tensor_core.cu, gemm_sm90*.cu) and cuBLAS on square matrices, C always f32 (contract:
// rows.h; the kernels: cuda_kernels.h). A kernel the device cannot run is a skipped row saying
// why: step 4 below compute capability 8.0, steps 5-7 off 9.0, and a Hopper step gemm_sm90
// refuses with a usage error (a step not in this build). The Hopper rows share one B^T per
// input dtype, made once before timing.
// Each result is checked against the f32 product of exactly its inputs (bf16 / f16 widened
// exactly): cuBLAS SGEMM's when a vendor kernel runs (for f32 with vendor, vendor's own result),
// else the CPU's BLAS up to N = 2048. Then the ratios: hand/vendor; each tensor-core kernel over
// the fastest f32 step and over cuBLAS SGEMM; steps 4-7 on bf16 over cublasGemmEx on the same
// inputs (vendor_bf16); each Hopper step over the one before (sm90_bf16/tc_bf16,
// sm90ws_bf16/sm90_bf16, sm90p_bf16/sm90ws_bf16) and the f16 ones over tc_f16. Time: wall clock
// of `iters` back-to-back products on the stream, after `warmup` untimed ones, divided by iters.
// Under the CUDA simulator every line says SIMULATED.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "apps/gemm_bench/cuda_kernels.h"
#include "apps/gemm_bench/rows.h"
#include "engine/cuda/blas.h"
#include "engine/cuda/context.h"
#include "engine/error.h"
#include "engine/impl.h"
#include "engine/ops.h"
#include "engine/ops_cpu.h"
#include "engine/ops_cuda.h"

namespace kiln::apps::gemm_bench {
namespace {

const char* const kSimTag = cuda::kSimulated ? "  SIMULATED" : "";

// Milliseconds per product: `iters` back-to-back after `warmup`, the stream drained around them.
double time_ms(const Options& o, const std::string& kernel, int64_t n, const void* a,
               const void* b, float* c) {
  cuda::DeviceGuard guard(0);
  for (int i = 0; i < o.warmup; ++i) run_kernel(kernel, n, a, b, c);
  cuda::synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < o.iters; ++i) run_kernel(kernel, n, a, b, c);
  cuda::synchronize();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() /
         o.iters;
}

// The largest acceptable max-error: float rounding, or TF32's 10-bit inputs when cuBLAS SGEMM
// uses them (bf16 and f16 values are exact in TF32, so their references stay f32 products).
double tolerance() { return cuda::tf32_enabled() ? 1e-2 : 1e-4; }

// The operands of one input dtype on the GPU, and the reference: the product of exactly those
// values (empty when nothing computed one). bt_d: B^T, made when a Hopper kernel first needs it.
struct Inputs {
  Tensor a_d, b_d, bt_d;
  std::vector<float> reference;
};

// a and b rounded to `in` (unchanged for f32) and copied to `gpu`, with the reference: the f32
// product of their exact widening. When a vendor kernel is asked for (`cublas`: cuBLAS is
// trusted) cuBLAS SGEMM computes it; for f32 with vendor among the kernels (`vendor_f32`) that is
// vendor's own timed result, so none is made here. Without cuBLAS the CPU's BLAS computes it up
// to N = 2048.
Inputs make_inputs(DType in, const Tensor& a, const Tensor& b, int64_t n, const Device& gpu,
                   bool cublas, bool vendor_f32) {
  const Tensor ar = in == DType::F32 ? a : a.to(in), br = in == DType::F32 ? b : b.to(in);
  Inputs x{ar.to(gpu), br.to(gpu), Tensor(), {}};
  if (in == DType::F32 && vendor_f32) return x;
  const Tensor aw = ar.to(DType::F32), bw = br.to(DType::F32);
  if (cublas) {
    const Tensor aw_d = aw.to(gpu), bw_d = bw.to(gpu);
    Tensor c_d = Tensor::empty({n, n}, DType::F32, gpu);
    {
      cuda::DeviceGuard guard(0);
      cuda::gemm_vendor<float>(cuda::Backend{}, false, false, n, n, n, aw_d.data<float>(),
                               bw_d.data<float>(), c_d.data<float>());
    }
    x.reference = c_d.to_vector<float>();
  } else if (n <= 2048) {
    Tensor c = Tensor::empty({n, n});
    cpu::gemm<float>(cpu::Backend{}, false, false, n, n, n, aw.data<float>(), bw.data<float>(),
                     c.data<float>());
    x.reference = c.to_vector<float>();
  }
  return x;
}

}  // namespace

bool cuda_rows(const Options& o, nlohmann::json& results, nlohmann::json& ratios) {
  const Device gpu(DeviceType::CUDA, 0);
  if (cuda::kSimulated)
    std::printf("gemm_bench: SIMULATED: the CUDA simulator runs the kernels on the CPU; these "
                "figures say nothing about a GPU\n");
  std::printf("gemm_bench: C (f32) = A B on %s (A and B f32, or bf16 / f16 for tc_*, sm90*_* and "
              "vendor_bf16), %d timed iteration(s) after %d warm-up%s\n",
              gpu.str().c_str(), o.iters, o.warmup, kSimTag);
  bool tensor_cores = true, sm90 = true;
  {
    cuda::DeviceGuard guard(0);
    tensor_cores = cuda::tensor_cores_available();
    sm90 = cuda::sm90_gemm_available();
  }
  const auto asked = [&](const char* k) {
    return std::find(o.kernels.begin(), o.kernels.end(), k) != o.kernels.end();
  };
  const bool vendor_f32 = asked("vendor"), cublas = vendor_f32 || asked("vendor_bf16");
  bool all_ok = true;
  for (int64_t n : o.sizes) {
    const Tensor a = random_matrix(n, 1), b = random_matrix(n, 2);
    std::map<DType, Inputs> inputs;  // made when a kernel first needs them
    std::map<std::string, double> gflops_of;
    // vendor first, so its result is the reference of the other f32 kernels.
    std::vector<std::string> order = o.kernels;
    std::stable_partition(order.begin(), order.end(),
                          [](const std::string& k) { return k == "vendor"; });
    // A kernel that cannot run here: a line saying why, and the row {size, kernel, dtype, skipped}.
    const auto skip = [&](const std::string& kernel, const std::string& why) {
      std::printf("N %6lld  %-11s skipped: %s\n", static_cast<long long>(n), kernel.c_str(),
                  why.c_str());
      results.push_back({{"size", n}, {"kernel", kernel},
                         {"dtype", dtype_name(input_dtype(kernel))}, {"skipped", why}});
    };
    for (const std::string& kernel : order) {
      const bool hopper = sm90_step(kernel).has_value();
      if (is_tensor_core(kernel) && !tensor_cores) {
        skip(kernel, gpu.str() + " has no bf16/f16 tensor cores (compute capability 8.0+)");
        continue;
      }
      if (hopper && !sm90) {
        skip(kernel, gpu.str() + " is not compute capability 9.0 (TMA and wgmma are sm_90a "
                                 "features)");
        continue;
      }
      const DType in = input_dtype(kernel);
      auto it = inputs.find(in);
      if (it == inputs.end())
        it = inputs.emplace(in, make_inputs(in, a, b, n, gpu, cublas, vendor_f32)).first;
      Inputs& x = it->second;
      if (hopper && !x.bt_d.defined()) {
        cuda::DeviceGuard guard(0);
        x.bt_d = transpose(x.b_d, 0, 1);
      }
      Tensor c_d = Tensor::empty({n, n}, DType::F32, gpu);
      const Tensor& b_d = hopper ? x.bt_d : x.b_d;
      double ms = 0;
      try {
        ms = time_ms(o, kernel, n, x.a_d.raw_data(), b_d.raw_data(), c_d.data<float>());
      } catch (const Error& e) {
        // gemm_sm90 refuses what it cannot run (a step this build lacks) with a usage error,
        // before queueing any work: a skipped row. Anything else still ends the benchmark.
        if (!hopper || e.kind() != ErrorKind::Usage) throw;
        skip(kernel, e.what());
        continue;
      }
      const double gflops = 2.0 * n * n * n / (ms * 1e6);
      const std::vector<float> got = c_d.to_vector<float>();
      double err = -1;
      if (kernel == "vendor" && x.reference.empty()) x.reference = got;
      else if (!x.reference.empty()) err = rel_error(got, x.reference);
      const bool ok = !(err > tolerance());  // NaN fails
      all_ok = all_ok && ok;
      char check[64];
      if (err < 0)
        std::snprintf(check, sizeof check, "%s", kernel == "vendor" ? "reference" : "unchecked");
      else std::snprintf(check, sizeof check, "max err %.1e%s", err, ok ? "" : " WRONG");
      std::printf("N %6lld  %-11s %-4s %10.1f GFLOP/s  %9.3f ms  %s%s\n",
                  static_cast<long long>(n), kernel.c_str(), dtype_name(in), gflops, ms, check,
                  kSimTag);
      gflops_of[kernel] = gflops;
      results.push_back({{"size", n}, {"kernel", kernel}, {"dtype", dtype_name(in)}, {"ms", ms},
                         {"gflops", gflops},
                         {"max_rel_error", err < 0 ? nlohmann::json() : nlohmann::json(err)},
                         {"ok", ok}});
    }
    // The comparisons the rows are for, where both sides ran: {size, "x_over_y": ratio}.
    const auto ratio = [&](const std::string& x, const std::string& y) {
      if (!gflops_of.count(x) || !gflops_of.count(y)) return;
      const double r = gflops_of[x] / gflops_of[y];
      std::printf("N %6lld  %s/%s %.2f%s\n", static_cast<long long>(n), x.c_str(), y.c_str(), r,
                  kSimTag);
      ratios.push_back({{"size", n}, {x + "_over_" + y, r}});
    };
    ratio("hand", "vendor");
    // Each tensor-core kernel against the fastest f32 step (regblock, which hand is for float)
    // and cuBLAS SGEMM.
    const std::string f32_step = gflops_of.count("regblock") ? "regblock" : "hand";
    for (const char* tc : {"tc_bf16", "tc_f16", "sm90_bf16", "sm90_f16", "sm90ws_bf16",
                           "sm90ws_f16", "sm90p_bf16", "sm90p_f16"}) {
      ratio(tc, f32_step);
      ratio(tc, "vendor");
    }
    // Steps 4-7 against cuBLAS on the same bf16 inputs; each step against the one before on
    // bf16, and the Hopper steps on f16 against step 4.
    for (const char* step : {"tc_bf16", "sm90_bf16", "sm90ws_bf16", "sm90p_bf16"})
      ratio(step, "vendor_bf16");
    ratio("sm90_bf16", "tc_bf16");
    ratio("sm90ws_bf16", "sm90_bf16");
    ratio("sm90p_bf16", "sm90ws_bf16");
    for (const char* step : {"sm90_f16", "sm90ws_f16", "sm90p_f16"}) ratio(step, "tc_f16");
  }
  return all_ok;
}

}  // namespace kiln::apps::gemm_bench
