// ps_server.cpp: a dedicated parameter server rank, synchronous or asynchronous
// (ps_protocol.h has the messages).
#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "comm/algo_util.h"
#include "comm/algorithms.h"
#include "comm/ps_protocol.h"

namespace kiln::comm {
namespace {

using namespace ps;

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

}  // namespace

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

}  // namespace kiln::comm
