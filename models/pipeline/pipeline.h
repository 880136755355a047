// pipeline.h: training a model split into stages on several devices, one thread per stage,
// micro-batches flowing through queues (pipeline model parallelism).
//
//   std::vector<Block> blocks = resnet_blocks(*model);
//   Pipeline pipe(blocks, tutorial_partition(blocks), {"cuda:0", "cuda:1"},  // or cpu:0, cpu:1
//                 [](const Tensor& y, const Tensor& t) { return mse_loss(y, t); },
//                 [](std::vector<Tensor> p) { return std::make_unique<SGD>(p, 0.001); },
//                 {.schedule = Schedule::OneFOneB, .split_size = 20});
//   double loss = pipe.train_step(images, targets);   // forward, backward, optimizer step
//
// How one step runs (schedule.h has the orders). The batch is cut into micro-batches of
// split_size rows (Tensor::rows). Stage s runs its blocks on its device, in its own thread,
// following its list of actions (stage_actions):
//   forward i    input: the batch rows (stage 0) or the message from stage s-1, made a leaf
//                that requires grad; output: sent to stage s+1 on its device (to(device),
//                ordered on GPUs by an event; channel.h), or, on the last stage, the loss of
//                the micro-batch scaled by its share of the batch (rows / batch), so the
//                gradients accumulated over micro-batches are those of the whole batch's mean.
//                The micro-batch's tensors wait in the stage's stash until its backward.
//   backward i   the output's backward with the gradient received from stage s+1 (the last
//                stage: the loss's backward); the input leaf's .grad goes back to stage s-1,
//                and the micro-batch leaves the stash.
//   after all    one optimizer step per stage, on the stage's thread.
// The autograd graph never crosses a stage: each stage's part begins at its input leaf, so
// every stage thread runs its own backward (the "boundary tensor" of torchgpipe and PyTorch's
// pipelining: https://pytorch.org/docs/stable/distributed.pipelining.html).
//
// Split backward (the zero-bubble schedules, zb-h1 and zb-h2: splits_backward()). A backward
// is two actions. B i (PipelineAction::Backward) computes only what stage s-1 waits for: the
// gradients of the activations and of the input leaf (backward_input_grads, engine/autograd.h),
// and sends the input's .grad back as above; the weights' gradients it leaves undone, in a
// WeightGradients kept in the micro-batch's stash entry (which then holds only that: it keeps
// what W needs). W i (PipelineAction::Weight), later, computes and accumulates them (the
// trace's "weight" spans); only then does the micro-batch leave the stash, so the activations
// held (peak_live_micro_batches) count from F i to W i.
// Nobody waits for a W, which is why the schedule can put them where a stage would otherwise
// idle. B and W together compute what one backward does, so the step's result is unchanged.
//
// Model chunks (the interleaved schedule, chunks = v > 1). The partition then has p x v
// pieces, and device d holds v of them, not neighbours: piece k = c p + d is chunk c of
// device d. A micro-batch goes through device 0, 1, ..., p-1 (chunk 0), then again through
// device 0, 1, ..., p-1 (chunk 1), and so on; the first piece takes the batch rows, the last
// computes the loss. Each device still has one thread and one optimizer (over the parameters
// of all its chunks: stage_parameters), and an action names its chunk. There is a channel
// per boundary between pieces, including the one from the last device back to device 0, and
// from a device to itself (p = 1); every device's actions come in an order in which no receive
// waits for a send that cannot come first (schedule.h). stages() and PipelineStepStats count
// devices; pieces() counts pieces; trace spans carry the device as stage and the chunk.
//
//   Pipeline pipe(blocks, balance(block_costs, 2 * 2), {"cuda:0", "cuda:1"}, loss, make_sgd,
//                 {.schedule = Schedule::Interleaved, .split_size = 20, .chunks = 2});
//
// Re-materialisation (recompute, GPipe section 2.3): the forward pass runs without recording
// the graph and keeps only the stage's input; the backward pass runs the forward again, with
// the graph, just before it (before B, in a split backward). Activation memory falls from m
// micro-batches of every layer's saved tensors to m stage inputs plus one micro-batch's, for
// one more forward per step. BatchNorm layers then see each micro-batch twice and update their
// running statistics twice (the gradients are unchanged): models/pipeline docs say more.
//
// Threads. CPU stages (cpu:N) each get their own OpenMP/BLAS/oneDNN thread budget
// (threads_per_stage), so two stages on a 2-core machine use one core each instead of both
// fighting over two. CUDA stages make their device current on their thread. Every stage thread
// runs the kernels (hand or vendor, engine/impl.h) of the thread that built the pipeline.
//
// Consecutive steps overlap (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024,
// sections 2.2 and 4: https://arxiv.org/abs/2401.10241). Each stage steps its own optimizer,
// so nothing ties the stages together at the end of a step: stage 0, done with step k (its
// optimizer step included), may start the forwards of step k+1 while the last stage still
// drains step k. submit_step() queues a step and returns; wait_step() waits for the oldest
// submitted one and returns its loss:
//
//   pipe.submit_step(x0, t0);  pipe.submit_step(x1, t1);  pipe.submit_step(x2, t2);
//   double l0 = pipe.wait_step(), l1 = pipe.wait_step(), l2 = pipe.wait_step();
//
// Each stage thread runs the queued steps in order, going from its part of step k straight to
// its part of step k+1. Which schedules gain: a ZB-H2 step is a parallelogram (the last stage
// starts and ends p - 1 forwards after stage 0); back to back, the parallelograms tile, and the
// fill and drain triangles of one step are filled by the neighbouring steps. In GPipe, 1F1B,
// ZB-H1 and interleaved, stage 0 ends every step last (its last backward needs every other
// stage's), so step k+1 cannot start sooner; overlap there only saves the hand-over between
// steps (ideal_bubble over several steps, schedule_sim.h, has both). Every stage runs the same
// operations in the same order as with train_step() one step at a time, so the losses and
// weights are bit for bit the same. The channels need no reset between steps: each boundary is
// FIFO, so the messages of step k+1 follow those of step k. At most kMaxStepsInFlight steps
// are unfinished at once (submit_step() blocks beyond). The caller keeps a submitted step's
// batch unchanged until its wait_step() (the stages read it while the step runs).
// train_step() is submit_step() then wait_step().
//
// Failure. An exception on any stage aborts every queue; the wait_step() (or train_step()) of
// that step then throws one Error naming the stage, its device, the micro-batch and the phase,
// with the first error's message and kind. The steps submitted before it end normally (a queue
// aborted from step k still delivers the messages of earlier steps); those submitted after it
// are cancelled: their wait_step() throws an Error saying so. No stage is left waiting: once
// every step in flight has ended, the queues are reset and the pipeline runs the next steps
// normally. The weights after a failed step are as the stages left them (some may have stepped
// their optimizer, others not).
//
// Hybrid data x pipeline parallelism: with stage_transports (one per stage, connecting that
// stage across the N replicas of the pipeline: threads with comm::make_local_group, or MPI
// processes), each stage averages its gradients over the replicas with comm::DataParallel.
// The weights' gradients of all micro-batches add up locally (under no_sync()) except in the
// stage's last action that computes them: its last backward, or, in a split backward, its
// last W (every B also runs under no_sync()). The grad-ready hooks of that last one launch the
// bucket allreduces, which overlap it and the rest of the pipeline's drain.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "engine/error.h"
#include "engine/optim/optimizer.h"
#include "engine/tensor.h"
#include "engine/trace.h"
#include "models/pipeline/channel.h"
#include "models/pipeline/partition.h"
#include "models/pipeline/schedule.h"

