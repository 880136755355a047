// pipeline.cpp: stage threads, the step loop of each stage, sends and receives.
#include "models/pipeline/pipeline.h"

#include <cstdint>
#include <algorithm>
#include <chrono>
#include <exception>
#include <map>
#include <optional>
#include <utility>

#include "comm/data_parallel.h"
#include "engine/allocator.h"
#include "engine/autocast.h"
#include "engine/autograd.h"
#include "engine/cuda/sync_debug.h"
#include "engine/error.h"
#include "engine/impl.h"
#include "engine/ops.h"
#include "engine/parallel.h"
#include "engine/trace.h"

#if KILN_WITH_CUDA
#include "engine/cuda/caching_allocator.h"
#include "engine/cuda/context.h"
#endif

namespace kiln {

namespace {

int64_t device_bytes(Device d, bool peak) {
#if KILN_WITH_CUDA
  if (d.is_cuda()) {
    MemoryStats s = cuda_allocator::stats(d.index);
    return peak ? s.peak_bytes : s.current_bytes;
  }
#endif
  MemoryStats s = cpu_allocator::stats(d.index);
  return peak ? s.peak_bytes : s.current_bytes;
}

void reset_device_peak(Device d) {
#if KILN_WITH_CUDA
  if (d.is_cuda()) {
    cuda_allocator::reset_peak(d.index);
    return;
  }
#endif
  cpu_allocator::reset_peak(d.index);
}

// The host waits for the work this thread queued on its stream of `d` (a GPU stage's step is
// over when its GPU work is).
void finish_device_work(Device d) {
#if KILN_WITH_CUDA
  if (d.is_cuda()) cuda::synchronize();
#else
  (void)d;
#endif
}

}  // namespace

// A micro-batch between its forward and its backward (its W, in a split backward) on one
// piece of the model.
struct Pipeline::Stashed {
  Tensor input;   // the piece's input (a leaf that requires grad, except on the first piece)
  Tensor output;  // the output (the scaled loss on the last piece); undefined under recompute
  std::optional<WeightGradients> weights;  // after B of a split backward: what W computes
};

Pipeline::Pipeline(std::vector<Block> blocks, Partition partition, std::vector<Device> devices,
                   LossFn loss, OptimizerFactory make_optimizer, PipelineOptions options)
    : blocks_(std::move(blocks)),
      partition_(std::move(partition)),
      devices_(std::move(devices)),
      loss_(std::move(loss)),
      options_(std::move(options)) {
  const int pieces = partition_.stages();
  if (pieces < 1) throw Error("pipeline: the partition has no stages", ErrorKind::Usage);
  if (partition_.bounds.back() != static_cast<int64_t>(blocks_.size())) {
    throw Error(detail::str("pipeline: the partition covers ", partition_.bounds.back(),
                            " blocks but the model has ", blocks_.size()), ErrorKind::Usage);
  }
  const int v = options_.chunks;
  if (v < 1) {
    throw Error(detail::str("pipeline: chunks must be at least 1, got ", v), ErrorKind::Usage);
  }
  if (v > 1 && options_.schedule != Schedule::Interleaved) {
    throw Error(detail::str("pipeline: chunks = ", v, " needs the interleaved schedule, not ",
                            schedule_name(options_.schedule),
                            " (which runs one chunk per device: set chunks = 1)"),
                ErrorKind::Usage);
  }
  if (v == 1 && static_cast<int>(devices_.size()) != pieces) {
    throw Error(detail::str("pipeline: ", pieces, " stages need ", pieces, " devices, got ",
                            devices_.size(), " (give one device per stage, e.g. cpu:0,cpu:1)"),
                ErrorKind::Usage);
  }
  if (v > 1 && static_cast<int64_t>(devices_.size()) * v != pieces) {
    throw Error(detail::str("pipeline: ", devices_.size(), " devices x ", v, " chunks need a ",
                            "partition into ", static_cast<int64_t>(devices_.size()) * v,
                            " pieces, but it has ", pieces, " (balance(costs, devices x chunks))"),
                ErrorKind::Usage);
  }
  const int p = static_cast<int>(devices_.size());
  if (!options_.stage_transports.empty() &&
      static_cast<int>(options_.stage_transports.size()) != p) {
    throw Error(detail::str("pipeline: hybrid parallelism needs one transport per stage (", p,
                            "), got ", options_.stage_transports.size()), ErrorKind::Usage);
  }
  KILN_CHECK(options_.split_size >= 0, "pipeline: split_size must be >= 0");
  threads_per_stage_ = options_.threads_per_stage > 0
                           ? options_.threads_per_stage
                           : std::max(1, hardware_threads() / p);
  for (int k = 0; k < pieces; ++k) {
    for (int64_t b = partition_.first(k); b < partition_.end(k); ++b) {
      blocks_[b].module->to(devices_[device_of(k)]);
    }
    activations_.push_back(std::make_unique<Channel>());
    gradients_.push_back(std::make_unique<Channel>());
  }
  for (int s = 0; s < p; ++s) {
    auto stage = std::make_unique<Stage>();
    stage->index = s;
    stage->device = devices_[s];
    stage->optimizer = make_optimizer(stage_parameters(s));
    stages_.push_back(std::move(stage));
  }
  // The stage threads run the kernels (hand or vendor, engine/impl.h) of the thread that built
  // the pipeline: a KernelsGuard is per thread, and a new thread would start at the default.
  const Impl kernels = current_impl();
  for (auto& stage : stages_) {
    Stage* st = stage.get();
    st->thread = std::thread([this, st, kernels] {
      KernelsGuard guard(kernels);
      stage_loop(*st);
    });
  }
}

Pipeline::~Pipeline() {
  {
    // Steps still in flight finish first (a failed one ends by its abort): no stage thread is
    // stopped mid-step, and none waits for a message that will not come.
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return unfinished_locked() == 0; });
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& stage : stages_) {
    if (stage->thread.joinable()) stage->thread.join();
  }
}

