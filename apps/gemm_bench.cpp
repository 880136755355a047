// gemm_bench: GFLOP/s of matrix products on square matrices, C (N,N) = A (N,N) B (N,N).
//
//   gemm_bench [--device cuda|cpu] [--sizes ...] [--kernels ...] [--dtypes bf16,f16]
//              [--iters 10] [--warmup 2] [--json out]
//
// --device cuda (the default in CUDA builds; apps/gemm_bench/cuda_rows.cpp): the steps of our
//   GEMM against cuBLAS, as tools/gpu_check.sh reports them (docs/cuda.md has the figures).
//   Kernels: naive, tiled, regblock (the f32 steps of engine/cuda/kernels/gemm.cu), tc_bf16 and
//   tc_f16 (step 4, tensor cores: A and B rounded to bf16 / f16, C in f32), hand (what matmul
//   uses with KILN_KERNELS=hand: regblock for float), vendor (cuBLAS SGEMM; TF32 only with
//   KILN_TF32=1) and vendor_bf16 (cublasGemmEx on the bf16 inputs); default hand,vendor; sizes
//   1024,2048,4096,8192 (64,128 under the simulator, where every line says SIMULATED). A bf16 /
//   f16 result is checked against the f32 product of its rounded inputs.
// --device cpu (the default without CUDA; apps/gemm_bench/cpu_rows.cpp): mixed precision, bf16
//   and f16 inputs with f32 sums (cpu::gemm_lowp), against f32 OpenBLAS. Kernels: blas, hand
//   (the AVX-512 BF16 kernel), vendor (oneDNN), convert (widen to f32, then OpenBLAS); default
//   all four; sizes 512,1024.
// One line per size and kernel, with the worst error against a reference (a wrong result exits
// 1), then the ratios (hand/vendor, tc_bf16/vendor_bf16, ...). FLOPs: 2 N^3 per product; time:
// wall clock of `iters` products after `warmup` untimed ones, divided by iters.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "apps/gemm_bench/rows.h"
#include "engine/cuda/context.h"
#include "engine/error.h"

using namespace kiln;
using kiln::apps::gemm_bench::Options;

int main(int argc, char** argv) {
  CLI::App app{"GEMM GFLOP/s: our CUDA GEMM steps (f32, tensor cores) vs cuBLAS, or CPU bf16/f16 "
               "kernels vs f32 OpenBLAS"};
  Options o;
  std::string device = kWithCuda ? "cuda" : "cpu";
  std::string json_path;
  o.dtypes = {"bf16", "f16"};
  app.add_option("--device", device, "cuda (our GEMM steps vs cuBLAS) or cpu (bf16/f16 vs f32 "
                                     "BLAS); default cuda in CUDA builds, else cpu")
      ->check(CLI::IsMember({"cuda", "cpu"}));
  app.add_option("--sizes", o.sizes, "matrix sizes N (N x N x N products), comma-separated "
                                     "(default cuda 1024,2048,4096,8192, 64,128 under the "
                                     "simulator; cpu 512,1024)")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  app.add_option("--kernels", o.kernels, "comma-separated; cuda: naive, tiled, regblock, tc_bf16, "
                                         "tc_f16, hand, vendor, vendor_bf16 (default hand,vendor); "
                                         "cpu: blas, hand, vendor, convert (default all)")
      ->delimiter(',')
      ->check(CLI::IsMember({"naive", "tiled", "regblock", "tc_bf16", "tc_f16", "hand", "vendor",
                             "vendor_bf16", "blas", "convert"}));
  app.add_option("--dtypes", o.dtypes, "cpu: the input formats, comma-separated (default bf16,f16)")
      ->delimiter(',')
      ->check(CLI::IsMember({"bf16", "f16"}));
  app.add_option("--iters", o.iters, "timed products per size and kernel (default 10; 1 under "
                                     "the simulator)")
      ->check(CLI::PositiveNumber);
  app.add_option("--warmup", o.warmup, "untimed products first (default 2; 0 under the simulator)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--json", json_path, "also write the results as JSON to this file");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // prints --help, or the error and a hint
    return rc == 0 ? 0 : 2;
  }

  const bool on_cpu = device == "cpu";
  // Under the simulator the CUDA rows run on the CPU, slowly: one product each by default.
  const bool simulated = !on_cpu && cuda::kSimulated;
  if (app.count("--iters") == 0) o.iters = simulated ? 1 : 10;
  if (app.count("--warmup") == 0) o.warmup = simulated ? 0 : 2;
  if (o.kernels.empty())
    o.kernels = on_cpu ? std::vector<std::string>{"blas", "hand", "vendor", "convert"}
                       : std::vector<std::string>{"hand", "vendor"};
  if (o.sizes.empty())
    o.sizes = on_cpu ? std::vector<int64_t>{512, 1024}
                     : cuda::kSimulated ? std::vector<int64_t>{64, 128}
                                        : std::vector<int64_t>{1024, 2048, 4096, 8192};
  for (const std::string& k : o.kernels) {
    const bool cpu_kernel = k == "blas" || k == "hand" || k == "vendor" || k == "convert";
    const bool cuda_kernel = k != "blas" && k != "convert";
    if (on_cpu ? !cpu_kernel : !cuda_kernel) {
      std::fprintf(stderr, "gemm_bench: --kernels %s is not a %s kernel (cpu: blas, hand, vendor, "
                           "convert; cuda: naive, tiled, regblock, tc_bf16, tc_f16, hand, "
                           "vendor, vendor_bf16)\n",
                   k.c_str(), device.c_str());
      return 2;
    }
  }

  try {
    nlohmann::json results = nlohmann::json::array(), ratios = nlohmann::json::array();
    bool all_ok = true;
    if (on_cpu) {
      all_ok = apps::gemm_bench::cpu_rows(o, results, ratios);
    } else {
      if (!cuda::is_available()) {
        std::fprintf(stderr, "gemm_bench: %s\n", cuda::unavailable_reason().c_str());
        return 2;
      }
#if KILN_WITH_CUDA
      all_ok = apps::gemm_bench::cuda_rows(o, results, ratios);
#endif
    }
    if (!json_path.empty()) {
      nlohmann::json j{{"simulated", simulated},
                       {"device", on_cpu ? std::string("cpu") : Device(DeviceType::CUDA, 0).str()},
                       {"iters", o.iters}, {"warmup", o.warmup}, {"results", results},
                       {"hand_over_vendor", ratios}};
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