namespace kiln {

namespace comm {
class DataParallel;
}

struct PipelineOptions {
  Schedule schedule = Schedule::GPipe;
  int64_t split_size = 0;  // rows per micro-batch (the last may be smaller); 0 or Naive: whole batch
  // Model chunks per device (Interleaved only; >= 1): the partition then has stages x chunks
  // pieces, piece c * stages + d on device d.
  int chunks = 1;
  bool recompute = false;  // re-materialisation: keep only stage inputs, recompute in backward
  int threads_per_stage = 0;  // CPU stages' thread budget; 0: max(1, cores / stages)
  // Hybrid: one transport per stage (empty: a single pipeline, no gradient averaging).
  std::vector<std::shared_ptr<comm::Transport>> stage_transports;
  comm::Algorithm algorithm = comm::Algorithm::Ring;
  size_t bucket_bytes = size_t{4} << 20;
  int replica = -1;  // this pipeline's replica index, for traces (hybrid runs)
  // Mixed precision: BF16 or F16 runs every stage's forward under an AutocastGuard of that
  // dtype (engine/autocast.h; the guard is per thread, so each stage thread sets its own);
  // F32: off. Loss scaling (fp16) is not part of the pipeline: use BF16.
  DType autocast = DType::F32;
};

struct PipelineStepStats {
  double seconds = 0;  // wall time from submit_step() to the step's end on every stage
  double loss = 0;        // the batch's loss (sum of the micro-batches' scaled losses)
  int micro_batches = 0;
  // Per stage (device): the most micro-batches (pairs of micro-batch and chunk, interleaved)
  // whose activations were held at once: from forward to backward, or to W in a split backward.
  std::vector<int> peak_live_micro_batches;
  // Per stage: the device allocator's peak bytes during the step above its bytes at the start,
  // less the parameters' gradients (what remains: activations, their gradients and
  // workspaces; cpu:N counted apart, allocator.h).
  std::vector<int64_t> peak_activation_bytes;
  // Hybrid: per stage, the share of the gradient allreduce time hidden behind computation.
  std::vector<double> overlap_fraction;
};

class Pipeline {
 public:
  using LossFn = std::function<Tensor(const Tensor& output, const Tensor& target)>;
  using OptimizerFactory = std::function<std::unique_ptr<Optimizer>(std::vector<Tensor>)>;

