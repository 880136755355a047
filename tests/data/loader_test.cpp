// loader_test.cpp: the asynchronous Loader (data/loader.h): sampler order and bit-identical
// batches for 0, 1, 2, 8 workers (with and without a random transform), early break and a new
// epoch, destruction mid-epoch, a worker's exception reaching next() of its batch, an exception
// in the consumer's loop, the prefetch bound, wait_seconds, batches that outlive their slot
// turn or the loader itself, and bad options.
//
// These tests also run under ThreadSanitizer (ctest -L loader in a -DKILN_SANITIZE=thread
// tree). They do no OpenMP work: the datasets are tiny and the loader itself runs no ops.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "data/batch_iterator.h"
#include "data/loader.h"
#include "data/sampler.h"
#include "data/synthetic.h"
#include "data/transforms.h"
#include "engine/error.h"
#include "engine/parallel.h"

namespace kiln {
namespace {

// A batch copied out to plain vectors, for comparisons.
struct HostBatch {
  std::vector<float> x;
  std::vector<int64_t> y;
  Shape shape;
  int64_t index;
  bool operator==(const HostBatch& o) const {
    return x == o.x && y == o.y && shape == o.shape && index == o.index;
  }
};

HostBatch to_host(const Batch& b) {
  return {b.inputs.to_vector<float>(), b.labels.to_vector<int64_t>(), b.inputs.shape(), b.index};
}

std::vector<HostBatch> epoch_of(BatchSource& source, int64_t epoch) {
  source.start_epoch(epoch);
  std::vector<HostBatch> out;
  for (Batch b; source.next(b);) out.push_back(to_host(b));
  return out;
}

LoaderOptions options(int64_t batch_size, int workers, int prefetch = 2) {
  LoaderOptions o;
  o.batch_size = batch_size;
  o.workers = workers;
  o.prefetch = prefetch;
  return o;
}

std::shared_ptr<const Compose> augmentation(const Shape& shape) {
  return std::make_shared<const Compose>(
      shape, std::vector<std::shared_ptr<const Transform>>{
                 std::make_shared<RandomCrop>(shape[1], 1),
                 std::make_shared<RandomHorizontalFlip>(0.5),
                 std::make_shared<Normalize>(std::vector<float>{0.5f}, std::vector<float>{0.25f})});
}

// A dataset whose get() can sleep, count calls, and fail for one index (like a corrupt file).
class TestDataset : public Dataset {
 public:
  explicit TestDataset(int64_t n, int sleep_us = 0, int64_t bad_index = -1)
      : n_(n), sleep_us_(sleep_us), bad_index_(bad_index) {}
  int64_t size() const override { return n_; }
  Shape example_shape() const override { return {1, 2, 2}; }
  int64_t num_classes() const override { return 10; }
  int64_t get(int64_t index, float* out) const override {
    gets.fetch_add(1);
    if (sleep_us_ > 0) std::this_thread::sleep_for(std::chrono::microseconds(sleep_us_));
    if (index == bad_index_) {
      throw Error("cannot decode 'images/cat/0042.png': not a PNG file (bad signature)",
                  ErrorKind::Input);
    }
    for (int k = 0; k < 4; ++k) out[k] = static_cast<float>(index * 4 + k);
    return index % 10;
  }
  std::string describe() const override { return "TestDataset"; }

  mutable std::atomic<int64_t> gets{0};

