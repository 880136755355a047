// model_parallel_toy: a two-layer model split over two devices, by hand and by kiln::Pipeline.
//
// The first example of PyTorch's "Single-Machine Model Parallel Best Practices" tutorial
// (https://pytorch.org/tutorials/intermediate/model_parallel_tutorial.html), in Kiln:
// net1 = Linear(10, 10) on the first device, ReLU, net2 = Linear(10, 5) on the second.
//
//   model_parallel_toy                   # cpu:0 cpu:1: two CPU places (engine/device.h)
//   model_parallel_toy cuda:0 cuda:1     # two GPUs
//
// Then the same model (same seed) on the same batch, trained by kiln::Pipeline: one block per
// stage, GPipe, micro-batches of 2 rows. The losses must agree. docs/model_parallel.md reads it.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <utility>
#include <vector>

#include "engine/cuda/context.h"
#include "engine/error.h"
#include "engine/init.h"
#include "engine/optim/sgd.h"
#include "layers/activation.h"
#include "layers/linear.h"
#include "layers/loss.h"
#include "models/pipeline/pipeline.h"

using namespace kiln;

namespace {

constexpr int kSteps = 5;
constexpr double kLr = 0.001;  // the tutorial's SGD learning rate

// A device named on the command line. A bad name, or a GPU that is not there, is an Error of
// kind Usage (exit 2) that says what is wrong.
Device device_arg(const char* spec) {
  Device d = parse_device(spec);
  if (d.is_cuda()) {
    KILN_CHECK_INPUT(cuda::is_available(), spec, ": ", cuda::unavailable_reason(),
                     " (here: model_parallel_toy cpu:0 cpu:1)");
    cuda::check_device(d.index);
  }
  return d;
}

// The tutorial's ToyModel. Each layer lives on its own device; forward() moves the activation.
struct ToyModel {
  Device dev0, dev1;
  std::shared_ptr<Linear> net1, net2;
  std::shared_ptr<ReLU> relu = std::make_shared<ReLU>();

  ToyModel(Device d0, Device d1) : dev0(d0), dev1(d1) {
    manual_seed(0);  // the same weights in both runs
    net1 = std::make_shared<Linear>(10, 10);
    net2 = std::make_shared<Linear>(10, 5);
    net1->to(dev0);
    net2->to(dev1);
  }
  Tensor forward(const Tensor& x) {
    Tensor h = relu->forward(net1->forward(x.to(dev0)));
    // to() is an autograd op: backward() copies the gradient of h back to dev0.
    return net2->forward(h.to(dev1));
  }
  std::vector<Tensor> parameters() const {
    std::vector<Tensor> p = net1->parameters();
    for (const Tensor& t : net2->parameters()) p.push_back(t);
    return p;
  }
};

int run(Device d0, Device d1) {
  // One batch of 20 random inputs and random targets (the tutorial's shapes), kept on the host.
  manual_seed(1);
  Tensor x = Tensor::empty({20, 10}), y = Tensor::empty({20, 5});
  normal_(x, 0, 1);
  normal_(y, 0, 1);

  std::printf("by hand: net1 on %s, net2 on %s, MSE, SGD lr %g\n", d0.str().c_str(),
              d1.str().c_str(), kLr);
  ToyModel model(d0, d1);
  SGD optimizer(model.parameters(), kLr);
  std::vector<double> by_hand;
  for (int step = 0; step < kSteps; ++step) {
    optimizer.zero_grad();
    Tensor loss = mse_loss(model.forward(x), y.to(d1));  // the targets on the output's device
    loss.backward();  // through net2 on d1, the copy, then net1 on d0
    optimizer.step();
    by_hand.push_back(loss.item());
    std::printf("  step %d  loss %.7f\n", step, by_hand.back());
  }

  // The same model as two blocks, one per stage; the pipeline moves each to its device and
  // runs each stage in its own thread, micro-batch by micro-batch.
  std::printf("kiln::Pipeline: 2 stages, GPipe, split size 2 (10 micro-batches)\n");
  ToyModel fresh(d0, d1);
  auto stage0 = std::make_shared<Sequential>();
  stage0->push_back("net1", fresh.net1);
  stage0->push_back("relu", fresh.relu);
  std::vector<Block> blocks = {{"net1+relu", stage0}, {"net2", fresh.net2}};
  PipelineOptions options;
  options.schedule = Schedule::GPipe;
  options.split_size = 2;
  Pipeline pipe(blocks, partition_at(2, {0, 1}), {d0, d1},
                [](const Tensor& out, const Tensor& target) { return mse_loss(out, target); },
                [](std::vector<Tensor> p) { return std::make_unique<SGD>(std::move(p), kLr); },
                options);
  double worst = 0;
  for (int step = 0; step < kSteps; ++step) {
    const double loss = pipe.train_step(x, y, step);
    worst = std::max(worst, std::fabs(loss - by_hand[step]));
    std::printf("  step %d  loss %.7f\n", step, loss);
  }
  // The micro-batch losses are summed in another order: equal up to float rounding.
  const bool agree = worst <= 1e-5;
  std::printf("losses %s after %d steps (largest difference %.2g)\n",
              agree ? "agree" : "DIFFER", kSteps, worst);
  return agree ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 1 && argc != 3) {
    std::fprintf(stderr, "usage: model_parallel_toy [DEVICE0 DEVICE1], e.g. cuda:0 cuda:1\n");
    return 2;
  }
  try {
    const Device d0 = device_arg(argc == 3 ? argv[1] : "cpu:0");
    const Device d1 = device_arg(argc == 3 ? argv[2] : "cpu:1");
    return run(d0, d1);
  } catch (const Error& e) {
    std::fprintf(stderr, "model_parallel_toy: %s\n", e.what());
    return e.exit_code();
  }
}
