// data_parallel.h: synchronous data parallelism, the way Horovod and PyTorch DDP do it.
//
// Every rank holds a full replica of the model and trains on its own shard of each global
// batch. After backward, each rank's gradient is the mean over its B/N examples; the average
// of the N ranks' gradients is the mean over all B examples, i.e. exactly the gradient one
// rank would have computed on the whole batch. So if the replicas start equal (the
// constructor broadcasts rank 0's parameters and buffers) and every rank applies the same
// averaged gradient with the same optimizer, they stay equal, step after step, and N ranks
// with batch B/N each follow the same trajectory as one rank with batch B.
//
//   std::vector<Tensor> buffers;  // BatchNorm statistics etc.: model->named_buffers()
//   comm::DataParallel dp(communicator, model->parameters(), buffers);
//   for (...) {
//     Tensor loss = cross_entropy(model(x), y);
//     opt.zero_grad();
//     loss.backward();      // grad-ready hooks start bucket allreduces as gradients appear
//     dp.synchronize();     // waits for them and averages: each .grad holds the average
//     opt.step();
//   }
//
// Fusion buckets. Allreducing each of a model's tensors separately pays the per-message
// latency once per tensor (the CNN has 8, a ResNet hundreds); allreducing one flat vector of
// all of them would wait for the whole backward pass. So gradients are packed into buckets of
// about bucket_bytes (25 MiB by default, PyTorch's number), filled in REVERSE registration
// order: backward produces the last layer's gradients first, so the first bucket fills first.
//
// Overlap. Each parameter has a grad-ready hook (engine/autograd.h) that the engine calls once
// its gradient for this backward pass is complete. By then the gradient is in its bucket's
// flat buffer (a bucket view, below; else the hook copies it there); when the bucket's last
// parameter is in, the bucket's allreduce is submitted to the Communicator's worker thread and
// runs WHILE backward goes on computing the gradients of earlier layers. synchronize() then only waits for what is left. Buckets are
// submitted strictly in bucket order (bucket k waits for buckets < k), so every rank submits
// the same collectives in the same order even if its gradients arrive in another order.
// A bucket overlaps only if it closes before backward ends: a model smaller than one bucket
// travels in one allreduce after backward and hides nothing (the MNIST CNN's 4.8 MB in 25 MiB;
// mnist_train uses 1 MiB buckets). Stats: comm_seconds is the time the allreduces ran,
// exposed_seconds the time synchronize() had to wait; overlap_fraction = 1 - exposed / comm is
// the share hidden behind backward.
//
// Gradients as bucket views (PyTorch DDP's gradient_as_bucket_view; Li et al., VLDB 2020).
// Each parameter's .grad is a view into its bucket's flat buffer, so the allreduce works on
// the gradients themselves: no copy into the bucket before it, no copy back after it. The
// constructor makes each view (Tensor::from_storage on the bucket's storage) the parameter's
// grad buffer (Tensor::set_grad_buffer, engine/tensor.h): when .grad is undefined, backward
// writes the gradient into the view (the copy it would otherwise make into a fresh tensor) and
// .grad becomes the view; when .grad is the view (no_sync accumulation), backward adds into it
// in place. So zero_grad() keeps dropping .grad as it always did, and the next backward puts
// the gradient back into the bucket; nothing has to re-attach views or zero them. The average
// is computed in place in the buckets, and synchronize() only makes sure every .grad is its
// view (a parameter without a gradient in this pass gets its view, holding the average of the
// others' gradients, as it got a zero-filled .grad before). A .grad that is not the view (one
// set before the constructor, or by set_grad) is copied into the bucket, and the view then
// replaces it. Consequences: a .grad read after a step is overwritten by the next backward
// (clone() it to keep it); a second backward before synchronize() is still an error, found
// only after it added into a bucket whose allreduce may be running (the step is lost either
// way); a parameter on another device than the transport's, and compression (the wire holds
// 16-bit values, which must be converted), keep the copies.
// grad_as_bucket_view = false keeps the copies for every parameter (for comparison).
//
// Compression (comm/wire_format.h) halves the bytes on the wire: gradients are rounded to f16
// or bf16 into a 16-bit copy of the bucket, summed in f32 by the reduction (comm/algorithms.h
// reduce_into) and rounded again, and widened back into the bucket to be averaged. The error
// per rounding is about 2^-11 relative for f16 and 2^-8 for bf16, harmless for SGD's noisy
// gradients; but f16 turns any gradient (or sum of gradients) above 65504 into inf, where bf16
// keeps f32's range. Under loss scaling such an inf makes every rank skip the step
// (engine/optim/grad_scaler.h); without it, the inf reaches the weights.
//
// no_sync(): gradient accumulation. Under the guard the hooks do nothing, so gradients add up
// locally in .grad over several micro-batches; the next backward outside the guard allreduces
// the accumulated sum (one allreduce for k micro-batches), as in PyTorch DDP.
//
// The large-minibatch recipe (Goyal et al. 2017, Horovod): with a fixed per-rank batch, N ranks
// make the batch N times larger, so the learning rate is multiplied by N, reached through a
// linear warm-up from the single-rank rate: large_minibatch_schedule() below.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "comm/wire_format.h"
#include "engine/optim/lr_schedule.h"
#include "engine/tensor.h"

