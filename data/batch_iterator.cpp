// batch_iterator.cpp: the synchronous BatchSource (see batch_iterator.h).
#include "data/batch_iterator.h"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "data/transforms.h"
#include "engine/error.h"

namespace kiln {

BatchSource::~BatchSource() = default;

int64_t BatchSource::next_into(const Tensor& inputs, const Tensor& labels) {
  Batch b;
  if (!next(b)) return 0;
  const int64_t rows = b.inputs.size(0);
  const Shape& shape = b.inputs.shape();
  detail::check_next_into_targets(inputs, labels, rows, Shape(shape.begin() + 1, shape.end()),
                                  b.inputs.device());
  inputs.rows(0, rows).copy_(b.inputs);
  labels.rows(0, rows).copy_(b.labels);
  return rows;
}

namespace detail {

void check_next_into_targets(const Tensor& inputs, const Tensor& labels, int64_t rows,
                             const Shape& example, Device device) {
  Shape want{inputs.defined() ? inputs.size(0) : 0};
  want.insert(want.end(), example.begin(), example.end());
  const bool fit = inputs.defined() && labels.defined() && inputs.dtype() == DType::F32 &&
                   labels.dtype() == DType::I64 && inputs.shape() == want &&
                   labels.shape() == Shape{want[0]} && want[0] >= rows &&
                   inputs.device() == device && labels.device() == device;
  if (!fit) {
    throw Error("next_into: a batch of " + std::to_string(rows) + " examples of shape " +
                    shape_str(example) + " on " + device.str() + " needs f32 inputs of at least " +
                    std::to_string(rows) + " rows of that shape and i64 labels as many, there; "
                    "got " + (inputs.defined() ? inputs.str() : std::string("undefined")) +
                    " and " + (labels.defined() ? labels.str() : std::string("undefined")),
                ErrorKind::Usage);
  }
}

ExampleWriter::ExampleWriter(const Dataset& dataset, std::shared_ptr<const Compose> transform,
                             uint64_t seed)
    : dataset_(dataset), transform_(std::move(transform)), seed_(seed) {
  const Shape in = dataset.example_shape();
  input_numel_ = shape_numel(in);
  output_shape_ = in;
  if (transform_) {
    if (transform_->input_shape() != in) {
      throw Error("the transform " + transform_->describe() + " expects examples of shape " +
                      shape_str(transform_->input_shape()) + ", but the dataset's are " +
                      shape_str(in) + " (" + dataset.describe() + ")",
                  ErrorKind::Usage);
    }
    output_shape_ = transform_->output_shape();
  }
  output_numel_ = shape_numel(output_shape_);
}

int64_t ExampleWriter::write(int64_t index, int64_t epoch, float* out,
                             std::vector<float>& scratch) const {
  if (!transform_) return dataset_.get(index, out);  // straight into the batch row
  // The raw example goes into scratch first, the pipeline writes the batch row; the first
  // input_numel_ floats of scratch hold the raw example, the rest is the pipeline's scratch.
  const size_t need = static_cast<size_t>(input_numel_ + transform_->scratch_floats());
  if (scratch.size() < need) scratch.resize(need);
  const int64_t label = dataset_.get(index, scratch.data());
  SampleContext ctx;
  ctx.seed = seed_;
  ctx.epoch = epoch;
  ctx.index = index;
  float* pipeline_scratch = transform_->scratch_floats() > 0 ? scratch.data() + input_numel_ : nullptr;
  transform_->apply(scratch.data(), out, ctx, pipeline_scratch);
  return label;
}

}  // namespace detail

BatchIterator::BatchIterator(const Dataset& dataset, std::shared_ptr<Sampler> sampler,
                             int64_t batch_size, bool drop_last,
                             std::shared_ptr<const Compose> transform, uint64_t seed)
    : dataset_(dataset),
      sampler_(std::move(sampler)),
      batch_size_(batch_size),
      drop_last_(drop_last),
      writer_(dataset, std::move(transform), seed) {
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

int64_t BatchIterator::epoch_batches() const {
  const int64_t n = static_cast<int64_t>(order_.size());
  return drop_last_ ? n / batch_size_ : (n + batch_size_ - 1) / batch_size_;
}

int64_t BatchIterator::epoch_position() const { return sampler_->position_after(start_, position_); }

void BatchIterator::start_epoch_at(int64_t epoch, int64_t position) {
  const auto t0 = std::chrono::steady_clock::now();
  order_ = sampler_->indices_from(epoch, position);
  epoch_ = epoch;
  start_ = position;
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
  shape.insert(shape.end(), writer_.output_shape().begin(), writer_.output_shape().end());
  Tensor inputs = Tensor::empty(shape, DType::F32);
  Tensor labels = Tensor::empty({b}, DType::I64);
  float* x = inputs.data<float>();
  int64_t* y = labels.data<int64_t>();
  const int64_t example_numel = writer_.output_numel();
  for (int64_t i = 0; i < b; ++i) {
    const int64_t index = order_[static_cast<size_t>(position_ + i)];
    y[i] = writer_.write(index, epoch_, x + i * example_numel, scratch_);
  }
  position_ += b;

  out.inputs = std::move(inputs);
  out.labels = std::move(labels);
  out.index = batch_index_++;
  wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return true;
}

}  // namespace kiln