std::vector<Tensor> Pipeline::stage_parameters(int stage) const {
  KILN_CHECK(stage >= 0 && stage < stages(), "pipeline: no stage ", stage, " of ", stages());
  std::vector<Tensor> params;
  for (int k = stage; k < pieces(); k += stages()) {  // chunk 0, 1, ... of the device
    for (int64_t b = partition_.first(k); b < partition_.end(k); ++b) {
      for (const Tensor& t : blocks_[b].module->parameters()) params.push_back(t);
    }
  }
  return params;
}

Tensor Pipeline::forward_blocks(int piece, const Tensor& x) const {
  AutocastGuard mixed(options_.autocast);
  Tensor y = x;
  for (int64_t b = partition_.first(piece); b < partition_.end(piece); ++b) {
    y = blocks_[b].module->forward(y);
  }
  return y;
}

trace::Ids Pipeline::ids(int piece, int micro_batch, int64_t step) const {
  trace::Ids ids{device_of(piece), micro_batch, -1, step, options_.replica};
  if (options_.schedule == Schedule::Interleaved) ids.chunk = piece / stages();
  return ids;
}

int Pipeline::unfinished_locked() const {
  int n = 0;
  for (const auto& job : jobs_) n += job->done < stages() ? 1 : 0;
  return n;
}

int Pipeline::steps_submitted_not_waited() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(jobs_.size());
}

double Pipeline::train_step(const Tensor& x, const Tensor& target, int64_t step) {
  if (steps_submitted_not_waited() > 0) {
    throw Error(detail::str("pipeline: train_step with ", steps_submitted_not_waited(),
                            " submitted steps not waited for (call wait_step() for each first)"),
                ErrorKind::Usage);
  }
  submit_step(x, target, step);
  return wait_step();
}

