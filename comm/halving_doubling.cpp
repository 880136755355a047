// halving_doubling.cpp: Rabenseifner's allreduce: recursive vector halving (a reduce-scatter)
// then recursive vector doubling (an allgather). Thakur, Rabenseifner & Gropp, "Optimization
// of Collective Communication Operations in MPICH" (2005); MPICH and Open MPI use it for
// medium messages.
//
// With p = 2^k ranks it takes 2 log2(p) steps where the ring takes 2 (p - 1), and still sends
// only 2 (p - 1) / p * K elements per rank: better when the per-message latency dominates
// (small buffers, many ranks), equal in bytes.
//
//   Reduce-scatter by recursive halving, p = 4, buffer [A B C D]:
//     step 1 (distance 2): 0 <-> 2, 1 <-> 3. The lower rank of each pair keeps the lower half
//            [A B] and sends its upper half [C D] to the partner, which keeps [C D]; each adds
//            the half it received into the half it kept. Ranks 0, 1 now hold partial [A B].
//     step 2 (distance 1): 0 <-> 1 split [A B]: 0 keeps A, 1 keeps B; 2 <-> 3 split [C D].
//            Rank v holds segment v summed over all 4 ranks.
//   Allgather by recursive doubling: the same steps backwards. Partners swap their finished
//   segments, so each holds the segment of both; the segment doubles at every step.
//
// Non-power-of-two N: let p be the largest power of two <= N and r = N - p. Before: among the
// first 2r ranks, each odd rank sends its whole buffer to the even rank below it, which adds it
// ("folding"); the odd ranks sit out. The p remaining ranks (the even ones of the first 2r, and
// all ranks >= 2r) run the algorithm above as virtual ranks 0..p-1. After: each even rank of
// the first 2r sends the result back to its odd partner. Cost: K more elements for those pairs.
//
// Any count works: a segment of length L splits into ceil(L/2) and floor(L/2) elements, so with
// fewer elements than ranks some halves are empty and those messages are simply not sent.
#include "comm/algo_util.h"
#include "comm/algorithms.h"

#include <cstdint>
#include <vector>

namespace kiln::comm {

void halving_doubling_allreduce(Transport& t, int n, const Buffer& buf, ReduceOp op) {
  check_algorithm_args(t, n, buf, "halving-doubling allreduce");
  const int64_t K = buf.count;
  if (n == 1 || K == 0) return;
  const int rank = t.rank();
  int p = 1;
  while (p * 2 <= n) p *= 2;
  const int extra = n - p;  // r in the comment above
  const int64_t sub = subchunk_elems(AlgorithmOptions().ring_subchunk_bytes, buf.type, K);
  Scratch scratch(buf.type, K, buf.device);  // received halves land here before they are added
  const Buffer empty = buf.slice(0, 0);

  // Received data is added into the matching part of `into`.
  auto add_from_scratch = [&](const Buffer& into) {
    const Buffer incoming = scratch.buffer().slice(0, into.count);
    return [into, incoming](int64_t off, int64_t len) {
      reduce_into(into.slice(off, len), incoming.slice(off, len));
    };
  };

  // ---- Fold: the first 2 * extra ranks pair up, odd into even. ----
  int v = -1;  // virtual rank among the p that run halving-doubling; -1: sits out
  if (rank < 2 * extra) {
    if (rank % 2 == 1) {
      pipelined_exchange(t, buf, rank - 1, empty, rank - 1, kTagHalvingDoubling, sub);
    } else {
      pipelined_exchange(t, empty, rank + 1, scratch.buffer().slice(0, K), rank + 1,
                         kTagHalvingDoubling, sub, add_from_scratch(buf));
      v = rank / 2;
    }
  } else {
    v = rank - extra;
  }
  auto real = [&](int virt) { return virt < extra ? 2 * virt : virt + extra; };

  if (v >= 0) {
    // ---- Reduce-scatter by recursive halving (distance p/2, p/4, ..., 1). ----
    // The segment [lo, hi) this rank is responsible for shrinks by half at every step; the
    // stack remembers each split for the allgather, which undoes them in reverse order.
    struct Split {
      int64_t lo, mid, hi;
      int partner;
      bool keep_low;
    };
    std::vector<Split> splits;
    int64_t lo = 0, hi = K;
    for (int mask = p / 2; mask >= 1; mask /= 2) {
      const int partner = v ^ mask;
      const int64_t mid = lo + (hi - lo + 1) / 2;  // the lower half gets the odd element
      const bool keep_low = (v & mask) == 0;       // the lower virtual rank keeps the lower half
      const Buffer low = buf.slice(lo, mid - lo), high = buf.slice(mid, hi - mid);
      const Buffer keep = keep_low ? low : high, give = keep_low ? high : low;
      // Send the half the partner keeps; receive the partner's copy of ours and add it.
      pipelined_exchange(t, give, real(partner), scratch.buffer().slice(0, keep.count),
                         real(partner), kTagHalvingDoubling, sub, add_from_scratch(keep));
      splits.push_back({lo, mid, hi, partner, keep_low});
      if (keep_low) hi = mid; else lo = mid;
    }
    // [lo, hi) is now summed over all N ranks, here and nowhere else.
    if (op == ReduceOp::Average) scale(buf.slice(lo, hi - lo), 1.0 / n);

    // ---- Allgather by recursive doubling (distance 1, 2, ..., p/2). ----
    // The partner finished the other half of the segment both had before the split: swap.
    for (auto it = splits.rbegin(); it != splits.rend(); ++it) {
      const Buffer low = buf.slice(it->lo, it->mid - it->lo);
      const Buffer high = buf.slice(it->mid, it->hi - it->mid);
      const Buffer mine = it->keep_low ? low : high, theirs = it->keep_low ? high : low;
      pipelined_exchange(t, mine, real(it->partner), theirs, real(it->partner),
                         kTagHalvingDoubling, sub);
    }
  }

  // ---- Unfold: the even ranks of the first 2 * extra give their partner the result. ----
  if (rank < 2 * extra) {
    if (rank % 2 == 0)
      pipelined_exchange(t, buf, rank + 1, empty, rank + 1, kTagHalvingDoubling, sub);
    else
      pipelined_exchange(t, empty, rank - 1, buf, rank - 1, kTagHalvingDoubling, sub);
  }
}

}  // namespace kiln::comm
