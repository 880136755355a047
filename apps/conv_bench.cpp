// conv_bench: times the two convolutions of the seed MNIST CNN, forward + backward, with the
// hand kernels (im2col + OpenBLAS) and the vendor kernels (oneDNN), side by side.
//
//   conv1: x (B, 1, 28, 28)  * w (32, 1, 3, 3)  -> (B, 32, 26, 26); backward: dw, db (no dx:
//          the images need no gradient), so 2x the forward FLOPs
//   conv2: x (B, 32, 26, 26) * w (64, 32, 3, 3) -> (B, 64, 24, 24); backward: dx, dw, db: 3x
//
// One iteration is forward + backward through the op (autograd included, as in training).
// Hand and vendor alternate round by round, so both see the same machine load; the figure is
// the median over iterations. FLOPs count 2 per multiply-add.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "engine/impl.h"
#include "engine/parallel.h"
#include "engine/philox.h"
#include "engine/init.h"
#include "layers/conv2d.h"

using namespace kiln;

namespace {

struct ConvSpec {
  const char* name;
  int64_t c, hw, k;
  bool needs_dx;
};

struct Setup {
  Tensor x, w, b, dy;
  double flops;  // per iteration, forward + backward
};

Setup make_setup(const ConvSpec& s, int64_t batch) {
  Generator gen(42);
  Setup st;
  const int64_t out = s.hw - 2;
  st.x = Tensor::empty({batch, s.c, s.hw, s.hw});
  uniform_(st.x, -1, 1, gen);
  if (s.needs_dx) st.x.set_requires_grad(true);
  st.w = Tensor::empty({s.k, s.c, 3, 3});
  default_init_(st.w, s.c * 9, gen);
  st.w.set_requires_grad(true);
  st.b = Tensor::empty({s.k});
  default_init_(st.b, s.c * 9, gen);
  st.b.set_requires_grad(true);
  st.dy = Tensor::empty({batch, s.k, out, out});
  uniform_(st.dy, -1, 1, gen);
  const double fwd = 2.0 * batch * s.k * out * out * s.c * 9;
  st.flops = fwd * (s.needs_dx ? 3 : 2);
  return st;
}

double step_ms(Setup& st) {
  auto t0 = std::chrono::steady_clock::now();
  Tensor y = conv2d(st.x, st.w, st.b, 1, 0);
  y.backward(st.dy);
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
  CLI::App app{"Times forward+backward of the seed CNN's convolutions, hand vs vendor kernels"};
  int threads = num_threads();
  int64_t batch = 128;
  int iters = 20, warmup = 3;
  app.add_option("--threads", threads, "OpenMP threads (kiln::set_num_threads)")
      ->check(CLI::PositiveNumber);
  app.add_option("--batch-size", batch, "images per batch")->check(CLI::PositiveNumber);
  app.add_option("--iters", iters, "timed iterations per kernel flavour")
      ->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "untimed iterations first (primitive creation, buffers)")
      ->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);

  try {
    set_num_threads(threads);
    const ConvSpec specs[] = {{"conv1  1->32, 28x28", 1, 28, 32, false},
                              {"conv2 32->64, 26x26", 32, 26, 64, true}};
    std::printf("conv_bench: batch %lld, %d thread(s), forward+backward, median of %d\n",
                static_cast<long long>(batch), threads, iters);
    std::printf("%-22s %12s %10s   %12s %10s   %s\n", "", "hand ms", "GFLOP/s", "vendor ms",
                "GFLOP/s", "vendor speed-up");
    double total[2] = {0, 0};
    for (const ConvSpec& s : specs) {
      Setup st = make_setup(s, batch);
      std::vector<double> times[2];
      const Impl impls[2] = {Impl::Hand, Impl::Vendor};
      for (int i = 0; i < warmup + iters; ++i) {
        for (int f = 0; f < 2; ++f) {
          set_kernel_impl(impls[f]);
          const double ms = step_ms(st);
          if (i >= warmup) times[f].push_back(ms);
        }
      }
      const double hand = median(times[0]), vendor = median(times[1]);
      total[0] += hand;
      total[1] += vendor;
      std::printf("%-22s %12.2f %10.1f   %12.2f %10.1f   %.2fx\n", s.name, hand,
                  st.flops / hand / 1e6, vendor, st.flops / vendor / 1e6, hand / vendor);
    }
    std::printf("%-22s %12.2f %10s   %12.2f %10s   %.2fx\n", "both", total[0], "", total[1], "",
                total[0] / total[1]);
  } catch (const Error& e) {
    std::fprintf(stderr, "conv_bench: %s\n", e.what());
    return e.exit_code();
  }
  return 0;
}
