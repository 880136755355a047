// step_graph.h: a training step run as one CUDA graph: a few eager steps, one capture, then a
// replay per step.
//
// Why: a step of a small or mid-sized model on a GPU is bound by the host, not the device. Each
// of its hundreds of kernels costs a few microseconds of CPU time to launch (plus Kiln's
// allocator and autograd bookkeeping), while the kernel itself may run for less; the GPU idles
// between them. A CUDA graph records the step's work once (stream capture) and replays it with
// one launch: the host enqueues a whole step in microseconds and the device runs the kernels
// back to back (CUDA C++ Programming Guide, "CUDA Graphs"; PyTorch's torch.cuda.graphs and
// torch.compile(mode="reduce-overhead") do the same: https://pytorch.org/docs/stable/notes/cuda.html#cuda-graphs).
//
//   StepGraph graph(device);                       // CPU device or disabled: every step eager
//   Tensor x = Tensor::empty(..., device), y = ...;  // static inputs: the graph reads these
//   for (auto& batch : loader) {
//     x.copy_(batch.images); y.copy_(batch.labels);  // the batch lands in the static inputs
//     Tensor loss = graph.run([&] {                  // forward, loss, backward, update
//       opt.zero_grad();
//       Tensor l = cross_entropy(net->forward(x), y);
//       l.backward();
//       opt.step();
//       return std::vector<Tensor>{l};
//     })[0];
//   }
//
// What a replay may and may not do. It repeats the captured kernels with the arguments they
// had at capture: the same pointers (the step's memory comes from a private pool of the caching
// allocator and keeps its addresses: engine/cuda/graph.h), the same scalars. So:
//   - inputs change by writing into the static tensors, never by passing new tensors;
//   - nothing in the step may depend on the host between steps: the learning rate, Adam's step
//     count, the fp16 loss scale and its skip-on-overflow decision live on the device
//     (engine/optim), and dropout's random numbers come from a device offset this class
//     advances before each replay (engine/philox.h);
//   - nothing in the step may wait for the device (item(), a blocking copy): CUDA refuses it
//     during capture, and the capture fails with its error;
//   - a step of another shape (the last, smaller batch) runs eagerly: call it directly.
// The first `warmup_steps` calls run eagerly: cuDNN's algorithm search, cuBLAS's handles and the
// optimizer's state are set up there, where they may allocate and synchronise. The next call
// captures the step and replays it once (a capture records without running), later calls
// replay only.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "engine/device.h"
#include "engine/philox.h"
#include "engine/tensor.h"

namespace kiln {

struct StepGraphOptions {
  bool enabled = true;   // false: every step runs eagerly
  int warmup_steps = 3;  // eager steps before the capture
};

class StepGraph {
 public:
  // `generators`: those whose numbers the step draws (dropout's); default: default_generator().
  explicit StepGraph(Device device, StepGraphOptions options = {},
                     std::vector<Generator*> generators = {});
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  // Runs one step. `step` queues the step's work and returns the tensors the caller reads
  // afterwards (the loss); after the capture, run() replays and returns the tensors the
  // captured step returned, which hold this replay's values once the device has run it.
  std::vector<Tensor> run(const std::function<std::vector<Tensor>()>& step);

  // Whether steps are captured at all (enabled, on a CUDA device).
  bool graphs_enabled() const;
  bool captured() const;
  int64_t replays() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln
