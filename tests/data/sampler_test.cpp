// sampler_test.cpp: SequentialSampler, RandomSampler (permutation, per-epoch reshuffle,
// reproducibility, golden indices, uniformity) and BatchIterator (shapes, partial last
// batch, drop_last, order of labels, validity of handed-out batches).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "data/batch_iterator.h"
#include "data/sampler.h"
#include "engine/error.h"

namespace kiln {
namespace {

bool is_permutation_of_range(std::vector<int64_t> v, int64_t n) {
  if (static_cast<int64_t>(v.size()) != n) return false;
  std::sort(v.begin(), v.end());
  for (int64_t i = 0; i < n; ++i) {
    if (v[static_cast<size_t>(i)] != i) return false;
  }
  return true;
}

TEST(ShardSampler, ContiguousSlicesCoverEveryIndexOnce) {
  for (int world = 1; world <= 4; ++world) {
    for (int64_t n : {0, 1, 3, 10, 10001}) {
      std::vector<int64_t> all;
      for (int r = 0; r < world; ++r) {
        const ShardSampler s(n, r, world);
        const std::vector<int64_t> idx = s.indices(0);
        EXPECT_EQ(static_cast<int64_t>(idx.size()), s.size());
        EXPECT_EQ(idx, s.indices(3));  // no shuffling
        all.insert(all.end(), idx.begin(), idx.end());
      }
      std::vector<int64_t> expected(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) expected[static_cast<size_t>(i)] = i;
      EXPECT_EQ(all, expected) << "n " << n << ", world " << world;
    }
  }
  EXPECT_EQ(ShardSampler(10, 1, 3).indices(0), (std::vector<int64_t>{3, 4, 5}));
  EXPECT_THROW(ShardSampler(10, 3, 3), Error);
  EXPECT_THROW(ShardSampler(10, 0, 0), Error);
  EXPECT_THROW(ShardSampler(-1, 0, 1), Error);
}

TEST(SequentialSampler, InOrderEveryEpoch) {
  SequentialSampler s(7);
  EXPECT_EQ(s.size(), 7);
  const std::vector<int64_t> expected{0, 1, 2, 3, 4, 5, 6};
  EXPECT_EQ(s.indices(0), expected);
  EXPECT_EQ(s.indices(5), expected);
  EXPECT_TRUE(SequentialSampler(0).indices(0).empty());
  EXPECT_THROW(SequentialSampler(-1), Error);
}

TEST(RandomSampler, IsAPermutation) {
  for (int64_t n : {1, 2, 7, 1000}) {
    RandomSampler s(n, 123);
    for (int64_t epoch : {0, 1, 17}) {
      EXPECT_TRUE(is_permutation_of_range(s.indices(epoch), n)) << "n=" << n << " epoch=" << epoch;
    }
  }
  EXPECT_TRUE(RandomSampler(0, 1).indices(0).empty());
}

TEST(RandomSampler, ReshufflesPerEpochAndReproduces) {
  RandomSampler a(1000, 42), b(1000, 42), c(1000, 43);
  EXPECT_NE(a.indices(0), a.indices(1));
  EXPECT_NE(a.indices(1), a.indices(2));
  EXPECT_EQ(a.indices(3), b.indices(3));  // same seed, same epoch: same order
  EXPECT_EQ(a.indices(3), a.indices(3));  // no hidden state between calls
  EXPECT_NE(a.indices(0), c.indices(0));  // another seed: another order
  std::vector<int64_t> identity(1000);
  std::iota(identity.begin(), identity.end(), int64_t{0});
  EXPECT_NE(a.indices(0), identity);
}

// Golden values from an independent Python implementation of Philox4x32-10 + Lemire's bounded
// integers + Fisher-Yates (the spec in sampler.h). They must hold on every platform and
// compiler: a change here changes every training run's data order.
TEST(RandomSampler, GoldenIndices) {
  auto first10 = [](const std::vector<int64_t>& v) {
    return std::vector<int64_t>(v.begin(), v.begin() + 10);
  };
  EXPECT_EQ(first10(RandomSampler(1000, 42).indices(0)),
            (std::vector<int64_t>{394, 617, 397, 168, 449, 654, 173, 722, 615, 263}));
  EXPECT_EQ(first10(RandomSampler(1000, 42).indices(1)),
            (std::vector<int64_t>{875, 606, 576, 643, 882, 45, 731, 737, 129, 905}));
  EXPECT_EQ(RandomSampler(10, 0).indices(0), (std::vector<int64_t>{6, 9, 0, 2, 1, 8, 4, 5, 7, 3}));
  EXPECT_EQ(first10(RandomSampler(60000, 1).indices(3)),
            (std::vector<int64_t>{41291, 51748, 32120, 40478, 8015, 28102, 16977, 53150, 47692,
                                  5115}));
}

// Over many epochs, each of the 3! = 6 orders of 3 elements must come up about equally often
// (a biased shuffle, e.g. swapping with any j in 0..n-1, fails this).
TEST(RandomSampler, OrdersAreUniform) {
  RandomSampler s(3, 7);
  std::map<std::vector<int64_t>, int> counts;
  const int epochs = 6000;
  for (int e = 0; e < epochs; ++e) counts[s.indices(e)]++;
  ASSERT_EQ(counts.size(), 6u);
  double chi2 = 0;
  for (const auto& kv : counts) {
    const double d = kv.second - epochs / 6.0;
    chi2 += d * d / (epochs / 6.0);
  }
  EXPECT_LT(chi2, 20.5) << "chi-square with 5 degrees of freedom; p < 0.001 above 20.5";
}

TEST(RandomSampler, RejectsBadEpoch) {
  RandomSampler s(5, 1);
  EXPECT_THROW(s.indices(-1), Error);
}

// A tiny data set: example i is shape (1, 2, 3) filled with i*10 + k, label i % 5.
class ToyDataset : public Dataset {
 public:
  explicit ToyDataset(int64_t n) : n_(n) {}
  int64_t size() const override { return n_; }
  Shape example_shape() const override { return {1, 2, 3}; }
  int64_t num_classes() const override { return 5; }
  int64_t get(int64_t index, float* out) const override {
    if (index < 0 || index >= n_) throw Error("ToyDataset: index out of range");
    for (int k = 0; k < 6; ++k) out[k] = static_cast<float>(index * 10 + k);
    return index % 5;
  }
  std::string describe() const override { return "toy"; }

