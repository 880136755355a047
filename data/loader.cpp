// loader.cpp: the asynchronous Loader (see loader.h for the design and the why).
#include "data/loader.h"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "data/transforms.h"
#include "engine/error.h"
#include "engine/trace.h"

#if KILN_WITH_CUDA
#include "engine/cuda/caching_allocator.h"
#include "engine/cuda/check.h"
#include "engine/cuda/context.h"
#include "engine/cuda/sync_calls.h"
#endif

namespace kiln {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// A tensor over `storage` (which it shares ownership of through `owner`: see the lease below).
Tensor tensor_over(std::shared_ptr<Storage> storage, const Shape& shape, DType dtype) {
  return Tensor::from_storage(std::move(storage), shape, dtype);
}

// A CPU tensor of `shape` in ordinary or page-locked (pinned) memory.
Tensor host_tensor(const Shape& shape, DType dtype, bool pinned) {
  const size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  return tensor_over(std::make_shared<Storage>(bytes, Device(),
                                               pinned ? MemoryKind::PinnedHost : MemoryKind::Host),
                     shape, dtype);
}

#if KILN_WITH_CUDA
// A device tensor whose block belongs to `stream` (the loader's copy stream) rather than to the
// calling thread's compute stream. Why: the caching allocator hands a block to a stream only when
// every earlier use of it on that stream is ordered before (caching_allocator.h, point 2). The
// copy runs on the copy stream, so the block must come from the copy stream's free list; a block
// from the compute stream's list could still be read by queued compute kernels when the copy
// overwrites it. Storage's allocating constructor uses the current stream, so the block is
// allocated here for the copy stream and the Storage adopts it.
Tensor device_tensor_for_stream(const Shape& shape, DType dtype, Device device,
                                cudaStream_t stream) {
  const size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  void* block = cuda_allocator::allocate(bytes, device.index, stream);
  return tensor_over(std::make_shared<Storage>(block, bytes, device, MemoryKind::Device), shape,
                     dtype);
}
#endif

}  // namespace

// ---- Slots and the pool ---------------------------------------------------------------------

// The staging buffers of one batch: room for a full batch (the last, smaller batch of an epoch
// uses the first rows).
struct Loader::Slot {
  Tensor inputs;  // f32 (batch_size, example...), pinned for a CUDA target or pin_memory
  Tensor labels;  // i64 (batch_size)
#if KILN_WITH_CUDA
  // Recorded on the copy stream after the host->device copy that reads this slot. A worker
  // waits for it before writing the slot again: overwriting pinned memory while the DMA engine
  // still reads it would corrupt the batch on the device, silently. (Never recorded: complete.)
  cuda::Event copied;
#endif
};

// The free slots. Held by shared_ptr from the Loader AND from every handed-out CPU batch, so a
// batch the caller keeps can still return its slot after the Loader is gone (then the pool,
// and with it the memory, dies with the last batch).
struct Loader::Pool {
  Pool(Shape batch_shape, bool pinned, bool recycle)
      : batch_shape(std::move(batch_shape)), pinned(pinned), recycle(recycle) {}

  // A free slot that can be written at once, or a new one: allocating rather than waiting
  // means a consumer that keeps batches can never deadlock the workers, and a device that is
  // behind never makes the host wait. The amount of work in flight is bounded by the tickets
  // (prefetch), not by the slots.
  //
  // A CUDA target's free slot may still be read by its copy (the slot's `copied` event): that
  // copy is queued behind whatever the device does, and may wait for the compute stream too
  // (an allocation between the compute work and the copy is an implicit synchronisation: CUDA
  // C++ Programming Guide, "Implicit Synchronization"). So a slot whose copy has finished
  // (polled, never waited for) is taken first, the most recently freed of them; when none has,
  // the pool grows, up to `max_slots`; only past that does the caller take the oldest slot and
  // wait for its copy (build()): the host is then that many batches ahead of the device, and
  // waiting costs nothing.
  std::unique_ptr<Slot> acquire() {
    {
      std::lock_guard<std::mutex> lock(mu);
      for (size_t i = free.size(); i-- > 0;) {
        if (!writable(*free[i])) continue;
        std::unique_ptr<Slot> slot = std::move(free[i]);
        free.erase(free.begin() + static_cast<std::ptrdiff_t>(i));
        return slot;
      }
      if (!free.empty() && allocated >= max_slots) {
        std::unique_ptr<Slot> slot = std::move(free.front());  // the oldest copy
        free.erase(free.begin());
        return slot;
      }
      ++allocated;
    }
    auto slot = std::make_unique<Slot>();  // allocation (pinning is slow) outside the lock
    slot->inputs = host_tensor(batch_shape, DType::F32, pinned);
    slot->labels = host_tensor({batch_shape[0]}, DType::I64, pinned);
    return slot;
  }

