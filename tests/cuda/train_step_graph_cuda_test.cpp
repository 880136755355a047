// train_step_graph_cuda_test.cpp: a whole fp16-style training step (forward, loss, backward,
// loss scaling's unscale and update, the optimizer skipping on found_inf, a learning rate that
// changes every step) captured once into a CUDA graph (engine/cuda/graph.h) and replayed gives,
// bit for bit, what the same steps give run eagerly: the same parameters, optimizer step count,
// loss-scale history and skipped steps. Possible only because every value that changes from
// step to step lives in device memory and the step decides nothing on the host
// (engine/optim/optimizer.h, engine/optim/grad_scaler.h); a value baked in at capture (the
// learning rate, Adam's bias corrections, the scale, the skip decision) would make the replays
// differ from the eager steps. One step's input holds an inf, so one replay must skip.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "engine/cuda/graph.h"
#include "engine/init.h"
#include "engine/optim/adam.h"
#include "engine/optim/grad_scaler.h"
#include "engine/tensor.h"
#include "layers/loss.h"
#include "layers/module.h"
#include "models/mnist_cnn.h"
#include "parity/parity_harness.h"
#include "support/cuda_skip.h"

namespace kiln {
namespace {

const Device kCuda(DeviceType::CUDA, 0);
constexpr int kSteps = 6;
constexpr int kInfStep = 3;  // this step's input holds an inf: the step is skipped

struct Trainer {
  std::shared_ptr<Module> net;
  std::unique_ptr<Adam> opt;
  std::unique_ptr<GradScaler> scaler;
  Tensor x, y;  // static: new data is copied into them

  Trainer(const Tensor& labels) {
    manual_seed(5);
    net = make_mnist_cnn();
    net->eval();  // dropout off: its masks would be drawn on the host
    net->to(kCuda);
    opt = std::make_unique<Adam>(net->parameters(), 1e-3);
    GradScalerOptions o;
    o.init_scale = 256.0;
    o.growth_interval = 2;  // the scale changes during the run
    scaler = std::make_unique<GradScaler>(o);
    scaler->keep_on_device(kCuda);
    x = Tensor::zeros({4, 1, 28, 28}, DType::F32, kCuda);
    y = labels.to(kCuda);
  }
  void step() {
    opt->zero_grad();
    scaler->scale(cross_entropy(net->forward(x), y)).backward();
    scaler->unscale_on_device(net->parameters());
    opt->step(scaler->found_inf());
    scaler->update_on_device();
  }
};

TEST(TrainStepGraphCuda, ReplayedStepMatchesEagerSteps) {
  KILN_SKIP_WITHOUT_CUDA();
  std::vector<Tensor> inputs;
  for (int s = 0; s < kSteps; ++s) {
    manual_seed(100 + static_cast<uint64_t>(s));
    Tensor x = Tensor::empty({4, 1, 28, 28});
    uniform_(x, -1, 1);
    if (s == kInfStep) x.data<float>()[17] = std::numeric_limits<float>::infinity();
    inputs.push_back(x);
  }
  const Tensor labels = Tensor::from_vector(std::vector<int64_t>{1, 7, 3, 9}, {4});
  auto lr_at = [](int s) { return 1e-3 / (1 + s); };

  Trainer eager(labels), graphed(labels);
  for (int s = 0; s < kSteps; ++s) {
    eager.opt->set_lr(lr_at(s));
    eager.x.copy_(inputs[static_cast<size_t>(s)]);
    eager.step();
  }

  graphed.opt->set_lr(lr_at(0));
  graphed.x.copy_(inputs[0]);
  graphed.step();  // step 0 eagerly: lazy state (buffers, step counts, handles) made outside
  // cross_entropy's target check (layers/loss.h) copies a flag into a pinned slot that host
  // code frees once it has read it; settling step 0's check here lets the capture reuse that
  // slot instead of pinning new memory, which a capture forbids (cudaHostAlloc). The captured
  // check's flag is then never read: replays run no host code.
  check_cross_entropy_targets();
  cuda::Graph graph;
  graph.capture([&] { graphed.step(); });  // records, runs nothing
  for (int s = 1; s < kSteps; ++s) {
    graphed.opt->set_lr(lr_at(s));  // a fill kernel before the replay, on the same stream
    graphed.x.copy_(inputs[static_cast<size_t>(s)]);
    graph.replay();
  }

  const auto want = eager.net->named_parameters(), got = graphed.net->named_parameters();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_TRUE(testing::bit_identical(want[i].first, got[i].second, want[i].second));
  EXPECT_EQ(graphed.scaler->skipped_steps(), 1);
  EXPECT_EQ(graphed.scaler->skipped_steps(), eager.scaler->skipped_steps());
  EXPECT_EQ(graphed.scaler->steps(), kSteps);
  EXPECT_EQ(graphed.opt->step_count(), eager.opt->step_count());
  const auto& h_want = eager.scaler->history();
  const auto& h_got = graphed.scaler->history();
  ASSERT_EQ(h_got.size(), h_want.size());
  EXPECT_GT(h_want.size(), 2u);
  for (size_t i = 0; i < h_want.size(); ++i) {
    EXPECT_EQ(h_got[i].step, h_want[i].step) << "change " << i;
    EXPECT_EQ(h_got[i].scale, h_want[i].scale) << "change " << i;
  }
}

}  // namespace
}  // namespace kiln