 private:
  int64_t n_;
  int sleep_us_;
  int64_t bad_index_;
};

class LoaderTest : public ::testing::Test {
 protected:
  void SetUp() override { set_num_threads(1); }  // no OpenMP work (quiet under TSan)
};

TEST_F(LoaderTest, SamplerOrderAndBitIdenticalForAnyWorkerCount) {
  const SyntheticDataset data(103, {1, 6, 6}, 10, /*seed=*/7);
  auto sampler = std::make_shared<RandomSampler>(data.size(), 5);
  BatchIterator reference(data, sampler, 8);
  const std::vector<HostBatch> ref0 = epoch_of(reference, 0), ref1 = epoch_of(reference, 1);
  ASSERT_EQ(ref0.size(), 13u);  // 12 full batches and one of 7
  for (int workers : {0, 1, 2, 8}) {
    Loader loader(data, sampler, options(8, workers));
    EXPECT_EQ(loader.workers(), workers);
    EXPECT_EQ(loader.num_batches(), 13);
    const std::vector<HostBatch> e0 = epoch_of(loader, 0), e1 = epoch_of(loader, 1);
    ASSERT_EQ(e0.size(), ref0.size()) << workers << " workers";
    for (size_t i = 0; i < ref0.size(); ++i) {
      EXPECT_TRUE(e0[i] == ref0[i]) << workers << " workers, batch " << i;
      EXPECT_TRUE(e1[i] == ref1[i]) << workers << " workers, epoch 1, batch " << i;
    }
  }
}

// A checkpoint taken after k batches stores the epoch's position; start_epoch_at() of that
// position gives the rest of the epoch with the same bits (transform included), and the
// examples before it are never read (Dataset::get is not called for them).
TEST_F(LoaderTest, StartEpochAtGivesTheRestOfTheEpochWithoutReadingTheSkipped) {
  const SyntheticDataset shapes(1, {1, 2, 2}, 10, 1);  // only for the transform's shape
  for (int workers : {0, 2}) {
    SCOPED_TRACE(::testing::Message() << workers << " workers");
    TestDataset data(50);
    auto sampler = std::make_shared<RandomSampler>(data.size(), 9);
    LoaderOptions o = options(8, workers);
    o.transform = augmentation(shapes.example_shape());
    o.seed = 4;
    Loader loader(data, sampler, o);
    const std::vector<HostBatch> full = epoch_of(loader, 1);
    ASSERT_EQ(full.size(), 7u);  // 6 of 8 and one of 2
    // Where the straight epoch stood after 3 batches.
    loader.start_epoch(1);
    Batch b;
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(loader.next(b));
    const int64_t position = loader.epoch_position();
    EXPECT_EQ(position, 24);
    b = Batch();
    // A fresh loader (a resumed process) from that position.
    TestDataset fresh_data(50);
    Loader resumed(fresh_data, sampler, o);
    resumed.start_epoch_at(1, position);
    EXPECT_EQ(resumed.epoch_batches(), 4);
    EXPECT_EQ(resumed.num_batches(), 7);  // the whole epoch's count is unchanged
    std::vector<HostBatch> rest;
    for (Batch r; resumed.next(r);) {
      rest.push_back(to_host(r));
      EXPECT_EQ(resumed.epoch_position(), std::min<int64_t>(50, position + 8 * static_cast<int64_t>(rest.size())));
    }
    ASSERT_EQ(rest.size(), 4u);
    for (size_t i = 0; i < rest.size(); ++i) {
      EXPECT_EQ(rest[i].x, full[3 + i].x) << "batch " << 3 + i;
      EXPECT_EQ(rest[i].y, full[3 + i].y) << "batch " << 3 + i;
      EXPECT_EQ(rest[i].index, static_cast<int64_t>(i));  // numbered from the start position
    }
    EXPECT_EQ(fresh_data.gets.load(), 26) << "examples before the position were read";
  }
}

// Two ranks train 4 steps of an epoch and checkpoint; the run resumes with 3 ranks (or 1) from
// the stored global position. The indices every rank's loader delivered, before and after the
// resume, cover the epoch: each exactly once, plus the new ranks' padding (fewer than 3).
TEST_F(LoaderTest, ResumingWithAnotherRankCountConsumesEveryIndexOnce) {
  const int64_t n = 95, batch = 5;
  for (int world2 : {1, 3}) {
    SCOPED_TRACE(::testing::Message() << world2 << " ranks after the resume");
    TestDataset data(n);
    std::map<int64_t, int> seen;
    auto record = [&](const Batch& b) {
      const std::vector<float> x = b.inputs.to_vector<float>();
      for (int64_t i = 0; i < b.inputs.size(0); ++i) ++seen[static_cast<int64_t>(x[i * 4]) / 4];
    };
    int64_t position = -1;
    for (int r = 0; r < 2; ++r) {
      Loader loader(data, std::make_shared<DistributedSampler>(n, r, 2, true, 3), options(batch, 1));
      loader.start_epoch(2);
      Batch b;
      for (int step = 0; step < 4; ++step) {
        ASSERT_TRUE(loader.next(b));
        record(b);
      }
      const int64_t p = loader.epoch_position();
      if (r > 0) EXPECT_EQ(p, position) << "the ranks disagree on the position";
      position = p;
    }
    EXPECT_EQ(position, 2 * 4 * batch);
    int64_t steps = -1;
    for (int r = 0; r < world2; ++r) {
      Loader loader(data, std::make_shared<DistributedSampler>(n, r, world2, true, 3),
                    options(batch, 2));
      loader.start_epoch_at(2, position);
      if (r > 0) EXPECT_EQ(loader.epoch_batches(), steps) << "the ranks would run unequal steps";
      steps = loader.epoch_batches();
      for (Batch b; loader.next(b);) record(b);
      EXPECT_EQ(loader.epoch_position(), n);
    }
    ASSERT_EQ(static_cast<int64_t>(seen.size()), n);
    int64_t repeats = 0;
    for (const auto& [index, count] : seen) repeats += count - 1;
    EXPECT_EQ(repeats, (world2 - (n - position) % world2) % world2);
  }
}

TEST_F(LoaderTest, TransformIsDeterministicAcrossWorkersAndEpochs) {
  const SyntheticDataset data(50, {1, 6, 6}, 10, /*seed=*/3);
  auto sampler = std::make_shared<RandomSampler>(data.size(), 1);
  auto transform = augmentation({1, 6, 6});
  BatchIterator reference(data, sampler, 16, /*drop_last=*/true, transform, /*seed=*/11);
  const std::vector<HostBatch> ref0 = epoch_of(reference, 0), ref1 = epoch_of(reference, 1);
  ASSERT_EQ(ref0.size(), 3u);
  EXPECT_NE(ref0[0].x, ref1[0].x);
  for (int workers : {0, 1, 2, 8}) {
    LoaderOptions o = options(16, workers, 3);
    o.drop_last = true;
    o.transform = transform;
    o.seed = 11;
    Loader loader(data, sampler, o);
    EXPECT_EQ(loader.num_batches(), 3);
    const std::vector<HostBatch> e0 = epoch_of(loader, 0), e1 = epoch_of(loader, 1);
    ASSERT_EQ(e0.size(), ref0.size());
    for (size_t i = 0; i < ref0.size(); ++i) {
      EXPECT_TRUE(e0[i] == ref0[i]) << workers << " workers, batch " << i;
      EXPECT_TRUE(e1[i] == ref1[i]) << workers << " workers, epoch 1, batch " << i;
    }
  }
  // Another seed augments differently.
  LoaderOptions o = options(16, 2);
  o.transform = transform;
  o.seed = 12;
  Loader other(data, sampler, o);
  EXPECT_NE(epoch_of(other, 0)[0].x, ref0[0].x);
}

TEST_F(LoaderTest, EarlyBreakThenNextEpoch) {
  const SyntheticDataset data(64, {1, 4, 4}, 10, 1);
  auto sampler = std::make_shared<RandomSampler>(data.size(), 2);
  BatchIterator reference(data, sampler, 4);
  const std::vector<HostBatch> ref1 = epoch_of(reference, 1);
  for (int workers : {0, 2, 8}) {
    Loader loader(data, sampler, options(4, workers, 3));
    loader.start_epoch(0);
    Batch b;
    ASSERT_TRUE(loader.next(b));
    ASSERT_TRUE(loader.next(b));
    EXPECT_EQ(b.index, 1);
    // Abandon epoch 0 with workers busy; epoch 1 must be exactly the reference.
    const std::vector<HostBatch> e1 = epoch_of(loader, 1);
    ASSERT_EQ(e1.size(), ref1.size());
    for (size_t i = 0; i < e1.size(); ++i) EXPECT_TRUE(e1[i] == ref1[i]) << workers << " workers";
    // And once more, restarting the same epoch immediately.
    loader.start_epoch(1);
    loader.start_epoch(1);
    EXPECT_TRUE(epoch_of(loader, 1) == ref1);
  }
}

TEST_F(LoaderTest, DestructionAtAnyPoint) {
  TestDataset slow(200, /*sleep_us=*/500);
  auto sampler = std::make_shared<SequentialSampler>(slow.size());
  for (int workers : {0, 1, 4}) {
    { Loader never_started(slow, sampler, options(4, workers)); }
    { Loader just_started(slow, sampler, options(4, workers));
      just_started.start_epoch(0); }
    { Loader mid_epoch(slow, sampler, options(4, workers, 4));
      mid_epoch.start_epoch(0);
      Batch b;
      ASSERT_TRUE(mid_epoch.next(b));
      ASSERT_TRUE(mid_epoch.next(b)); }  // workers are building batches 2..5 right now
    { Loader finished(slow, sampler, options(50, workers));
      EXPECT_EQ(epoch_of(finished, 0).size(), 4u); }
  }
}

TEST_F(LoaderTest, WorkerErrorReachesNextOfItsBatchNamingTheItem) {
  TestDataset data(40, 0, /*bad_index=*/13);
  auto sampler = std::make_shared<SequentialSampler>(data.size());
  for (int workers : {0, 1, 3}) {
    Loader loader(data, sampler, options(5, workers));
    loader.start_epoch(0);
    Batch b;
    ASSERT_TRUE(loader.next(b));  // batches 0 and 1 (indices 0..9) are fine
    ASSERT_TRUE(loader.next(b));
    try {
      loader.next(b);  // batch 2 holds index 13
      FAIL() << "no error for the corrupt item";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("images/cat/0042.png"), std::string::npos) << what;
      EXPECT_NE(what.find("not a PNG file (bad signature)"), std::string::npos) << what;
      EXPECT_NE(what.find("dataset index 13"), std::string::npos) << what;
      EXPECT_NE(what.find("batch 2"), std::string::npos) << what;
      EXPECT_EQ(e.kind(), ErrorKind::Input);
    }
    // The loader goes on with the next batch.
    ASSERT_TRUE(loader.next(b));
    EXPECT_EQ(b.index, 3);
    EXPECT_EQ(b.labels.to_vector<int64_t>()[0], 15 % 10);
    int rest = 0;
    while (loader.next(b)) ++rest;
    EXPECT_EQ(rest, 4);
  }
}

TEST_F(LoaderTest, ExceptionInTheConsumerLoop) {
  TestDataset data(100, 200);
  auto sampler = std::make_shared<SequentialSampler>(data.size());
  for (int workers : {0, 2}) {
    auto loader = std::make_unique<Loader>(data, sampler, options(4, workers, 3));
    auto train = [&] {
      loader->start_epoch(0);
      for (Batch b; loader->next(b);) {
        if (b.index == 2) throw std::runtime_error("loss is NaN");
      }
    };
    EXPECT_THROW(train(), std::runtime_error);
    // Usable again after the exception, and destructible right after one.
    EXPECT_EQ(epoch_of(*loader, 0).size(), 25u);
    EXPECT_THROW(train(), std::runtime_error);
    loader.reset();
  }
}

TEST_F(LoaderTest, WorkersStayWithinPrefetchBatches) {
  const int64_t bs = 4;
  for (int prefetch : {1, 3}) {
    TestDataset data(400);
    auto sampler = std::make_shared<SequentialSampler>(data.size());
    Loader loader(data, sampler, options(bs, /*workers=*/4, prefetch));
    loader.start_epoch(0);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_EQ(data.gets.load(), prefetch * bs);  // fast dataset: the queue is full, no more
    Batch b;
    for (int k = 1; k <= 5; ++k) {
      ASSERT_TRUE(loader.next(b));
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      EXPECT_LE(data.gets.load(), (k + prefetch) * bs) << "after " << k << " batches";
    }
    EXPECT_EQ(data.gets.load(), (5 + prefetch) * bs);
  }
}

TEST_F(LoaderTest, WaitSecondsGrowsWithASlowDatasetAndShrinksWithWorkers) {
  // 8 batches of 4 examples, 2 ms each: 8 ms to build a batch; the "training step" takes 25 ms.
  TestDataset slow(32, /*sleep_us=*/2000);
  auto sampler = std::make_shared<SequentialSampler>(slow.size());
  auto waited = [&](int workers) {
    Loader loader(slow, sampler, options(4, workers, 2));
    loader.start_epoch(0);
    for (Batch b; loader.next(b);) std::this_thread::sleep_for(std::chrono::milliseconds(25));
    EXPECT_EQ(loader.batch_wait_seconds().size(), 8u);
    return loader.wait_seconds();
  };
  const double sync = waited(0), async = waited(2);
  EXPECT_GE(sync, 8 * 4 * 0.002);  // at least every get()'s sleep
  // With workers, only the first batch is waited for (about 8 ms); the rest was built during
  // the "steps".
  EXPECT_LT(async, 0.5 * sync) << "sync " << sync << " s, async " << async << " s";
}

TEST_F(LoaderTest, HeldBatchesStayValidAndSlotsAreRecycled) {
  const SyntheticDataset data(60, {1, 3, 3}, 10, 9);
  auto sampler = std::make_shared<RandomSampler>(data.size(), 4);
  BatchIterator reference(data, sampler, 5);
  const std::vector<HostBatch> ref = epoch_of(reference, 0);
  Loader loader(data, sampler, options(5, 2, 2));
  const int64_t initial_slots = loader.slots_allocated();
  EXPECT_EQ(initial_slots, 4);  // prefetch + workers
  // Keep every batch of the epoch: the pool grows instead of deadlocking or overwriting.
  loader.start_epoch(0);
  std::vector<Batch> kept;
  for (Batch b; loader.next(b);) kept.push_back(b);
  ASSERT_EQ(kept.size(), ref.size());
  for (size_t i = 0; i < kept.size(); ++i) EXPECT_TRUE(to_host(kept[i]) == ref[i]) << i;
  kept.clear();
  // Dropping batches as we go: the slots are reused, the pool stops growing.
  const int64_t after_keeping = loader.slots_allocated();
  for (int epoch = 0; epoch < 3; ++epoch) {
    const std::vector<HostBatch> e = epoch_of(loader, 0);
    EXPECT_TRUE(e == ref);
  }
  EXPECT_EQ(loader.slots_allocated(), after_keeping);
}

TEST_F(LoaderTest, ABatchMayOutliveTheLoader) {
  const SyntheticDataset data(20, {1, 3, 3}, 10, 9);
  auto sampler = std::make_shared<SequentialSampler>(data.size());
  BatchIterator reference(data, sampler, 5);
  const std::vector<HostBatch> ref = epoch_of(reference, 0);
  Batch kept;
  {
    Loader loader(data, sampler, options(5, 2));
    loader.start_epoch(0);
    ASSERT_TRUE(loader.next(kept));
    ASSERT_TRUE(loader.next(kept));
  }
  EXPECT_TRUE(to_host(kept) == ref[1]);
  Tensor view = kept.inputs.reshape({5, 9});
  kept = Batch();
  EXPECT_EQ(view.to_vector<float>(), ref[1].x);  // a view keeps the slot too
}

TEST_F(LoaderTest, DropLastAndEmptyDatasets) {
  TestDataset data(10);
  auto sampler = std::make_shared<SequentialSampler>(data.size());
  LoaderOptions o = options(4, 2);
  o.drop_last = true;
  Loader loader(data, sampler, o);
  EXPECT_EQ(loader.num_batches(), 2);
  EXPECT_EQ(epoch_of(loader, 0).size(), 2u);
  TestDataset empty(0);
  Loader none(empty, std::make_shared<SequentialSampler>(0), options(4, 2));
  EXPECT_EQ(none.num_batches(), 0);
  EXPECT_TRUE(epoch_of(none, 0).empty());
}

// With drop_last, a batch larger than the epoch would leave every epoch without a batch (an app
// that starts the next epoch when one runs dry looped until the sampler's epoch limit): the
// Loader refuses it, and check_batch_fits_dataset says so in the words of the app's flag.
TEST_F(LoaderTest, DropLastBatchLargerThanTheEpochIsRefused) {
  TestDataset data(10);
  LoaderOptions o = options(11, 0);
  o.drop_last = true;
  try {
    Loader loader(data, std::make_shared<SequentialSampler>(data.size()), o);
    ADD_FAILURE() << "no error for batch 11 of 10 examples with drop_last";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Usage);
    EXPECT_NE(std::string(e.what()).find("batch size 11 is larger than the 10 examples"),
              std::string::npos) << e.what();
  }
  o.batch_size = 10;  // exactly one batch
  Loader one(data, std::make_shared<SequentialSampler>(data.size()), o);
  EXPECT_EQ(one.num_batches(), 1);
  o.batch_size = 11;
  o.drop_last = false;  // one short batch
  Loader short_one(data, std::make_shared<SequentialSampler>(data.size()), o);
  EXPECT_EQ(short_one.num_batches(), 1);