 private:
  int64_t n_;
};

// Collects every batch of one epoch.
std::vector<Batch> run_epoch(BatchSource& source, int64_t epoch) {
  source.start_epoch(epoch);
  std::vector<Batch> out;
  for (Batch b; source.next(b);) out.push_back(b);
  return out;
}

TEST(BatchIterator, ShapesAndPartialLastBatch) {
  ToyDataset ds(11);
  BatchIterator it(ds, std::make_shared<SequentialSampler>(11), 4);
  EXPECT_EQ(it.num_batches(), 3);
  std::vector<Batch> batches = run_epoch(it, 0);
  ASSERT_EQ(batches.size(), 3u);
  const int64_t sizes[] = {4, 4, 3};
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(batches[i].inputs.shape(), (Shape{sizes[i], 1, 2, 3}));
    EXPECT_EQ(batches[i].inputs.dtype(), DType::F32);
    EXPECT_TRUE(batches[i].inputs.device().is_cpu());
    EXPECT_EQ(batches[i].labels.shape(), (Shape{sizes[i]}));
    EXPECT_EQ(batches[i].labels.dtype(), DType::I64);
    EXPECT_EQ(batches[i].index, static_cast<int64_t>(i));
  }
  // Contents: sequential order, so batch 2 holds examples 8, 9, 10.
  const std::vector<float> x = batches[2].inputs.to_vector<float>();
  for (int64_t r = 0; r < 3; ++r) {
    for (int k = 0; k < 6; ++k) EXPECT_EQ(x[static_cast<size_t>(r * 6 + k)], (8 + r) * 10 + k);
  }
  Batch extra;
  EXPECT_FALSE(it.next(extra));  // stays at the end
  EXPECT_FALSE(it.next(extra));
  EXPECT_GE(it.wait_seconds(), 0.0);
}

TEST(BatchIterator, DropLast) {
  ToyDataset ds(11);
  BatchIterator it(ds, std::make_shared<SequentialSampler>(11), 4, /*drop_last=*/true);
  EXPECT_EQ(it.num_batches(), 2);
  std::vector<Batch> batches = run_epoch(it, 0);
  ASSERT_EQ(batches.size(), 2u);
  EXPECT_EQ(batches[1].inputs.size(0), 4);

  // Exact multiple: nothing dropped. Batch larger than the data set: one batch, or none.
  BatchIterator exact(ds, std::make_shared<SequentialSampler>(8), 4, true);
  EXPECT_EQ(run_epoch(exact, 0).size(), 2u);
  BatchIterator big(ds, std::make_shared<SequentialSampler>(11), 64);
  EXPECT_EQ(big.num_batches(), 1);
  std::vector<Batch> one = run_epoch(big, 0);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].inputs.size(0), 11);
  BatchIterator big_drop(ds, std::make_shared<SequentialSampler>(11), 64, true);
  EXPECT_EQ(big_drop.num_batches(), 0);
  EXPECT_TRUE(run_epoch(big_drop, 0).empty());
}

