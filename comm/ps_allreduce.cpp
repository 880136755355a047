// ps_allreduce.cpp: the synchronous parameter server as an allreduce: co-located (every
// rank serves one shard) or the workers' side of dedicated servers (ps_protocol.h).
#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "comm/algo_util.h"
#include "comm/algorithms.h"
#include "comm/ps_protocol.h"

namespace kiln::comm {
namespace {

using namespace ps;

// ---- Co-located synchronous PS ------------------------------------------------------------

void ps_colocated(Transport& t, int n, const Buffer& buf, ReduceOp op) {
  const int64_t K = buf.count;
  const int r = t.rank();
  auto shard = [&](int s) { return buf.slice(chunk_offset(K, n, s), chunk_count(K, n, s)); };
  const Buffer mine = shard(r);
  Scratch slots(buf.type, n * mine.count, buf.device);  // slot q: rank q's copy of my shard
  auto slot = [&](int q) { return slots.buffer().slice(q * mine.count, mine.count); };

  // Phase 1 (push): shard s to its server s; the contributions to my shard into their slots.
  std::vector<P2POp> ops;
  std::vector<int> recv_from;
  for (int s = 0; s < n; ++s) {
    if (s == r) continue;
    const Buffer b = shard(s);
    if (b.count > 0) ops.push_back(P2POp::send(b.data, b.bytes(), s, kTagPsPush));
  }
  for (int q = 0; q < n; ++q) {
    if (q == r || mine.count == 0) continue;
    ops.push_back(P2POp::recv(slot(q).data, mine.bytes(), q, kTagPsPush));
    recv_from.push_back(q);
  }
  auto req = t.start(ops);
  req->wait();
  for (size_t i = 0, first = ops.size() - recv_from.size(); i < recv_from.size(); ++i)
    KILN_CHECK(req->received_bytes(first + i) == mine.bytes(), "ps allreduce: rank ", r,
               " expected ", mine.bytes(), " bytes from rank ", recv_from[i], ", got ",
               req->received_bytes(first + i), ": do all ranks pass the same count and type?");

  // The server's work: sum in rank order, so the result does not depend on arrival order.
  if (mine.count > 0) {
    copy_buffer(slot(r), mine);
    for (int q = 1; q < n; ++q) reduce_into(slot(0), slot(q));
    if (op == ReduceOp::Average) scale(slot(0), 1.0 / n);
    copy_buffer(mine, slot(0));
  }

  // Phase 2 (pull): my result to every rank; every other shard from its server.
  ops.clear();
  for (int s = 0; s < n; ++s) {
    if (s == r) continue;
    if (mine.count > 0) ops.push_back(P2POp::send(mine.data, mine.bytes(), s, kTagPsResult));
    const Buffer b = shard(s);
    if (b.count > 0) ops.push_back(P2POp::recv(b.data, b.bytes(), s, kTagPsResult));
  }
  t.run(ops);
}

// ---- Dedicated servers, synchronous: the worker side ---------------------------------------

void ps_dedicated(Transport& t, int n, const Buffer& buf, ReduceOp op, int servers) {
  const PsOptions o{n, servers, false, 0};
  check_layout(t, o, "ps allreduce");
  const int64_t K = buf.count;
  std::vector<PsHeader> headers(servers);
  std::vector<P2POp> sends, recvs;
  for (int s = 0; s < servers; ++s) {
    const Buffer b = buf.slice(chunk_offset(K, servers, s), chunk_count(K, servers, s));
    PsHeader& h = headers[s];
    h.kind = static_cast<uint32_t>(PsKind::Push);
    h.elem = static_cast<uint8_t>(buf.type);
    h.op = static_cast<uint8_t>(op);
    h.count = b.count;
    sends.push_back(P2POp::send(&h, sizeof h, n + s, kTagPsHeader));
    sends.push_back(P2POp::send(b.data, b.bytes(), n + s, kTagPsPayload));
    recvs.push_back(P2POp::recv(b.data, b.bytes(), n + s, kTagPsPayload));
  }
  // Push, then pull: the sums overwrite the buffer the pushes read from, so the sends must be
  // complete before the receives are posted.
  t.run(sends);
  auto req = t.start(recvs);
  req->wait();
  for (int s = 0; s < servers; ++s)
    KILN_CHECK(req->received_bytes(s) == recvs[s].bytes, "ps allreduce: rank ", t.rank(),
               " expected ", recvs[s].bytes, " bytes from server ", n + s, ", got ",
               req->received_bytes(s));
}

}  // namespace

void ps_allreduce(Transport& t, int n, const Buffer& buf, ReduceOp op,
                  const AlgorithmOptions& options) {
  check_algorithm_args(t, n, buf, "ps allreduce");
  KILN_CHECK(options.ps_servers >= 0, "ps allreduce: ps_servers must be >= 0, got ",
             options.ps_servers);
  if (options.ps_servers > 0) {
    ps_dedicated(t, n, buf, op, options.ps_servers);
  } else if (n > 1 && buf.count > 0) {
    ps_colocated(t, n, buf, op);
  }
}

void ps_shutdown(Transport& t, const PsOptions& options) {
  check_layout(t, options, "ps_shutdown");
  KILN_CHECK(t.rank() < options.workers, "ps_shutdown: rank ", t.rank(), " is not a worker");
  send_done(t, options, PsKind::Shutdown);
}

}  // namespace kiln::comm
