// parameter_server.cpp: the parameter-server pattern (Dean et al. 2012; Li et al. 2014) on Transport::start().
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
// (local, mpi); co-located PS runs anywhere (nccl too).
#include "comm/parameter_server.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <string>

#include "comm/algo_util.h"
#include "comm/algorithms.h"

namespace kiln::comm {
namespace {

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

void check_layout(const Transport& t, const PsOptions& o, const char* what) {
  KILN_CHECK(o.workers >= 1 && o.servers >= 1, what, ": need at least 1 worker and 1 server, got ",
             o.workers, " workers and ", o.servers, " servers");
  KILN_CHECK(o.workers + o.servers <= t.size(), what, ": ", o.workers, " workers + ", o.servers,
             " servers need ", o.workers + o.servers, " ranks, the transport has ", t.size());
  if (!t.device().is_cpu()) {
    throw Error(std::string(what) + ": dedicated parameter servers need a host-memory transport "
                "(local or mpi), not " + t.name() + "; use ps_servers 0 (co-located) or ring",
                ErrorKind::Usage);
  }
  KILN_CHECK(o.staleness >= 0, what, ": staleness must be >= 0, got ", o.staleness);
}

Buffer host_buffer(void* data, int64_t count, ElemType type) {
  Buffer b;
  b.data = data;
  b.count = count;
  b.type = type;
  return b;
}

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

// ---- The server ----------------------------------------------------------------------------

class Server {
 public:
  Server(Transport& t, const PsOptions& o, const OptimizerFactory& make)
      : t_(t), o_(o), make_(make), finished_(o.workers, false), clock_(o.workers, 0) {}

  void run() {
    int done = 0;
    while (done < o_.workers) {
      PsHeader h;
      auto req = t_.start({P2POp::recv(&h, sizeof h, kAnySource, kTagPsHeader)});
      req->wait();
      const int src = req->source(0);
      KILN_CHECK(req->received_bytes(0) == sizeof h && src >= 0 && src < o_.workers,
                 "parameter server ", t_.rank(), ": a malformed header from rank ", src,
                 " (", req->received_bytes(0), " bytes): is every rank running the same "
                 "program with the same --ps-servers?");
      switch (static_cast<PsKind>(h.kind)) {
        case PsKind::Push: on_push(src, h); break;
        case PsKind::Init: on_init(src, h); break;
        case PsKind::PushPull: on_push_pull(src, h); break;
        case PsKind::Shutdown:
        case PsKind::Finish:
          KILN_CHECK(!finished_[src], "parameter server ", t_.rank(), ": worker ", src,
                     " finished twice");
          finished_[src] = true;
          ++done;
          answer_eligible();
          break;
        default:
          throw Error("parameter server " + std::to_string(t_.rank()) + ": unknown message kind " +
                      std::to_string(h.kind) + " from rank " + std::to_string(src));
      }
    }
  }

 private:
  // Receives the payload that follows a header from `src` into `dst`.
  void recv_payload(int src, void* dst, size_t bytes) {
    auto req = t_.start({P2POp::recv(dst, bytes, src, kTagPsPayload)});
    req->wait();
    KILN_CHECK(req->received_bytes(0) == bytes, "parameter server ", t_.rank(), ": expected a ",
               bytes, "-byte payload from rank ", src, ", got ", req->received_bytes(0));
  }

  // Synchronous: collect every worker's shard, sum in worker order, send the sum to all.
  void on_push(int src, const PsHeader& h) {
    const ElemType type = static_cast<ElemType>(h.elem);
    if (arrived_ == 0) {
      round_count_ = h.count;
      round_type_ = type;
      round_op_ = static_cast<ReduceOp>(h.op);
      slots_.assign(static_cast<size_t>(o_.workers) * h.count * elem_size(type), 0);
      pushed_.assign(o_.workers, false);
    }
    KILN_CHECK(h.count == round_count_ && type == round_type_, "parameter server ", t_.rank(),
               ": worker ", src, " pushed ", h.count, " x ", elem_name(type), ", others ",
               round_count_, " x ", elem_name(round_type_), ": all workers must allreduce the "
               "same buffers in the same order");
    KILN_CHECK(!pushed_[src], "parameter server ", t_.rank(), ": worker ", src,
               " pushed twice in one round");
    const size_t bytes = static_cast<size_t>(h.count) * elem_size(type);
    recv_payload(src, slots_.data() + src * bytes, bytes);
    pushed_[src] = true;
    if (++arrived_ < o_.workers) return;
    arrived_ = 0;
    auto slot = [&](int w) { return host_buffer(slots_.data() + w * bytes, h.count, type); };
    for (int w = 1; w < o_.workers; ++w) reduce_into(slot(0), slot(w));
    if (round_op_ == ReduceOp::Average) scale(slot(0), 1.0 / o_.workers);
    std::vector<P2POp> ops;
    for (int w = 0; w < o_.workers; ++w)
      ops.push_back(P2POp::send(slots_.data(), bytes, w, kTagPsPayload));
    t_.run(ops);
  }