  void release(std::unique_ptr<Slot> slot) noexcept {
    if (!recycle) return;  // freed: its memory goes back to the pinned allocator (see below)
    try {
      std::lock_guard<std::mutex> lock(mu);
      free.push_back(std::move(slot));
    } catch (...) {
      // Out of memory growing the free list: the slot is freed instead of cached.
    }
  }

  int64_t slots() const {
    std::lock_guard<std::mutex> lock(mu);
    return allocated;
  }

  // Whether the slot's staging buffers can be overwritten now: its last copy (if any) finished.
  static bool writable(const Slot& slot) {
#if KILN_WITH_CUDA
    return slot.copied.query();
#else
    (void)slot;
    return true;
#endif
  }

  const Shape batch_shape;  // (batch_size, example...)
  const bool pinned;
  // Slots allocated before acquire() waits for a copy instead of growing (set once, before the
  // workers start): twice the steady-state pool.
  int64_t max_slots = 0;
  // False for pinned slots handed to the caller (a CPU target with pin_memory): the caller may
  // start an asynchronous copy from the batch (to(cuda, non_blocking)) and drop it at once; only
  // the pinned allocator knows about that copy (pinned_allocator::record_stream), so such slots
  // are freed to it, and it hands the block out again only after the copy has finished.
  const bool recycle;
  mutable std::mutex mu;
  std::vector<std::unique_ptr<Slot>> free;
  int64_t allocated = 0;
};

namespace {

// Owns a slot taken from the pool and gives it back when destroyed: the "lease". For a CPU
// target the tensors handed to the caller share ownership of it (aliasing shared_ptr), so the
// slot comes back exactly when the caller has dropped every tensor and view of the batch.
class SlotLease {
 public:
  SlotLease(std::shared_ptr<Loader::Pool> pool, std::unique_ptr<Loader::Slot> slot)
      : pool_(std::move(pool)), slot_(std::move(slot)) {}
  ~SlotLease() {
    if (slot_) pool_->release(std::move(slot_));
  }
  SlotLease(const SlotLease&) = delete;
  SlotLease& operator=(const SlotLease&) = delete;
  Loader::Slot& slot() { return *slot_; }

 private:
  std::shared_ptr<Loader::Pool> pool_;
  std::unique_ptr<Loader::Slot> slot_;
};

}  // namespace

struct Loader::Built {
  std::unique_ptr<SlotLease> lease;  // the slot the batch was built in (back to the pool on reset)
  int64_t count = 0;                 // rows
  std::exception_ptr error;          // set when building failed
};

void check_batch_fits_dataset(int64_t batch_size, int64_t images, const std::string& flag,
                              const std::string& set_name) {
  if (batch_size <= images) return;
  throw Error(detail::str(flag, " ", batch_size, " is larger than the ", images, " images of the ",
                          set_name, ": lower ", flag),
              ErrorKind::Usage);
}

// ---- Construction and shutdown --------------------------------------------------------------

