// synthetic_test.cpp: SyntheticDataset examples are pure functions of (seed, index): the same
// bits on every call, in any order and from any thread; labels in range and all used; values
// in [0, 1); bad arguments rejected; work_us really spends the time.
#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <set>
#include <thread>
#include <vector>

#include "data/synthetic.h"
#include "engine/error.h"

namespace kiln {
namespace {

std::vector<float> example(const SyntheticDataset& ds, int64_t i, int64_t* label = nullptr) {
  std::vector<float> out(static_cast<size_t>(shape_numel(ds.example_shape())));
  const int64_t l = ds.get(i, out.data());
  if (label) *label = l;
  return out;
}

TEST(Synthetic, DeterministicLabelsInRangeValuesInUnitInterval) {
  const SyntheticDataset a(200, {3, 5, 7}, 10, 123), b(200, {3, 5, 7}, 10, 123),
      other_seed(200, {3, 5, 7}, 10, 124);
  EXPECT_EQ(a.size(), 200);
  EXPECT_EQ(a.example_shape(), (Shape{3, 5, 7}));
  EXPECT_EQ(a.num_classes(), 10);
  std::set<int64_t> labels;
  int differ = 0;
  for (int64_t i = 199; i >= 0; --i) {  // any order
    int64_t la = -1, lb = -1;
    const std::vector<float> xa = example(a, i, &la);
    EXPECT_EQ(xa, example(b, i, &lb));
    EXPECT_EQ(la, lb);
    EXPECT_EQ(xa, example(a, i));  // again
    ASSERT_GE(la, 0);
    ASSERT_LT(la, 10);
    labels.insert(la);
    for (float v : xa) {
      ASSERT_GE(v, 0.0f);
      ASSERT_LT(v, 1.0f);
    }
    differ += xa != example(other_seed, i);
    if (i > 0) {
      EXPECT_NE(xa, example(a, i - 1));
    }
  }
  EXPECT_EQ(labels.size(), 10u);
  EXPECT_EQ(differ, 200);
  EXPECT_THROW(example(a, 200), Error);
  EXPECT_THROW(example(a, -1), Error);
}

TEST(Synthetic, RejectsBadArguments) {
  EXPECT_THROW(SyntheticDataset(-1, {1, 2, 2}, 2, 0), Error);
  EXPECT_THROW(SyntheticDataset(4, {1, 0, 2}, 2, 0), Error);
  EXPECT_THROW(SyntheticDataset(4, {}, 2, 0), Error);
  EXPECT_THROW(SyntheticDataset(4, {1, 2, 2}, 0, 0), Error);
  EXPECT_THROW(SyntheticDataset(4, {1, 2, 2}, 2, 0, -1.0), Error);
}

TEST(Synthetic, WorkUsSpinsAtLeastThatLong) {
  const SyntheticDataset ds(10, {1, 4, 4}, 3, 7, 2000.0);  // 2 ms per get
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < 5; ++i) example(ds, i);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(seconds, 0.010);
  EXPECT_EQ(example(ds, 3), example(SyntheticDataset(10, {1, 4, 4}, 3, 7), 3));  // same data
}

TEST(Synthetic, ThreadsGetTheSameExamples) {
  const SyntheticDataset ds(64, {2, 6, 6}, 5, 99);
  const int64_t numel = shape_numel(ds.example_shape());
  std::vector<float> serial(static_cast<size_t>(64 * numel)), threaded(serial.size());
  std::vector<int64_t> serial_labels(64), threaded_labels(64);
  for (int64_t i = 0; i < 64; ++i) serial_labels[i] = ds.get(i, serial.data() + i * numel);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int64_t i = t; i < 64; i += 4) threaded_labels[i] = ds.get(i, threaded.data() + i * numel);
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(serial, threaded);
  EXPECT_EQ(serial_labels, threaded_labels);
}

}  // namespace
}  // namespace kiln