int64_t Pipeline::submit_step(const Tensor& x, const Tensor& target, int64_t step) {
  KILN_CHECK_INPUT(x.dim() >= 1 && target.dim() >= 1 && x.size(0) == target.size(0),
                   "pipeline: the batch has ", x.dim() >= 1 ? x.size(0) : 0,
                   " rows but the targets have ", target.dim() >= 1 ? target.size(0) : 0);
  KILN_CHECK_INPUT(x.size(0) >= 1, "pipeline: an empty batch");
  auto job = std::make_shared<StepJob>();
  job->submitted = std::chrono::steady_clock::now();
  StepInput& in = job->in;
  in.x = x.detach();
  in.target = target.detach();
  in.rows = x.size(0);
  in.step = step;
  const int64_t split = options_.schedule == Schedule::Naive || options_.split_size == 0
                            ? in.rows
                            : options_.split_size;
  for (int64_t r = 0; r < in.rows; r += split) in.starts.push_back(r);
  in.starts.push_back(in.rows);
  job->results.resize(stages());

  std::unique_lock<std::mutex> lock(mu_);
  // After a failure, the aborted channels are reset once every step in flight has ended (the
  // failed one, those it interrupted or cancelled); the new step then runs normally.
  cv_.wait(lock, [&] {
    const int unfinished = unfinished_locked();
    return aborted_ ? unfinished == 0 : unfinished < kMaxStepsInFlight;
  });
  if (aborted_) {
    for (int k = 0; k < pieces(); ++k) {
      activations_[k]->reset();
      gradients_[k]->reset();
    }
    aborted_ = false;
  }
  job->seq = next_seq_++;
  jobs_.push_back(job);
  cv_.notify_all();
  return job->seq;
}

double Pipeline::wait_step() {
  std::shared_ptr<StepJob> job;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (jobs_.empty()) {
      throw Error("pipeline: wait_step() with no step submitted (call submit_step() first)",
                  ErrorKind::Usage);
    }
    job = jobs_.front();
    cv_.wait(lock, [&] { return job->done == stages(); });
    jobs_.pop_front();
  }
  cv_.notify_all();
  if (!job->error.empty()) throw Error(job->error, job->kind);
  last_ = PipelineStepStats();
  last_.micro_batches = static_cast<int>(job->in.starts.size()) - 1;
  for (const StageResult& r : job->results) {
    last_.peak_live_micro_batches.push_back(r.peak_live);
    last_.peak_activation_bytes.push_back(r.peak_bytes);
    if (r.overlap >= 0) last_.overlap_fraction.push_back(r.overlap);
  }
  last_.loss = job->results.back().loss;
  last_.seconds = std::chrono::duration<double>(job->finished - job->submitted).count();
  return last_.loss;
}

void Pipeline::stage_loop(Stage& stage) {
  if (stage.device.is_cpu()) set_num_threads(threads_per_stage_);
#if KILN_WITH_CUDA
  std::optional<cuda::DeviceGuard> guard;
  if (stage.device.is_cuda()) guard.emplace(stage.device.index);
#endif
  int64_t next = 0;  // the submission number of this stage's next step
  while (true) {
    std::shared_ptr<StepJob> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // A step is waited for (and leaves jobs_) only once every stage has ended it, so this
      // stage's next step is in jobs_ once submitted.
      cv_.wait(lock, [&] { return stopping_ || (!jobs_.empty() && jobs_.back()->seq >= next); });
      if (stopping_) return;
      job = jobs_[static_cast<size_t>(next - jobs_.front()->seq)];
    }
    bool skip;
    {
      std::lock_guard<std::mutex> lock(mu_);
      skip = job->cancelled;
    }
    try {
      if (!skip) run_step(stage, *job);
    } catch (const ChannelAborted&) {
      // Another stage failed and reported it (cancelling this step, or naming it in the step's
      // error); a step before the failed one that the abort cut short gets the failure's words.
      std::lock_guard<std::mutex> lock(mu_);
      if (job->error.empty() && !job->cancelled) {
        job->error = "pipeline: the step was aborted because another failed";
        for (const auto& other : jobs_) {
          if (!other->error.empty() && !other->cancelled) {
            job->error = other->error;
            job->kind = other->kind;
          }
        }
      }
    } catch (...) {
      fail(detail::str("pipeline stage ", stage.index, " (", stage.device.str(), ")"),
           std::current_exception(), *job);
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (++job->done == stages()) job->finished = std::chrono::steady_clock::now();
    }
    cv_.notify_all();
    ++next;
  }
}

