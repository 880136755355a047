// data_parallel.cpp: buckets, grad-ready hooks, and the synchronize() that averages.
#include "comm/data_parallel.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstddef>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "comm/algorithms.h"
#include "comm/fault_injection.h"
#include "engine/autograd.h"
#include "engine/trace.h"

namespace kiln::comm {

namespace {

using SteadyClock = std::chrono::steady_clock;

double since(SteadyClock::time_point t) {
  return std::chrono::duration<double>(SteadyClock::now() - t).count();
}

// A tensor of `shape` and `format` that views `flat`'s storage from element `offset` on. A
// bucket holds each gradient's bytes in its parameter's memory format (KRSC for a channels-last
// conv weight, Module::to(MemoryFormat)): the same bytes on every rank, whose models are built
// and moved alike, and no reordering on the way in or out.
Tensor view_of(const Tensor& flat, int64_t offset, const Shape& shape,
               MemoryFormat format = MemoryFormat::Contiguous) {
  Tensor v = Tensor::from_storage(flat.impl()->storage, shape, flat.dtype(),
                                  flat.impl()->offset + offset);
  v.impl()->memory_format = format;
  return v;
}

}  // namespace

double DataParallelStats::overlap_fraction() const {
  if (comm_seconds <= 0) return 0.0;
  const double f = 1.0 - exposed_seconds / comm_seconds;
  return f < 0 ? 0.0 : (f > 1 ? 1.0 : f);
}

// The hooks hold this, not the DataParallel: a parameter can outlive its DataParallel, and a
// hook cannot be unregistered, so the destructor just cuts the link.
struct DataParallel::State {
  std::mutex mu;
  DataParallel* dp = nullptr;
};

DataParallel::DataParallel(std::shared_ptr<Communicator> comm, std::vector<Tensor> params,
                           std::vector<Tensor> buffers, DataParallelOptions options)
    : comm_(std::move(comm)),
      params_(std::move(params)),
      buffers_(std::move(buffers)),
      options_(options),
      state_(std::make_shared<State>()) {
  KILN_CHECK(comm_ != nullptr, "DataParallel: the communicator is null");
  KILN_CHECK(comm_->is_member(), "DataParallel: rank ", comm_->rank(), " is not a member of the "
             "communicator (a dedicated parameter-server rank runs comm::serve instead)");
  KILN_CHECK(options_.bucket_bytes > 0, "DataParallel: bucket_bytes must be > 0");
  const Device dev = comm_->transport().device();
  const bool compressed = options_.wire != WireFormat::Uncompressed;
  if (compressed) {
    KILN_CHECK(dev.is_cpu(), "DataParallel: ", wire_format_name(options_.wire), " compression is "
               "implemented for host transports (local, mpi); with ", comm_->transport().name(),
               " send the gradients uncompressed");
  }

  // Buckets in reverse registration order, cut at bucket_bytes and where the dtype changes.
  bucket_of_.assign(params_.size(), -1);
  ready_.assign(params_.size(), 0);
  for (size_t k = params_.size(); k-- > 0;) {
    const Tensor& p = params_[k];
    KILN_CHECK(p.defined() && p.is_leaf(), "DataParallel: parameter ", k, " is not a leaf tensor");
    KILN_CHECK(p.dtype() == DType::F32 || p.dtype() == DType::F64, "DataParallel: parameter ", k,
               " is ", p.str(), "; only f32 and f64 parameters can be averaged");
    KILN_CHECK(!compressed || p.dtype() == DType::F32, "DataParallel: ",
               wire_format_name(options_.wire), " compression needs f32 parameters; parameter ",
               k, " is ", p.str());
    if (!p.requires_grad()) continue;
    const size_t bytes = p.nbytes();
    const bool fits = !buckets_.empty() && buckets_.back().dtype == p.dtype() &&
                      static_cast<size_t>(buckets_.back().count) * dtype_size(p.dtype()) + bytes <=
                          options_.bucket_bytes;
    if (!fits) {
      buckets_.emplace_back();
      buckets_.back().dtype = p.dtype();
    }
    Bucket& b = buckets_.back();
    b.params.push_back(k);
    b.offset.push_back(b.count);
    b.count += p.numel();
    bucket_of_[k] = static_cast<int>(buckets_.size() - 1);
  }
  for (Bucket& b : buckets_) {
    b.flat = Tensor::zeros({b.count}, b.dtype, dev);
    if (compressed) b.wire = Tensor::zeros({b.count}, wire_dtype(options_.wire, b.dtype), dev);
  }
  // Gradients as bucket views: each .grad is written by backward straight into its slot of the
  // flat buffer. Not with compression (the wire holds 16-bit values, not the gradient) nor for
  // a parameter on another device than the transport's (its .grad cannot live in the bucket).
  grad_view_.resize(params_.size());
  if (options_.grad_as_bucket_view && !compressed) {
    for (const Bucket& b : buckets_) {
      for (size_t s = 0; s < b.params.size(); ++s) {
        Tensor& p = params_[b.params[s]];
        if (!(p.device() == dev)) continue;
        grad_view_[b.params[s]] = view_of(b.flat, b.offset[s], p.shape(), p.memory_format());
        p.set_grad_buffer(grad_view_[b.params[s]]);
      }
    }
  }
  reset_pass();

  if (options_.broadcast_from_rank0) broadcast_parameters();

  state_->dp = this;
  for (size_t k = 0; k < params_.size(); ++k) {
    if (bucket_of_[k] < 0) continue;
    std::weak_ptr<State> weak = state_;
    params_[k].register_grad_ready_hook([weak, k](Tensor& grad) {
      auto s = weak.lock();
      if (!s) return;
      std::lock_guard<std::mutex> lock(s->mu);
      if (s->dp != nullptr) s->dp->on_grad_ready(k, grad);
    });
  }
}

DataParallel::~DataParallel() {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->dp = nullptr;
  }
  // Backward allocates the parameters' gradients again (a .grad that is a view keeps its
  // bucket's storage alive until it is dropped).
  for (size_t k = 0; k < params_.size(); ++k) {
    if (grad_view_[k].defined() && params_[k].grad_buffer().same(grad_view_[k])) {
      params_[k].set_grad_buffer(Tensor());
    }
  }
  // Never leave an allreduce running on buffers we are about to free.
  for (Bucket& b : buckets_) {
    if (b.work) {
      try {
        b.work->wait();
      } catch (...) {
      }
    }
  }
}