TEST(BatchIterator, LabelsFollowTheSamplerOrder) {
  ToyDataset ds(13);
  auto sampler = std::make_shared<RandomSampler>(13, 5);
  BatchIterator it(ds, sampler, 5);
  for (int64_t epoch : {0, 1}) {
    const std::vector<int64_t> order = sampler->indices(epoch);
    std::vector<Batch> batches = run_epoch(it, epoch);
    ASSERT_EQ(batches.size(), 3u);
    size_t pos = 0;
    for (const Batch& b : batches) {
      const std::vector<int64_t> y = b.labels.to_vector<int64_t>();
      const std::vector<float> x = b.inputs.to_vector<float>();
      for (size_t r = 0; r < y.size(); ++r, ++pos) {
        EXPECT_EQ(y[r], order[pos] % 5);
        EXPECT_EQ(x[r * 6], order[pos] * 10);  // the example itself, not only its label
      }
    }
    EXPECT_EQ(pos, order.size());
  }
}

TEST(BatchIterator, HandedOutBatchesStayValid) {
  ToyDataset ds(6);
  BatchIterator it(ds, std::make_shared<SequentialSampler>(6), 2);
  it.start_epoch(0);
  Batch first, second;
  ASSERT_TRUE(it.next(first));
  const std::vector<float> before = first.inputs.to_vector<float>();
  ASSERT_TRUE(it.next(second));
  EXPECT_FALSE(first.inputs.same(second.inputs));
  EXPECT_EQ(first.inputs.to_vector<float>(), before);
  // A new epoch starts again at batch 0.
  it.start_epoch(1);
  Batch again;
  ASSERT_TRUE(it.next(again));
  EXPECT_EQ(again.index, 0);
  EXPECT_EQ(again.inputs.to_vector<float>(), before);
}

TEST(BatchIterator, Errors) {
  ToyDataset ds(6);
  try {
    BatchIterator bad(ds, std::make_shared<SequentialSampler>(6), 0);
    FAIL() << "batch size 0 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Usage);
  }
  BatchIterator it(ds, std::make_shared<SequentialSampler>(6), 2);
  Batch b;
  EXPECT_THROW(it.next(b), Error);  // before start_epoch
  // A sampler that reaches past the data set: the dataset's own error comes through.
  BatchIterator past(ds, std::make_shared<SequentialSampler>(7), 4);
  past.start_epoch(0);
  ASSERT_TRUE(past.next(b));
  EXPECT_THROW(past.next(b), Error);
}

