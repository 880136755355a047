// binary_blocks.cpp: the binary-blocks allreduce, halving-doubling for any N with no rank left
// idle. Rabenseifner and Träff, "More Efficient Reduction Algorithms for Non-Power-of-Two Number
// of Processors in Message-Passing Parallel Systems" (EuroPVM/MPI 2004); Thakur, Rabenseifner
// and Gropp, "Optimization of Collective Communication Operations in MPICH" (IJHPCA 2005).
//
// What it fixes. Recursive halving-doubling (halving_doubling.cpp) needs a power of two. For
// other N it folds: N - p ranks (p the largest power of two <= N) hand their whole buffer to a
// partner and then sit idle through every halving and doubling step, while each partner sends
// K more than everybody else, 3K - 2K/p in all (2.5K for N = 5, 6, 7). Binary blocks keeps
// every rank at work and no rank sends more than 2K.
//
// The blocks. Write N in binary: 7 = 4 + 2 + 1. Each 1-bit is a block of 2^k consecutive
// ranks, the largest first: for N = 7, ranks 0-3 form block A, ranks 4-5 block B, rank 6
// block C. Each block runs halving-doubling inside itself, and the blocks hand their partial
// sums up the chain of blocks (smaller to next larger) and the results back down. A power of
// two is one block: the algorithm is then exactly halving-doubling.
//
// The segments. Recursive halving cuts the buffer into a binary tree: the root is [0, K); a
// node of length L splits into a lower half of ceil(L/2) elements and an upper half of
// floor(L/2). In a block of 2^k ranks, rank v ends its reduce-scatter owning the node at depth
// k found by following the bits of v, most significant first (0: lower half). Every block cuts
// the SAME tree, only to a different depth, so one segment of a smaller block is exactly a run
// of consecutive segments of a larger one: B's segment [a b] is A's segments a and b. That is
// what lets a smaller block hand its sums to the next larger one piece by piece, each piece to
// the one rank that owns it there.
//
//   N = 7, the buffer in A's four segments [a b c d]: B's segments are [ab] [cd], C's [abcd].
//
//                 block A: ranks 0  1  2  3      block B: ranks 4  5      block C: rank 6
//   1. reduce-scatter inside each block by recursive halving (C, one rank, has nothing to do):
//                          a  b  c  d  (sum of A)            ab cd (sum of B)      abcd (its own)
//   2. up: each block hands its segments to the next larger block, which adds them
//        C -> B:  6 --ab--> 4    6 --cd--> 5                  B now holds the sum of B and C
//        B -> A:  4 --a--> 0   4 --b--> 1   5 --c--> 2   5 --d--> 3
//                          a  b  c  d  (sum of all 7 ranks: each segment reduced once, here)
//   3. down: the finished segments go back the way they came
//        A -> B:  0 --a--> 4   1 --b--> 4   2 --c--> 5   3 --d--> 5
//        B -> C:  4 --ab--> 6   5 --cd--> 6                  C holds the whole result: done
//   4. allgather inside each block by recursive doubling: A's and B's ranks end with [a b c d].
//
// Every segment is reduced once, by its owner in the largest block, and only copied afterwards,
// so every rank ends with the same bits. For Average that owner divides it by N, once.
//
// Cost. K elements; blocks of b_0 > b_1 > ... > b_{m-1} ranks (m = the number of 1-bits of N).
// What one rank sends, exactly when every b divides K:
//   reduce-scatter and allgather in its block  (1 - 1/b) K each, halving-doubling's on b ranks
//   up, every block but the largest             K/b: its segment, to the next larger block
//   down, every block but the smallest          K/b: its finished segment, to the next smaller
// so that a rank of
//   the largest block    2K - K/b_0          N = 7: 1.75K   N = 6: 1.75K   N = 5: 1.75K
//   a middle block       2K                  N = 7: 2K (B)
//   the smallest block   2K - K/b_{m-1}      N = 7: K (C)   N = 6: 1.5K    N = 5: K
//   (one block, N = 2^k: 2(N-1)/N K, halving-doubling's and the ring's)
// Summed over the ranks: 2(N-1) K, as for the ring and halving-doubling (for any K, divisible
// or not): the same bytes, spread more evenly, the busiest rank sending at most 2K where
// halving-doubling's folding ranks send up to 3K.
// Steps on the longest path: the largest block's log2(b_0) halving steps (the smaller blocks
// halve meanwhile, and the chain up reaches A one hop per block while A still halves: a block
// is at least twice the next one, so it halves at least one step longer), the hop into A, one
// hop down per smaller block and log2 b_j doubling steps: at most 2 floor(log2 N) + 2, the
// steps of halving-doubling with its fold and unfold; the ring takes 2(N - 1).
// The price of a one-rank block: it sends its whole buffer up and receives the whole result
// back (K each way) and so does a folding rank of halving-doubling; the difference is that
// nobody else idles meanwhile.
//
// Any count works: segments of fewer than one element are empty and their messages are simply
// not sent (both sides compute the same lengths). Every transfer is pipelined in sub-chunks
// (AlgorithmOptions' default, 1 MiB) like the ring's, so a reduction overlaps the next transfer.
#include "comm/algo_util.h"
#include "comm/algorithms.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace kiln::comm {
namespace {

// A block of 2^log2 consecutive ranks starting at `first`.
struct Block {
  int first, size, log2;
};

// The blocks of n, from its binary representation, largest first: 7 -> {0, 4}, {4, 2}, {6, 1}.
std::vector<Block> blocks_of(int n) {
  std::vector<Block> blocks;
  int first = 0;
  for (int k = 30; k >= 0; --k) {
    if ((n >> k) & 1) {
      blocks.push_back({first, 1 << k, k});
      first += 1 << k;
    }
  }
  return blocks;
}

// The node of the halving tree of [0, K) at depth `depth` reached by the bits of v (most
// significant first; 0: the lower half, which gets the odd element).
struct Segment {
  int64_t lo, hi;
  int64_t count() const { return hi - lo; }
};
Segment segment(int64_t K, int depth, int v) {
  int64_t lo = 0, hi = K;
  for (int bit = depth - 1; bit >= 0; --bit) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if ((v >> bit) & 1) lo = mid; else hi = mid;
  }
  return {lo, hi};
}

