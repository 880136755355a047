// synthetic.h: a dataset of random examples, for tests and for the loader benchmark.
//
// Example i and its label are pure functions of (seed, i), drawn from Philox
// (engine/philox.h) with key = seed:
//   counter base of example i = i * ((numel + 4) / 4)   (numel + 1 numbers, 4 per counter)
//   label  = philox_u32(seed, base, 0) mapped to [0, num_classes)  (multiply-shift)
//   x[k]   = uniform01(philox_u32(seed, base, 1 + k)),  k = 0..numel-1, in [0, 1)
// so any thread may build any example in any order and get the same bits.
//
// work_us > 0 makes every get() also spin (busy-wait, like a CPU-bound decoder) for that
// many microseconds: the loader benchmark uses it to emulate the decode cost of real images
// without any files.
#pragma once

#include <cstdint>
#include <string>

#include "data/dataset.h"

namespace kiln {

class SyntheticDataset : public Dataset {
 public:
  // size >= 0 examples of shape example_shape (every dimension >= 1), num_classes >= 1,
  // work_us >= 0. Throws kiln::Error (Usage) otherwise.
  SyntheticDataset(int64_t size, Shape example_shape, int64_t num_classes, uint64_t seed,
                   double work_us = 0);

  int64_t size() const override { return size_; }
  Shape example_shape() const override { return shape_; }
  int64_t num_classes() const override { return num_classes_; }
  int64_t get(int64_t index, float* out) const override;
  std::string describe() const override;

  uint64_t seed() const { return seed_; }
  double work_us() const { return work_us_; }

 private:
  int64_t size_;
  Shape shape_;
  int64_t numel_;
  int64_t num_classes_;
  uint64_t seed_;
  double work_us_;
};

}  // namespace kiln