Loader::Loader(const Dataset& dataset, std::shared_ptr<Sampler> sampler, LoaderOptions options)
    : dataset_(dataset),
      sampler_(std::move(sampler)),
      options_(std::move(options)),
      writer_(dataset, options_.transform, options_.seed) {
  KILN_CHECK_INPUT(sampler_ != nullptr, "Loader: no sampler given");
  auto usage = [](const std::string& what) { throw Error("Loader: " + what, ErrorKind::Usage); };
  if (options_.batch_size < 1) usage(detail::str("batch size must be >= 1, got ", options_.batch_size));
  if (options_.workers < 0) usage(detail::str("workers must be >= 0, got ", options_.workers));
  if (options_.prefetch < 1) usage(detail::str("prefetch must be >= 1, got ", options_.prefetch));
  // With drop_last, a batch larger than an epoch leaves every epoch without a batch: a consumer
  // that starts the next epoch when one runs dry would loop through epochs for ever.
  if (options_.drop_last && sampler_->size() > 0 && options_.batch_size > sampler_->size()) {
    usage(detail::str("batch size ", options_.batch_size, " is larger than the ", sampler_->size(),
                      " examples of an epoch, and drop_last leaves no batch in it"));
  }
  const bool to_cuda = options_.device.is_cuda();
#if KILN_WITH_CUDA
  if (to_cuda) cuda::check_device(options_.device.index);
#else
  if (to_cuda || options_.pin_memory) {
    usage(std::string(to_cuda ? "device " + options_.device.str() : "pin_memory") +
          " needs a build with CUDA (this one has no CUDA backend); use the CPU without "
          "pin_memory");
  }
#endif
  Shape batch_shape{options_.batch_size};
  batch_shape.insert(batch_shape.end(), writer_.output_shape().begin(),
                     writer_.output_shape().end());
  const bool pinned = options_.pin_memory || to_cuda;
  pool_ = std::make_shared<Pool>(batch_shape, pinned, /*recycle=*/to_cuda || !pinned);
  // Pre-allocate the steady-state pool: up to `prefetch` batches waiting, one being built by
  // each worker (at least one for workers = 0).
  {
    std::vector<std::unique_ptr<Slot>> initial;
    for (int i = 0; i < options_.prefetch + std::max(options_.workers, 1); ++i) {
      initial.push_back(pool_->acquire());
    }
    for (auto& slot : initial) pool_->release(std::move(slot));
    pool_->max_slots = 2 * static_cast<int64_t>(initial.size());
  }
#if KILN_WITH_CUDA
  if (to_cuda) {
    // Non-blocking: it does not synchronise with the legacy default stream; created on the
    // target device (a stream belongs to the device current at its creation).
    cuda::DeviceGuard guard(options_.device.index);
    KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
  }
#endif
  // The workers' rows in a trace: "<this thread's label> loader worker i" ("rank 1 loader
  // worker 0" in a data-parallel run).
  std::vector<std::string> labels;
  const std::string owner = trace::thread_label();
  for (int i = 0; i < options_.workers; ++i) {
    labels.push_back((owner.empty() ? "" : owner + " ") + "loader worker " + std::to_string(i));
  }
  // Last: nothing after this may throw (running threads must be joined).
  threads_.reserve(static_cast<size_t>(options_.workers));
  for (int i = 0; i < options_.workers; ++i) {
    threads_.emplace_back([this, label = std::move(labels[static_cast<size_t>(i)])] {
      trace::set_thread_label(label);
      worker_loop();
    });
  }
}

Loader::~Loader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    stopping_.store(true, std::memory_order_relaxed);
  }
  work_cv_.notify_all();
  // A worker in the middle of a batch notices `stopping_` at its next example and returns.
  for (std::thread& t : threads_) t.join();
  ready_.clear();  // their slots go back to the pool
#if KILN_WITH_CUDA
  if (copy_stream_) {
    // Copies still reading pinned slots must finish before the slots are freed.
    cuda::DeviceGuard guard(options_.device.index);
    cuda::AllowSync allow("Loader teardown: the copies still reading pinned slots finish first");
    (void)cuda::stream_synchronize_nothrow(copy_stream_);
    pool_.reset();
    (void)cudaStreamDestroy(copy_stream_);
  }
#endif
}

int64_t Loader::slots_allocated() const { return pool_->slots(); }

int64_t Loader::batches_in(int64_t n) const {
  const int64_t bs = options_.batch_size;
  return options_.drop_last ? n / bs : (n + bs - 1) / bs;
}

int64_t Loader::num_batches() const { return batches_in(sampler_->size()); }

// ---- Epochs -----------------------------------------------------------------------------------

void Loader::start_epoch_at(int64_t epoch, int64_t position) {
  const auto t0 = Clock::now();
  auto order =
      std::make_shared<const std::vector<int64_t>>(sampler_->indices_from(epoch, position));
  std::map<int64_t, std::unique_ptr<Built>> stale;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++gen_;  // work of the previous epoch in flight is thrown away when it finishes
    live_gen_.store(gen_, std::memory_order_relaxed);
    epoch_ = epoch;
    start_position_ = position;
    order_ = std::move(order);
    epoch_batches_ = batches_in(static_cast<int64_t>(order_->size()));
    next_ticket_ = 0;
    consumed_ = 0;
    stale.swap(ready_);
    started_ = true;
  }
  work_cv_.notify_all();
  stale.clear();  // outside the lock: the slots go back to the pool
  // Drawing the epoch's order is part of what the consumer waits for (as in BatchIterator).
  batch_waits_.clear();
  wait_seconds_ = seconds_since(t0);
}

