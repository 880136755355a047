// gemm_bench: GFLOP/s of our CUDA GEMM steps against cuBLAS on square matrices,
// C (N,N) = A (N,N) B (N,N), as tools/gpu_check.sh reports them (docs/cuda.md has the figures).
//
//   gemm_bench [--sizes 1024,2048,4096,8192] [--kernels hand,vendor] [--iters 10] [--json out]
//
// Kernels: naive, tiled, regblock (the f32 steps of engine/cuda/kernels/gemm.cu), tc_bf16 and
// tc_f16 (step 4, tensor cores: A and B rounded to bf16 / f16, C in f32), hand (what matmul uses
// with KILN_KERNELS=hand: regblock for float) and vendor (cuBLAS SGEMM; TF32 only with
// KILN_TF32=1). One line per size and kernel, then hand/vendor and each tensor-core kernel over
// regblock and over vendor, when both ran. Each result is checked against a reference (cuBLAS
// when it ran, else the CPU's BLAS up to N = 2048; for a tensor-core kernel the same product of
// its rounded inputs) and the worst error relative to max|C| is printed; a wrong result exits 1.
// FLOPs: 2 N^3 per product. Time: wall clock of `iters` back-to-back products on the stream,
// after `warmup` untimed ones, divided by iters.
// Under the CUDA simulator the kernels run on the CPU and cuBLAS is the simulator's host-computed
// stand-in: every line says SIMULATED and the default sizes are small.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "engine/cuda/context.h"
#include "engine/error.h"
#include "engine/ops_cpu.h"
#include "engine/ops_cuda.h"
#include "engine/tensor.h"
#include "engine/cuda/blas.h"

using namespace kiln;

namespace {

const char* const kSimTag = cuda::kSimulated ? "  SIMULATED" : "";

const Device kGpu(DeviceType::CUDA, 0);

Tensor random_matrix(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n * n));
  for (float& x : v) x = dist(gen);
  return Tensor::from_vector(v, {n, n});
}

// The input dtype of a tensor-core kernel ("tc_bf16", "tc_f16"); F32 for the others.
DType input_dtype(const std::string& kernel) {
  if (kernel == "tc_bf16") return DType::BF16;
  if (kernel == "tc_f16") return DType::F16;
  return DType::F32;
}

// One product with the named kernel, queued on the current stream of cuda:0. a and b are
// float, or for the tensor-core kernels bf16 / f16 bit patterns.
void run_kernel(const std::string& kernel, int64_t n, const void* a, const void* b, float* c) {
  const DType in = input_dtype(kernel);
  if (in != DType::F32)
    return cuda::gemm_tensor_core(in, false, false, n, n, n, static_cast<const uint16_t*>(a),
                                  static_cast<const uint16_t*>(b), c);
  const float* af = static_cast<const float*>(a);
  const float* bf = static_cast<const float*>(b);
  if (kernel == "vendor") return cuda::gemm_vendor<float>(false, false, n, n, n, af, bf, c);
  cuda::GemmKernel k = cuda::GemmKernel::RegisterBlocked;  // "hand" and "regblock"
  if (kernel == "naive") k = cuda::GemmKernel::Naive;
  if (kernel == "tiled") k = cuda::GemmKernel::Tiled;
  cuda::gemm_hand<float>(k, false, false, n, n, n, af, bf, c);
}

// The largest acceptable max-error: float rounding, or TF32's 10-bit inputs when cuBLAS uses them.
double tolerance() { return cuda::tf32_enabled() ? 1e-2 : 1e-4; }

