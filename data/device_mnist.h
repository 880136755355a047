// device_mnist.h: MNIST held whole in device memory, each batch gathered there by a kernel.
//
//   DeviceMnistBatches train(train_set, std::make_shared<RandomSampler>(train_set.size(), seed),
//                            /*batch_size=*/128, Device(DeviceType::CUDA, 0));
//   train.start_epoch(epoch);
//   for (Batch b; train.next(b);) { ... b.inputs (B, 1, 28, 28) f32, b.labels (B) i64 ... }
//
// Why: a small model on a GPU trains faster than a host pipeline feeds it. MNIST's training set
// is 47 MB of raw bytes (60,000 x 784) and 60 KB of labels: it fits in any GPU's memory, so it
// is copied there once, and a batch then costs one kernel launch: no worker thread, no pinned
// staging, no host-to-device copy per step. The fastest MNIST and CIFAR-10 trainers keep the
// whole set on the GPU the same way (tysam-code's hlb-mnist, https://github.com/tysam-code/hlb-mnist;
// Keller Jordan's airbench, https://github.com/KellerJordan/cifar10-airbench).
//
// The same batches as the Loader (data/loader.h), bit for bit: the epoch's order comes from the
// same Sampler (RandomSampler is a pure function of (seed, epoch)), it is cut into batches of
// batch_size the same way (the last one smaller), and each pixel is normalised on the device by
// mnist_pixel_of, the rule MnistDataset::get() applies on the host (data/mnist_kernels.h).
//
// Per epoch, the order (8 bytes per example: 480 KB for MNIST) goes to the device once, from
// pinned memory and without waiting for the copy; next() then launches the gather kernel on a
// slice of it (cpu:: or cuda::gather_mnist_batch, by the device). start_epoch_at(epoch,
// position) starts mid-epoch as the Loader does (a resumed checkpoint). On the CPU the same
// class gathers in host memory (the CPU twin; tests compare the two).
//
// Memory: the set's bytes stay on the device for the object's lifetime; each batch next() hands
// out is freshly allocated (the caching allocator makes that cheap) and stays valid as long as
// the caller holds it. next_into() writes into tensors the caller reuses instead, such as a CUDA
// graph's static inputs (engine/step_graph.h).
#pragma once

#include <cstdint>
#include <memory>

#include "data/batch_iterator.h"
#include "data/mnist.h"
#include "data/sampler.h"
#include "engine/device.h"
#include "engine/tensor.h"

namespace kiln {

class DeviceMnistBatches : public BatchSource {
 public:
  // Copies `set`'s images and labels to `device` (the host waits for that copy, once: a named
  // wait, engine/cuda/sync_debug.h). Throws kiln::Error (Usage) for batch_size < 1, a null
  // sampler, or a sampler whose indices go beyond the set.
  DeviceMnistBatches(const MnistDataset& set, std::shared_ptr<Sampler> sampler,
                     int64_t batch_size, Device device);

  void start_epoch_at(int64_t epoch, int64_t position) override;
  bool next(Batch& out) override;
  // Gathers the next batch straight into inputs.rows(0, B) and labels.rows(0, B) (f32
  // (batch_size, 1, 28, 28) and i64 (batch_size) on this source's device).
  int64_t next_into(const Tensor& inputs, const Tensor& labels) override;
  int64_t num_batches() const override;
  int64_t epoch_batches() const override;
  int64_t epoch_position() const override;
  double wait_seconds() const override { return wait_seconds_; }

  Device device() const { return device_; }
  int64_t batch_size() const { return batch_size_; }

 private:
  // Gathers the `rows` examples order_[position_ ...] into `inputs` / `labels`.
  void gather(const Tensor& inputs, const Tensor& labels, int64_t rows);

  std::shared_ptr<Sampler> sampler_;
  int64_t batch_size_;
  Device device_;
  int64_t examples_;
  Tensor images_;  // u8 (examples, 784) on device_
  Tensor labels_;  // u8 (examples) on device_

  bool started_ = false;
  int64_t start_ = 0;     // the epoch's global position at start_epoch_at()
  Tensor order_;          // i64: the epoch's indices from start_ on, on device_
  int64_t position_ = 0;  // next position in order_
  int64_t batch_index_ = 0;
  double wait_seconds_ = 0.0;
};

}  // namespace kiln
