// ps_protocol.h: what the parameter server's ranks say to each other (internal to comm/).
//
// Three ways to run it:
//
// 1. Co-located, synchronous (ps_allreduce, options.ps_servers == 0): every member rank is the
//    server of one shard (the ring's balanced chunks). Phase 1: each rank sends shard s to rank
//    s; rank s adds the N contributions in rank order (0, 1, ..., N-1: deterministic) and, for
//    Average, divides by N. Phase 2: rank s sends the result to every rank. Bytes per rank:
//    2 (N - 1) K / N, like the ring, but as an all-to-all of N - 1 messages at once.
//
// 2. Dedicated servers, synchronous (ps_allreduce with ps_servers = S; ranks [n, n + S) run
//    serve()): worker w sends shard s to server n + s as a header (PsHeader, fixed size, tag
//    kTagPsHeader) and a payload (tag kTagPsPayload). The server receives headers from any
//    rank, then the payload from that header's sender; when all W workers pushed it sums in
//    worker order and sends the sum (payload tag) back to each. Bytes: each worker sends K;
//    each server receives W * K / S and sends as much: with S = 1 the server carries W times
//    a worker's traffic: the bottleneck that the ring removes.
//
// 3. Dedicated servers, asynchronous (AsyncPsWorker; serve() with options.async): the server
//    keeps its shard of the parameters and an optimizer over it (the factory's). Messages:
//      Init      worker 0: header + initial parameters; other workers: header only. When all
//                W workers have sent theirs (a barrier), each gets back a reply header (tag
//                kTagPsReply) + worker 0's shard (payload tag).
//      PushPull  header (round = the worker's clock after this step, lr) + gradient. The
//                server applies it at once (set_grad, set_lr, step) and answers with the new
//                parameters when the worker's clock is at most `staleness` ahead of the
//                slowest unfinished worker (stale synchronous parallel, Ho et al. 2013);
//                otherwise the pull waits until the slow workers' pushes (or finishes) make it
//                eligible. The reply header's `step` field is that slowest clock.
//      Finish    header only: the worker is done and no longer holds anyone back.
//    A server returns when every worker finished (async) or shut down (sync: ps_shutdown).
//
// Dedicated servers exchange a host-memory header, so they run on host-memory transports
#pragma once

#include <cstdint>

#include "comm/algo_util.h"
#include "comm/algorithms.h"
#include "comm/parameter_server.h"
#include "comm/transport.h"

namespace kiln::comm::ps {

enum class PsKind : uint32_t { Push = 1, Shutdown, Init, PushPull, Finish, Reply };

// The fixed-size header of every message to a dedicated server (and of async replies).
struct PsHeader {
  uint32_t kind = 0;   // PsKind
  uint8_t elem = 0;    // ElemType of the payload
  uint8_t op = 0;      // ReduceOp (sync push)
  uint16_t unused = 0;
  int64_t round = 0;   // async: the worker's clock (steps pushed); sync: 0
  int64_t count = 0;   // payload elements (0 for Shutdown / Finish / a non-initialising Init)
  double lr = 0;       // async push: the learning rate the server's optimizer uses
  int64_t step = 0;    // async reply: the slowest unfinished worker's clock
};
static_assert(sizeof(PsHeader) == 40, "PsHeader must have the same layout on every rank");

// Errors for a layout the transport cannot hold, or a device a dedicated server cannot use.
void check_layout(const Transport& t, const PsOptions& o, const char* what);

// A Buffer over host memory.
Buffer host_buffer(void* data, int64_t count, ElemType type);

// A header of `kind` (Shutdown or Finish) to every server.
void send_done(Transport& t, const PsOptions& o, PsKind kind);

}  // namespace kiln::comm::ps