// max |got - want| / max |want|.
double rel_error(const std::vector<float>& got, const std::vector<float>& want) {
  double scale = 0, worst = 0;
  for (float w : want) scale = std::max(scale, static_cast<double>(std::fabs(w)));
  for (size_t i = 0; i < want.size(); ++i) {
    const double e = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(e <= worst)) worst = e;  // NaN sticks
  }
  return scale > 0 ? worst / scale : worst;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"CUDA GEMM: our kernels (f32 steps, tensor cores) vs cuBLAS, GFLOP/s on square matrices"};
  std::vector<int64_t> sizes;
  std::vector<std::string> kernels{"hand", "vendor"};
  int iters = cuda::kSimulated ? 1 : 10, warmup = cuda::kSimulated ? 0 : 2;
  std::string json_path;
  app.add_option("--sizes", sizes, "matrix sizes N (N x N x N products), comma-separated "
                                   "(default 1024,2048,4096,8192; 64,128 under the simulator)")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  app.add_option("--kernels", kernels,
                 "comma-separated: naive, tiled, regblock, tc_bf16, tc_f16, hand, vendor")
      ->delimiter(',')
      ->check(CLI::IsMember({"naive", "tiled", "regblock", "tc_bf16", "tc_f16", "hand", "vendor"}));
  app.add_option("--iters", iters, "timed products per size and kernel")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "untimed products first")->check(CLI::NonNegativeNumber);
  app.add_option("--json", json_path, "also write the results as JSON to this file");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // prints --help, or the error and a hint
    return rc == 0 ? 0 : 2;
  }
  if (sizes.empty()) sizes = cuda::kSimulated ? std::vector<int64_t>{64, 128}
                                        : std::vector<int64_t>{1024, 2048, 4096, 8192};

  try {
    if (!cuda::is_available()) {
      std::fprintf(stderr, "gemm_bench: %s\n", cuda::unavailable_reason().c_str());
      return 2;
    }
    if (cuda::kSimulated)
      std::printf("gemm_bench: SIMULATED: the CUDA simulator runs the kernels on the CPU; these "
                  "figures say nothing about a GPU\n");
    std::printf("gemm_bench: C = A B (f32 C; A and B f32, or bf16 / f16 for tc_*) on %s, %d timed "
                "iteration(s) after %d warm-up%s\n",
                kGpu.str().c_str(), iters, warmup, kSimTag);
    nlohmann::json results = nlohmann::json::array(), ratios = nlohmann::json::array();
    nlohmann::json tc_ratios = nlohmann::json::array();
    bool all_ok = true;
    for (int64_t n : sizes) {
      const Tensor a = random_matrix(n, 1), b = random_matrix(n, 2);
      const bool vendor_runs = std::find(kernels.begin(), kernels.end(), "vendor") != kernels.end();
      // Per input dtype: the operands on the GPU and the reference, the product of exactly those
      // values. f32: cuBLAS's timed result when it runs (vendor goes first), else the CPU up to
      // 2048. bf16 / f16: the f32 product of the rounded inputs (widened exactly), by cuBLAS when
      // it runs, else by the CPU up to 2048.
      struct Inputs {
        Tensor a_d, b_d;
        std::vector<float> reference;
      };
      std::map<DType, Inputs> inputs;
      auto inputs_for = [&](DType in) -> Inputs& {
        auto it = inputs.find(in);
        if (it != inputs.end()) return it->second;
        const Tensor ar = in == DType::F32 ? a : a.to(in), br = in == DType::F32 ? b : b.to(in);
        Inputs x{ar.to(kGpu), br.to(kGpu), {}};
        const Tensor aw = ar.to(DType::F32), bw = br.to(DType::F32);
        if (in != DType::F32 && vendor_runs) {
          const Tensor aw_d = aw.to(kGpu), bw_d = bw.to(kGpu);
          Tensor c_d = Tensor::empty({n, n}, DType::F32, kGpu);
          {
            cuda::DeviceGuard guard(0);
            cuda::gemm_vendor<float>(false, false, n, n, n, aw_d.data<float>(), bw_d.data<float>(),
                                     c_d.data<float>());
          }
          x.reference = c_d.to_vector<float>();
        } else if (!vendor_runs && n <= 2048) {
          Tensor c = Tensor::empty({n, n});
          cpu::gemm<float>(false, false, n, n, n, aw.data<float>(), bw.data<float>(), c.data<float>());
          x.reference = c.to_vector<float>();
        }
        return inputs.emplace(in, std::move(x)).first->second;
      };
      std::map<std::string, double> gflops_of;
      // vendor first, so its result is the reference of the others.
      std::vector<std::string> order = kernels;
      std::stable_partition(order.begin(), order.end(), [](const std::string& k) { return k == "vendor"; });
      for (const std::string& kernel : order) {
        Inputs& in = inputs_for(input_dtype(kernel));
        Tensor c_d = Tensor::empty({n, n}, DType::F32, kGpu);
        double ms = 0;
        {
          cuda::DeviceGuard guard(0);
          for (int i = 0; i < warmup; ++i)
            run_kernel(kernel, n, in.a_d.raw_data(), in.b_d.raw_data(), c_d.data<float>());
          cuda::synchronize();
          const auto t0 = std::chrono::steady_clock::now();
          for (int i = 0; i < iters; ++i)
            run_kernel(kernel, n, in.a_d.raw_data(), in.b_d.raw_data(), c_d.data<float>());
          cuda::synchronize();
          ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / iters;
        }
        const double gflops = 2.0 * n * n * n / (ms * 1e6);
        const std::vector<float> got = c_d.to_vector<float>();
        double err = -1;
        if (kernel == "vendor" && in.reference.empty()) in.reference = got;
        else if (!in.reference.empty()) err = rel_error(got, in.reference);
        const bool ok = !(err > tolerance());  // NaN fails
        all_ok = all_ok && ok;
        char check[64];
        if (err < 0) std::snprintf(check, sizeof check, "%s", kernel == "vendor" ? "reference" : "unchecked");
        else std::snprintf(check, sizeof check, "max err %.1e%s", err, ok ? "" : " WRONG");
        std::printf("N %6lld  %-8s %10.1f GFLOP/s  %9.3f ms  %s%s\n", static_cast<long long>(n),
                    kernel.c_str(), gflops, ms, check, kSimTag);
        gflops_of[kernel] = gflops;
        results.push_back({{"size", n}, {"kernel", kernel}, {"ms", ms}, {"gflops", gflops},
                           {"dtype", dtype_name(input_dtype(kernel))},
                           {"max_rel_error", err < 0 ? nlohmann::json() : nlohmann::json(err)},
                           {"ok", ok}});
      }
      auto ran = [&](const std::string& k) { return gflops_of.count(k) > 0; };
      if (ran("hand") && ran("vendor")) {
        const double r = gflops_of["hand"] / gflops_of["vendor"];
        std::printf("N %6lld  hand/vendor %.2f%s\n", static_cast<long long>(n), r, kSimTag);
        ratios.push_back({{"size", n}, {"hand_over_vendor", r}});
      }
      // Each tensor-core kernel against the fastest f32 step (regblock, which hand is for
      // float) and against cuBLAS SGEMM.
      const std::string f32_step = ran("regblock") ? "regblock" : "hand";
      for (const char* tc : {"tc_bf16", "tc_f16"}) {
        if (!ran(tc) || (!ran(f32_step) && !ran("vendor"))) continue;
        nlohmann::json row{{"size", n}, {"kernel", tc}};
        std::printf("N %6lld  %s", static_cast<long long>(n), tc);
        if (ran(f32_step)) {
          row["over_f32_step"] = gflops_of[tc] / gflops_of[f32_step];
          std::printf("  /%s %.2f", f32_step.c_str(), gflops_of[tc] / gflops_of[f32_step]);
        }
        if (ran("vendor")) {
          row["over_vendor_f32"] = gflops_of[tc] / gflops_of["vendor"];
          std::printf("  /vendor(f32) %.2f", gflops_of[tc] / gflops_of["vendor"]);
        }
        std::printf("%s\n", kSimTag);
        tc_ratios.push_back(row);
      }
    }
    if (!json_path.empty()) {
      nlohmann::json j{{"simulated", cuda::kSimulated}, {"device", kGpu.str()}, {"dtype", "f32"},
                       {"iters", iters}, {"warmup", warmup}, {"results", results},
                       {"hand_over_vendor", ratios}, {"tensor_core", tc_ratios}};
      std::ofstream out(json_path);
      KILN_CHECK_INPUT(out.good(), "gemm_bench: cannot write --json ", json_path);
      out << j.dump(2) << "\n";
    }
    if (!all_ok) {
      std::fprintf(stderr, "gemm_bench: a kernel produced a wrong result (see WRONG above)\n");
      return 1;
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "gemm_bench: %s\n", e.what());
    return e.exit_code();
  }
  return 0;
}
