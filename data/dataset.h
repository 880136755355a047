// dataset.h: the Dataset interface: a finite, indexable collection of labelled examples.
//
// A Dataset answers "what is example i?" and nothing else: which examples make an epoch and
// in what order is the Sampler's job (data/sampler.h), and grouping examples into batch
// tensors is the BatchSource's (data/batch_iterator.h). This split is PyTorch's
// Dataset/Sampler/DataLoader, and it is what lets the asynchronous Loader (data/loader.h)
// replace the synchronous iterator without any dataset knowing.
//
// Conventions:
//   - Examples are dense float32 arrays of shape example_shape(), e.g. {1, 28, 28} (C, H, W)
//     for MNIST; get() writes one into a caller-owned buffer (no allocation per example), so a
//     batch builder can write straight into row i of a (B, C, H, W) batch tensor.
//   - Labels are class indices in [0, num_classes()).
//   - get() is const and must be safe to call from several threads at once (the Loader's
//     worker threads will do that): keep decoded data immutable after construction.
#pragma once

#include <cstdint>
#include <string>

#include "engine/tensor.h"

namespace kiln {

class Dataset {
 public:
  virtual ~Dataset() = default;
  // Number of examples; valid indices are 0..size()-1.
  virtual int64_t size() const = 0;
  // Shape of one example, without the batch dimension, e.g. {1, 28, 28}.
  virtual Shape example_shape() const = 0;
  // Number of classes; every label is in [0, num_classes()).
  virtual int64_t num_classes() const = 0;
  // Writes example `index` as float32 into out[shape_numel(example_shape())] and returns its
  // label. An index outside 0..size()-1 throws kiln::Error.
  virtual int64_t get(int64_t index, float* out) const = 0;
  // One line for logs: what it is, how many examples, where it came from.
  virtual std::string describe() const = 0;
};

}  // namespace kiln