void Pipeline::fail(const std::string& where, const std::exception_ptr& error, StepJob& job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (job.error.empty() && !job.cancelled) {
      std::string message = "unknown exception";
      ErrorKind kind = ErrorKind::Runtime;
      try {
        std::rethrow_exception(error);
      } catch (const Error& e) {
        message = e.what();
        kind = e.kind();
      } catch (const std::exception& e) {
        message = e.what();
      } catch (...) {
      }
      job.error = where + ": " + message;
      job.kind = kind;
      // The steps submitted after it are cancelled: their stages skip them, or stop at the
      // aborted channels.
      for (const auto& later : jobs_) {
        if (later->seq > job.seq && later->error.empty()) {
          later->cancelled = true;
          later->error = detail::str("pipeline: step ", later->seq, " was cancelled because step ",
                                     job.seq, " failed (", job.error, ")");
        }
      }
    }
    aborted_ = true;
  }
  for (int k = 0; k < pieces(); ++k) {
    activations_[k]->abort(job.seq);
    gradients_[k]->abort(job.seq);
  }
}

void Pipeline::send(int from_piece, Channel& to, int to_piece, int micro_batch, const Tensor& t) {
  const Device dst = devices_[device_of(to_piece)];
  trace::Scope span("send", trace::Phase::Send, devices_[device_of(from_piece)],
                    ids(from_piece, micro_batch, -1));
  ChannelMessage message;
  message.micro_batch = micro_batch;
  message.tensor = t.detach().to(dst, /*non_blocking=*/true);
#if KILN_WITH_CUDA
  if (dst.is_cuda()) {
    // The copy was queued on this thread's stream of dst: mark its end for the receiver.
    cuda::DeviceGuard guard(dst.index);
    message.ready = std::make_shared<cuda::Event>();
    message.ready->record();
  }
#endif
  to.push(std::move(message));
}

Tensor Pipeline::receive(Channel& from, int piece, int micro_batch, int64_t seq) {
  trace::Scope span("receive", trace::Phase::Receive, devices_[device_of(piece)],
                    ids(piece, micro_batch, -1));
  ChannelMessage message = from.pop(seq);
  KILN_CHECK(message.micro_batch == micro_batch, "pipeline piece ", piece, " (stage ",
             device_of(piece), ") expected micro-batch ", micro_batch, " but received ",
             message.micro_batch);
#if KILN_WITH_CUDA
  if (message.ready) {
    message.ready->wait();  // this stage's stream waits for the copy, the host does not
    // The block was allocated for the sender's stream; this stream uses it too.
    cuda_allocator::record_stream(message.tensor.impl()->storage->data, cuda::current_stream());
  }
#endif
  return message.tensor;
}

