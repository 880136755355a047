// collectives.cpp: reduce-scatter, allgather, broadcast and barrier on Transport::start().
//
//   ring_reduce_scatter  the first phase of the ring allreduce on its own: N - 1 steps, partial
//                        sums travel around the ring; rank r ends with block r. Sends
//                        (N - 1) * block bytes per rank.
//   ring_allgather       the second phase: N - 1 steps, blocks travel around the ring into
//                        place. Sends (N - 1) * block bytes per rank.
//   tree_broadcast       binomial tree: in round k every rank that has the data sends it to the
//                        rank 2^k further away (relative to the root), so ceil(log2 N) rounds
//                        reach everyone; the root sends log2 N copies, leaves none.
//   barrier              dissemination (Hensgen, Finkel, Manber 1988): in round k rank r
//                        signals r + 2^k and waits for r - 2^k. After ceil(log2 N) rounds every
//                        rank has heard, directly or through others, from every rank, so no one
//                        leaves before everyone arrived. One-byte messages (a zero-byte NCCL
//                        send completes without its peer, so it would not synchronise).
#include <cstdint>
#include <vector>

#include "comm/algo_util.h"
#include "comm/algorithms.h"

namespace kiln::comm {
namespace {

// The sub-chunk size the collectives pipeline with (the ring allreduce's default).
int64_t default_sub(const Buffer& b) {
  return subchunk_elems(AlgorithmOptions().ring_subchunk_bytes, b.type, b.count);
}

}  // namespace

void ring_reduce_scatter(Transport& t, int n, const Buffer& in, const Buffer& out, ReduceOp op) {
  check_algorithm_args(t, n, in, "reduce_scatter");
  check_algorithm_args(t, n, out, "reduce_scatter");
  const int64_t m = out.count;
  KILN_CHECK(in.type == out.type && in.count == m * n, "reduce_scatter: `in` must hold ", n,
             " blocks of ", m, " ", elem_name(out.type), " elements, got ", in.count, " ",
             elem_name(in.type));
  const int r = t.rank(), next = (r + 1) % n, prev = (r + n - 1) % n;
  auto block = [&](int b) { return in.slice(static_cast<int64_t>((b % n + n) % n) * m, m); };
  if (n == 1 || m == 0) {
    copy_buffer(out, block(r));
    return;
  }
  // The partial sum of block b travels r-1 -> ... : at step s, rank r sends its partial of
  // block (r - s - 1) (at step 0 just its own input) and receives the partial of block
  // (r - s - 2), to which it adds its own input. The last block received, at s = N - 2, is
  // block r: it goes straight into `out`.
  Scratch a(out.type, m, out.device), b(out.type, m, out.device);
  Buffer cur = block(r - 1), nxt = a.buffer(), spare = b.buffer();
  const int64_t sub = default_sub(out);
  for (int s = 0; s < n - 1; ++s) {
    const Buffer dst = s == n - 2 ? out : nxt;
    const Buffer own = block(r - s - 2);
    pipelined_exchange(t, cur, next, dst, prev, kTagReduceScatter, sub,
                       [&](int64_t off, int64_t len) {
                         reduce_into(dst.slice(off, len), own.slice(off, len));
                       });
    // The buffer just received is sent at the next step; the one just sent is free again.
    const Buffer freed = s == 0 ? spare : cur;
    cur = dst;
    nxt = freed;
  }
  if (op == ReduceOp::Average) scale(out, 1.0 / n);
}

void ring_allgather(Transport& t, int n, const Buffer& in, const Buffer& out) {
  check_algorithm_args(t, n, in, "allgather");
  check_algorithm_args(t, n, out, "allgather");
  const int64_t m = in.count;
  KILN_CHECK(in.type == out.type && out.count == m * n, "allgather: `out` must hold ", n,
             " blocks of ", m, " ", elem_name(in.type), " elements, got ", out.count, " ",
             elem_name(out.type));
  const int r = t.rank(), next = (r + 1) % n, prev = (r + n - 1) % n;
  auto block = [&](int b) { return out.slice(static_cast<int64_t>((b % n + n) % n) * m, m); };
  copy_buffer(block(r), in);
  if (n == 1 || m == 0) return;
  const int64_t sub = default_sub(in);
  // At step s rank r forwards block (r - s), which it has had since step s - 1 (its own at
  // s = 0), and receives block (r - s - 1) into place.
  for (int s = 0; s < n - 1; ++s)
    pipelined_exchange(t, block(r - s), next, block(r - s - 1), prev, kTagAllgather, sub);
}

void tree_broadcast(Transport& t, int n, const Buffer& buf, int root) {
  check_algorithm_args(t, n, buf, "broadcast");
  KILN_CHECK(root >= 0 && root < n, "broadcast: root ", root, " is not a member rank (0..",
             n - 1, ")");
  if (n == 1 || buf.count == 0) return;
  // Ranks relative to the root: v = 0 is the root. Rank v receives from v - 2^k where 2^k is
  // v's lowest set bit, then sends to v + 2^j for every 2^j below that bit (while < N).
  const int r = t.rank();
  const int v = (r - root + n) % n;
  auto real = [&](int rel) { return (rel + root) % n; };
  int mask = 1;
  while (mask < n) {
    if (v & mask) {
      auto req = t.start({P2POp::recv(buf.data, buf.bytes(), real(v - mask), kTagBroadcast)});
      req->wait();
      KILN_CHECK(req->received_bytes(0) == buf.bytes(), "broadcast: rank ", r, " expected ",
                 buf.bytes(), " bytes from rank ", real(v - mask), ", got ",
                 req->received_bytes(0), ": do all ranks pass the same count and type?");
      break;
    }
    mask <<= 1;
  }
  std::vector<P2POp> sends;
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (v + mask < n) sends.push_back(P2POp::send(buf.data, buf.bytes(), real(v + mask), kTagBroadcast));
  if (!sends.empty()) t.run(sends);
}

void barrier(Transport& t, int n) {
  KILN_CHECK(n >= 1 && n <= t.size() && t.rank() < n, "barrier: rank ", t.rank(),
             " is not one of the ", n, " member ranks");
  if (n == 1) return;
  Scratch token(ElemType::F16, 1, t.device());  // 2 bytes on the transport's device
  char* p = static_cast<char*>(token.buffer().data);
  const int r = t.rank();
  for (int k = 1; k < n; k <<= 1)
    t.run({P2POp::send(p, 1, (r + k) % n, kTagBarrier),
           P2POp::recv(p + 1, 1, (r - k + n) % n, kTagBarrier)});
}

}  // namespace kiln::comm
