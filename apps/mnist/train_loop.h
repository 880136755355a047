// train_loop.h: one epoch of training and one pass of evaluation, on one rank.
//
// Both read batches from a BatchSource (data/loader.h: worker threads build them ahead;
// data/device_mnist.h: gathered on the GPU) and move them to the training device. What a
// training step does after the loss (plain, or with the gradients exchanged between ranks) is
// the caller's StepFn, so the same loop serves --dist none and every data-parallel mode
// (apps/mnist/dist_training.h). With --cuda-graph the whole step, forward to update, runs
// through a StepGraph (engine/step_graph.h): see TrainStep.
#pragma once

#include <cstdint>
#include <functional>

#include "data/batch_iterator.h"
#include "engine/autocast.h"
#include "engine/device.h"
#include "engine/step_graph.h"
#include "engine/tensor.h"
#include "engine/trace.h"
#include "layers/module.h"

namespace kiln::apps::mnist {

// The run's autocast (--precision, --activations): the 16-bit dtype (F32: off) and what flows
// between layers under it (engine/autocast.h).
struct AutocastPolicy {
  DType dtype = DType::F32;
  AutocastOutputs outputs = AutocastOutputs::F32;
};

struct EpochResult {
  double train_loss = 0;      // mean over the epoch's training examples
  double train_seconds = 0;   // the training loop only (batches + steps)
  double wait_seconds = 0;    // of which the loop waited for batches
  double images_per_sec = 0;  // training images / train_seconds (all ranks' images)
  int64_t train_seen = 0;     // training images of this rank, a resumed epoch's earlier part
                              // included (all workers' after sum_training_over_workers)
  int64_t trained_now = 0;    // of which this process trained (for images_per_sec)
  double test_loss = 0, test_accuracy = 0;
  double eval_seconds = 0;
};

// Where a training epoch stands: what a mid-epoch checkpoint records and a resumed epoch starts
// from (apps/common/train_checkpoint.h).
struct EpochProgress {
  int64_t position = 0;  // examples of the epoch's global order trained on (all ranks)
  int64_t steps = 0;     // training steps of the epoch so far
  double loss_sum = 0;   // sum of loss x batch size over them (this rank's, or all ranks')
  int64_t seen = 0;      // examples over them (likewise)
};

// Mid-epoch checkpoints: after each training step but the epoch's last (the epoch-end
// checkpoint covers that one), when due() says so, the loop reads its pending losses and calls
// save() with where the epoch stands (this rank's sums). due() must give the same answer on
// every rank (save may communicate).
struct MidEpochSave {
  std::function<bool()> due;
  std::function<void(const EpochProgress&)> save;
};

// What a training step does once the loss is computed: backward and the update (plain, with
// DataParallel's gradient averaging, or through the asynchronous parameter server). `ids` says
// which step (and replica) the step's trace spans belong to (engine/trace.h).
using StepFn = std::function<void(Tensor& loss, const trace::Ids& ids)>;

// How train_epoch runs each step.
//
// Eagerly (graph null): before(), then the forward pass and the loss, then update(loss).
//
// As a CUDA graph (--cuda-graph, graph set): each batch is written into the static `inputs`
// and `labels` (BatchSource::next_into: a copy of the loader's batch, or the gather of
// --data-on-device straight into them), before() runs on the host, and then forward, loss and
// update(loss) run as one step through graph->run(): eagerly for its warm-up steps, captured
// once, replayed after that. What changes between steps must reach the device outside the
// graph, so before() holds the host-side work: the per-step learning rate (set_lr writes the
// device's copy with a kernel, which a capture would bake in). A batch smaller than `inputs`
// (an epoch's last) runs the same step eagerly on the first rows. update() must then neither
// wait for the device nor open trace scopes (a timing event cannot be captured): the loop
// records one "step" span per step instead of forward, backward and optimizer.
struct TrainStep {
  std::function<void()> before;  // may be empty
  StepFn update;
  StepGraph* graph = nullptr;
  Tensor inputs, labels;  // with a graph: f32 (batch, 1, 28, 28) and i64 (batch) on the device
};

// One pass over the training set (epoch is 0-based; the progress bar shows epoch + 1 of
// `epochs` when `progress` is true and stdout is a terminal). Fills the training fields of
// `r`. A loss that is not finite stops training with an error saying to lower --lr.
// When tracing is on it records the loader waits and each step's forward pass (with a graph,
// one "step" span per step: TrainStep), with
// ids.step = epoch * batches per epoch + batch and ids.replica = `replica` (-1: not
// data-parallel). With autocast.dtype BF16 or F16 each forward runs under an AutocastGuard of
// that dtype and autocast.outputs (engine/autocast.h; mixed precision); F32 leaves it off.
// `start`: where the epoch begins (a resumed checkpoint's progress; zeros: the beginning): the
// source starts at start.position without reading what came before, and the sums continue
// from start's. `mid_epoch`: optional mid-epoch checkpoints (null: none).
void train_epoch(Module& model, const TrainStep& how, BatchSource& source, Device device,
                 int epoch, int epochs, bool progress, int replica, EpochResult& r,
                 const AutocastPolicy& autocast = {}, const EpochProgress& start = {},
                 const MidEpochSave* mid_epoch = nullptr);

// Where host-timed spans of training on `device` go: the device itself for a CPU, the host
// (cpu:0) for a GPU, whose spans are timed by the GPU.
inline Device host_side(Device device) { return device.is_cuda() ? Device() : device; }

// Accuracy and mean loss over the batches of `source`, in eval mode (dropout off), recording
// nothing, under autocast as train_epoch. Fills the test fields of `r`.
void evaluate(Module& model, BatchSource& source, Device device, EpochResult& r,
              const AutocastPolicy& autocast = {});

}  // namespace kiln::apps::mnist