void Pipeline::run_step(Stage& stage, StepJob& job) {
  const StepInput& in = job.in;
  StageResult& result = job.results[stage.index];
  const int s = stage.index, p = stages(), last_piece = pieces() - 1;
  const int m = static_cast<int>(in.starts.size()) - 1;
  const Device dev = stage.device;
  const bool split = splits_backward(options_.schedule);
  const std::vector<PipelineAction> actions =
      stage_actions(options_.schedule, s, p, m, options_.chunks);
  // Hybrid: the action whose grad-ready hooks launch the allreduces, the stage's last one that
  // computes weight gradients (W in a split backward); every other runs under no_sync().
  const PipelineAction::Kind syncing_kind =
      split ? PipelineAction::Weight : PipelineAction::Backward;
  int last_syncing = -1;
  for (int k = 0; k < static_cast<int>(actions.size()); ++k) {
    if (actions[k].kind == syncing_kind) last_syncing = k;
  }
  result = StageResult();
  stage.optimizer->zero_grad();
  if (!options_.stage_transports.empty() && !stage.dp) {
    // Built here, on the stage thread: its constructor broadcasts replica 0's parameters, a
    // collective that meets the same stage of every other replica.
    std::vector<Tensor> buffers;
    for (int k = s; k < pieces(); k += p) {
      for (int64_t b = partition_.first(k); b < partition_.end(k); ++b) {
        for (auto& [name, t] : blocks_[b].module->named_buffers()) buffers.push_back(t);
      }
    }
    comm::DataParallelOptions dp_options;
    dp_options.algorithm = options_.algorithm;
    dp_options.bucket_bytes = options_.bucket_bytes;
    stage.dp = std::make_shared<comm::DataParallel>(
        std::make_shared<comm::Communicator>(options_.stage_transports[s]), stage_parameters(s),
        buffers, dp_options);
  }
  reset_device_peak(dev);
  const int64_t bytes_at_start = device_bytes(dev, /*peak=*/false);

  std::map<std::pair<int, int>, Stashed> stash;  // (chunk, micro-batch)
  std::vector<Tensor> losses;
  // The batch's rows are copied to the stage's device without the host waiting when the caller's
  // batch is in pinned memory (Tensor::pin_memory; from pageable memory the copy blocks, and
  // KILN_SYNC_DEBUG reports it): train_step returns only after the copies have finished.
  auto scaled_loss = [&](const Tensor& out, int i) {
    const int64_t a = in.starts[i], b = in.starts[i + 1];
    Tensor target = in.target.rows(a, b).to(dev, /*non_blocking=*/true);
    // The micro-batch's mean loss times its share of the batch: the sum over micro-batches is
    // the batch's mean loss, and so are the accumulated gradients.
    return loss_(out, target) * (static_cast<double>(b - a) / static_cast<double>(in.rows));
  };
  const char* phase = "forward";
  int current = -1, current_chunk = 0;
  try {
    for (int a = 0; a < static_cast<int>(actions.size()); ++a) {
      const PipelineAction& action = actions[a];
      const int i = action.micro_batch, c = action.chunk;
      KILN_CHECK(c >= 0 && c < options_.chunks, "pipeline stage ", s, ": an action of chunk ", c,
                 " but the device has ", options_.chunks);
      const int k = c * p + s;  // the piece of the model this action runs
      const bool first = k == 0, last = k == last_piece;
      current = i;
      current_chunk = c;
      std::optional<comm::DataParallel::NoSync> accumulate;
      if (stage.dp && action.kind != PipelineAction::Forward && a != last_syncing) {
        accumulate.emplace(*stage.dp);
      }
      if (action.kind == PipelineAction::Forward) {
        phase = "forward";
        Stashed st;
        if (first) {
          st.input = in.x.rows(in.starts[i], in.starts[i + 1]).to(dev, /*non_blocking=*/true);
        } else {
          st.input = receive(*activations_[k], k, i, job.seq);
          st.input.set_requires_grad(true);  // the boundary: a leaf whose .grad goes back
        }
        Tensor out;
        {
          trace::Scope span("forward", trace::Phase::Forward, dev, ids(k, i, in.step));
          std::optional<NoGradGuard> no_grad;
          if (options_.recompute) no_grad.emplace();  // keep the input only
          out = forward_blocks(k, st.input);
          if (last) {
            out = scaled_loss(out, i);
            losses.push_back(out.detach());
          }
        }
        if (!last) send(k, *activations_[k + 1], k + 1, i, out);
        if (!options_.recompute) st.output = out;
        const bool fresh = stash.emplace(std::make_pair(c, i), std::move(st)).second;
        KILN_CHECK(fresh, "pipeline stage ", s, ": a second forward of micro-batch ", i,
                   " (chunk ", c, ") in one step");
        result.peak_live = std::max(result.peak_live, static_cast<int>(stash.size()));
      } else if (action.kind == PipelineAction::Backward) {
        phase = "backward";
        auto it = stash.find({c, i});
        KILN_CHECK(it != stash.end() && !it->second.weights, "pipeline stage ", s,
                   ": backward of micro-batch ", i, " (chunk ", c, ") before its forward");
        Stashed& st = it->second;
        if (options_.recompute) {
          phase = "recompute";
          trace::Scope span("recompute", trace::Phase::Recompute, dev, ids(k, i, in.step));
          st.output = forward_blocks(k, st.input);
          if (last) st.output = scaled_loss(st.output, i);
          phase = "backward";
        }
        Tensor grad_out;
        if (!last) grad_out = receive(*gradients_[k], k, i, job.seq);
        {
          trace::Scope span("backward", trace::Phase::Backward, dev, ids(k, i, in.step));
          if (split) {
            // B: the activations' and the input's gradients now, the weights' in W.
            if (!grad_out.defined()) {
              grad_out = Tensor::ones(st.output.shape(), st.output.dtype(), st.output.device());
            }
            std::vector<Tensor> inputs;
            if (!first) inputs.push_back(st.input);
            st.weights.emplace(backward_input_grads(st.output, grad_out, inputs));
          } else {
            st.output.backward(grad_out);
          }
        }
        if (!first) send(k, *gradients_[k - 1], k - 1, i, st.input.grad());
        if (split) {
          st.input = Tensor();  // what W needs, its WeightGradients holds
          st.output = Tensor();
        } else {
          stash.erase(it);
        }
      } else {
        phase = "weight";
        KILN_CHECK(split, "pipeline stage ", s, ": a weight pass in schedule ",
                   schedule_name(options_.schedule), ", which does not split the backward");
        auto it = stash.find({c, i});
        KILN_CHECK(it != stash.end() && it->second.weights, "pipeline stage ", s,
                   ": weight pass of micro-batch ", i, " (chunk ", c, ") before its backward");
        {
          trace::Scope span("weight", trace::Phase::Weight, dev, ids(k, i, in.step));
          it->second.weights->run();
        }
        stash.erase(it);
      }
    }
    current = -1;
    KILN_CHECK(stash.empty(), "pipeline stage ", s, ": ", stash.size(),
               " micro-batches still held at the end of the step (schedule ",
               schedule_name(options_.schedule), ")");
    if (stage.dp) {
      phase = "gradient allreduce";
      stage.dp->synchronize();
    }
    phase = "optimizer step";
    {
      trace::Scope span("optimizer", trace::Phase::Optimizer, dev,
                        trace::Ids{s, -1, -1, in.step, options_.replica});
      stage.optimizer->step();
    }
    {
      // A step ends when its device work does: train_step returns the loss and the step's
      // time and peak memory, and the caller may then reuse the batch. The one wait of a
      // stage's step, on the stage's own thread (so named here, not by the caller).
      cuda::AllowSync allow("pipeline: a stage's step ends when its device work does");
      finish_device_work(dev);
      for (const Tensor& l : losses) result.loss += l.item();
    }
  } catch (const ChannelAborted&) {
    throw;
  } catch (...) {
    std::string where = detail::str("pipeline stage ", s, " (", dev.str(), ")");
    if (current >= 0) where += detail::str(", micro-batch ", current);
    if (current >= 0 && options_.chunks > 1) where += detail::str(", chunk ", current_chunk);
    fail(where + ", " + phase, std::current_exception(), job);
    throw ChannelAborted{};  // reported; the loop only has to count this stage as done
  }
  // Less the parameters' gradients, which are dropped by zero_grad() and so allocated anew in
  // every step: what is left is activations, their gradients and workspaces.
  int64_t grad_bytes = 0;
  for (const Tensor& t : stage_parameters(s)) grad_bytes += static_cast<int64_t>(t.nbytes());
  result.peak_bytes = std::max<int64_t>(0, device_bytes(dev, /*peak=*/true) - bytes_at_start -
                                               grad_bytes);
  if (stage.dp) result.overlap = stage.dp->stats().overlap_fraction();
}

}  // namespace kiln
