// sampler.cpp: sequential and seeded random samplers (see sampler.h for the why).
#include "data/sampler.h"

#include <algorithm>
#include <cstddef>
#include <limits>
#include <numeric>
#include <utility>

#include "engine/error.h"
#include "engine/philox.h"

namespace kiln {

Sampler::~Sampler() = default;

std::vector<int64_t> Sampler::indices_from(int64_t epoch, int64_t position) const {
  std::vector<int64_t> all = indices(epoch);
  KILN_CHECK_INPUT(position >= 0 && position <= static_cast<int64_t>(all.size()),
                   "Sampler::indices_from: position ", position, " is outside the epoch (0..",
                   all.size(), ")");
  all.erase(all.begin(), all.begin() + position);
  return all;
}

int64_t Sampler::position_after(int64_t position, int64_t taken) const { return position + taken; }

namespace {

// Reads consecutive 32-bit numbers of the Philox stream (key, base): number i is
// philox_u32(key, base, i). Keeps the current 4-number block so each counter value is
// computed once.
class PhiloxStream {
 public:
  PhiloxStream(uint64_t key, uint64_t base) : key_(key), base_(base) {}
  uint32_t next() {
    if (i_ % 4 == 0) block_ = philox4x32_10(key_, base_ + i_ / 4);
    return block_.v[i_++ % 4];
  }

 private:
  uint64_t key_, base_;
  uint64_t i_ = 0;
  PhiloxOut block_{};
};

// A uniform integer in [0, range), range >= 1, without modulo bias (Lemire, "Fast Random
// Integer Generation in an Interval", 2019): the high half of x * range is the answer; the few
// x whose low half falls below 2^32 mod range are rejected and redrawn.
uint32_t uniform_below(PhiloxStream& stream, uint32_t range) {
  uint64_t m = static_cast<uint64_t>(stream.next()) * range;
  uint32_t low = static_cast<uint32_t>(m);
  if (low < range) {
    const uint32_t threshold = (0u - range) % range;  // 2^32 mod range
    while (low < threshold) {
      m = static_cast<uint64_t>(stream.next()) * range;
      low = static_cast<uint32_t>(m);
    }
  }
  return static_cast<uint32_t>(m >> 32);
}

void check_size(int64_t n, const char* who) {
  KILN_CHECK_INPUT(n >= 0, who, ": the number of examples must be >= 0, got ", n);
}

}  // namespace

std::vector<int64_t> philox_permutation(int64_t n, uint64_t key, uint64_t counter_base) {
  KILN_CHECK_INPUT(n >= 0 && n <= static_cast<int64_t>(std::numeric_limits<uint32_t>::max()),
                   "philox_permutation: n must be in 0..2^32-1, got ", n);
  std::vector<int64_t> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), int64_t{0});
  // Fisher-Yates (Durstenfeld): for i = n-1 down to 1, swap element i with a uniformly chosen
  // element j of 0..i. Every one of the n! orders is equally likely.
  PhiloxStream stream(key, counter_base);
  for (int64_t i = n - 1; i >= 1; --i) {
    const int64_t j = uniform_below(stream, static_cast<uint32_t>(i + 1));
    std::swap(perm[static_cast<size_t>(i)], perm[static_cast<size_t>(j)]);
  }
  return perm;
}

SequentialSampler::SequentialSampler(int64_t n) : n_(n) { check_size(n, "SequentialSampler"); }

std::vector<int64_t> SequentialSampler::indices(int64_t epoch) const {
  std::vector<int64_t> out(static_cast<size_t>(n_));
  std::iota(out.begin(), out.end(), int64_t{0});
  return out;
}

ShardSampler::ShardSampler(int64_t n, int rank, int world_size) {
  check_size(n, "ShardSampler");
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    throw Error(detail::str("ShardSampler: rank ", rank, " of world_size ", world_size,
                            ": need world_size >= 1 and 0 <= rank < world_size"),
                ErrorKind::Usage);
  }
  begin_ = n * rank / world_size;
  end_ = n * (rank + 1) / world_size;
}

std::vector<int64_t> ShardSampler::indices(int64_t epoch) const {
  std::vector<int64_t> out(static_cast<size_t>(end_ - begin_));
  std::iota(out.begin(), out.end(), begin_);
  return out;
}

