// runs.h: the training setups resnet_bench times, side by side: one device, naive model
// parallelism, and pipelines at each split size, each a fresh ResNet from the same seed.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/autocast.h"
#include "engine/device.h"
#include "engine/optim/grad_scaler.h"
#include "engine/optim/sgd.h"
#include "engine/tensor.h"
#include "models/pipeline/pipeline.h"
#include "models/resnet.h"

namespace kiln::apps {

struct Workload {
  std::string model = "resnet50";
  int64_t image = 64, batch = 120, classes = 1000;
  double lr = 0.001;  // the tutorial's SGD learning rate
  int64_t width = 64;  // stem channels (64: the real nets; 8 or 16: narrow nets of the same depth)
  std::string precision = "fp32";  // --precision (apps/common/mixed_precision.h)
  DType autocast = DType::F32;     // its autocast dtype: forwards run under AutocastGuard
  // --activations: 16-bit activations between layers (the single-device run; the pipelines'
  // stages exchange f32 activations).
  std::string activations_flag = "16bit";
  AutocastOutputs outputs = AutocastOutputs::LowPrecision;
  // --memory-format: the images' memory format (engine/tensor.h). Channels-last images keep
  // every activation channels-last; contiguous ones are channel-blocked on the CPU where that
  // is faster (layers/layout.h).
  std::string memory_format_flag = "contiguous";  // as given: contiguous | channels_last
  MemoryFormat memory_format = MemoryFormat::Contiguous;
};

// The tutorial's data: random images in the workload's memory format and one-hot rows of random
// labels (MSE loss).
struct Batch {
  Tensor x, y;
};
Batch random_batch(const Workload& w, uint64_t seed);
// The batch in pinned host memory when a device is a GPU (copies from it to a GPU are queued
// without the host waiting); as it is otherwise.
Batch for_devices(Batch batch, const std::vector<Device>& devices);

// A fresh model of the workload (seeded, so every setup starts from the same weights).
std::shared_ptr<ResNet> make_model(const Workload& w);

// One timed setup. step() runs one training step: on one device it only queues the step's work
// (the host does not wait for the device: with the batch pinned, even its copy is queued); a
// pipeline submits the step (Pipeline::submit_step), so that its stages overlap consecutive
// steps. finish() returns once everything queued so far is done: the timer calls it before
// reading the clock. The batch stays unchanged until then.
class Run {
 public:
  virtual ~Run() = default;
  virtual void step(const Batch& batch) = 0;
  virtual void finish() {}
  // Untimed steps before the repeats (a CUDA-graph run also captures during them).
  virtual int warmup_steps() const { return 1; }
  // The loss scaler of an fp16 run (its history goes into the JSON); null otherwise.
  virtual const GradScaler* scaler() const { return nullptr; }
  std::string mode;       // "single", "model-parallel", "pipeline"
  std::string label;      // printed name, e.g. "single (1 thread)"
  int64_t split = 0;      // pipeline rows per micro-batch (0: none)
  int micro_batches = 0;  // pipeline micro-batches per step
  std::string schedule;   // pipeline schedule name ("" for the others)
  int chunks = 0;         // pipeline model chunks per device (0 for the others)
  std::vector<double> step_seconds;  // one entry per repeat: mean step time of that repeat
};

// The whole model on one device, trained by the calling thread with `threads` CPU threads.
// cuda_graph (a CUDA device): the step is captured once into a CUDA graph and replayed
// (engine/step_graph.h); the batch is copied into the graph's static inputs each step.
std::unique_ptr<Run> make_single_run(const Workload& w, Device device, int threads,
                                     const std::string& label, bool cuda_graph = false);

// The model cut by `partition` onto `devices`, run by a Pipeline.
class PipelineRun : public Run {
 public:
  PipelineRun(const Workload& w, const Partition& partition, const std::vector<Device>& devices,
              PipelineOptions options);
  void step(const Batch& batch) override;    // submits the step
  void finish() override;                    // waits for every submitted step
  Pipeline& pipeline() { return *pipeline_; }  // last_step(): the last step finish() waited for

 private:
  std::shared_ptr<ResNet> model_;
  std::unique_ptr<Pipeline> pipeline_;
  int64_t steps_ = 0;
};

// How much slower two CPU stages are when they run at once than one alone (each with
// `threads` threads, the same fixed matrix work): about 1.0 when cpu:0 and cpu:1 really run in
// parallel, about 2.0 when they share one core's worth of time (oversubscribed).
double cpu_parallel_slowdown(int threads);

}  // namespace kiln::apps