  // Asynchronous: worker 0 brings the parameters; every worker gets them back once all W
  // have asked (init is a barrier, so no push can change them before everyone has them).
  void on_init(int src, const PsHeader& h) {
    KILN_CHECK(std::find(init_waiting_.begin(), init_waiting_.end(), src) == init_waiting_.end() &&
                   !initialised_,
               "parameter server ", t_.rank(), ": worker ", src, " called init() twice");
    if (src == 0) {
      KILN_CHECK(make_, "parameter server ", t_.rank(), ": asynchronous mode needs an optimizer "
                 "factory (serve(t, options, make_optimizer))");
      Tensor p = Tensor::empty({h.count}, DType::F32);
      recv_payload(src, p.raw_data(), static_cast<size_t>(h.count) * sizeof(float));
      p.set_requires_grad(true);
      param_ = p;
      optimizer_ = make_({param_});
    }
    init_waiting_.push_back(src);
    if (static_cast<int>(init_waiting_.size()) == o_.workers) {
      initialised_ = true;
      for (int w : init_waiting_) reply(w);
      init_waiting_.clear();
    }
  }

  void on_push_pull(int src, const PsHeader& h) {
    KILN_CHECK(param_.defined(), "parameter server ", t_.rank(), ": worker ", src,
               " pushed before worker 0 called init()");
    KILN_CHECK(h.count == param_.numel(), "parameter server ", t_.rank(), ": worker ", src,
               " pushed ", h.count, " elements, the shard has ", param_.numel());
    Tensor g = Tensor::empty({h.count}, DType::F32);
    recv_payload(src, g.raw_data(), static_cast<size_t>(h.count) * sizeof(float));
    if (h.count > 0) {
      param_.set_grad(g);
      optimizer_->set_lr(h.lr);
      optimizer_->step();
    }
    clock_[src] = h.round;
    deferred_.push_back(src);
    answer_eligible();
  }

  // The slowest clock among unfinished workers (the worker asking is unfinished).
  int64_t slowest() const {
    int64_t m = LLONG_MAX;
    for (int w = 0; w < o_.workers; ++w)
      if (!finished_[w]) m = std::min(m, clock_[w]);
    return m;
  }

  // Answers every deferred pull whose worker is now within the staleness bound.
  void answer_eligible() {
    if (deferred_.empty()) return;
    const int64_t slow = slowest();
    std::vector<int> still;
    for (int w : deferred_) {
      if (clock_[w] - slow <= o_.staleness) reply(w);
      else still.push_back(w);
    }
    deferred_.swap(still);
  }

  void reply(int w) {
    PsHeader h;
    h.kind = static_cast<uint32_t>(PsKind::Reply);
    h.elem = static_cast<uint8_t>(ElemType::F32);
    h.round = clock_[w];
    h.step = slowest();
    h.count = param_.numel();
    t_.run({P2POp::send(&h, sizeof h, w, kTagPsReply),
            P2POp::send(param_.raw_data(), static_cast<size_t>(h.count) * sizeof(float), w,
                        kTagPsPayload)});
  }

  Transport& t_;
  PsOptions o_;
  const OptimizerFactory& make_;
  std::vector<bool> finished_;
  // synchronous round
  int arrived_ = 0;
  int64_t round_count_ = 0;
  ElemType round_type_ = ElemType::F32;
  ReduceOp round_op_ = ReduceOp::Sum;
  std::vector<char> slots_;
  std::vector<bool> pushed_;
  // asynchronous
  Tensor param_;
  std::unique_ptr<Optimizer> optimizer_;
  std::vector<int64_t> clock_;
  std::vector<int> deferred_, init_waiting_;
  bool initialised_ = false;
};

void send_done(Transport& t, const PsOptions& o, PsKind kind) {
  std::vector<PsHeader> headers(o.servers);
  std::vector<P2POp> ops;
  for (int s = 0; s < o.servers; ++s) {
    headers[s].kind = static_cast<uint32_t>(kind);
    ops.push_back(P2POp::send(&headers[s], sizeof(PsHeader), o.workers + s, kTagPsHeader));
  }
  t.run(ops);
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

void serve(Transport& t, const PsOptions& options, const OptimizerFactory& make_optimizer) {
  check_layout(t, options, "serve");
  KILN_CHECK(t.rank() >= options.workers && t.rank() < options.workers + options.servers,
             "serve: rank ", t.rank(), " is not a server (servers are ranks ", options.workers,
             "..", options.workers + options.servers - 1, ")");
  if (options.async && !make_optimizer) {
    throw Error("serve: the asynchronous parameter server needs an optimizer factory, e.g. "
                "[](std::vector<Tensor> p) { return std::make_unique<SGD>(p, 0.01); }",
                ErrorKind::Usage);
  }
  Server(t, options, make_optimizer).run();
}

void ps_shutdown(Transport& t, const PsOptions& options) {
  check_layout(t, options, "ps_shutdown");
  KILN_CHECK(t.rank() < options.workers, "ps_shutdown: rank ", t.rank(), " is not a worker");
  send_done(t, options, PsKind::Shutdown);
}

// ---- AsyncPsWorker -------------------------------------------------------------------------

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
