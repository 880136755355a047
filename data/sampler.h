// sampler.h: which dataset indices make up an epoch, and in what order.
//
// A Sampler is a pure function of the epoch number: indices(epoch) returns the whole
// epoch's order at once. No hidden state advances between calls, so a resumed run (epoch 3
// of a checkpoint) sees exactly the order an uninterrupted run saw, and several consumers
// (loader workers, ranks) can ask for the same epoch and agree.
//
// Positions: every epoch has one GLOBAL order (for DistributedSampler the order all ranks
// share, before it is dealt out). How far an epoch got is a global position: the number of
// examples at the front of that order that have been consumed, by all ranks together. A
// checkpoint taken in the middle of an epoch stores (epoch, position); indices_from(epoch,
// position) is the rest of the epoch, the consumer's share of it, so a run resumed with the
// same rank count continues with exactly the batches it would have seen, and one resumed with
// another rank count deals the REMAINING examples out among its ranks: none is skipped, none
// repeated (padding aside, see DistributedSampler). position_after() turns "this consumer took
// k examples of indices_from(epoch, p)" back into a global position.
//
//   SequentialSampler(n)      0, 1, ..., n-1 every epoch (evaluation).
//   RandomSampler(n, seed)    a uniformly random permutation of 0..n-1, a different one each
//                             epoch, the same one for the same (seed, epoch) on every platform.
//   DistributedSampler(n, rank, world_size, shuffle, seed)
//                             this rank's share of the epoch when world_size processes train
//                             together (data parallelism): every rank draws the SAME epoch order
//                             (seed, epoch), pads it to a multiple of world_size and takes every
//                             world_size-th index starting at `rank` (PyTorch's scheme).
//
// Why not std::shuffle: the algorithm of std::shuffle and of std::uniform_int_distribution is
// implementation-defined, so libstdc++, libc++ and MSVC give different orders from the same
// seed. RandomSampler runs its own Fisher-Yates shuffle on the Philox4x32 counter stream of
// engine/philox.h (key = seed, counter base = epoch << 40), with Lemire's unbiased bounded
// integer method; every step is specified integer arithmetic, so the order is identical
// everywhere (tests/data/sampler_test.cpp pins a few golden indices).
#pragma once

#include <cstdint>
#include <vector>

namespace kiln {

class Sampler {
 public:
  virtual ~Sampler();
  // The dataset indices of epoch `epoch` (>= 0), in order. Size: size().
  virtual std::vector<int64_t> indices(int64_t epoch) const = 0;
  // Number of indices per epoch.
  virtual int64_t size() const = 0;
  // The rest of epoch `epoch` after global position `position` (0 <= position <= the epoch's
  // length), this consumer's share of it. indices_from(e, 0) == indices(e). The default is for
  // samplers with one consumer, whose order is the global order: indices(epoch) without its
  // first `position` entries.
  virtual std::vector<int64_t> indices_from(int64_t epoch, int64_t position) const;
  // The global position after this consumer took the first `taken` entries of
  // indices_from(epoch, position) (every consumer taking as many). Default: position + taken.
  virtual int64_t position_after(int64_t position, int64_t taken) const;
};

class SequentialSampler : public Sampler {
 public:
  explicit SequentialSampler(int64_t n);
  std::vector<int64_t> indices(int64_t epoch) const override;
  int64_t size() const override { return n_; }

 private:
  int64_t n_;
};

// ShardSampler(n, rank, world_size): the contiguous slice [rank * n / W, (rank + 1) * n / W) of
// 0..n-1, in order. The slices of the W ranks cover every index exactly once (no padding, unlike
// DistributedSampler), so sharded evaluation adds up to exactly the full test set.
class ShardSampler : public Sampler {
 public:
  // Throws kiln::Error (Usage) unless world_size >= 1, 0 <= rank < world_size and n >= 0.
  ShardSampler(int64_t n, int rank, int world_size);
  std::vector<int64_t> indices(int64_t epoch) const override;
  int64_t size() const override { return end_ - begin_; }