  // Moves each piece's blocks to its device (Module::to) and starts one thread per device.
  // partition.stages() must equal devices.size() x options.chunks; errors (Usage) say what does
  // not match.
  Pipeline(std::vector<Block> blocks, Partition partition, std::vector<Device> devices,
           LossFn loss, OptimizerFactory make_optimizer, PipelineOptions options = {});
  ~Pipeline();  // stops and joins the stage threads
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  // One training step on a batch (x and target have the same number of rows, on any device).
  // Returns the batch's loss. `step` labels the trace spans. Usage error while steps submitted
  // with submit_step() are not yet waited for.
  double train_step(const Tensor& x, const Tensor& target, int64_t step = -1);

  // Steps that overlap (above). submit_step queues a step and returns its number (0, 1, ... in
  // submission order), blocking while kMaxStepsInFlight steps are unfinished; the batch must
  // stay unchanged until the step's wait_step(). wait_step waits for the oldest submitted step
  // not yet waited for, sets last_step() to its stats and returns its loss; it throws the
  // step's failure (or its cancellation), and is a Usage error with nothing submitted.
  static constexpr int kMaxStepsInFlight = 3;
  int64_t submit_step(const Tensor& x, const Tensor& target, int64_t step = -1);
  double wait_step();
  int steps_submitted_not_waited() const;

  int stages() const { return static_cast<int>(devices_.size()); }  // devices
  int chunks() const { return options_.chunks; }                     // pieces per device
  int pieces() const { return partition_.stages(); }                 // stages() x chunks()
  Device device(int stage) const { return devices_.at(stage); }
  const Partition& partition() const { return partition_; }
  const std::vector<Block>& blocks() const { return blocks_; }
  // The parameters of every chunk of device `stage`, chunk 0 first.
  std::vector<Tensor> stage_parameters(int stage) const;
  Optimizer& optimizer(int stage) { return *stages_.at(stage)->optimizer; }
  const PipelineStepStats& last_step() const { return last_; }
  const PipelineOptions& options() const { return options_; }
  int threads_per_stage() const { return threads_per_stage_; }

 private:
  struct Stashed;  // a micro-batch's tensors between its forward and backward (or W)
  struct Stage {
    int index = 0;
    Device device;
    std::unique_ptr<Optimizer> optimizer;
    std::shared_ptr<comm::DataParallel> dp;  // hybrid only (built on the stage thread)
    std::thread thread;
  };
  // What one stage measured in one step, written by its thread.
  struct StageResult {
    int peak_live = 0;
    int64_t peak_bytes = 0;
    double loss = 0;
    double overlap = -1;  // hybrid: the allreduce time hidden; -1: not hybrid
  };
  struct StepInput {
    Tensor x, target;
    int64_t rows = 0;
    std::vector<int64_t> starts;  // micro-batch i: rows [starts[i], starts[i + 1])
    int64_t step = -1;
  };
  // A submitted step: its input, each stage's results, and how it ended (under mu_).
  struct StepJob {
    int64_t seq = 0;  // submission number
    StepInput in;
    std::vector<StageResult> results;  // per stage
    int done = 0;                      // stages that have ended it
    std::string error;                 // empty: no failure
    ErrorKind kind = ErrorKind::Runtime;
    bool cancelled = false;  // a step before it failed: the stages skip it
    std::chrono::steady_clock::time_point submitted, finished;
  };

  void stage_loop(Stage& stage);
  void run_step(Stage& stage, StepJob& job);
  Tensor forward_blocks(int piece, const Tensor& x) const;
  int device_of(int piece) const { return piece % stages(); }
  trace::Ids ids(int piece, int micro_batch, int64_t step) const;
  void send(int from_piece, Channel& to, int to_piece, int micro_batch, const Tensor& t);
  Tensor receive(Channel& from, int piece, int micro_batch, int64_t seq);
  void fail(const std::string& what, const std::exception_ptr& error, StepJob& job);
  int unfinished_locked() const;

  std::vector<Block> blocks_;
  Partition partition_;
  std::vector<Device> devices_;
  LossFn loss_;
  PipelineOptions options_;
  int threads_per_stage_ = 1;
  std::vector<std::unique_ptr<Stage>> stages_;
  std::vector<std::unique_ptr<Channel>> activations_;  // [k]: piece k-1 -> k
  std::vector<std::unique_ptr<Channel>> gradients_;    // [k]: piece k+1 -> k

  // The submitted steps not yet waited for, oldest first, and the stage threads' progress.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<StepJob>> jobs_;
  int64_t next_seq_ = 0;  // the number of the next submitted step
  bool aborted_ = false;  // a step failed: the channels are reset once no step is unfinished
  bool stopping_ = false;
  PipelineStepStats last_;
};

}  // namespace kiln
