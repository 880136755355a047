// gemm_bench: GFLOP/s of matrix products on square matrices, C (N,N) = A (N,N) B (N,N).
//
//   gemm_bench [--device cuda|cpu] [--sizes ...] [--kernels ...] [--precision bf16,fp16]
//              [--threads N] [--iters 10] [--warmup 2] [--json out]
//
// --device cuda (the default in CUDA builds; apps/gemm_bench/cuda_rows.cpp): the steps of our
//   GEMM against cuBLAS, as tools/gpu_check.sh reports them (docs/cuda.md has the figures).
//   Kernels (apps/gemm_bench/cuda_kernels.h): naive, tiled, regblock (the f32 steps of
//   engine/cuda/kernels/gemm.cu), tc_bf16 and tc_f16 (step 4, gemm_tensor_core.cu: A and B
//   rounded to bf16 / f16, C in f32), the Hopper steps on the same inputs (compute capability
//   9.0 only, cuda::gemm_sm90): sm90_bf16 and sm90_f16 (step 5, TMA and wgmma), sm90ws_bf16 and
//   sm90ws_f16 (step 6, warp-specialised), sm90p_bf16 and sm90p_f16 (step 7, persistent), hand
//   (what matmul uses with KILN_KERNELS=hand: regblock for float), vendor (cuBLAS SGEMM; TF32
//   only with KILN_TF32=1) and vendor_bf16 (cublasGemmEx on the bf16 inputs); default
//   hand,vendor; sizes 1024,2048,4096,8192 (64,128 under the simulator, where every line says
//   SIMULATED). A bf16 / f16 result is checked against the f32 product of its rounded inputs. A
//   kernel the device cannot run (or a Hopper step not in this build) is a skipped line saying
//   why.
// --device cpu (the default without CUDA; apps/gemm_bench/cpu_rows.cpp): mixed precision, bf16
//   and f16 inputs with f32 sums (cpu::gemm_lowp), against f32 OpenBLAS. Kernels: blas, hand
//   (the AVX-512 BF16 kernel), vendor (oneDNN), convert (widen to f32, then OpenBLAS); default
//   all four; sizes 512,1024; --precision: the input formats (bf16, fp16), --threads: the
//   OpenMP/BLAS budget as in the other apps. The old spellings --dtypes and f16 still work
//   (apps/common/flag_names.h).
// One line per size and kernel, with the worst error against a reference (a wrong result exits
// 1), then the ratios (hand/vendor, tc_bf16/vendor_bf16, sm90p_bf16/sm90ws_bf16, ...). FLOPs:
// 2 N^3 per product; time: wall clock of `iters` products after `warmup` untimed ones, divided
// by iters. --json: {simulated, device, iters, warmup, results: one row per size and kernel
// ({size, kernel, dtype, ms, gflops, max_rel_error, ok}, or {size, kernel, dtype, skipped: why}),
// hand_over_vendor: the ratios, {size, "x_over_y": ratio} each}.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "apps/common/flag_checks.h"
#include "apps/common/output_paths.h"
#include "engine/parallel.h"
#include "apps/gemm_bench/rows.h"
#include "engine/cuda/context.h"
#include "engine/error.h"
#include "engine/output_file.h"

using namespace kiln;
using kiln::apps::gemm_bench::Options;

