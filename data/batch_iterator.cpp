// batch_iterator.cpp: the synchronous BatchSource (see batch_iterator.h).
#include "data/batch_iterator.h"

#include <chrono>
#include <utility>

#include "engine/error.h"

namespace kiln {

BatchSource::~BatchSource() = default;

BatchIterator::BatchIterator(const Dataset& dataset, std::shared_ptr<Sampler> sampler,
                             int64_t batch_size, bool drop_last)
    : dataset_(dataset),
      sampler_(std::move(sampler)),
      batch_size_(batch_size),
      drop_last_(drop_last),
      example_shape_(dataset.example_shape()) {
  KILN_CHECK_INPUT(sampler_ != nullptr, "BatchIterator: no sampler given");
  if (batch_size_ < 1) {
    throw Error(detail::str("BatchIterator: batch size must be >= 1, got ", batch_size_),
                ErrorKind::Usage);
  }
}

int64_t BatchIterator::num_batches() const {
  const int64_t n = sampler_->size();
  return drop_last_ ? n / batch_size_ : (n + batch_size_ - 1) / batch_size_;
}

void BatchIterator::start_epoch(int64_t epoch) {
  const auto t0 = std::chrono::steady_clock::now();
  order_ = sampler_->indices(epoch);
  position_ = 0;
  batch_index_ = 0;
  started_ = true;
  // Drawing the epoch's order is part of what the consumer waits for.
  wait_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

bool BatchIterator::next(Batch& out) {
  KILN_CHECK(started_, "BatchIterator::next: call start_epoch(epoch) before next()");
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t remaining = static_cast<int64_t>(order_.size()) - position_;
  const int64_t b = std::min(batch_size_, remaining);
  if (b <= 0 || (drop_last_ && b < batch_size_)) return false;

  // inputs is (B, example_shape...), labels is (B).
  Shape shape{b};
  shape.insert(shape.end(), example_shape_.begin(), example_shape_.end());
  Tensor inputs = Tensor::empty(shape, DType::F32);
  Tensor labels = Tensor::empty({b}, DType::I64);
  float* x = inputs.data<float>();
  int64_t* y = labels.data<int64_t>();
  const int64_t example_numel = shape_numel(example_shape_);
  for (int64_t i = 0; i < b; ++i) {
    const int64_t index = order_[static_cast<size_t>(position_ + i)];
    y[i] = dataset_.get(index, x + i * example_numel);
  }
  position_ += b;

  out.inputs = std::move(inputs);
  out.labels = std::move(labels);
  out.index = batch_index_++;
  wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return true;
}

}  // namespace kiln
