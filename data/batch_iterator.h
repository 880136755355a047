// batch_iterator.h: turning a Dataset + Sampler into batches of tensors for the training loop.
//
// BatchSource is what a training or evaluation loop consumes:
//
//   source.start_epoch(epoch);
//   for (Batch b; source.next(b);) { ... b.inputs (B, C, H, W) f32, b.labels (B) i64 ... }
//   double waited = source.wait_seconds();   // for loader_wait_fraction
//
// BatchIterator is the synchronous implementation: next() builds the batch on the calling
// thread, so all of that time is time the training loop waits (the "workers=0" baseline of
// docs/data_loading.md). The asynchronous Loader (data/loader.h: worker threads, a bounded
// queue, pinned buffers, prefetch) is another BatchSource; apps hold a BatchSource and do not
// care which.
//
// Transforms: an optional Compose pipeline (data/transforms.h) is applied to each example
// after Dataset::get(), with SampleContext{seed, epoch, index}: random augmentations are a pure
// function of (seed, epoch, dataset index), so the Loader, with any number of workers, builds
// bit-identical batches (both use detail::ExampleWriter below).
//
// Batches: the sampler's order of the epoch is cut into consecutive batches of batch_size;
// the last one is smaller unless drop_last (then it is skipped). Batch tensors are freshly
// allocated CPU tensors (Tensor::empty) each time: a batch handed out stays valid for as long
// as the caller holds it (no buffer is reused under its feet).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "data/dataset.h"
#include "data/sampler.h"
#include "engine/device.h"
#include "engine/tensor.h"

namespace kiln {

class Compose;

struct Batch {
  Tensor inputs;      // f32 (B, C, H, W) on CPU: (B, example_shape...)
  Tensor labels;      // i64 (B)
  int64_t index = 0;  // batch number in the epoch: 0, 1, ...
};

class BatchSource {
 public:
  virtual ~BatchSource();
  // Begins epoch `epoch` (>= 0): the sampler's order for that epoch, batch 0 next.
  void start_epoch(int64_t epoch) { start_epoch_at(epoch, 0); }
  // Begins epoch `epoch` at global position `position` (data/sampler.h): the rest of the
  // epoch, Sampler::indices_from(epoch, position), cut into batches. The examples before the
  // position are not read or decoded. Resuming a checkpoint taken mid-epoch.
  virtual void start_epoch_at(int64_t epoch, int64_t position) = 0;
  // Fills `out` with the next batch and returns true; false at the end of the epoch.
  virtual bool next(Batch& out) = 0;
  // Writes the next batch into the first B rows of `inputs` and `labels`, tensors the caller
  // reuses from batch to batch (a CUDA graph's static inputs: engine/step_graph.h), and
  // returns B; 0 at the end of the epoch. `inputs` is f32 (R, example...) and `labels` i64 (R),
  // R >= B, on the device the batches are delivered to (else kiln::Error, Usage). The default
  // copies next()'s batch in; a source that builds its batches on that device
  // (data/device_mnist.h) writes them there directly.
  virtual int64_t next_into(const Tensor& inputs, const Tensor& labels);
  // Batches per epoch (the same every epoch), counted from its start.
  virtual int64_t num_batches() const = 0;
  // Batches of the epoch as last started (fewer than num_batches() after a start mid-epoch).
  virtual int64_t epoch_batches() const = 0;
  // The epoch's global position after the batches next() handed out since the start: what a
  // checkpoint stores, and start_epoch_at() takes back.
  virtual int64_t epoch_position() const = 0;
  // Total seconds next() spent producing or waiting for batches since start_epoch().
  virtual double wait_seconds() const = 0;
};

namespace detail {

// next_into's checks: throws kiln::Error (Usage) unless `inputs` is f32 (R, example...) and
// `labels` i64 (R) on `device`, with R >= rows.
void check_next_into_targets(const Tensor& inputs, const Tensor& labels, int64_t rows,
                             const Shape& example, Device device);

// Writes one example of a batch: Dataset::get() and then the optional transform. Shared by
// BatchIterator and Loader, so both produce the same bits. Const and thread-safe; each thread
// brings its own `scratch` (resized on first use, then reused: no allocation per example).
class ExampleWriter {
 public:
  // Throws kiln::Error (Usage) when the transform's input shape is not the dataset's.
  ExampleWriter(const Dataset& dataset, std::shared_ptr<const Compose> transform, uint64_t seed);
  // Shape of one example as written (the transform's output shape, or the dataset's).
  const Shape& output_shape() const { return output_shape_; }
  int64_t output_numel() const { return output_numel_; }
  // Writes example `index` of epoch `epoch` into out[output_numel()]; returns its label.
  int64_t write(int64_t index, int64_t epoch, float* out, std::vector<float>& scratch) const;

 private:
  const Dataset& dataset_;
  std::shared_ptr<const Compose> transform_;
  uint64_t seed_;
  Shape output_shape_;
  int64_t input_numel_ = 0, output_numel_ = 0;
};

}  // namespace detail

class BatchIterator : public BatchSource {
 public:
  // `dataset` must outlive the iterator. batch_size >= 1. `transform` (optional) is applied to
  // every example with SampleContext{seed, epoch, index}; its input shape must be the
  // dataset's example shape.
  BatchIterator(const Dataset& dataset, std::shared_ptr<Sampler> sampler, int64_t batch_size,
                bool drop_last = false, std::shared_ptr<const Compose> transform = nullptr,
                uint64_t seed = 0);

  void start_epoch_at(int64_t epoch, int64_t position) override;
  bool next(Batch& out) override;
  int64_t num_batches() const override;
  int64_t epoch_batches() const override;
  int64_t epoch_position() const override;
  double wait_seconds() const override { return wait_seconds_; }

  int64_t batch_size() const { return batch_size_; }

 private:
  const Dataset& dataset_;
  std::shared_ptr<Sampler> sampler_;
  int64_t batch_size_;
  bool drop_last_;
  detail::ExampleWriter writer_;
  std::vector<float> scratch_;

  bool started_ = false;
  int64_t epoch_ = 0;
  int64_t start_ = 0;           // the epoch's global position at start_epoch_at()
  std::vector<int64_t> order_;  // the epoch's indices (from start_ on)
  int64_t position_ = 0;        // next position in order_
  int64_t batch_index_ = 0;
  double wait_seconds_ = 0.0;
};

}  // namespace kiln
