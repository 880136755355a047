// loader.h: the asynchronous Loader: worker threads build the next batches while the training
// loop computes on the current one (PyTorch's DataLoader, num_workers > 0).
//
//   LoaderOptions o;  o.batch_size = 128;  o.workers = 2;  o.prefetch = 4;
//   o.device = Device(DeviceType::CUDA, 0);          // batches arrive on cuda:0
//   Loader loader(train_set, std::make_shared<RandomSampler>(train_set.size(), seed), o);
//   loader.start_epoch(epoch);
//   for (Batch b; loader.next(b);) { ... b.inputs (B, C, H, W) f32, b.labels (B) i64 ... }
//
// Why: with the synchronous BatchIterator, every millisecond spent decoding and collating a
// batch is a millisecond the model waits (loader_wait_fraction of mnist_train). A GPU step takes
// a few milliseconds; decoding 128 JPEGs takes tens. Keeping the GPU fed means doing that work
// on other cores, AHEAD of time, and moving the result to the device without stopping it.
//
// How it works (each point is a classic ingredient of a GPU input pipeline):
//
//  1. Tickets. An epoch's batches are numbered 0..num_batches()-1 (the sampler's order cut into
//     batch_size pieces). A free worker takes the next ticket b and builds the WHOLE batch b
//     (Dataset::get of each index, the optional transform with SampleContext{seed, epoch,
//     index}, written straight into the batch's rows: the collate). The consumer asks for
//     batch 0, then 1, ... and waits for that one specifically, whoever builds it: batches come
//     out strictly in sampler order, and because an example is a pure function of (dataset,
//     transform, seed, epoch, index), the batches are bit-identical for 0, 1, 2 or 8 workers.
//
//  2. A bounded queue (`prefetch`). Workers never run more than `prefetch` batches ahead of
//     the consumer: ticket b is taken only while b < (batches handed out) + prefetch. Why a
//     bound: without one, fast workers would decode the whole epoch into memory (60000 MNIST
//     images are 188 MB as floats; ImageNet would not fit); and a deep queue buys nothing once
//     it is deep enough to absorb the jitter of the workers. (PyTorch's prefetch_factor is per
//     worker; here `prefetch` is the total depth, so more workers than `prefetch` idle.)
//
//  3. Reusable staging buffers. A batch is built into a slot: pre-allocated (batch_size,
//     example...) input and label buffers, reused batch after batch (a pool of prefetch +
//     workers slots to start with), so the steady state allocates nothing.
//
//  4. Pinned memory. When the batch goes to a GPU (or pin_memory), the slots are page-locked
//     host memory (engine/cuda/pinned_allocator.h): the GPU's copy engine can DMA from them
//     directly and asynchronously; from pageable memory the driver copies through a bounce
//     buffer and the copy cannot overlap anything.
//
//  5. A copy stream and an event (CUDA target). next() queues the host->device copy of the
//     batch on the loader's own copy stream (non-blocking), not on the compute stream: the copy
//     then runs WHILE the GPU still computes the previous step queued on the compute stream.
//     An event recorded after the copy, and waited on by the consumer's compute stream
//     (cuda::current_stream()), orders "copy done" before "the next kernel reads the batch"
//     without blocking the host. The device tensors are allocated for the copy stream and
//     marked as used on the compute stream (cuda_allocator::record_stream), so their memory is
//     not recycled while compute kernels may still read it. The slot goes back to the pool
//     with that event; a worker reuses it only after the event completed (the DMA has read it).
//     It polls the events and takes a slot whose copy is done, growing the pool when none is,
//     so next() does not wait for the device: a copy can be held up behind the compute stream
//     (an allocation issued between them is an implicit synchronisation), and waiting for it
//     would make the loader wait for the GPU, the one thing it exists to avoid.
//
// Lifetime of what next() hands out (the caller may keep batches as long as it likes):
//   - CUDA target: fresh device tensors from the caching allocator; the slot is recycled
//     inside the loader once its copy finished.
//   - CPU target: the slot's own buffers, handed out without a copy. The batch tensors' Storage
//     handle is an aliasing shared_ptr that shares ownership of a "lease" on the slot; when
//     the caller drops the last tensor (or view) of the batch, the lease's destructor gives the
//     slot back to the pool. So a slot is never overwritten under the caller. When the caller
//     holds more batches than there are free slots, a worker allocates another slot (the pool
//     grows) instead of waiting, so keeping batches can never deadlock the loader. The pool is
//     held by shared_ptr from each lease: a batch may even outlive the Loader.
//     (With pin_memory on a CPU target the caller may start an asynchronous copy from the
//     batch and drop it at once; only the pinned allocator tracks that copy, so those slots are
//     freed to it rather than recycled here: it reuses the block after the copy, and cheaply.)
//
// Errors: an exception in a worker (a corrupt image, ...) is captured with its batch, and
// next() for THAT batch throws kiln::Error "Loader: batch b, dataset index i: <original
// message>" (same ErrorKind); the next call goes on with batch b+1.
//
// Shutdown: start_epoch() at any point drops the batches of the old epoch (workers finishing an
// old batch throw it away; its slot returns to the pool); the destructor stops and joins the
// workers (condition variables with a stop flag), waits for pending copies, and frees the
// slots, at any point of an epoch, also while the consumer unwinds from an exception.
//
// workers = 0: no threads; next() builds the batch itself (same code, same bits: a debugging
// and baseline mode, as in PyTorch). Dataset::get and the transform must be thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "data/batch_iterator.h"
#include "engine/device.h"

