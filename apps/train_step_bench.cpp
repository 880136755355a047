// train_step_bench: images/s of the seed CNN's training step (forward, backward, optimizer),
// batch in memory, no data loading. The Kiln half of tools/bench_vs_pytorch.sh, which runs
// the same step in PyTorch (tools/bench_pytorch_step.py) for the ratio.
//
//   train_step_bench --threads 2 --batch-size 128 --steps 30 [--kernels hand|vendor]
// Prints one line: "kiln threads=2 kernels=vendor batch=128 images_per_sec=... ms_per_step=..."
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "engine/error.h"
#include "engine/impl.h"
#include "engine/init.h"
#include "engine/optim/sgd.h"
#include "engine/parallel.h"
#include "layers/loss.h"
#include "models/mnist_cnn.h"

using namespace kiln;

int main(int argc, char** argv) {
  CLI::App app{"Kiln: time the seed CNN training step (batch in memory)"};
  int threads = 1, batch = 128, steps = 30, warmup = 5;
  std::string kernels = "vendor";
  app.add_option("--threads", threads, "CPU threads (OpenMP budget)")->check(CLI::PositiveNumber);
  app.add_option("--batch-size", batch, "images per step")->check(CLI::PositiveNumber);
  app.add_option("--steps", steps, "timed steps")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "untimed steps first")->check(CLI::NonNegativeNumber);
  app.add_option("--kernels", kernels, "hand or vendor")->check(CLI::IsMember({"hand", "vendor"}));
  CLI11_PARSE(app, argc, argv);
  try {
    set_num_threads(threads);
    set_kernel_impl(parse_impl(kernels.c_str()));
    manual_seed(1);
    auto net = make_mnist_cnn();
    net->train();
    SGD opt(net->parameters(), 0.01, 0.9);
    Tensor x = Tensor::empty({batch, 1, 28, 28});
    uniform_(x, -1, 1);
    std::vector<int64_t> labels(static_cast<size_t>(batch));
    for (int i = 0; i < batch; ++i) labels[static_cast<size_t>(i)] = i % 10;
    Tensor y = Tensor::from_vector(labels, {batch});

    std::vector<double> ms;
    for (int s = 0; s < warmup + steps; ++s) {
      auto t0 = std::chrono::steady_clock::now();
      opt.zero_grad();
      Tensor loss = cross_entropy(net->forward(x), y);
      loss.backward();
      opt.step();
      auto t1 = std::chrono::steady_clock::now();
      if (s >= warmup) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    double median = ms[ms.size() / 2];
    std::printf("kiln threads=%d kernels=%s batch=%d images_per_sec=%.1f ms_per_step=%.2f\n",
                threads, kernels.c_str(), batch, batch * 1000.0 / median, median);
  } catch (const Error& e) {
    std::fprintf(stderr, "train_step_bench: %s\n", e.what());
    return e.exit_code();
  }
  return 0;
}
