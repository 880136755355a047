// conv_bench: times convolutions forward + backward with the hand kernels and the vendor
// kernels side by side, on the CPU (im2col + OpenBLAS vs oneDNN) or on a CUDA GPU (our implicit
// GEMM vs cuDNN).
//
//   conv_bench                                   the MNIST CNN's two convolutions, CPU
//   conv_bench --device cuda --shapes resnet50   ResNet-50-like layers on the GPU, batch 32
//
// Shape sets (--shapes):
//   mnist     conv1: x (B, 1, 28, 28)  * w (32, 1, 3, 3)  -> (B, 32, 26, 26); backward: dw, db
//                    (no dx: the images need no gradient), so 2x the forward FLOPs
//             conv2: x (B, 32, 26, 26) * w (64, 32, 3, 3) -> (B, 64, 24, 24); backward: dx, dw,
//                    db: 3x                                          (default batch 128)
//   resnet50  the 3x3 convolutions of the four stages (64 ch 56x56, 128 ch 28x28, 256 ch
//             14x14, 512 ch 7x7, padding 1), a 1x1 256->64 at 56x56, and the 7x7 stride-2
//             stem 3->64 at 224x224 (no dx)                          (default batch 32)
//
// One iteration is forward + backward through the op (autograd included, as in training); on
// a GPU it is bracketed by device synchronisations, so the time is the GPU's. Hand and vendor
// alternate round by round, so both see the same machine state; the figure is the median over
// iterations. FLOPs count 2 per multiply-add. The last column is hand time / vendor time.
//
// --json FILE writes the same figures as JSON (the flags, then one row per convolution and the
// totals); the table goes to stdout either way.
//
// Under the CUDA simulator (a build with -DKILN_CUDA_SIM=ON) the GPU runs on the CPU and cuDNN
// is the simulator's host-computed stand-in: the batch defaults to 1 and one iteration, and every
// line says SIMULATED: those figures measure the simulator, never a GPU.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "apps/common/flag_checks.h"
#include "apps/common/output_paths.h"
#include "apps/common/progress.h"
#include "engine/output_file.h"
#include "engine/cuda/context.h"
#include "engine/impl.h"
#include "engine/init.h"
#include "engine/parallel.h"
#include "engine/philox.h"
#include "layers/conv2d.h"
#include "layers/conv2d_kernels.h"

using namespace kiln;

