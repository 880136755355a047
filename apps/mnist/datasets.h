// datasets.h: MNIST's training and test sets in the --format asked for.
//
//   idx          the four MNIST IDX files (data/mnist.h), normalised as they load
//   imagefolder  DIR/train/<class>/*.png and DIR/test/<class>/*.png (data/image_folder.h),
//                normalised by a transform to the very bits of the IDX path
#pragma once

#include <memory>

#include "apps/mnist/options.h"
#include "data/dataset.h"
#include "data/mnist.h"
#include "data/transforms.h"

namespace kiln::apps::mnist {

// The training and test sets in the --format asked for, and the transform they need.
struct Datasets {
  std::unique_ptr<Dataset> train, test;
  std::shared_ptr<const Compose> transform;  // null: examples arrive ready (IDX: normalised)
  // The same sets as MnistDataset, whose raw bytes --data-on-device copies to the GPU
  // (--format idx; null for imagefolder).
  const MnistDataset* idx_train = nullptr;
  const MnistDataset* idx_test = nullptr;
};

// Reads o.data in o.format, keeping at most o.limit_train / o.limit_test examples. A missing
// or malformed file is an Input error saying what to do.
Datasets load_datasets(const Options& o);

}  // namespace kiln::apps::mnist