namespace {
// "a, b, c": a list of flag values for help and error texts.
std::string joined(const std::vector<std::string>& words) {
  std::string out;
  for (const std::string& w : words) out += (out.empty() ? "" : ", ") + w;
  return out;
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"GEMM GFLOP/s: our CUDA GEMM steps (f32, tensor cores) vs cuBLAS, or CPU bf16/f16 "
               "kernels vs f32 OpenBLAS"};
  Options o;
  std::string device = kWithCuda ? "cuda" : "cpu";
  std::string json_path;
  int threads = num_threads();
  o.dtypes = {"bf16", "fp16"};
  app.add_option("--device", device, "cuda (our GEMM steps vs cuBLAS) or cpu (bf16/f16 vs f32 "
                                     "BLAS); default cuda in CUDA builds, else cpu")
      ->check(apps::one_of({"cuda", "cpu"}));
  app.add_option("--sizes", o.sizes, "matrix sizes N (N x N x N products), comma-separated "
                                     "(default cuda 1024,2048,4096,8192, 64,128 under the "
                                     "simulator; cpu 512,1024)")
      ->delimiter(',')
      ->check(apps::in_range(int64_t{1}, int64_t{1} << 20));
  std::vector<std::string> all_kernels = apps::gemm_bench::kCudaKernels;
  for (const std::string& k : apps::gemm_bench::kCpuKernels)
    if (std::find(all_kernels.begin(), all_kernels.end(), k) == all_kernels.end())
      all_kernels.push_back(k);
  app.add_option("--kernels", o.kernels,
                 "comma-separated; cuda: " + joined(apps::gemm_bench::kCudaKernels) +
                     " (default hand,vendor); cpu: " + joined(apps::gemm_bench::kCpuKernels) +
                     " (default all)")
      ->delimiter(',')
      ->check(apps::one_of(all_kernels));
  app.add_option("--precision", o.dtypes, "cpu: the input formats, comma-separated (default "
                                          "bf16,fp16)")
      ->delimiter(',')
      ->check(apps::one_of({"bf16", "fp16"}));
  app.add_option("--threads", threads, "CPU threads (OpenMP and BLAS; kiln::set_num_threads)")
      ->check(apps::at_least(1))->capture_default_str();
  app.add_option("--iters", o.iters, "timed products per size and kernel (default 10; 1 under "
                                     "the simulator)")
      ->check(apps::at_least(1));
  app.add_option("--warmup", o.warmup, "untimed products first (default 2; 0 under the simulator)")
      ->check(apps::at_least(0));
  app.add_option("--json", json_path, "also write the results as JSON to this file");
  if (const std::optional<int> rc = apps::parse_flags(
          app, argc, argv, "gemm_bench",
          {apps::renamed_flag("--dtypes", "--precision"),
           apps::renamed_value("--precision", "f16", "fp16")})) {
    return *rc;
  }
  set_num_threads(threads);

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
  const std::vector<std::string>& device_kernels =
      on_cpu ? apps::gemm_bench::kCpuKernels : apps::gemm_bench::kCudaKernels;
  for (const std::string& k : o.kernels) {
    if (std::find(device_kernels.begin(), device_kernels.end(), k) == device_kernels.end()) {
      std::fprintf(stderr, "gemm_bench: error: --kernels %s is not a %s kernel (cpu: %s; cuda: "
                           "%s)\n",
                   k.c_str(), device.c_str(), joined(apps::gemm_bench::kCpuKernels).c_str(),
                   joined(apps::gemm_bench::kCudaKernels).c_str());
      return 2;
    }
  }

  try {
    apps::check_output_paths({{"--json", json_path}});  // written after the products: check now
    // A, B and C of the largest product, in f32 (the references and rounded copies come on top).
    const int64_t largest = *std::max_element(o.sizes.begin(), o.sizes.end());
    apps::check_fits_in_memory("--sizes", std::to_string(largest),
                               3.0 * static_cast<double>(largest) * largest * sizeof(float),
                               "three " + std::to_string(largest) + " x " +
                                   std::to_string(largest) + " f32 matrices");
    nlohmann::json results = nlohmann::json::array(), ratios = nlohmann::json::array();
    bool all_ok = true;
    if (on_cpu) {
      all_ok = apps::gemm_bench::cpu_rows(o, results, ratios);
    } else {
      if (!cuda::is_available()) {
        std::fprintf(stderr, "gemm_bench: error: %s\n", cuda::unavailable_reason().c_str());
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
      write_output_file("--json", json_path, j.dump(2) + "\n");
    }
    if (!all_ok) {
      std::fprintf(stderr, "gemm_bench: a kernel produced a wrong result (see WRONG above)\n");
      return 1;
    }
  } catch (const OutOfMemory& e) {
    const Error sized = apps::size_error(e, "--sizes");  // the matrices are the only buffers
    std::fprintf(stderr, "gemm_bench: error: %s\n", sized.what());
    return sized.exit_code();
  } catch (const Error& e) {
    std::fprintf(stderr, "gemm_bench: error: %s\n", e.what());
    return e.exit_code();
  }
  return 0;
}
