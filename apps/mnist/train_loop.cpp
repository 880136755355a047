// train_loop.cpp: see train_loop.h.
#include "apps/mnist/train_loop.h"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "apps/common/progress.h"
#include "engine/allocator.h"
#include "engine/autocast.h"
#include "engine/autograd.h"
#include "engine/cuda/sync_debug.h"
#include "engine/error.h"
#include "engine/ops.h"
#include "engine/trace.h"
#include "layers/loss.h"

namespace kiln::apps::mnist {

namespace {

// Hands the CPU allocator's cache back to the OS (see evaluate()). On a GPU the phases' blocks
// fit side by side, and cudaFree/cudaMalloc would stall the device: the cache stays.
void release_cached(Device device) {
  if (device.is_cpu()) cpu_allocator::release_cached();
}

// The values of `parts` (tensors on one device, of one dtype) in order, read on the host as
// double with ONE wait for the device: they are first gathered into one tensor on their device
// (device-side copies, which the host does not wait for). The values are those each part's
// to_vector<double>() would give.
std::vector<double> read_all(const std::vector<Tensor>& parts) {
  if (parts.empty()) return {};
  if (parts.size() == 1) return parts[0].to_vector<double>();
  int64_t total = 0;
  for (const Tensor& p : parts) total += p.numel();
  Tensor all = Tensor::empty({total}, parts[0].dtype(), parts[0].device());
  int64_t at = 0;
  for (const Tensor& p : parts) {
    all.rows(at, at + p.numel()).copy_(p.reshape({p.numel()}));
    at += p.numel();
  }
  return all.to_vector<double>();
}

}  // namespace

void train_epoch(Module& model, const TrainStep& how, BatchSource& source, Device device,
                 int epoch, int epochs, bool progress, int replica, EpochResult& r,
                 const AutocastPolicy& autocast, const EpochProgress& start,
                 const MidEpochSave* mid_epoch) {
  model.train();
  source.start_epoch_at(epoch, start.position);
  const int64_t batches = source.epoch_batches();  // left in this epoch
  ProgressBar bar("epoch " + std::to_string(epoch + 1) + "/" + std::to_string(epochs),
                  start.steps + batches, progress);
  // Reading a loss on the host waits for the device. On a GPU, reading it every step would
  // stall the launch queue once per step, so losses are kept on the device and read in groups
  // (every kReadEvery steps and at the end), a group with one wait: the GPU stays busy, and
  // divergence is still caught within a few steps. That read and the mid-epoch checkpoints are
  // the loop's only waits for the device (KILN_SYNC_DEBUG=error checks it: docs/cuda.md).
  const int kReadEvery = device.is_cuda() ? 32 : 1;
  const bool graphed = how.graph != nullptr;
  // --cuda-graph: forward, loss and update as one step, the one a graph captures (TrainStep).
  auto forward_and_update = [&](const Tensor& x, const Tensor& y, const trace::Ids& ids) {
    Tensor loss;
    {
      AutocastGuard mixed(autocast.dtype, true, autocast.outputs);
      loss = cross_entropy(model(x), y);
    }
    how.update(loss, ids);
    return loss;
  };
  std::vector<Tensor> pending;        // losses on the device
  std::vector<int64_t> pending_rows;  // their batch sizes
  double loss_sum = start.loss_sum;
  int64_t seen = start.seen, step = start.steps, seen_now = 0;
  const auto started = Clock::now();
  auto read_pending = [&] {
    std::vector<double> losses;
    {
      cuda::AllowSync allow("mnist_train: the losses, read once per 32 steps on a GPU");
      losses = read_all(pending);
      // A bad label is named before the NaN loss it makes could read as divergence (the
      // device has passed those checks already: no further wait).
      check_cross_entropy_targets();
    }
    for (size_t k = 0; k < losses.size(); ++k) {
      const double l = losses[k];
      const int64_t n = pending_rows[k];
      ++step;
      KILN_CHECK(std::isfinite(l), "training diverged: the loss is ", l, " at epoch ", epoch + 1,
                 ", step ", step, ". Lower --lr.");
      loss_sum += l * static_cast<double>(n);
      seen += n;
      seen_now += n;
      bar.update(step, l, static_cast<double>(seen_now) / seconds_since(started));
    }
    pending.clear();
    pending_rows.clear();
  };
  for (int64_t i = 0;; ++i) {
    trace::Ids ids;
    ids.step = static_cast<int64_t>(epoch) * source.num_batches() + start.steps + i;
    ids.replica = replica;
    // The batch: in the graph's static inputs (their first rows), or a batch of its own.
    Tensor x, y;
    {
      std::optional<trace::Scope> wait;  // not for the call that finds the epoch over
      if (i < batches) {
        wait.emplace("loader wait", trace::Phase::LoaderWait, host_side(device), ids);
      }
      if (graphed) {
        const int64_t rows = source.next_into(how.inputs, how.labels);
        if (rows == 0) break;
        x = how.inputs.rows(0, rows);
        y = how.labels.rows(0, rows);
      } else {
        Batch b;
        if (!source.next(b)) break;
        x = b.inputs.device() == device ? b.inputs : b.inputs.to(device);
        y = b.labels.device() == device ? b.labels : b.labels.to(device);
      }
    }
    if (how.before) how.before();
    Tensor loss;
    if (!graphed) {
      {
        trace::Scope forward("forward", trace::Phase::Forward, device, ids);
        AutocastGuard mixed(autocast.dtype, true, autocast.outputs);
        loss = cross_entropy(model(x), y);
      }
      how.update(loss, ids);
      loss = loss.detach();
    } else if (x.size(0) == how.inputs.size(0)) {
      // A full batch: the graph's step. Its loss is overwritten by the next replay: a copy is
      // kept.
      trace::Scope whole(how.graph->captured() ? "step (graph replay)" : "step (before capture)",
                         trace::Phase::Other, device, ids);
      loss = how.graph->run([&] {
        return std::vector<Tensor>{forward_and_update(how.inputs, how.labels, ids)};
      })[0].clone();
    } else {
      trace::Scope whole("step (eager: a smaller batch)", trace::Phase::Other, device, ids);
      loss = forward_and_update(x, y, ids).detach();
    }
    pending.push_back(loss);
    pending_rows.push_back(x.size(0));
    if (static_cast<int>(pending.size()) >= kReadEvery) read_pending();
    if (mid_epoch != nullptr && i + 1 < batches && mid_epoch->due()) {
      read_pending();  // the sums include this step
      mid_epoch->save(EpochProgress{source.epoch_position(), step, loss_sum, seen});
    }
  }
  read_pending();  // also waits for the last step: the epoch's time is complete
  r.train_seconds = seconds_since(started);
  bar.clear();
  r.wait_seconds = source.wait_seconds();
  r.train_loss = seen > 0 ? loss_sum / static_cast<double>(seen) : 0.0;
  r.train_seen = seen;
  r.trained_now = seen_now;
  r.images_per_sec =
      r.train_seconds > 0 ? static_cast<double>(seen_now) / r.train_seconds : 0.0;
}

// Training and evaluation allocate different tensor sizes, and the caching allocator keeps
// every freed block for reuse: holding both sets would add the two phases' memory together
// in RSS. Handing the cache back at each phase change costs one round of page faults per
// epoch (milliseconds) and keeps the peak at the larger phase instead of their sum.
//
// The host reads nothing until the pass is over: each batch's loss, predictions and labels stay
// on the device, and are read at the end with one wait (on a GPU, reading them per batch would
// make the host wait for every batch before queueing the next). The sums are the same, taken in
// the same order.
void evaluate(Module& model, BatchSource& source, Device device, EpochResult& r,
              const AutocastPolicy& autocast) {
  release_cached(device);
  NoGradGuard no_grad;
  AutocastGuard mixed(autocast.dtype, true, autocast.outputs);
  model.eval();
  source.start_epoch(0);
  const auto start = Clock::now();
  std::vector<Tensor> losses, predictions, labels;  // per batch, on the device
  std::vector<int64_t> rows;
  for (Batch b; source.next(b);) {
    Tensor x = b.inputs.device() == device ? b.inputs : b.inputs.to(device);
    Tensor y = b.labels.device() == device ? b.labels : b.labels.to(device);
    Tensor logits = model(x);
    losses.push_back(cross_entropy(logits, y));
    predictions.push_back(argmax(logits, 1));
    labels.push_back(y.clone());  // not the batch's own memory: the loader reuses it
    rows.push_back(b.inputs.size(0));
  }
  std::vector<double> loss, pred, truth;
  {
    cuda::AllowSync allow("mnist_train: the evaluation's losses and predictions, read once");
    loss = read_all(losses);
    pred = read_all(predictions);
    truth = read_all(labels);
    check_cross_entropy_targets();
  }
  int64_t correct = 0, seen = 0;
  double loss_sum = 0;
  for (size_t i = 0; i < loss.size(); ++i) {
    loss_sum += loss[i] * static_cast<double>(rows[i]);
    seen += rows[i];
  }
  for (size_t i = 0; i < pred.size(); ++i) correct += pred[i] == truth[i];
  release_cached(device);
  r.eval_seconds = seconds_since(start);
  r.test_accuracy = seen > 0 ? static_cast<double>(correct) / static_cast<double>(seen) : 0.0;
  r.test_loss = seen > 0 ? loss_sum / static_cast<double>(seen) : 0.0;
}

}  // namespace kiln::apps::mnist