int64_t Loader::epoch_position() const {
  // consumed_ and order_ are the consumer's (see next()); every batch but the last is full.
  if (!started_) return 0;
  const int64_t taken =
      std::min(consumed_ * options_.batch_size, static_cast<int64_t>(order_->size()));
  return sampler_->position_after(start_position_, taken);
}

// ---- Workers ----------------------------------------------------------------------------------

void Loader::worker_loop() {
  std::vector<float> scratch;  // this worker's transform scratch, reused for every example
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    // A ticket is free when the epoch has batches left AND taking it keeps us within `prefetch`
    // batches of the consumer: the bounded queue.
    work_cv_.wait(lock, [&] {
      return stop_ || (started_ && next_ticket_ < epoch_batches_ &&
                       next_ticket_ < consumed_ + options_.prefetch);
    });
    if (stop_) return;
    const int64_t b = next_ticket_++;
    const uint64_t gen = gen_;
    const int64_t epoch = epoch_;
    const std::shared_ptr<const std::vector<int64_t>> order = order_;  // alive while we build
    lock.unlock();
    std::unique_ptr<Built> built;
    {
      trace::Scope span("build batch", trace::Phase::Other);
      built = build(b, gen, *order, epoch, scratch);
    }
    lock.lock();
    if (gen == gen_ && !stop_) {
      ready_.emplace(b, std::move(built));
      ready_cv_.notify_all();  // the consumer may be waiting for exactly this batch
    }
    // else: start_epoch() or the destructor came in between; `built` (and its slot) is dropped.
  }
}

std::unique_ptr<Loader::Built> Loader::build(int64_t b, uint64_t gen,
                                             const std::vector<int64_t>& order, int64_t epoch,
                                             std::vector<float>& scratch) {
  auto built = std::make_unique<Built>();
  const int64_t first = b * options_.batch_size;
  built->count = std::min(options_.batch_size, static_cast<int64_t>(order.size()) - first);
  int64_t index = -1;
  try {
    built->lease = std::make_unique<SlotLease>(pool_, pool_->acquire());
    Slot& slot = built->lease->slot();
#if KILN_WITH_CUDA
    // Returns at once unless the pool is at max_slots and every slot's copy is still queued.
    {
      cuda::AllowSync allow("Loader: a slot is written only after the copy out of it finished");
      slot.copied.synchronize();  // the previous batch's copy out of this slot has finished
    }
#endif
    float* x = slot.inputs.data<float>();
    int64_t* y = slot.labels.data<int64_t>();
    const int64_t row = writer_.output_numel();
    for (int64_t i = 0; i < built->count; ++i) {
      // Abandon stale work early (a new epoch started, or the loader is being destroyed): the
      // result would be thrown away anyway.
      if (stopping_.load(std::memory_order_relaxed) ||
          live_gen_.load(std::memory_order_relaxed) != gen) {
        break;
      }
      index = order[static_cast<size_t>(first + i)];
      y[i] = writer_.write(index, epoch, x + i * row, scratch);
    }
  } catch (const Error& e) {
    built->error = std::make_exception_ptr(
        Error(detail::str("Loader: batch ", b, ", dataset index ", index, ": ", e.what()),
              e.kind()));
  } catch (const std::exception& e) {
    built->error = std::make_exception_ptr(
        Error(detail::str("Loader: batch ", b, ", dataset index ", index, ": ", e.what())));
  } catch (...) {
    built->error = std::make_exception_ptr(
        Error(detail::str("Loader: batch ", b, ", dataset index ", index, ": unknown error")));
  }
  return built;
}

// ---- The consumer -----------------------------------------------------------------------------