// ---- DistributedSampler -------------------------------------------------------------------

std::vector<std::vector<int64_t>> shards(int64_t n, int world, bool shuffle, uint64_t seed,
                                         int64_t epoch, bool drop_last = false) {
  std::vector<std::vector<int64_t>> out;
  for (int r = 0; r < world; ++r) {
    out.push_back(DistributedSampler(n, r, world, shuffle, seed, drop_last).indices(epoch));
  }
  return out;
}

TEST(DistributedSampler, DisjointCoveringAndEqualLength) {
  for (int64_t n : {0, 1, 3, 10, 11, 12, 13, 100, 101}) {
    for (int world : {1, 2, 3, 4, 7}) {
      for (bool shuffle : {false, true}) {
        const auto s = shards(n, world, shuffle, 9, 2);
        const int64_t per_rank = (n + world - 1) / world;
        std::vector<int64_t> all;
        for (int r = 0; r < world; ++r) {
          EXPECT_EQ(static_cast<int64_t>(s[r].size()), per_rank) << n << "/" << world;
          EXPECT_EQ(DistributedSampler(n, r, world, shuffle, 9).size(), per_rank);
        }
        // Interleave back into the padded epoch order: position i belongs to rank i % world.
        for (int64_t i = 0; i < per_rank * world; ++i) all.push_back(s[i % world][i / world]);
        // The first n positions are a permutation of 0..n-1 (disjoint and covering), the rest
        // repeat the order from its start (PyTorch's padding).
        std::vector<int64_t> head(all.begin(), all.begin() + n);
        EXPECT_TRUE(is_permutation_of_range(head, n)) << n << "/" << world;
        for (int64_t i = n; i < static_cast<int64_t>(all.size()); ++i) {
          EXPECT_EQ(all[i], all[i - n]) << n << "/" << world;
        }
        if (!shuffle) {
          for (int64_t i = 0; i < n; ++i) EXPECT_EQ(all[i], i);
        } else if (n > 0) {
          // The epoch's order is RandomSampler's for the same (seed, epoch).
          EXPECT_EQ(head, RandomSampler(n, 9).indices(2));
        }
      }
    }
  }
}

