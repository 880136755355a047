// ring.cpp: ring allreduce (Patarasuk & Yuan 2009; Baidu's "ring allreduce"; Horovod, NCCL).
//
// The N ranks form a ring: rank r sends only to next = r + 1 and receives only from
// prev = r - 1 (mod N), so every link carries the same load and no rank is a hot spot. The
// buffer of K elements is cut into N chunks (balanced: the first K % N chunks hold one element
// more; with K < N some chunks are empty and simply never travel).
//
// 1. Reduce-scatter, N - 1 steps. At step s, rank r sends chunk (r - s) to next and receives
//    chunk (r - s - 1) from prev, adding it into its own copy. A chunk travels around the ring
//    collecting one contribution per hop, so after N - 1 steps rank r holds chunk (r + 1)
//    summed over all ranks.
//        N = 3, after step 0:  rank 0 has c2 = x0+x2,  rank 1 has c0 = x0+x1,  rank 2 has c1 = x1+x2
//        after step 1:         rank 0 has c1 = x0+x1+x2, rank 1 has c2 (all), rank 2 has c0 (all)
//    For Average the owner divides its finished chunk by N here, once, before sharing it.
// 2. Allgather, N - 1 steps. At step s, rank r sends chunk (r + 1 - s) (finished) to next and
//    receives chunk (r - s) from prev into place. After N - 1 steps everyone has every chunk.
//    Every rank ends with the same bits: each chunk was reduced once, by its owner, and copied.
//
// Bytes sent per rank: (N - 1) chunks in each phase, 2(N - 1) * K / N elements when N divides K:
// almost 2K whatever N, which is why the ring is bandwidth-optimal (Patarasuk and Yuan 2009) and why a
// parameter server, whose server receives N * K, stops scaling.
//
// Pipelining: each step's chunk travels in sub-chunks of options.ring_subchunk_bytes, posted
// as separate requests; the reduction of sub-chunk j runs while j + 1 is on the wire.
#include "comm/algo_util.h"
#include "comm/algorithms.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace kiln::comm {

int64_t subchunk_elems(size_t bytes, ElemType type, int64_t count) {
  if (bytes == 0) return std::max<int64_t>(count, 1);
  return std::max<int64_t>(1, static_cast<int64_t>(bytes / elem_size(type)));
}

void pipelined_exchange(Transport& t, const Buffer& send, int to, const Buffer& recv_into,
                        int from, int tag, int64_t sub,
                        const std::function<void(int64_t, int64_t)>& on_recv) {
  const int64_t n_send = (send.count + sub - 1) / sub;
  const int64_t n_recv = (recv_into.count + sub - 1) / sub;
  const int64_t steps = std::max(n_send, n_recv);
  std::vector<std::unique_ptr<Request>> reqs;
  reqs.reserve(static_cast<size_t>(steps));
  for (int64_t j = 0; j < steps; ++j) {
    std::vector<P2POp> ops;
    if (j < n_send) {
      const Buffer b = send.slice(j * sub, std::min(sub, send.count - j * sub));
      ops.push_back(P2POp::send(b.data, b.bytes(), to, tag));
    }
    if (j < n_recv) {
      const Buffer b = recv_into.slice(j * sub, std::min(sub, recv_into.count - j * sub));
      ops.push_back(P2POp::recv(b.data, b.bytes(), from, tag));
    }
    reqs.push_back(t.start(ops));
  }
  for (int64_t j = 0; j < steps; ++j) {
    reqs[j]->wait();
    if (j < n_recv) {
      const int64_t off = j * sub, n = std::min(sub, recv_into.count - j * sub);
      const size_t op = j < n_send ? 1 : 0;
      const size_t want = static_cast<size_t>(n) * elem_size(recv_into.type);
      KILN_CHECK(reqs[j]->received_bytes(op) == want, "rank ", t.rank(), ": expected ", want,
                 " bytes from rank ", from, " (tag ", tag, "), got ", reqs[j]->received_bytes(op),
                 ": do all ranks call the collective with the same count and type?");
      if (on_recv) on_recv(off, n);
    }
  }
}

void ring_allreduce(Transport& t, int n, const Buffer& buf, ReduceOp op,
                    const AlgorithmOptions& options) {
  check_algorithm_args(t, n, buf, "ring allreduce");
  const int64_t K = buf.count;
  if (n == 1 || K == 0) return;  // one rank: the sum is the buffer (and the average too)
  const int r = t.rank(), next = (r + 1) % n, prev = (r + n - 1) % n;
  auto chunk = [&](int c) {
    c = ((c % n) + n) % n;
    return buf.slice(chunk_offset(K, n, c), chunk_count(K, n, c));
  };
  const int64_t sub = subchunk_elems(options.ring_subchunk_bytes, buf.type, K);
  // Received chunks land here before they are added (chunk 0 is the largest).
  Scratch scratch(buf.type, chunk_count(K, n, 0), buf.device);

  // 1. Reduce-scatter.
  for (int s = 0; s < n - 1; ++s) {
    const Buffer mine = chunk(r - s - 1);
    const Buffer incoming = scratch.buffer().slice(0, mine.count);
    pipelined_exchange(t, chunk(r - s), next, incoming, prev, kTagRing, sub,
                       [&](int64_t off, int64_t len) {
                         reduce_into(mine.slice(off, len), incoming.slice(off, len));
                       });
  }
  if (op == ReduceOp::Average) scale(chunk(r + 1), 1.0 / n);

  // 2. Allgather: finished chunks travel straight into place.
  for (int s = 0; s < n - 1; ++s)
    pipelined_exchange(t, chunk(r + 1 - s), next, chunk(r - s), prev, kTagRing, sub);
}

}  // namespace kiln::comm