// One piece of a transfer with several peers: `buf` goes to, or comes from, `peer`.
struct Piece {
  Buffer buf;
  int peer;
};

// Sends every piece (kind Send) or receives every piece into place (kind Recv) at once, each
// cut into sub-chunks of `sub` elements like pipelined_exchange: sub-chunk j of every piece is
// posted in one batch, all batches at once, and they complete in order. Empty pieces do not
// travel. Receives check that each sub-chunk has the size this rank expects.
void transfer_pieces(Transport& t, P2POp::Kind kind, const std::vector<Piece>& pieces,
                     int64_t sub) {
  int64_t rounds = 0;
  for (const Piece& p : pieces) rounds = std::max(rounds, (p.buf.count + sub - 1) / sub);
  struct Posted {
    std::unique_ptr<Request> req;
    std::vector<std::pair<size_t, int>> expect;  // receives: (bytes, peer) per op
  };
  std::vector<Posted> posted;
  posted.reserve(static_cast<size_t>(rounds));
  for (int64_t j = 0; j < rounds; ++j) {
    std::vector<P2POp> ops;
    Posted p;
    for (const Piece& piece : pieces) {
      if (j * sub >= piece.buf.count) continue;
      const Buffer b = piece.buf.slice(j * sub, std::min(sub, piece.buf.count - j * sub));
      if (kind == P2POp::Send) {
        ops.push_back(P2POp::send(b.data, b.bytes(), piece.peer, kTagBinaryBlocks));
      } else {
        ops.push_back(P2POp::recv(b.data, b.bytes(), piece.peer, kTagBinaryBlocks));
        p.expect.emplace_back(b.bytes(), piece.peer);
      }
    }
    p.req = t.start(ops);
    posted.push_back(std::move(p));
  }
  for (Posted& p : posted) {
    p.req->wait();
    for (size_t op = 0; op < p.expect.size(); ++op) {
      KILN_CHECK(p.req->received_bytes(op) == p.expect[op].first, "rank ", t.rank(),
                 ": expected ", p.expect[op].first, " bytes from rank ", p.expect[op].second,
                 " (tag ", kTagBinaryBlocks, "), got ", p.req->received_bytes(op),
                 ": do all ranks call the collective with the same count and type?");
    }
  }
}

}  // namespace