void DataParallel::broadcast_parameters() {
  const Device dev = comm_->transport().device();
  auto bcast = [&](Tensor& t) {
    const bool direct = t.device() == dev && (t.dtype() == DType::F32 || t.dtype() == DType::F64);
    if (direct) {
      comm_->broadcast(t, 0);
      return;
    }
    // Another device or an integer buffer (BatchNorm's step count): through an f64 copy.
    Tensor staged = t.device() == dev ? t.clone() : t.to(dev);
    if (staged.dtype() != DType::F32 && staged.dtype() != DType::F64) {
      staged = staged.to(DType::F64);
    }
    comm_->broadcast(staged, 0);
    t.copy_(staged);
  };
  NoGradGuard no_grad;
  for (Tensor& p : params_) {
    // The bytes as they lie (a channels-last weight's KRSC order, the same on every rank).
    Tensor d = p.storage_order_view();
    bcast(d);
  }
  for (Tensor& b : buffers_) bcast(b);
}

void DataParallel::reset_pass() {
  std::fill(ready_.begin(), ready_.end(), 0);
  for (Bucket& b : buckets_) {
    b.pending = static_cast<int>(b.params.size());
    b.launched = false;
    b.work.reset();
  }
  next_launch_ = 0;
}

// Copies parameter k's gradient (or zeros) into its slot of the bucket's flat buffer, or of its
// wire buffer when compressed (copy_ rounds to f16 / bf16 by the engine's rule, vectorised);
// nothing to do for a gradient that already is its bucket view.
void DataParallel::pack(size_t k, const Tensor* grad) {
  if (grad_view_[k].defined()) {
    if (grad == nullptr) {
      grad_view_[k].zero_();
    } else if (!grad->same(grad_view_[k])) {
      grad_view_[k].copy_(*grad);  // a .grad set otherwise (before construction, set_grad)
    }
    return;
  }
  Bucket& b = buckets_[bucket_of_[k]];
  size_t slot = 0;
  while (b.params[slot] != k) ++slot;
  const Tensor& p = params_[k];
  Tensor view = view_of(b.wire.defined() ? b.wire : b.flat, b.offset[slot], p.shape(),
                        p.memory_format());
  if (grad == nullptr) {
    view.zero_();
  } else {
    view.copy_(*grad);
  }
}