TEST(DistributedSampler, MatchesPyTorchPadding) {
  // torch DistributedSampler(range(10), num_replicas=4, shuffle=False): padded to 12 with
  // [0, 1]; rank r takes positions r, r + 4, r + 8.
  const auto s = shards(10, 4, false, 0, 0);
  EXPECT_EQ(s[0], (std::vector<int64_t>{0, 4, 8}));
  EXPECT_EQ(s[1], (std::vector<int64_t>{1, 5, 9}));
  EXPECT_EQ(s[2], (std::vector<int64_t>{2, 6, 0}));
  EXPECT_EQ(s[3], (std::vector<int64_t>{3, 7, 1}));
  // Fewer examples than ranks: the order repeats as often as needed.
  const auto tiny = shards(2, 5, false, 0, 0);
  EXPECT_EQ(tiny[0], std::vector<int64_t>{0});
  EXPECT_EQ(tiny[2], std::vector<int64_t>{0});
  EXPECT_EQ(tiny[4], std::vector<int64_t>{0});
  EXPECT_EQ(tiny[3], std::vector<int64_t>{1});
  // drop_last cuts instead: 10 over 4 ranks gives 2 each, 8 distinct indices.
  const auto cut = shards(10, 4, false, 0, 0, /*drop_last=*/true);
  EXPECT_EQ(cut[0], (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(cut[3], (std::vector<int64_t>{3, 7}));
  EXPECT_EQ(DistributedSampler(10, 0, 4, false, 0, true).size(), 2);
}

TEST(DistributedSampler, ReshufflesPerEpochSameAcrossRanksAndRuns) {
  const auto e0 = shards(1000, 4, true, 42, 0), e1 = shards(1000, 4, true, 42, 1);
  for (int r = 0; r < 4; ++r) EXPECT_NE(e0[r], e1[r]) << "rank " << r;
  // Another process with the same seed (another run, or a peer computing the same split) agrees.
  EXPECT_EQ(e1, shards(1000, 4, true, 42, 1));
  EXPECT_NE(e0, shards(1000, 4, true, 43, 0));
  // Through a BatchSource: start_epoch(epoch) is the per-epoch reshuffle.
  ToyDataset ds(1000);
  auto sampler = std::make_shared<DistributedSampler>(1000, 1, 4, true, 42);
  BatchIterator it(ds, sampler, 250);
  for (int64_t epoch : {0, 1}) {
    it.start_epoch(epoch);
    Batch b;
    ASSERT_TRUE(it.next(b));
    EXPECT_EQ(b.labels.to_vector<int64_t>().size(), 250u);
    EXPECT_FALSE(it.next(b));
  }
}

TEST(DistributedSampler, Errors) {
  auto kind = [](auto make) {
    try {
      make();
    } catch (const Error& e) {
      return static_cast<int>(e.kind());
    }
    return -1;
  };
  const int usage = static_cast<int>(ErrorKind::Usage);
  EXPECT_EQ(kind([] { DistributedSampler(10, 4, 4); }), usage);   // rank >= world_size
  EXPECT_EQ(kind([] { DistributedSampler(10, -1, 4); }), usage);  // negative rank
  EXPECT_EQ(kind([] { DistributedSampler(10, 0, 0); }), usage);   // no ranks
  EXPECT_THROW(DistributedSampler(-1, 0, 1), Error);
  EXPECT_THROW(DistributedSampler(10, 0, 2).indices(-1), Error);
}

// ---- Mid-epoch positions and re-sharding ---------------------------------------------------

TEST(DistributedSampler, IndicesFromZeroIsIndicesAndTailMatchesForTheSameWorld) {
  for (bool drop_last : {false, true}) {
    for (int world : {1, 2, 3, 4}) {
      for (int64_t n : {0, 1, 7, 10, 101}) {
        for (int r = 0; r < world; ++r) {
          SCOPED_TRACE(::testing::Message() << "n=" << n << " world=" << world << " rank=" << r
                                            << " drop_last=" << drop_last);
          const DistributedSampler s(n, r, world, true, 5, drop_last);
          const std::vector<int64_t> all = s.indices(2);
          EXPECT_EQ(s.indices_from(2, 0), all);
          // After k whole examples per rank (a step boundary), the same world continues with
          // the tail of the straight order, padding included, bit for bit.
          for (int64_t k = 0; k <= static_cast<int64_t>(all.size()); ++k) {
            const int64_t p = s.position_after(0, k);
            if (p == n && k < static_cast<int64_t>(all.size())) continue;  // inside the padding
            EXPECT_EQ(s.indices_from(2, p),
                      std::vector<int64_t>(all.begin() + k, all.end())) << "k=" << k;
          }
        }
      }
    }
  }
}

// Counts how often each index of 0..n-1 was consumed: 2 ranks take k examples each (whole
// steps), then `world2` ranks take the rest of the epoch from the global position.
std::map<int64_t, int> consume_across_resume(int64_t n, int64_t k, int world2, bool drop_last,
                                             int64_t* padding_out) {
  std::map<int64_t, int> seen;
  int64_t position = 0;
  for (int r = 0; r < 2; ++r) {
    const DistributedSampler s(n, r, 2, true, 11, drop_last);
    const std::vector<int64_t> idx = s.indices(0);
    for (int64_t i = 0; i < k; ++i) ++seen[idx[static_cast<size_t>(i)]];
    position = s.position_after(0, k);
  }
  int64_t taken = 0;
  for (int r = 0; r < world2; ++r) {
    for (int64_t i : DistributedSampler(n, r, world2, true, 11, drop_last).indices_from(0, position)) {
      ++seen[i];
      ++taken;
    }
  }
  *padding_out = taken - (n - position);
  return seen;
}

TEST(DistributedSampler, ResumingWithAnotherWorldSkipsNothingAndRepeatsOnlyPadding) {
  for (int world2 : {1, 2, 3, 4, 5}) {
    for (int64_t n : {60, 61, 97}) {
      for (int64_t k : {0, 5, 12, 24}) {
        SCOPED_TRACE(::testing::Message() << "n=" << n << " k=" << k << " world2=" << world2);
        int64_t padding = 0;
        const auto seen = consume_across_resume(n, k, world2, false, &padding);
        ASSERT_EQ(static_cast<int64_t>(seen.size()), n) << "an index was never consumed";
        int64_t repeats = 0;
        for (const auto& [index, count] : seen) {
          ASSERT_GE(index, 0);
          ASSERT_LT(index, n);
          repeats += count - 1;
        }
        // Only the second part's padding repeats examples: fewer than world2 of them, and
        // none when what was left divides evenly.
        EXPECT_EQ(repeats, padding);
        EXPECT_GE(padding, 0);
        EXPECT_LT(padding, world2);
        if ((n - std::min<int64_t>(n, 2 * k)) % world2 == 0) EXPECT_EQ(padding, 0);
      }
    }
  }
}

TEST(DistributedSampler, ResumingWithDropLastNeverRepeats) {
  for (int world2 : {1, 3, 4}) {
    int64_t padding = 0;
    const auto seen = consume_across_resume(61, 10, world2, true, &padding);
    for (const auto& [index, count] : seen) EXPECT_EQ(count, 1) << "index " << index;
    EXPECT_LE(padding, 0);
    EXPECT_GT(padding, -world2);  // fewer than world2 of the remaining examples left out
  }
}

TEST(ShardOfOrder, GoldenPaddingAndErrors) {
  const std::vector<int64_t> order = {10, 11, 12, 13, 14, 15, 16};
  // From position 3, 3 ranks: left 13 14 15 16, padded with 10 11 -> 13 14 15 16 10 11.
  EXPECT_EQ(shard_of_order(order, 3, 0, 3, false), (std::vector<int64_t>{13, 16}));
  EXPECT_EQ(shard_of_order(order, 3, 1, 3, false), (std::vector<int64_t>{14, 10}));
  EXPECT_EQ(shard_of_order(order, 3, 2, 3, false), (std::vector<int64_t>{15, 11}));
  EXPECT_EQ(shard_of_order(order, 3, 2, 3, true), (std::vector<int64_t>{15}));
  // Fewer left than ranks: the padding wraps round the order again and again.
  EXPECT_EQ(shard_of_order({7}, 0, 3, 4, false), (std::vector<int64_t>{7}));
  EXPECT_TRUE(shard_of_order(order, 7, 0, 2, false).empty());
  EXPECT_THROW(shard_of_order(order, 8, 0, 2, false), Error);
  EXPECT_THROW(shard_of_order(order, -1, 0, 2, false), Error);
  EXPECT_THROW(shard_of_order(order, 0, 2, 2, false), Error);
}

TEST(RandomSampler, IndicesFromDropsTheConsumedPrefix) {
  const RandomSampler s(50, 3);
  const std::vector<int64_t> all = s.indices(1);
  EXPECT_EQ(s.indices_from(1, 0), all);
  EXPECT_EQ(s.indices_from(1, 20), std::vector<int64_t>(all.begin() + 20, all.end()));
  EXPECT_TRUE(s.indices_from(1, 50).empty());
  EXPECT_EQ(s.position_after(20, 5), 25);
  EXPECT_THROW(s.indices_from(1, 51), Error);
  // The single-rank order is the distributed samplers' global order: positions mean the same.
  EXPECT_EQ(all, DistributedSampler(50, 0, 1, true, 3).indices(1));
}

}  // namespace
}  // namespace kiln