RandomSampler::RandomSampler(int64_t n, uint64_t seed) : n_(n), seed_(seed) {
  check_size(n, "RandomSampler");
}

// Each epoch gets its own region of the counter space: 2^40 counters (2^42 numbers), far
// more than a shuffle of up to 2^32 elements draws, so epochs never share random numbers.
constexpr int kEpochShift = 40;

std::vector<int64_t> RandomSampler::indices(int64_t epoch) const {
  KILN_CHECK_INPUT(epoch >= 0 && epoch < (int64_t{1} << (64 - kEpochShift)),
                   "RandomSampler::indices: epoch must be in 0..2^24-1, got ", epoch);
  return philox_permutation(n_, seed_, static_cast<uint64_t>(epoch) << kEpochShift);
}

DistributedSampler::DistributedSampler(int64_t n, int rank, int world_size, bool shuffle,
                                       uint64_t seed, bool drop_last)
    : n_(n), rank_(rank), world_size_(world_size), shuffle_(shuffle), seed_(seed),
      drop_last_(drop_last) {
  check_size(n, "DistributedSampler");
  if (world_size < 1) {
    throw Error(detail::str("DistributedSampler: world_size must be >= 1, got ", world_size),
                ErrorKind::Usage);
  }
  if (rank < 0 || rank >= world_size) {
    throw Error(detail::str("DistributedSampler: rank must be in 0..", world_size - 1,
                            " (world_size ", world_size, "), got ", rank),
                ErrorKind::Usage);
  }
  const int64_t w = world_size;
  per_rank_ = drop_last ? n / w : (n + w - 1) / w;
}

std::vector<int64_t> shard_of_order(const std::vector<int64_t>& order, int64_t position,
                                    int rank, int world_size, bool drop_last) {
  const int64_t n = static_cast<int64_t>(order.size());
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    throw Error(detail::str("shard_of_order: rank ", rank, " of world_size ", world_size,
                            ": need world_size >= 1 and 0 <= rank < world_size"),
                ErrorKind::Usage);
  }
  if (position < 0 || position > n) {
    throw Error(detail::str("shard_of_order: position ", position, " is outside the epoch (0..",
                            n, ")"),
                ErrorKind::Usage);
  }
  // 1. What is left, padded (repeating the epoch's beginning) or cut to a multiple of W.
  const int64_t w = world_size, left = n - position;
  const int64_t total = drop_last ? left / w * w : (left + w - 1) / w * w;
  // 2. This rank's share: entries rank, rank + W, rank + 2W, ... of it.
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(total / w));
  for (int64_t i = rank; i < total; i += w) {
    const int64_t at = position + i;  // past n: padding entry at - n (n > 0 whenever total > 0)
    mine.push_back(order[static_cast<size_t>(at < n ? at : (at - n) % n)]);
  }
  return mine;
}

// The epoch's global order (a philox permutation, or 0..n-1 without shuffle), the same on every
// rank: each rank computes it from the same (seed, epoch).
std::vector<int64_t> DistributedSampler::epoch_order(int64_t epoch) const {
  KILN_CHECK_INPUT(epoch >= 0 && epoch < (int64_t{1} << (64 - kEpochShift)),
                   "DistributedSampler::indices: epoch must be in 0..2^24-1, got ", epoch);
  if (shuffle_) return philox_permutation(n_, seed_, static_cast<uint64_t>(epoch) << kEpochShift);
  std::vector<int64_t> order(static_cast<size_t>(n_));
  std::iota(order.begin(), order.end(), int64_t{0});
  return order;
}

std::vector<int64_t> DistributedSampler::indices(int64_t epoch) const {
  return shard_of_order(epoch_order(epoch), 0, rank_, world_size_, drop_last_);
}

std::vector<int64_t> DistributedSampler::indices_from(int64_t epoch, int64_t position) const {
  return shard_of_order(epoch_order(epoch), position, rank_, world_size_, drop_last_);
}

int64_t DistributedSampler::position_after(int64_t position, int64_t taken) const {
  return std::min(n_, position + taken * world_size_);
}

}  // namespace kiln