void DataParallel::on_grad_ready(size_t k, const Tensor& grad) {
  if (no_sync_depth_ > 0) return;  // accumulate locally
  KILN_CHECK(!ready_[k], "DataParallel: parameter ", k, " got a second gradient before "
             "synchronize(): call synchronize() after every backward, or accumulate "
             "micro-batches under no_sync()");
  ready_[k] = 1;
  pack(k, &grad);
  Bucket& b = buckets_[bucket_of_[k]];
  if (--b.pending == 0) launch_ready(/*from_hook=*/true);
}

// Submits, in bucket order, every bucket whose parameters are all in.
void DataParallel::launch_ready(bool from_hook) {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
    launch(buckets_[next_launch_], from_hook);
    if (observer_) observer_(static_cast<int>(next_launch_), from_hook);
    ++next_launch_;
  }
}

void DataParallel::launch(Bucket& b, bool from_hook) {
  b.launched = true;
  ++stats_.buckets_launched;
  if (from_hook) ++stats_.buckets_from_hooks;
  // Sum on the wire; the division by N happens once, in f32/f64, when unpacking.
  Buffer buf;
  if (b.wire.defined()) {
    buf.data = b.wire.raw_data();
    buf.count = b.count;
    buf.type = elem_type_of(b.wire.dtype());
    buf.device = b.wire.device();
  } else {
    buf = buffer_of(b.flat, comm_->transport());
  }
  // The worker thread runs one operation at a time, so the transport's byte counter moves
  // only for this allreduce while it runs: its bytes, exactly.
  Communicator* c = comm_.get();
  const Algorithm alg = options_.algorithm;
  uint64_t* bytes = &b.bytes;
  const int index = static_cast<int>(&b - buckets_.data());
  b.work = comm_->submit(
      [c, buf, alg, bytes, index] {
        // Host time on the worker thread: allreduce_now returns once the collective is done.
        std::optional<trace::Scope> span;
        if (trace::Tracer::global().enabled()) {
          trace::Ids ids;
          ids.bucket = index;
          ids.replica = c->rank();
          span.emplace("bucket " + std::to_string(index), trace::Phase::Allreduce, Device(), ids);
        }
        const uint64_t before = c->bytes_sent();
        c->allreduce_now(buf, ReduceOp::Sum, alg);
        *bytes = c->bytes_sent() - before;
      },
      b.wire.defined() ? b.wire : b.flat);
}