#if KILN_WITH_CUDA
#include "engine/cuda/runtime.h"
#endif

namespace kiln {

class Compose;

struct LoaderOptions {
  int64_t batch_size = 1;  // >= 1
  int workers = 0;         // worker threads; 0: build batches synchronously in next()
  int prefetch = 2;        // batches built ahead of the consumer, at most (>= 1)
  bool pin_memory = false; // page-locked host slots (always on for a CUDA device; needs CUDA)
  Device device = Device();  // cpu, or cuda:N: batches are copied there (copy stream + event)
  bool drop_last = false;    // skip a last, smaller batch
  uint64_t seed = 0;         // SampleContext seed of the transform
  std::shared_ptr<const Compose> transform;  // optional per-example pipeline
};

// For apps that use whole batches only (drop_last): throws kiln::Error (Usage) when
// `batch_size` is larger than the `images` of a set, in the words of the flag that set it
// ("--batch-size 100000 is larger than the 60000 images of the training set: lower
// --batch-size"). Call it once the set is open, before any batch is allocated.
void check_batch_fits_dataset(int64_t batch_size, int64_t images, const std::string& flag,
                              const std::string& set_name);

class Loader : public BatchSource {
 public:
  // `dataset` must outlive the loader (and be thread-safe, see dataset.h). Throws kiln::Error
  // (Usage) for bad options (batch_size < 1, workers < 0, prefetch < 1, a CUDA device or
  // pin_memory in a build without CUDA, a transform for another shape, drop_last with a batch
  // larger than the sampler's epoch, which would leave every epoch without a batch).
  Loader(const Dataset& dataset, std::shared_ptr<Sampler> sampler, LoaderOptions options);
  ~Loader() override;
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // Starts at batch 0 of Sampler::indices_from(epoch, position): with workers, the tickets
  // begin there, so the skipped examples are never built.
  void start_epoch_at(int64_t epoch, int64_t position) override;
  // Waits for the next batch in sampler order (building it itself when workers = 0). Throws
  // the worker's error for a batch that failed (see above).
  bool next(Batch& out) override;
  int64_t num_batches() const override;
  int64_t epoch_batches() const override { return epoch_batches_; }
  int64_t epoch_position() const override;
  // Seconds next() waited since start_epoch() (for loader_wait_fraction), and per batch.
  double wait_seconds() const override { return wait_seconds_; }
  const std::vector<double>& batch_wait_seconds() const { return batch_waits_; }

  int workers() const { return options_.workers; }
  const LoaderOptions& options() const { return options_; }
  // Staging slots allocated so far (prefetch + workers at first; more only while the caller
  // holds batches of a CPU target). For tests and curious readers.
  int64_t slots_allocated() const;

  struct Slot;  // staging buffers of one batch (loader.cpp)
  struct Pool;  // the free slots, shared with the leases of handed-out batches

 private:
  struct Built;  // a batch built by a worker (or by next() itself), or its error

  void worker_loop();
  // Builds batch `b` of the epoch (gen, order, epoch) into a slot. Never throws: errors are
  // captured in Built::error.
  std::unique_ptr<Built> build(int64_t b, uint64_t gen, const std::vector<int64_t>& order,
                               int64_t epoch, std::vector<float>& scratch);
  // Turns a built batch into what next() returns (a lease for a CPU target, a copy for CUDA).
  void hand_out(std::unique_ptr<Built> built, Batch& out);
  int64_t batches_in(int64_t order_size) const;

  const Dataset& dataset_;
  std::shared_ptr<Sampler> sampler_;
  LoaderOptions options_;
  detail::ExampleWriter writer_;
  std::shared_ptr<Pool> pool_;
  std::vector<float> scratch_;  // workers = 0: next()'s own scratch

  // ---- State shared by the consumer and the workers, guarded by mu_. ----------------------
  mutable std::mutex mu_;
  std::condition_variable work_cv_;   // workers wait here for a ticket (or stop)
  std::condition_variable ready_cv_;  // the consumer waits here for batch `consumed_`
  bool stop_ = false;
  bool started_ = false;
  uint64_t gen_ = 0;  // bumped by start_epoch(): work of an older generation is thrown away
  int64_t epoch_ = 0;
  int64_t start_position_ = 0;  // the epoch's global position at start_epoch_at()
  std::shared_ptr<const std::vector<int64_t>> order_;  // the epoch's indices (shared with workers)
  int64_t epoch_batches_ = 0;
  int64_t next_ticket_ = 0;  // next batch a worker will build
  int64_t consumed_ = 0;     // next batch the consumer will take
  std::map<int64_t, std::unique_ptr<Built>> ready_;  // built batches (or errors) not yet taken, by number
  // Read by workers between examples without the lock, to abandon stale work early.
  std::atomic<uint64_t> live_gen_{0};
  std::atomic<bool> stopping_{false};

  // ---- Consumer-only state. -----------------------------------------------------------------
  double wait_seconds_ = 0.0;
  std::vector<double> batch_waits_;

  std::vector<std::thread> threads_;

#if KILN_WITH_CUDA
  cudaStream_t copy_stream_ = nullptr;  // CUDA target: the loader's host->device copy stream
#endif
};

}  // namespace kiln