void binary_blocks_allreduce(Transport& t, int n, const Buffer& buf, ReduceOp op) {
  check_algorithm_args(t, n, buf, "binary-blocks allreduce");
  const int64_t K = buf.count;
  if (n == 1 || K == 0) return;
  const std::vector<Block> blocks = blocks_of(n);
  const int rank = t.rank();
  size_t j = 0;  // this rank's block
  while (rank >= blocks[j].first + blocks[j].size) ++j;
  const Block& me = blocks[j];
  const int v = rank - me.first, k = me.log2;  // rank within the block; the block is 2^k ranks
  const Block* larger = j > 0 ? &blocks[j - 1] : nullptr;
  const Block* smaller = j + 1 < blocks.size() ? &blocks[j + 1] : nullptr;
  const int64_t sub = subchunk_elems(AlgorithmOptions().ring_subchunk_bytes, buf.type, K);
  // Everything received to be added lands here first: at most a half of the buffer (a first
  // halving step's kept half; a segment of a block of two or more ranks).
  Scratch scratch(buf.type, (K + 1) / 2, buf.device);
  const Buffer empty = buf.slice(0, 0);
  auto part = [&](const Segment& s) { return buf.slice(s.lo, s.count()); };
  // Receive into scratch from `from` and add into `into` (send `give` to `to` meanwhile).
  auto exchange_add = [&](const Buffer& give, int to, const Buffer& into, int from) {
    const Buffer incoming = scratch.buffer().slice(0, into.count);
    pipelined_exchange(t, give, to, incoming, from, kTagBinaryBlocks, sub,
                       [&](int64_t off, int64_t len) {
                         reduce_into(into.slice(off, len), incoming.slice(off, len));
                       });
  };

  // ---- 1. Reduce-scatter inside the block by recursive halving. ----
  // At the step on bit b, partners differ in bit b of v; each keeps the child of its current
  // node that its bit names, sends the other child and adds the partner's copy of its own.
  for (int bit = k - 1; bit >= 0; --bit) {
    const int partner = me.first + (v ^ (1 << bit));
    const Segment keep = segment(K, k - bit, v >> bit);
    const Segment give = segment(K, k - bit, (v >> bit) ^ 1);
    exchange_add(part(give), partner, part(keep), partner);
  }
  const Segment mine = segment(K, k, v);  // summed over this block

  // ---- 2. Up: the smaller block's sums in, ours on to the larger block. ----
  // A segment of depth k is the 2^d segments of depth k + d below it: the smaller block's rank
  // v >> d holds ours inside its own.
  if (smaller) {
    const int d = k - smaller->log2;
    exchange_add(empty, smaller->first + (v >> d), part(mine), smaller->first + (v >> d));
  }
  if (larger) {
    const int d = larger->log2 - k;
    std::vector<Piece> pieces;
    for (int i = 0; i < (1 << d); ++i) {
      const int w = (v << d) + i;  // the larger block's rank that owns this piece
      pieces.push_back({part(segment(K, larger->log2, w)), larger->first + w});
    }
    transfer_pieces(t, P2POp::Send, pieces, sub);

    // ---- 3. Down: the finished pieces come back into place, from the same ranks ... ----
    transfer_pieces(t, P2POp::Recv, pieces, sub);
  } else {
    // The largest block: `mine` now holds the sum over all N ranks, here and nowhere else.
    if (op == ReduceOp::Average) scale(part(mine), 1.0 / n);
  }
  // ---- ... and go on down to the smaller block. ----
  if (smaller) {
    const int d = k - smaller->log2;
    pipelined_exchange(t, part(mine), smaller->first + (v >> d), empty,
                       smaller->first + (v >> d), kTagBinaryBlocks, sub);
  }

  // ---- 4. Allgather inside the block by recursive doubling (the halving steps reversed). ----
  // At the step on bit b, v holds the node at depth k - b on its path and the partner the
  // sibling node: swapping them gives both the parent.
  for (int bit = 0; bit < k; ++bit) {
    const int partner = me.first + (v ^ (1 << bit));
    pipelined_exchange(t, part(segment(K, k - bit, v >> bit)), partner,
                       part(segment(K, k - bit, (v >> bit) ^ 1)), partner, kTagBinaryBlocks,
                       sub);
  }
}

}  // namespace kiln::comm