namespace kiln::comm {

struct DataParallelOptions {
  size_t bucket_bytes = size_t{25} << 20;  // fusion bucket capacity (a larger tensor gets its own)
  Algorithm algorithm = Algorithm::Ring;
  WireFormat wire = WireFormat::Uncompressed;  // f16 / bf16: compress gradients on the wire
  bool broadcast_from_rank0 = true; // constructor broadcasts parameters and buffers
  // Each .grad is a view into its bucket (no copies in or out); false: the gradients are
  // copied into the buckets and the averages back into each .grad.
  bool grad_as_bucket_view = true;
};

struct DataParallelStats {
  int64_t steps = 0;           // synchronize() calls that allreduced
  int64_t buckets_launched = 0;
  int64_t buckets_from_hooks = 0;  // of which were launched by a hook, during backward
  double comm_seconds = 0;     // sum of the buckets' allreduce times on the worker thread
  double exposed_seconds = 0;  // time synchronize() waited for them
  uint64_t bytes_sent = 0;     // bytes this rank sent in the gradient allreduces
  // Share of the communication hidden behind backward: 1 - exposed / comm, in [0, 1].
  double overlap_fraction() const;
};

class DataParallel {
 public:
  // params: the model's trainable parameters in registration order (model->parameters());
  // buffers: state that must agree across ranks but is not trained (BatchNorm statistics).
  // Every member rank of `comm` constructs it with the same tensors in the same order.
  DataParallel(std::shared_ptr<Communicator> comm, std::vector<Tensor> params,
               std::vector<Tensor> buffers = {}, DataParallelOptions options = {});
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // Rank 0's parameters and buffers to every rank (the constructor calls it).
  void broadcast_parameters();

  // Call after backward, before the optimizer step: launches the buckets not launched yet
  // (parameters without a gradient contribute zeros), waits for all, and leaves the average
  // over the ranks in each parameter's .grad (its bucket view, or copied there). Under
  // no_sync() it does nothing.
  void synchronize();

  // RAII: while one lives, backward passes only accumulate gradients locally.
  class NoSync {
   public:
    explicit NoSync(DataParallel& dp);
    ~NoSync();
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DataParallel& dp_;
  };
  NoSync no_sync() { return NoSync(*this); }

  const DataParallelStats& stats() const { return stats_; }
  void reset_stats() { stats_ = DataParallelStats(); }
  const DataParallelOptions& options() const { return options_; }
  Communicator& communicator() const { return *comm_; }
  int num_buckets() const { return static_cast<int>(buckets_.size()); }
  // The parameter indices (into `params`) of bucket b, in the order they fill it.
  const std::vector<size_t>& bucket_params(int b) const { return buckets_.at(b).params; }
  // Bucket b's flat buffer (count elements of the parameters' dtype on the transport's device):
  // with grad_as_bucket_view, the storage the parameters' .grad views share.
  const Tensor& bucket_buffer(int b) const { return buckets_.at(b).flat; }
  // Called on the backward thread each time a bucket is submitted (tests, tracing).
  void set_launch_observer(std::function<void(int bucket, bool from_hook)> fn) {
    observer_ = std::move(fn);
  }

 private:
  struct Bucket {
    std::vector<size_t> params;   // indices into params_
    std::vector<int64_t> offset;  // element offset of each in the flat buffer
    int64_t count = 0;
    DType dtype = DType::F32;
    Tensor flat;                  // count elements of dtype on the transport's device
    Tensor wire;                  // compressed: count elements of the wire dtype (f16, bf16)
    int pending = 0;              // parameters not ready yet in this pass
    bool launched = false;
    std::shared_ptr<Work> work;
    uint64_t bytes = 0;           // sent by the last allreduce (written by the worker thread)
  };
  struct State;  // what the hooks see (outlives this object if the tensors do)

  void on_grad_ready(size_t param, const Tensor& grad);
  void pack(size_t param, const Tensor* grad);  // grad null: zeros
  void launch_ready(bool from_hook);
  void launch(Bucket& b, bool from_hook);
  void reset_pass();

  std::shared_ptr<Communicator> comm_;
  std::vector<Tensor> params_, buffers_;
  DataParallelOptions options_;
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_;  // per parameter
  std::vector<char> ready_;     // per parameter, this pass
  std::vector<Tensor> grad_view_;  // per parameter: its slot of the bucket (undefined: copies)
  size_t next_launch_ = 0;
  int no_sync_depth_ = 0;
  DataParallelStats stats_;
  std::function<void(int, bool)> observer_;
  std::shared_ptr<State> state_;
};

// Horovod's learning rate for a fixed per-rank batch: base_lr * world_size, reached by a linear
// warm-up over warmup_steps optimizer steps starting from base_lr (Goyal et al. 2017), then
// multiplied by gamma every decay_every steps (StepLR; gamma 1: constant). t counts steps.
std::shared_ptr<LRSchedule> large_minibatch_schedule(double base_lr, int world_size,
                                                     int64_t warmup_steps, int64_t decay_every,
                                                     double gamma);

// The tensors concatenated into one f32 vector on the CPU (and back): for comparing replicas
// and for the asynchronous parameter server's flat parameter vector.
std::vector<float> flatten_to_host(const std::vector<Tensor>& tensors);
void unflatten_from_host(const std::vector<float>& flat, std::vector<Tensor>& tensors);

}  // namespace kiln::comm
