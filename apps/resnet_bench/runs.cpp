// runs.cpp: the single-device, model-parallel and pipelined training setups.
#include "apps/resnet_bench/runs.h"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <random>
#include <thread>
#include <utility>

#include "engine/autocast.h"
#include "engine/cuda/sync_debug.h"
#include "engine/init.h"
#include "engine/ops.h"
#include "engine/parallel.h"
#include "engine/philox.h"
#include "engine/step_graph.h"
#include "layers/loss.h"

#if KILN_WITH_CUDA
#include "engine/cuda/context.h"
#endif

namespace kiln::apps {

Batch random_batch(const Workload& w, uint64_t seed) {
  manual_seed(seed);
  Batch b;
  b.x = Tensor::empty({w.batch, 3, w.image, w.image});
  uniform_(b.x, -1, 1);
  b.x = b.x.to(w.memory_format);  // converted once here, not in every step
  std::mt19937_64 rng(seed);
  std::vector<float> onehot(static_cast<size_t>(w.batch * w.classes), 0.0f);
  for (int64_t i = 0; i < w.batch; ++i) {
    onehot[static_cast<size_t>(i * w.classes + static_cast<int64_t>(rng() % w.classes))] = 1.0f;
  }
  b.y = Tensor::from_vector(onehot, {w.batch, w.classes});
  return b;
}

Batch for_devices(Batch batch, const std::vector<Device>& devices) {
  for (const Device& d : devices) {
    if (!d.is_cuda()) continue;
    batch.x = batch.x.pin_memory();
    batch.y = batch.y.pin_memory();
    break;
  }
  return batch;
}

std::shared_ptr<ResNet> make_model(const Workload& w) {
  manual_seed(1234);
  ResNetConfig config = resnet_config(w.model, w.classes);
  config.base_planes = w.width;
  config.width_per_group = w.width;
  return make_resnet(config);
}

namespace {

class SingleRun : public Run {
 public:
  SingleRun(const Workload& w, Device device, int threads, bool cuda_graph)
      : model_(make_model(w)), device_(device), threads_(threads), autocast_(w.autocast),
        outputs_(w.outputs) {
    cuda::AllowSync allow("resnet_bench setup: the model is uploaded once");
    model_->to(device);
    opt_ = std::make_unique<SGD>(model_->parameters(), w.lr);
    if (w.autocast == DType::F16) {
      scaler_ = std::make_unique<GradScaler>();
      // On a GPU the scaler decides on the device: no wait per step, and a graph can hold it.
      if (device.is_cuda()) scaler_->keep_on_device(device);
    }
    if (cuda_graph) {
      StepGraphOptions options;
      options.warmup_steps = kGraphWarmup - 1;  // the last warm-up step captures
      graph_ = std::make_unique<StepGraph>(device, options);
      x_ = Tensor::empty({w.batch, 3, w.image, w.image}, DType::F32, device, w.memory_format);
      y_ = Tensor::empty({w.batch, w.classes}, DType::F32, device);
    }
  }

  const GradScaler* scaler() const override { return scaler_.get(); }
  int warmup_steps() const override { return graph_ ? kGraphWarmup : 1; }

  void step(const Batch& batch) override {
    const int previous = num_threads();
    set_num_threads(threads_);
    if (graph_) {
      // The batch lands in the graph's static inputs (queued: the batch is pinned), then the
      // captured step replays on them.
      x_.copy_(batch.x, /*non_blocking=*/true);
      y_.copy_(batch.y, /*non_blocking=*/true);
      graph_->run([&] { return train_step(x_, y_); });
    } else {
      // Queued without the host waiting when the batch is pinned (for_devices), as a loader's
      // batches are: the copy is part of the step, the wait is not.
      train_step(batch.x.to(device_, /*non_blocking=*/true),
                 batch.y.to(device_, /*non_blocking=*/true));
    }
    set_num_threads(previous);
  }

  void finish() override {
#if KILN_WITH_CUDA
    if (device_.is_cuda()) {
      cuda::DeviceGuard guard(device_.index);
      cuda::AllowSync allow("resnet_bench: the clock is read once the timed steps are done");
      cuda::synchronize();
    }
#endif
  }

