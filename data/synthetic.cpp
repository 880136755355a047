// synthetic.cpp: random examples as pure functions of (seed, index); see synthetic.h.
#include "data/synthetic.h"

#include <chrono>
#include <cmath>
#include <utility>

#include "engine/error.h"
#include "engine/philox.h"

namespace kiln {

SyntheticDataset::SyntheticDataset(int64_t size, Shape example_shape, int64_t num_classes,
                                   uint64_t seed, double work_us)
    : size_(size), shape_(std::move(example_shape)), numel_(0), num_classes_(num_classes),
      seed_(seed), work_us_(work_us) {
  bool shape_ok = !shape_.empty();
  for (int64_t d : shape_) shape_ok = shape_ok && d >= 1;
  if (size < 0 || !shape_ok || num_classes < 1 || !(work_us >= 0) || !std::isfinite(work_us)) {
    throw Error(detail::str("SyntheticDataset: needs size >= 0 (got ", size,
                            "), an example shape with every dimension >= 1 (got ",
                            shape_str(shape_), "), num_classes >= 1 (got ", num_classes,
                            ") and work_us >= 0 (got ", work_us, ")"),
                ErrorKind::Usage);
  }
  numel_ = shape_numel(shape_);
}

int64_t SyntheticDataset::get(int64_t index, float* out) const {
  KILN_CHECK(index >= 0 && index < size_, "SyntheticDataset: index ", index,
             " is out of range for a data set of ", size_, " examples");
  // Emulated decode cost first: a busy-wait, so it occupies a core like real decoding would.
  if (work_us_ > 0) {
    const auto until = std::chrono::steady_clock::now() +
                       std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                           std::chrono::duration<double, std::micro>(work_us_));
    while (std::chrono::steady_clock::now() < until) {
    }
  }
  // numel + 1 numbers per example (label, then the values), 4 per counter value.
  const uint64_t base = static_cast<uint64_t>(index) * static_cast<uint64_t>((numel_ + 4) / 4);
  for (int64_t k = 0; k < numel_; ++k) {
    out[k] = uniform01(philox_u32(seed_, base, static_cast<uint64_t>(1 + k)));
  }
  const uint64_t bits = philox_u32(seed_, base, 0);
  return static_cast<int64_t>((bits * static_cast<uint64_t>(num_classes_)) >> 32);
}

std::string SyntheticDataset::describe() const {
  return detail::str("Synthetic: ", size_, " random examples of ", shape_str(shape_), " in ",
                     num_classes_, " classes (seed ", seed_, ", ", work_us_, " us of work per get)");
}

}  // namespace kiln