namespace {

struct ConvSpec {
  const char* name;
  int64_t c, hw, k, ksize, stride, pad;
  bool needs_dx;
};

const std::vector<ConvSpec> kMnist = {{"conv1  1->32 3x3, 28x28", 1, 28, 32, 3, 1, 0, false},
                                      {"conv2 32->64 3x3, 26x26", 32, 26, 64, 3, 1, 0, true}};
const std::vector<ConvSpec> kResnet50 = {
    {"64->64 3x3, 56x56", 64, 56, 64, 3, 1, 1, true},
    {"128->128 3x3, 28x28", 128, 28, 128, 3, 1, 1, true},
    {"256->256 3x3, 14x14", 256, 14, 256, 3, 1, 1, true},
    {"512->512 3x3, 7x7", 512, 7, 512, 3, 1, 1, true},
    {"256->64 1x1, 56x56", 256, 56, 64, 1, 1, 0, true},
    {"stem 3->64 7x7/2, 224x224", 3, 224, 64, 7, 2, 3, false},
};

struct Setup {
  Tensor x, w, b, dy;
  int64_t stride, pad;
  double flops;  // per iteration, forward + backward
};

Setup make_setup(const ConvSpec& s, int64_t batch, Device device) {
  Generator gen(42);
  Setup st;
  st.stride = s.stride;
  st.pad = s.pad;
  const int64_t out = (s.hw + 2 * s.pad - s.ksize) / s.stride + 1;
  const int64_t fan_in = s.c * s.ksize * s.ksize;
  // A copy of t on the device, a leaf of autograd (requiring grad when asked).
  auto device_leaf = [&](Tensor t, bool grad) {
    Tensor d = t.to(device).detach();
    if (grad) d.set_requires_grad(true);
    return d;
  };
  Tensor x = Tensor::empty({batch, s.c, s.hw, s.hw});
  uniform_(x, -1, 1, gen);
  Tensor w = Tensor::empty({s.k, s.c, s.ksize, s.ksize});
  default_init_(w, fan_in, gen);
  Tensor b = Tensor::empty({s.k});
  default_init_(b, fan_in, gen);
  Tensor dy = Tensor::empty({batch, s.k, out, out});
  uniform_(dy, -1, 1, gen);
  st.x = device_leaf(x, s.needs_dx);
  st.w = device_leaf(w, true);
  st.b = device_leaf(b, true);
  st.dy = device_leaf(dy, false);
  const double fwd = 2.0 * batch * s.k * out * out * fan_in;
  st.flops = fwd * (s.needs_dx ? 3 : 2);
  return st;
}

void sync(Device device) {
#if KILN_WITH_CUDA
  if (device.is_cuda()) {
    cuda::DeviceGuard guard(device.index);
    cuda::synchronize();
  }
#else
  (void)device;
#endif
}

double step_ms(Setup& st, Device device) {
  sync(device);
  auto t0 = std::chrono::steady_clock::now();
  Tensor y = conv2d(st.x, st.w, st.b, st.stride, st.pad);
  y.backward(st.dy);
  sync(device);
  auto t1 = std::chrono::steady_clock::now();
  st.x.set_grad(Tensor());
  st.w.set_grad(Tensor());
  st.b.set_grad(Tensor());
  return std::chrono::duration<double, std::milli>(t1 - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Times forward+backward of convolutions, hand vs vendor kernels (CPU or CUDA)"};
  int threads = num_threads();
  int64_t batch = 0;
  int iters = 0, warmup = -1;
  std::string device_spec = "cpu", shapes = "mnist", hand_kernel = "implicit-gemm", json_path;
  // --help shows the defaults: these four's values, and in words those of the three below,
  // which depend on --shapes and on the simulator.
  app.add_option("--device", device_spec, "cpu | cuda | cuda:N")->capture_default_str();
  app.add_option("--shapes", shapes, "mnist | resnet50")
      ->check(apps::one_of({"mnist", "resnet50"}))->capture_default_str();
  app.add_option("--hand-kernel", hand_kernel,
                 "CUDA hand kernel: implicit-gemm | direct (the naive reference)")
      ->check(apps::one_of({"implicit-gemm", "direct"}))->capture_default_str();
  app.add_option("--threads", threads, "OpenMP threads (kiln::set_num_threads)")
      ->check(apps::at_least(1))->capture_default_str();
  app.add_option("--batch-size", batch,
                 "images per batch (default: 128 mnist, 32 resnet50; 1 under the simulator)")
      ->check(apps::at_least(int64_t{1}));
  app.add_option("--iters", iters, "timed iterations per kernel flavour (default 20; 1 simulated)")
      ->check(apps::at_least(1));
  app.add_option("--warmup", warmup,
                 "untimed iterations first: algorithm search, buffers (default 3; 0 simulated)")
      ->check(apps::at_least(0));
  app.add_option("--json", json_path, "also write the results as JSON to this file");
  if (const std::optional<int> rc = apps::parse_flags(app, argc, argv, "conv_bench")) return *rc;

  try {
    apps::check_output_paths({{"--json", json_path}});  // written after the timings: check now
    set_num_threads(threads);
    const Device device(device_spec);
    const bool on_gpu = device.is_cuda();
    if (on_gpu) {
      if (!cuda::is_available())
        throw Error("--device " + device_spec + ": " + cuda::unavailable_reason(),
                    ErrorKind::Usage);
      cuda::check_device(device.index);
    }
    const bool simulated = on_gpu && cuda::kSimulated;
    if (batch == 0) batch = simulated ? 1 : shapes == "mnist" ? 128 : 32;
    if (iters == 0) iters = simulated ? 1 : 20;
    if (warmup < 0) warmup = simulated ? 0 : 3;
    const bool with_vendor = true;  // cuDNN, or oneDNN on the CPU
#if KILN_WITH_CUDA
    if (on_gpu) {
      cuda::ConvCudaOptions options = cuda::conv2d_cuda_options();
      options.kernel =
          hand_kernel == "direct" ? cuda::ConvKernel::Direct : cuda::ConvKernel::ImplicitGemm;
      cuda::set_conv2d_cuda_options(options);
    }
#endif
    const char* tag = simulated ? "  SIMULATED" : "";
    const std::vector<ConvSpec>& specs = shapes == "mnist" ? kMnist : kResnet50;
    for (const ConvSpec& spec : specs) {  // each input (its output and gradients come on top)
      apps::check_fits_in_memory(
          "--batch-size", std::to_string(batch),
          static_cast<double>(batch) * spec.c * spec.hw * spec.hw * sizeof(float),
          std::string("the f32 input of ") + spec.name);
    }
    const std::string hand_name =
        on_gpu ? "hand (" + hand_kernel + ")" : std::string("hand (im2col+OpenBLAS)");
    const char* vendor_name = on_gpu ? "cuDNN" : "oneDNN";
    std::printf("conv_bench: %s on %s, batch %lld, %s, forward+backward, median of %d%s\n",
                shapes.c_str(), device.str().c_str(), static_cast<long long>(batch),
                on_gpu ? "GPU time" : apps::count_of(threads, "thread").c_str(), iters,
                tag);
    std::printf("%-28s %10s %9s   %10s %9s   %s%s\n", "", "hand ms", "GFLOP/s", "vendor ms",
                "GFLOP/s", "hand/vendor", tag);
    std::printf("%-28s %s vs %s%s\n", "", hand_name.c_str(),
                with_vendor ? vendor_name : "(no vendor library in the simulator)", tag);
    double total[2] = {0, 0};
    nlohmann::json rows = nlohmann::json::array();
    for (const ConvSpec& s : specs) {
      Setup st = make_setup(s, batch, device);
      std::vector<double> times[2];
      const Impl impls[2] = {Impl::Hand, Impl::Vendor};
      const int flavours = with_vendor ? 2 : 1;
      for (int i = 0; i < warmup + iters; ++i) {
        for (int f = 0; f < flavours; ++f) {
          KernelsGuard kernels(impls[f]);
          const double ms = step_ms(st, device);
          if (i >= warmup) times[f].push_back(ms);
        }
      }
      const double hand = median(times[0]);
      total[0] += hand;
      nlohmann::json row = {{"conv", s.name}, {"flops", st.flops}, {"hand_ms", hand},
                            {"hand_gflops", st.flops / hand / 1e6}};
      if (with_vendor) {
        const double vendor = median(times[1]);
        total[1] += vendor;
        row["vendor_ms"] = vendor;
        row["vendor_gflops"] = st.flops / vendor / 1e6;
        row["hand_over_vendor"] = hand / vendor;
        std::printf("%-28s %10.2f %9.1f   %10.2f %9.1f   %.2fx%s\n", s.name, hand,
                    st.flops / hand / 1e6, vendor, st.flops / vendor / 1e6, hand / vendor, tag);
      } else {
        std::printf("%-28s %10.2f %9.3f   %10s %9s   %s%s\n", s.name, hand, st.flops / hand / 1e6,
                    "-", "-", "-", tag);
      }
      rows.push_back(row);
    }
    if (with_vendor)
      std::printf("%-28s %10.2f %9s   %10.2f %9s   %.2fx%s\n", "all", total[0], "", total[1], "",
                  total[0] / total[1], tag);
    else
      std::printf("%-28s %10.2f%s\n", "all", total[0], tag);
    if (!json_path.empty()) {
      nlohmann::json j = {{"app", "conv_bench"}, {"device", device.str()}, {"shapes", shapes},
                          {"batch_size", batch}, {"threads", threads}, {"iters", iters},
                          {"warmup", warmup}, {"simulated", simulated}, {"hand", hand_name},
                          {"vendor", vendor_name}, {"rows", rows},
                          {"total_hand_ms", total[0]}};
      if (with_vendor) {
        j["total_vendor_ms"] = total[1];
        j["total_hand_over_vendor"] = total[0] / total[1];
      }
      write_output_file("--json", json_path, j.dump(2) + "\n");
    }
  } catch (const OutOfMemory& e) {
    const Error sized = apps::size_error(e, "--batch-size " + std::to_string(batch));
    std::fprintf(stderr, "conv_bench: error: %s\n", sized.what());
    return sized.exit_code();
  } catch (const Error& e) {
    std::fprintf(stderr, "conv_bench: error: %s\n", e.what());
    return e.exit_code();
  }
  return 0;
}