 private:
  std::shared_ptr<ResNet> model_;
  std::unique_ptr<SGD> opt_;
  Device device_;
  int threads_;
  DType autocast_;
  AutocastOutputs outputs_;
  std::unique_ptr<GradScaler> scaler_;
  std::unique_ptr<StepGraph> graph_;  // --cuda-graph
  Tensor x_, y_;                      // the graph's static inputs

  static constexpr int kGraphWarmup = 3;  // eager steps settle cuDNN's choices, then capture

  // Forward, loss, backward, update: queued, never waited for.
  std::vector<Tensor> train_step(const Tensor& x, const Tensor& y) {
    opt_->zero_grad();
    Tensor loss;
    {
      AutocastGuard mixed(autocast_, true, outputs_);
      loss = mse_loss(model_->forward(x), y);
    }
    if (scaler_ && device_.is_cuda()) {  // fp16 on a GPU: the skip is decided on the device
      scaler_->scale(loss).backward();
      scaler_->unscale_on_device(model_->parameters());
      opt_->step(scaler_->found_inf());
      scaler_->update_on_device();
    } else if (scaler_) {  // fp16 on the CPU: dynamic loss scaling decided on the host
      scaler_->scale(loss).backward();
      if (scaler_->update(scaler_->unscale_(model_->parameters()))) opt_->step();
    } else {
      loss.backward();
      opt_->step();
    }
    return {loss};
  }
};

}  // namespace

std::unique_ptr<Run> make_single_run(const Workload& w, Device device, int threads,
                                     const std::string& label, bool cuda_graph) {
  auto run = std::make_unique<SingleRun>(w, device, threads, cuda_graph);
  run->mode = "single";
  run->label = label;
  return run;
}

PipelineRun::PipelineRun(const Workload& w, const Partition& partition,
                         const std::vector<Device>& devices, PipelineOptions options)
    : model_(make_model(w)) {
  cuda::AllowSync allow("resnet_bench setup: the stages' parameters are uploaded once");
  options.autocast = w.autocast;
  const double lr = w.lr;
  pipeline_ = std::make_unique<Pipeline>(
      resnet_blocks(*model_), partition, devices,
      [](const Tensor& out, const Tensor& target) { return mse_loss(out, target); },
      [lr](std::vector<Tensor> params) { return std::make_unique<SGD>(std::move(params), lr); },
      options);
  const int64_t rows = options.schedule == Schedule::Naive || options.split_size == 0
                           ? w.batch
                           : options.split_size;
  split = options.schedule == Schedule::Naive ? 0 : rows;
  micro_batches = static_cast<int>((w.batch + rows - 1) / rows);
  if (options.schedule != Schedule::Naive) {
    schedule = schedule_name(options.schedule);
    chunks = options.chunks;
  }
}

void PipelineRun::step(const Batch& batch) { pipeline_->submit_step(batch.x, batch.y, steps_++); }

void PipelineRun::finish() {
  while (pipeline_->steps_submitted_not_waited() > 0) pipeline_->wait_step();
}

double cpu_parallel_slowdown(int threads) {
  Tensor a = Tensor::ones({384, 384}), b = Tensor::ones({384, 384});
  auto work = [&] {
    set_num_threads(threads);
    for (int i = 0; i < 40; ++i) Tensor c = matmul(a, b);
  };
  auto seconds = [](auto fn) {
    auto t0 = std::chrono::steady_clock::now();
    fn();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  std::thread warm(work);  // the first call on a thread starts its OpenMP pool
  warm.join();
  double alone = 1e30, together = 1e30;
  for (int r = 0; r < 3; ++r) {  // alternate, keep the best of each (noise only adds time)
    alone = std::min(alone, seconds([&] {
      std::thread t(work);
      t.join();
    }));
    together = std::min(together, seconds([&] {
      std::thread t0(work), t1(work);
      t0.join();
      t1.join();
    }));
  }
  return together / alone;
}

}  // namespace kiln::apps
