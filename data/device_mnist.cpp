// device_mnist.cpp: see device_mnist.h.
#include "data/device_mnist.h"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "data/mnist_kernels.h"
#include "engine/cuda/sync_debug.h"
#include "engine/dispatch.h"
#include "engine/error.h"

namespace kiln {

namespace {

constexpr int64_t kPixels = MnistDataset::kRows * MnistDataset::kCols;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Host values on `device`: on a GPU through pinned memory, queued without waiting (the pinned
// block is not reused before the copy has read it: engine/cuda/tensor_copy.h).
template <typename T>
Tensor to_device_async(const std::vector<T>& values, Device device) {
  Tensor host = Tensor::from_vector(values, {static_cast<int64_t>(values.size())});
  if (device.is_cpu()) return host;
  return host.pin_memory().to(device, /*non_blocking=*/true);
}

}  // namespace

DeviceMnistBatches::DeviceMnistBatches(const MnistDataset& set, std::shared_ptr<Sampler> sampler,
                                       int64_t batch_size, Device device)
    : sampler_(std::move(sampler)), batch_size_(batch_size), device_(device),
      examples_(set.size()) {
  KILN_CHECK_INPUT(sampler_ != nullptr, "DeviceMnistBatches: no sampler given");
  if (batch_size_ < 1) {
    throw Error(detail::str("DeviceMnistBatches: batch size must be >= 1, got ", batch_size_),
                ErrorKind::Usage);
  }
  // The set's bytes as they are in the file: 1 byte a pixel, normalised only when gathered.
  const uint8_t* pixels = set.image_bytes(0);  // the examples lie one after another
  const std::vector<uint8_t> image_bytes(pixels, pixels + examples_ * kPixels);
  std::vector<uint8_t> label_bytes(static_cast<size_t>(examples_));
  for (int64_t i = 0; i < examples_; ++i) {
    label_bytes[static_cast<size_t>(i)] = static_cast<uint8_t>(set.label(i));
  }
  cuda::AllowSync allow("DeviceMnistBatches: the data set, copied to the device once");
  images_ = Tensor::from_vector(image_bytes, {examples_, kPixels}, device_);
  labels_ = Tensor::from_vector(label_bytes, {examples_}, device_);
}

int64_t DeviceMnistBatches::num_batches() const {
  return (sampler_->size() + batch_size_ - 1) / batch_size_;
}

int64_t DeviceMnistBatches::epoch_batches() const {
  const int64_t n = order_.defined() ? order_.numel() : 0;
  return (n + batch_size_ - 1) / batch_size_;
}

int64_t DeviceMnistBatches::epoch_position() const {
  return sampler_->position_after(start_, position_);
}

void DeviceMnistBatches::start_epoch_at(int64_t epoch, int64_t position) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<int64_t> order = sampler_->indices_from(epoch, position);
  for (int64_t index : order) {
    KILN_CHECK_INPUT(index >= 0 && index < examples_, "DeviceMnistBatches: the sampler gave "
                     "index ", index, ", beyond the ", examples_, " examples of the set");
  }
  order_ = order.empty() ? Tensor::empty({0}, DType::I64, device_)
                         : to_device_async(order, device_);
  start_ = position;
  position_ = 0;
  batch_index_ = 0;
  started_ = true;
  // Drawing the epoch's order is part of what the consumer waits for (as BatchIterator counts it).
  wait_seconds_ = seconds_since(t0);
}

void DeviceMnistBatches::gather(const Tensor& inputs, const Tensor& labels, int64_t rows) {
  const int64_t* indices = order_.data<int64_t>() + position_;
  const uint8_t* images = images_.data<uint8_t>();
  const uint8_t* set_labels = labels_.data<uint8_t>();
  float* out_images = inputs.data<float>();
  int64_t* out_labels = labels.data<int64_t>();
  on_device("gather_mnist_batch", device_, [&](auto backend) {
    gather_mnist_batch(backend, images, set_labels, kPixels, indices, rows, out_images,
                       out_labels);
  });
  position_ += rows;
  ++batch_index_;
}

bool DeviceMnistBatches::next(Batch& out) {
  KILN_CHECK(started_, "DeviceMnistBatches::next: call start_epoch(epoch) before next()");
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t rows = std::min(batch_size_, order_.numel() - position_);
  if (rows <= 0) return false;
  Tensor inputs = Tensor::empty({rows, 1, MnistDataset::kRows, MnistDataset::kCols}, DType::F32,
                                device_);
  Tensor labels = Tensor::empty({rows}, DType::I64, device_);
  out.index = batch_index_;
  gather(inputs, labels, rows);
  out.inputs = std::move(inputs);
  out.labels = std::move(labels);
  wait_seconds_ += seconds_since(t0);
  return true;
}

int64_t DeviceMnistBatches::next_into(const Tensor& inputs, const Tensor& labels) {
  KILN_CHECK(started_, "DeviceMnistBatches::next_into: call start_epoch(epoch) before");
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t rows = std::min(batch_size_, order_.numel() - position_);
  if (rows <= 0) return 0;
  detail::check_next_into_targets(inputs, labels, rows,
                                  Shape{1, MnistDataset::kRows, MnistDataset::kCols}, device_);
  gather(inputs, labels, rows);
  wait_seconds_ += seconds_since(t0);
  return rows;
}

}  // namespace kiln