 private:
  int64_t begin_, end_;
};

class RandomSampler : public Sampler {
 public:
  RandomSampler(int64_t n, uint64_t seed);
  std::vector<int64_t> indices(int64_t epoch) const override;
  int64_t size() const override { return n_; }
  uint64_t seed() const { return seed_; }

 private:
  int64_t n_;
  uint64_t seed_;
};

// DistributedSampler: the epoch's order (a philox permutation of 0..n-1 for (seed, epoch) as in
// RandomSampler, or 0..n-1 without shuffle) is the same on every rank, because each rank
// computes it from the same (seed, epoch): no communication is needed to agree on it. Rank r
// takes positions r, r + W, r + 2W, ... (W = world_size), so the ranks' shares are disjoint.
// Every rank must run the same number of steps (a collective all-reduce per step would hang
// otherwise), so when n is not a multiple of W the order is padded to ceil(n / W) * W by
// repeating its beginning (PyTorch's DistributedSampler does the same): a few examples are seen
// twice per epoch. With drop_last the order is instead cut to floor(n / W) * W. The per-epoch
// reshuffle comes through indices(epoch), i.e. BatchSource::start_epoch(epoch): there is no
// set_epoch() to forget.
//
// Mid-epoch positions (see the top of this file): after every rank took k examples the ranks
// together consumed global positions [0, k * W) of the padded order, so the global position is
// min(n, k * W) (a position in the padding means the real examples are all consumed).
// indices_from(epoch, p) deals out order[p..n) the same way, padded with order[0], order[1],
// ... to a multiple of W (cut, with drop_last): shard_of_order() below. With the same W and a
// p reached by whole steps that is exactly the tail of indices(epoch), bit for bit (the same
// padding entries at the same places); with another W it is the remaining examples re-sharded.
// The padding is then computed for what remains, so a resumed epoch may repeat up to W' - 1
// examples (never more than a straight run with W' ranks would) and skips none; with drop_last
// up to W' - 1 remaining examples are left out, as a straight run leaves out its tail.
class DistributedSampler : public Sampler {
 public:
  // Throws kiln::Error (Usage) unless world_size >= 1 and 0 <= rank < world_size, n >= 0.
  DistributedSampler(int64_t n, int rank, int world_size, bool shuffle = true, uint64_t seed = 0,
                     bool drop_last = false);
  std::vector<int64_t> indices(int64_t epoch) const override;
  // Indices of this rank per epoch: ceil(n / world_size) (floor with drop_last); equal on all
  // ranks.
  int64_t size() const override { return per_rank_; }
  std::vector<int64_t> indices_from(int64_t epoch, int64_t position) const override;
  int64_t position_after(int64_t position, int64_t taken) const override;
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }

 private:
  std::vector<int64_t> epoch_order(int64_t epoch) const;

  int64_t n_;
  int rank_, world_size_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
  int64_t per_rank_;
};

// Rank `rank`'s share of what is left of an epoch: order[position..) (order: the epoch's global
// order, unpadded), padded by repeating order[0], order[1], ... (again and again if need be) to
// a multiple of world_size, or cut to one with drop_last, then every world_size-th entry from
// `rank` on. shard_of_order(order, 0, ...) is DistributedSampler's indices(epoch). Throws
// kiln::Error (Usage) for a position outside 0..order.size() or a bad rank.
std::vector<int64_t> shard_of_order(const std::vector<int64_t>& order, int64_t position,
                                    int rank, int world_size, bool drop_last);

// A uniform random permutation of 0..n-1 drawn from the Philox stream (key, counter base):
// the shuffle RandomSampler uses, exposed for tests and for other samplers (distributed).
std::vector<int64_t> philox_permutation(int64_t n, uint64_t key, uint64_t counter_base);

}  // namespace kiln
