// ps_async_worker.cpp: a worker of the asynchronous parameter server: init, push_pull, finish.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/algo_util.h"
#include "comm/ps_protocol.h"

namespace kiln::comm {

using namespace ps;

AsyncPsWorker::AsyncPsWorker(Transport& t, PsOptions options, int64_t count)
    : t_(t), options_(options), count_(count) {
  check_layout(t, options, "AsyncPsWorker");
  KILN_CHECK(t.rank() < options.workers, "AsyncPsWorker: rank ", t.rank(), " is not a worker "
             "(workers are ranks 0..", options.workers - 1, ")");
  KILN_CHECK(count >= 0, "AsyncPsWorker: count must be >= 0, got ", count);
}

AsyncPsWorker::~AsyncPsWorker() {
  if (finished_) return;
  try {
    finish();
  } catch (...) {
    // Destructors do not throw: the servers will time out and say so.
  }
}

namespace {

// One request/reply round with every server: header (+ this worker's shard of `send`), then the
// reply header and the server's parameters into `params`. Returns the largest staleness the
// servers reported (their clock for this worker minus the slowest clock).
int64_t exchange_with_servers(Transport& t, const PsOptions& o, int64_t count, PsKind kind,
                              int64_t round, double lr, const float* send, float* params) {
  const int S = o.servers;
  std::vector<PsHeader> out(S), in(S);
  std::vector<P2POp> ops;
  for (int s = 0; s < S; ++s) {
    const int64_t off = chunk_offset(count, S, s), len = chunk_count(count, S, s);
    PsHeader& h = out[s];
    h.kind = static_cast<uint32_t>(kind);
    h.elem = static_cast<uint8_t>(ElemType::F32);
    h.round = round;
    h.lr = lr;
    h.count = send != nullptr ? len : 0;
    ops.push_back(P2POp::send(&h, sizeof h, o.workers + s, kTagPsHeader));
    if (send != nullptr)
      ops.push_back(P2POp::send(send + off, len * sizeof(float), o.workers + s, kTagPsPayload));
    ops.push_back(P2POp::recv(&in[s], sizeof(PsHeader), o.workers + s, kTagPsReply));
    ops.push_back(P2POp::recv(params + off, len * sizeof(float), o.workers + s, kTagPsPayload));
  }
  auto req = t.start(ops);
  req->wait();
  int64_t staleness = 0;
  for (int s = 0; s < S; ++s) {
    KILN_CHECK(in[s].kind == static_cast<uint32_t>(PsKind::Reply) &&
                   in[s].count == chunk_count(count, S, s),
               "AsyncPsWorker: rank ", t.rank(), ": a malformed reply from server ",
               o.workers + s);
    staleness = std::max(staleness, in[s].round - in[s].step);
  }
  return staleness;
}

}  // namespace

void AsyncPsWorker::init(float* params) {
  KILN_CHECK(step_ == 0 && !finished_, "AsyncPsWorker::init: call it once, before push_pull");
  if (t_.rank() == 0) {
    // Worker 0 sends its parameters and gets the same values back: receive them elsewhere, so
    // no receive writes into a buffer a send may still be reading.
    std::vector<float> echo(static_cast<size_t>(count_));
    exchange_with_servers(t_, options_, count_, PsKind::Init, 0, 0, params, echo.data());
  } else {
    exchange_with_servers(t_, options_, count_, PsKind::Init, 0, 0, nullptr, params);
  }
}

void AsyncPsWorker::push_pull(const float* grad, float* params, double lr) {
  KILN_CHECK(!finished_, "AsyncPsWorker::push_pull after finish()");
  ++step_;
  const int64_t s = exchange_with_servers(t_, options_, count_, PsKind::PushPull, step_, lr,
                                          grad, params);
  max_staleness_seen_ = std::max<int>(max_staleness_seen_, static_cast<int>(s));
}

void AsyncPsWorker::finish() {
  if (finished_) return;
  finished_ = true;
  send_done(t_, options_, PsKind::Finish);
}

}  // namespace kiln::comm
