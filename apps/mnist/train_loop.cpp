// train_loop.cpp: see train_loop.h.
#include "apps/mnist/train_loop.h"

#include <cmath>
#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "apps/common/progress.h"
#include "engine/allocator.h"
#include "engine/autocast.h"
#include "engine/autograd.h"
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

}  // namespace

void train_epoch(Module& model, const StepFn& step_fn, BatchSource& source, Device device,
                 int epoch, int epochs, bool progress, int replica, EpochResult& r,
                 DType autocast, const EpochProgress& start, const MidEpochSave* mid_epoch) {
  model.train();
  source.start_epoch_at(epoch, start.position);
  const int64_t batches = source.epoch_batches();  // left in this epoch
  ProgressBar bar("epoch " + std::to_string(epoch + 1) + "/" + std::to_string(epochs),
                  start.steps + batches, progress);
  // Reading a loss on the host waits for the device. On a GPU, reading it every step would
  // stall the launch queue once per step, so losses are kept on the device and read in groups
  // (every kReadEvery steps and at the end): the GPU stays busy, and divergence is still caught
  // within a few steps.
  const int kReadEvery = device.is_cuda() ? 32 : 1;
  std::vector<std::pair<Tensor, int64_t>> pending;  // (loss on the device, batch size)
  double loss_sum = start.loss_sum;
  int64_t seen = start.seen, step = start.steps, seen_now = 0;
  const auto started = Clock::now();
  auto read_pending = [&] {
    for (auto& [loss, n] : pending) {
      const double l = loss.item();
      ++step;
      KILN_CHECK(std::isfinite(l), "training diverged: the loss is ", l, " at epoch ", epoch + 1,
                 ", step ", step, ". Lower --lr.");
      loss_sum += l * static_cast<double>(n);
      seen += n;
      seen_now += n;
      bar.update(step, l, static_cast<double>(seen_now) / seconds_since(started));
    }
    pending.clear();
  };
  for (int64_t i = 0;; ++i) {
    trace::Ids ids;
    ids.step = static_cast<int64_t>(epoch) * source.num_batches() + start.steps + i;
    ids.replica = replica;
    Batch b;
    {
      std::optional<trace::Scope> wait;  // not for the call that finds the epoch over
      if (i < batches) {
        wait.emplace("loader wait", trace::Phase::LoaderWait, host_side(device), ids);
      }
      if (!source.next(b)) break;
    }
    Tensor x = b.inputs.device() == device ? b.inputs : b.inputs.to(device);
    Tensor y = b.labels.device() == device ? b.labels : b.labels.to(device);
    Tensor loss;
    {
      trace::Scope forward("forward", trace::Phase::Forward, device, ids);
      AutocastGuard mixed(autocast);
      loss = cross_entropy(model(x), y);
    }
    step_fn(loss, ids);
    pending.emplace_back(loss.detach(), b.inputs.size(0));
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
void evaluate(Module& model, BatchSource& source, Device device, EpochResult& r,
              DType autocast) {
  release_cached(device);
  NoGradGuard no_grad;
  AutocastGuard mixed(autocast);
  model.eval();
  source.start_epoch(0);
  const auto start = Clock::now();
  int64_t correct = 0, seen = 0;
  double loss_sum = 0;
  for (Batch b; source.next(b);) {
    Tensor x = b.inputs.device() == device ? b.inputs : b.inputs.to(device);
    Tensor y = b.labels.device() == device ? b.labels : b.labels.to(device);
    Tensor logits = model(x);
    const int64_t n = b.inputs.size(0);
    loss_sum += cross_entropy(logits, y).item() * static_cast<double>(n);
    const std::vector<int64_t> pred = argmax(logits, 1).to_vector<int64_t>();
    const std::vector<int64_t> truth = b.labels.to_vector<int64_t>();
    for (size_t i = 0; i < pred.size(); ++i) correct += pred[i] == truth[i];
    seen += n;
  }
  release_cached(device);
  r.eval_seconds = seconds_since(start);
  r.test_accuracy = seen > 0 ? static_cast<double>(correct) / static_cast<double>(seen) : 0.0;
  r.test_loss = seen > 0 ? loss_sum / static_cast<double>(seen) : 0.0;
}

}  // namespace kiln::apps::mnist