void DataParallel::synchronize() {
  if (no_sync_depth_ > 0) return;
  // Testing aid: KILN_FAULT makes one rank die here, its step's allreduces under way.
  maybe_inject_fault(comm_->rank(), stats_.steps + 1);
  const auto start = SteadyClock::now();
  // Parameters whose hook did not fire in this pass (unused in the forward pass, or a pass
  // without backward): their current .grad if any (accumulated under no_sync), else zeros.
  for (size_t k = 0; k < params_.size(); ++k) {
    if (bucket_of_[k] < 0 || ready_[k]) continue;
    const Tensor g = params_[k].grad();
    pack(k, g.defined() ? &g : nullptr);
    ready_[k] = 1;
    --buckets_[bucket_of_[k]].pending;
  }
  launch_ready(/*from_hook=*/false);
  std::exception_ptr error;
  for (Bucket& b : buckets_) {
    try {
      b.work->wait();
    } catch (...) {
      if (!error) error = std::current_exception();
    }
  }
  stats_.exposed_seconds += since(start);
  if (error) {
    reset_pass();
    std::rethrow_exception(error);
  }
  for (Bucket& b : buckets_) {
    stats_.comm_seconds += b.work->seconds();
    stats_.bytes_sent += b.bytes;
  }

  // Unpack: average = sum / N, written into each .grad. A compressed sum is widened (exactly)
  // into the flat buffer first.
  const double inv = 1.0 / static_cast<double>(comm_->size());
  NoGradGuard no_grad;
  for (Bucket& b : buckets_) {
    if (b.wire.defined()) b.flat.copy_(b.wire);
    if (b.flat.device().is_cpu()) {
      if (b.dtype == DType::F32) {
        float* p = b.flat.data<float>();
        const float f = static_cast<float>(inv);
        for (int64_t i = 0; i < b.count; ++i) p[i] *= f;
      } else {
        double* p = b.flat.data<double>();
        for (int64_t i = 0; i < b.count; ++i) p[i] *= inv;
      }
    } else {
      scale(buffer_of(b.flat, comm_->transport()), inv);
    }
    for (size_t s = 0; s < b.params.size(); ++s) {
      Tensor& p = params_[b.params[s]];
      const Tensor& bucket_view = grad_view_[b.params[s]];
      if (bucket_view.defined()) {  // the average is already the gradient
        if (!p.grad().same(bucket_view)) p.set_grad(bucket_view);
        continue;
      }
      const Tensor view = view_of(b.flat, b.offset[s], p.shape(), p.memory_format());
      Tensor g = p.grad();
      if (!g.defined()) {
        p.set_grad(Tensor::empty(p.shape(), p.dtype(), p.device(), p.memory_format()));
        g = p.grad();
      }
      g.copy_(view);
    }
  }
  ++stats_.steps;
  reset_pass();
}

DataParallel::NoSync::NoSync(DataParallel& dp) : dp_(dp) { ++dp_.no_sync_depth_; }
DataParallel::NoSync::~NoSync() { --dp_.no_sync_depth_; }

std::shared_ptr<LRSchedule> large_minibatch_schedule(double base_lr, int world_size,
                                                     int64_t warmup_steps, int64_t decay_every,
                                                     double gamma) {
  KILN_CHECK(world_size >= 1, "large_minibatch_schedule: world_size must be >= 1");
  auto inner = std::make_shared<StepLR>(world_scaled_lr(base_lr, world_size),
                                        decay_every > 0 ? decay_every : 1,
                                        decay_every > 0 ? gamma : 1.0);
  if (warmup_steps <= 0 || world_size == 1) return inner;
  // Starts at base_lr (factor 1/N of the scaled rate) and reaches base_lr * N at warmup_steps.
  return std::make_shared<LinearWarmup>(inner, warmup_steps, 1.0 / world_size);
}

std::vector<float> flatten_to_host(const std::vector<Tensor>& tensors) {
  std::vector<float> out;
  for (const Tensor& t : tensors) {
    const std::vector<float> v = t.to_vector<float>();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

void unflatten_from_host(const std::vector<float>& flat, std::vector<Tensor>& tensors) {
  int64_t off = 0;
  for (const Tensor& t : tensors) off += t.numel();
  KILN_CHECK(off == static_cast<int64_t>(flat.size()), "unflatten_from_host: ", flat.size(),
             " values for tensors of ", off, " elements");
  off = 0;
  NoGradGuard no_grad;
  for (Tensor& t : tensors) {
    const int64_t n = t.numel();
    std::vector<float> part(flat.begin() + off, flat.begin() + off + n);
    Tensor d = t.detach();
    d.copy_(Tensor::from_vector<float>(part, t.shape()));
    off += n;
  }
}

}  // namespace kiln::comm