  check_batch_fits_dataset(60000, 60000, "--batch-size", "training set");
  try {
    check_batch_fits_dataset(100000, 60000, "--batch-size", "training set");
    ADD_FAILURE() << "no error for --batch-size 100000 of 60000 images";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Usage);
    EXPECT_STREQ(e.what(), "--batch-size 100000 is larger than the 60000 images of the training "
                           "set: lower --batch-size");
  }
}

TEST_F(LoaderTest, BadOptions) {
  TestDataset data(10);
  auto sampler = std::make_shared<SequentialSampler>(data.size());
  auto kind_of = [&](LoaderOptions o) {
    try {
      Loader loader(data, sampler, o);
    } catch (const Error& e) {
      return static_cast<int>(e.kind());
    }
    return -1;
  };
  const int usage = static_cast<int>(ErrorKind::Usage);
  EXPECT_EQ(kind_of(options(0, 0)), usage);
  EXPECT_EQ(kind_of(options(4, -1)), usage);
  EXPECT_EQ(kind_of(options(4, 1, 0)), usage);
  LoaderOptions wrong_shape = options(4, 1);
  wrong_shape.transform = augmentation({1, 6, 6});  // the dataset's examples are [1, 2, 2]
  EXPECT_EQ(kind_of(wrong_shape), usage);
#if !KILN_WITH_CUDA
  LoaderOptions pinned = options(4, 1);
  pinned.pin_memory = true;
  EXPECT_EQ(kind_of(pinned), usage);
  LoaderOptions gpu = options(4, 1);
  gpu.device = Device(DeviceType::CUDA, 0);
  EXPECT_EQ(kind_of(gpu), usage);
#endif
  Loader loader(data, sampler, options(4, 1));
  Batch b;
  EXPECT_THROW(loader.next(b), Error);  // before start_epoch
}

}  // namespace
}  // namespace kiln
