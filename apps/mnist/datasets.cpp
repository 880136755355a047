// datasets.cpp: see datasets.h.
#include "apps/mnist/datasets.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "data/image_folder.h"
#include "data/mnist.h"
#include "engine/error.h"

namespace kiln::apps::mnist {

namespace {

// The first `limit` examples of an ImageFolder would all be of class 0 (examples are sorted
// by class), so --limit-* takes `limit` examples spread evenly over the whole set instead.
class SpreadSubset : public Dataset {
 public:
  SpreadSubset(std::unique_ptr<Dataset> base, int64_t limit)
      : base_(std::move(base)), n_(std::min(limit, base_->size())) {}
  int64_t size() const override { return n_; }
  Shape example_shape() const override { return base_->example_shape(); }
  int64_t num_classes() const override { return base_->num_classes(); }
  int64_t get(int64_t index, float* out) const override {
    KILN_CHECK_INPUT(index >= 0 && index < n_, "SpreadSubset: index ", index, " out of range");
    return base_->get(index * base_->size() / n_, out);
  }
  std::string describe() const override {
    return base_->describe() + ", " + std::to_string(n_) + " of them used";
  }

 private:
  std::unique_ptr<Dataset> base_;
  int64_t n_;
};

}  // namespace

Datasets load_datasets(const Options& o) {
  Datasets d;
  if (o.format == "idx") {
    auto train = std::make_unique<MnistDataset>(MnistDataset::load(o.data, MnistSplit::Train, o.limit_train));
    auto test = std::make_unique<MnistDataset>(MnistDataset::load(o.data, MnistSplit::Test, o.limit_test));
    d.idx_train = train.get();
    d.idx_test = test.get();
    d.train = std::move(train);
    d.test = std::move(test);
    return d;
  }
  // ImageFolder: PNGs decode to pixel / 255.0f; Normalize then computes (x - 0.1307f) / 0.3081f
  // in float32, the very expression of MnistDataset::normalize_pixel: the same bits as IDX.
  ImageFolderOptions grey28;
  grey28.channels = 1;
  grey28.height = grey28.width = 28;
  auto limited = [](std::unique_ptr<ImageFolderDataset> set, int64_t limit) -> std::unique_ptr<Dataset> {
    KILN_CHECK_INPUT(set->num_classes() == 10, set->root(), " holds ", set->num_classes(),
                     " class folders; MNIST needs 10 (0..9)");
    if (limit > 0 && limit < set->size()) return std::make_unique<SpreadSubset>(std::move(set), limit);
    return set;
  };
  auto train = std::make_unique<ImageFolderDataset>(ImageFolderDataset::open(
      (std::filesystem::path(o.data) / "train").string(), grey28));
  auto test = std::make_unique<ImageFolderDataset>(ImageFolderDataset::open(
      (std::filesystem::path(o.data) / "test").string(), grey28));
  check_same_classes(*train, *test);
  d.train = limited(std::move(train), o.limit_train);
  d.test = limited(std::move(test), o.limit_test);
  d.transform = std::make_shared<const Compose>(
      Shape{1, 28, 28}, std::vector<std::shared_ptr<const Transform>>{std::make_shared<Normalize>(
                            std::vector<float>{MnistDataset::kMean},
                            std::vector<float>{MnistDataset::kStd})});
  return d;
}

}  // namespace kiln::apps::mnist