bool Loader::next(Batch& out) {
  KILN_CHECK(started_, "Loader::next: call start_epoch(epoch) before next()");
  // started_, consumed_ and epoch_batches_ are written only by this (the consumer's) thread,
  // under mu_ because workers read them: reading them here without the lock is race-free.
  const auto t0 = Clock::now();
  if (consumed_ >= epoch_batches_) return false;
  const int64_t b = consumed_;
  std::unique_ptr<Built> built;
  if (options_.workers == 0) {
    built = build(b, gen_, *order_, epoch_, scratch_);  // synchronous: the same code, same bits
    consumed_ = b + 1;
  } else {
    std::unique_lock<std::mutex> lock(mu_);
    // Wait for batch b itself, not for "any batch": that is what keeps the sampler's order.
    ready_cv_.wait(lock, [&] { return ready_.count(b) > 0; });
    auto it = ready_.find(b);
    built = std::move(it->second);
    ready_.erase(it);
    consumed_ = b + 1;  // frees one place in the bounded queue
    lock.unlock();
    work_cv_.notify_all();
  }
  if (built->error) {
    const double waited = seconds_since(t0);
    wait_seconds_ += waited;
    batch_waits_.push_back(waited);
    std::rethrow_exception(built->error);  // `built` (and its slot) is released on the way out
  }
  hand_out(std::move(built), out);
  out.index = b;
  const double waited = seconds_since(t0);
  wait_seconds_ += waited;
  batch_waits_.push_back(waited);
  return true;
}

void Loader::hand_out(std::unique_ptr<Built> built, Batch& out) {
  Shape shape = pool_->batch_shape;
  shape[0] = built->count;
#if KILN_WITH_CUDA
  if (options_.device.is_cuda()) {
    const Device device = options_.device;
    Slot& slot = built->lease->slot();
    cuda::DeviceGuard guard(device.index);
    cudaStream_t compute = cuda::current_stream();  // the consumer's stream on the target device
    Tensor x = device_tensor_for_stream(shape, DType::F32, device, copy_stream_);
    Tensor y = device_tensor_for_stream({built->count}, DType::I64, device, copy_stream_);
    // Timed on the compute stream, from where it stands before the copy to the wait for it: the
    // copy time the compute stream is exposed to (near zero when the copy overlaps compute).
    trace::Scope span("h2d", trace::Phase::HostToDevice, device);
    try {
      // Pinned source + async copy on the copy stream: returns at once; the DMA overlaps the
      // compute kernels already queued on the compute stream.
      KILN_CUDA_CHECK(cudaMemcpyAsync(x.raw_data(), slot.inputs.raw_data(), x.nbytes(),
                                      cudaMemcpyHostToDevice, copy_stream_));
      KILN_CUDA_CHECK(cudaMemcpyAsync(y.raw_data(), slot.labels.raw_data(), y.nbytes(),
                                      cudaMemcpyHostToDevice, copy_stream_));
      slot.copied.record(copy_stream_);
      // Kernels queued on the compute stream from now on (the step that reads this batch) start
      // only after the copy: a GPU-side wait, the host does not block.
      slot.copied.wait(compute);
      // The blocks belong to the copy stream but are read (and freed) on the compute stream: the
      // allocator must not give them to the next copy before that compute work has finished.
      cuda_allocator::record_stream(x.impl()->storage->data, compute);
      cuda_allocator::record_stream(y.impl()->storage->data, compute);
    } catch (...) {
      cuda::AllowSync allow("Loader: a failed hand-out frees its slot after the DMA");
      (void)cuda::stream_synchronize_nothrow(copy_stream_);  // never free a slot the DMA may read
      throw;
    }
    out.inputs = std::move(x);
    out.labels = std::move(y);
    return;  // `built` dies here: the slot returns to the pool, its `copied` event recorded
  }
#endif
  // CPU target: hand out the slot's own memory, no copy. The tensors' Storage handles are
  // aliasing shared_ptrs: they point at the slot's Storage but share ownership of the lease, so
  // the slot returns to the pool when the caller drops the last tensor or view of this batch.
  std::shared_ptr<SlotLease> lease(std::move(built->lease));
  Slot& slot = lease->slot();
  out.inputs = tensor_over(std::shared_ptr<Storage>(lease, slot.inputs.impl()->storage.get()),
                           shape, DType::F32);
  out.labels = tensor_over(std::shared_ptr<Storage>(lease, slot.labels.impl()->storage.get()),
                           {built->count}, DType::I64);
}

}  // namespace kiln
