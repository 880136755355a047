// sim/nccl_clique.cpp: the rendezvous of a simulated NCCL communicator and the data movement
// of its operations (see nccl_clique.h).
// The collectives' results as the NCCL user guide defines them
// (https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/usage/collectives.html).
//
// Reductions combine the ranks' inputs in rank order 0, 1, ..., n-1, each step rounded to the
// element type (f16, bf16: computed in f32 and rounded to nearest even by the engine's rule,
// engine/host_device.h, as half arithmetic does);
// ncclAvg is that sum divided by n, rounded once. Real NCCL combines in the order of its ring
// or tree (and may pre-scale floating inputs for ncclAvg), so its float results can differ
// from these in the last bits; sums of small integers agree exactly.
#include "engine/cuda/sim/nccl_clique.h"

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "engine/error.h"
#include "engine/host_device.h"

namespace kiln::sim::nccl {

namespace {

using Clock = std::chrono::steady_clock;

// ---- Element rules ------------------------------------------------------------------------

template <typename T>
T combine(T a, T b, ncclRedOp_t op) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;  // wrap-around, as the GPU's integer adds do
    switch (op) {
      case ncclProd: return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
      case ncclMax: return a > b ? a : b;
      case ncclMin: return a < b ? a : b;
      default: return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
    }
  } else {
    switch (op) {
      case ncclProd: return a * b;
      case ncclMax: return a > b ? a : b;
      case ncclMin: return a < b ? a : b;
      default: return a + b;
    }
  }
}
// f16 and bf16 (the engine's Half and BFloat16, engine/host_device.h): in f32, rounded back.
Half combine(Half a, Half b, ncclRedOp_t op) {
  return narrow<Half>(combine(widen(a), widen(b), op));
}
BFloat16 combine(BFloat16 a, BFloat16 b, ncclRedOp_t op) {
  return narrow<BFloat16>(combine(widen(a), widen(b), op));
}

template <typename T>
T divide(T a, int n) {
  return static_cast<T>(a / static_cast<T>(n));
}
Half divide(Half a, int n) { return narrow<Half>(widen(a) / static_cast<float>(n)); }
BFloat16 divide(BFloat16 a, int n) { return narrow<BFloat16>(widen(a) / static_cast<float>(n)); }

// result = op over inputs[0..n), then / n for ncclAvg.
template <typename T>
void reduce(const std::vector<const void*>& inputs, void* result, size_t count, ncclRedOp_t op) {
  T* out = static_cast<T*>(result);
  std::memcpy(out, inputs[0], count * sizeof(T));
  for (size_t r = 1; r < inputs.size(); ++r) {
    const T* in = static_cast<const T*>(inputs[r]);
    for (size_t i = 0; i < count; ++i) out[i] = combine(out[i], in[i], op);
  }
  if (op == ncclAvg) {
    for (size_t i = 0; i < count; ++i) out[i] = divide(out[i], static_cast<int>(inputs.size()));
  }
}

void reduce_any(ncclDataType_t type, const std::vector<const void*>& inputs, void* result,
                size_t count, ncclRedOp_t op) {
  switch (type) {
    case ncclInt8: reduce<int8_t>(inputs, result, count, op); return;
    case ncclUint8: reduce<uint8_t>(inputs, result, count, op); return;
    case ncclInt32: reduce<int32_t>(inputs, result, count, op); return;
    case ncclUint32: reduce<uint32_t>(inputs, result, count, op); return;
    case ncclInt64: reduce<int64_t>(inputs, result, count, op); return;
    case ncclUint64: reduce<uint64_t>(inputs, result, count, op); return;
    case ncclFloat16: reduce<Half>(inputs, result, count, op); return;
    case ncclBfloat16: reduce<BFloat16>(inputs, result, count, op); return;
    case ncclFloat32: reduce<float>(inputs, result, count, op); return;
    case ncclFloat64: reduce<double>(inputs, result, count, op); return;
    default: return;  // rejected when the call was made
  }
}

const char* red_op_name(ncclRedOp_t op) {
  switch (op) {
    case ncclSum: return "sum";
    case ncclProd: return "prod";
    case ncclMax: return "max";
    case ncclMin: return "min";
    case ncclAvg: return "avg";
    default: return "?";
  }
}

std::string describe(const Op& op) {
  std::string s = std::string(op_name(op.kind)) + " of " + std::to_string(op.count) + " " +
                  type_name(op.type);
  if (op.kind == Op::AllReduce) s += std::string(" (") + red_op_name(op.op) + ")";
  if (op.kind == Op::Broadcast) s += " from root " + std::to_string(op.peer);
  return s;
}

}  // namespace

const char* op_name(Op::Kind kind) {
  switch (kind) {
    case Op::AllReduce: return "ncclAllReduce";
    case Op::Broadcast: return "ncclBroadcast";
    case Op::Send: return "ncclSend";
    case Op::Recv: return "ncclRecv";
  }
  return "?";
}

const char* type_name(ncclDataType_t type) {
  switch (type) {
    case ncclInt8: return "int8";
    case ncclUint8: return "uint8";
    case ncclInt32: return "int32";
    case ncclUint32: return "uint32";
    case ncclInt64: return "int64";
    case ncclUint64: return "uint64";
    case ncclFloat16: return "float16";
    case ncclBfloat16: return "bfloat16";
    case ncclFloat32: return "float32";
    case ncclFloat64: return "float64";
    default: return "an unsupported type";
  }
}

size_t type_size(ncclDataType_t type) {
  switch (type) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
  }
}

Clique::Clique(int nranks)
    : nranks_(nranks),
      devices_(nranks, -1),
      next_coll_(nranks, 0),
      next_send_(static_cast<size_t>(nranks) * nranks, 0),
      next_recv_(static_cast<size_t>(nranks) * nranks, 0),
      in_flight_(nranks, 0),
      error_(nranks, ncclSuccess),
      error_why_(nranks) {}

void Clique::fail_join(const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!aborted_) {
    aborted_ = true;
    abort_reason_ = why;
  }
  cv_.notify_all();
}

ncclResult_t Clique::join(int rank, int device, double timeout_s, std::string* why) {
  std::unique_lock<std::mutex> lock(mu_);
  if (aborted_) {
    *why = abort_reason_;
    return ncclSystemError;
  }
  std::string refused;
  if (devices_[rank] >= 0) {
    refused = "ncclCommInitRank: rank " + std::to_string(rank) + " joined this communicator twice";
  }
  for (int r = 0; r < nranks_ && refused.empty(); ++r) {
    if (devices_[r] == device) {  // NCCL: "Duplicate GPU detected"
      refused = "ncclCommInitRank: ranks " + std::to_string(r) + " and " + std::to_string(rank) +
                " are both on CUDA device " + std::to_string(device) + "; NCCL needs one " +
                "device per rank (cudaSetDevice before ncclCommInitRank; KILN_SIM_DEVICES " +
                "sets how many the simulator has)";
    }
  }
  if (!refused.empty()) {  // the communicator can never form: release the ranks waiting
    if (!aborted_) {
      aborted_ = true;
      abort_reason_ = refused;
    }
    cv_.notify_all();
    *why = refused;
    return ncclInvalidUsage;
  }
  devices_[rank] = device;
  if (++joined_ == nranks_) cv_.notify_all();
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  cv_.wait_until(lock, deadline, [&] { return joined_ == nranks_ || aborted_; });
  if (joined_ == nranks_ && !aborted_) return ncclSuccess;
  if (!aborted_) {
    aborted_ = true;
    abort_reason_ = "ncclCommInitRank: only " + std::to_string(joined_) + " of " +
                    std::to_string(nranks_) + " ranks joined within " +
                    std::to_string(static_cast<int>(timeout_s)) + " s (KILN_SIM_NCCL_TIMEOUT_S)";
    cv_.notify_all();
  }
  *why = abort_reason_;
  return ncclSystemError;
}

ncclResult_t Clique::issue(int rank, std::vector<Op>& ops, std::string* why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_) {
    *why = "the communicator was aborted: " + abort_reason_;
    return ncclRemoteError;
  }
  for (Op& op : ops) {
    switch (op.kind) {
      case Op::AllReduce:
      case Op::Broadcast: op.seq = next_coll_[rank]++; break;
      case Op::Send: op.seq = next_send_[static_cast<size_t>(rank) * nranks_ + op.peer]++; break;
      case Op::Recv: op.seq = next_recv_[static_cast<size_t>(rank) * nranks_ + op.peer]++; break;
    }
  }
  ++in_flight_[rank];
  return ncclSuccess;
}

void Clique::cancel(int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  --in_flight_[rank];
  cv_.notify_all();
}

bool Clique::post_collective(int rank, const Op& op) {
  CollSlot& s = colls_[op.seq];
  if (s.ops.empty()) {
    s.ops.resize(nranks_);
    s.posted.assign(nranks_, 0);
    s.left = nranks_;
  }
  s.ops[rank] = op;
  s.posted[rank] = 1;
  if (++s.arrived < nranks_) return false;
  // Everyone is here: the same call on every rank?
  const Op& first = s.ops[0];
  for (int r = 1; r < nranks_ && s.error.empty(); ++r) {
    const Op& o = s.ops[r];
    const bool same = o.kind == first.kind && o.count == first.count && o.type == first.type &&
                      (o.kind != Op::AllReduce || o.op == first.op) &&
                      (o.kind != Op::Broadcast || o.peer == first.peer);
    if (!same) {
      s.error = "collective #" + std::to_string(op.seq) + " differs between ranks: rank 0 " +
                "called " + describe(first) + ", rank " + std::to_string(r) + " called " +
                describe(o) + " (every rank must issue the same collectives in the same order)";
    }
  }
  if (!s.error.empty()) {
    s.done = true;
    return false;
  }
  s.running = true;
  return true;
}

bool Clique::post_p2p(int rank, const Op& op) {
  const P2PKey key = op.kind == Op::Send ? P2PKey{rank, op.peer, op.seq}
                                         : P2PKey{op.peer, rank, op.seq};
  P2PSlot& s = p2p_[key];
  if (op.kind == Op::Send) {
    s.send = op;
    s.send_posted = true;
  } else {
    s.recv = op;
    s.recv_posted = true;
  }
  if (!s.send_posted || !s.recv_posted) return false;
  const size_t sent = s.send.count * type_size(s.send.type);
  const size_t room = s.recv.count * type_size(s.recv.type);
  if (sent != room) {
    s.error = "ncclSend #" + std::to_string(op.seq) + " from rank " +
              std::to_string(std::get<0>(key)) + " to rank " + std::to_string(std::get<1>(key)) +
              " carries " + std::to_string(sent) + " bytes (" + std::to_string(s.send.count) +
              " " + type_name(s.send.type) + ") but the matching ncclRecv expects " +
              std::to_string(room) + " bytes (" + std::to_string(s.recv.count) + " " +
              type_name(s.recv.type) + "); NCCL needs the same count and type on both sides";
    s.done = true;
    return false;
  }
  s.running = true;
  return true;
}

void Clique::move_collective(uint64_t seq) {
  CollSlot* s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    s = &colls_.at(seq);  // std::map: the node stays put while others are inserted
  }
  const Op& first = s->ops[0];
  const size_t bytes = first.count * type_size(first.type);
  if (first.kind == Op::Broadcast) {
    const void* src = s->ops[first.peer].send;
    for (int r = 0; r < nranks_; ++r) {
      if (s->ops[r].recv != src) std::memcpy(s->ops[r].recv, src, bytes);
    }
    return;
  }
  // In place is allowed (sendbuff == recvbuff): reduce into a temporary, then hand it out.
  std::vector<const void*> inputs(nranks_);
  for (int r = 0; r < nranks_; ++r) inputs[r] = s->ops[r].send;
  std::vector<unsigned char> result(bytes);
  reduce_any(first.type, inputs, result.data(), first.count, first.op);
  for (int r = 0; r < nranks_; ++r) std::memcpy(s->ops[r].recv, result.data(), bytes);
}

void Clique::move_p2p(const P2PKey& key) {
  P2PSlot* s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    s = &p2p_.at(key);
  }
  const size_t bytes = s->send.count * type_size(s->send.type);
  if (s->recv.recv != s->send.send) std::memmove(s->recv.recv, s->send.send, bytes);
}

void Clique::fail_rank(int rank, ncclResult_t code, const std::string& why) {
  if (error_[rank] == ncclSuccess) {
    error_[rank] = code;
    error_why_[rank] = why;
  }
}

void Clique::run(int rank, const std::vector<Op>& ops, double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  struct Mine {
    const Op* op;
    P2PKey key;
  };
  std::vector<Mine> mine;
  std::vector<Mine> to_move;
  if (!aborted_) {
    for (const Op& op : ops) {
      const bool collective = op.kind == Op::AllReduce || op.kind == Op::Broadcast;
      const P2PKey key = collective ? P2PKey{-1, -1, op.seq}
                         : op.kind == Op::Send ? P2PKey{rank, op.peer, op.seq}
                                               : P2PKey{op.peer, rank, op.seq};
      mine.push_back({&op, key});
      if (collective ? post_collective(rank, op) : post_p2p(rank, op)) {
        to_move.push_back({&op, key});
      }
    }
  }
  // Move the bytes of the matches this rank completed, outside the lock (the other ranks
  // involved wait for `done`, so their buffers stay put).
  if (!to_move.empty()) {
    lock.unlock();
    for (const Mine& m : to_move) {
      if (std::get<0>(m.key) < 0) {
        move_collective(m.op->seq);
      } else {
        move_p2p(m.key);
      }
    }
    lock.lock();
    for (const Mine& m : to_move) {
      const bool coll = std::get<0>(m.key) < 0;
      bool& running = coll ? colls_.at(m.op->seq).running : p2p_.at(m.key).running;
      bool& done = coll ? colls_.at(m.op->seq).done : p2p_.at(m.key).done;
      running = false;
      done = true;
    }
    cv_.notify_all();
  }

  // Wait for the matches the other ranks complete. An abort releases the wait, but never
  // while someone is still writing into this rank's buffers.
  auto state = [&](const Mine& m, bool* running) {
    if (std::get<0>(m.key) < 0) {
      const CollSlot& s = colls_.at(m.op->seq);
      *running = s.running;
      return s.done;
    }
    const P2PSlot& s = p2p_.at(m.key);
    *running = s.running;
    return s.done;
  };
  auto settled = [&] {
    bool all_done = true, any_running = false;
    for (const Mine& m : mine) {
      bool running = false;
      all_done = state(m, &running) && all_done;
      any_running = any_running || running;
    }
    return all_done || (aborted_ && !any_running);
  };
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  if (!cv_.wait_until(lock, deadline, settled)) {
    // A peer never came: fail the whole communicator, as a watchdog would, so that no rank
    // waits for this one either.
    aborted_ = true;
    abort_reason_ = "rank " + std::to_string(rank) + " waited " +
                    std::to_string(static_cast<int>(timeout_s)) + " s for its peers in " +
                    std::string(ops.empty() ? "an operation" : op_name(ops.front().kind)) +
                    " (KILN_SIM_NCCL_TIMEOUT_S)";
    cv_.notify_all();
    cv_.wait(lock, settled);
  }

  // Collect the outcome, and free the slots every participant has seen.
  std::string failure;
  ncclResult_t code = ncclSuccess;
  for (const Mine& m : mine) {
    bool running = false;
    const bool done = state(m, &running);
    const std::string& error = std::get<0>(m.key) < 0 ? colls_.at(m.op->seq).error
                                                      : p2p_.at(m.key).error;
    if (failure.empty() && done && !error.empty()) {
      failure = error;
      code = ncclInvalidUsage;
    } else if (failure.empty() && !done) {
      failure = describe(*m.op) + " did not complete: the communicator was aborted (" +
                abort_reason_ + ")";
      code = ncclRemoteError;
    }
    if (std::get<0>(m.key) < 0) {
      if (--colls_.at(m.op->seq).left == 0) colls_.erase(m.op->seq);
    } else if (--p2p_.at(m.key).left == 0) {
      p2p_.erase(m.key);
    }
  }
  if (mine.empty() && aborted_ && !ops.empty()) {
    failure = describe(ops.front()) + " did not start: the communicator was aborted (" +
              abort_reason_ + ")";
    code = ncclRemoteError;
  }
  if (!failure.empty()) fail_rank(rank, code, failure);
  --in_flight_[rank];
  cv_.notify_all();
  if (!failure.empty()) {
    throw Error("NCCL (simulator), rank " + std::to_string(rank) + ": " + failure);
  }
}

void Clique::abort(int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!aborted_) {
    aborted_ = true;
    abort_reason_ = "rank " + std::to_string(rank) + " called ncclCommAbort";
  }
  for (int r = 0; r < nranks_; ++r) {
    if (r != rank) fail_rank(r, ncclRemoteError, "a peer failed: " + abort_reason_);
  }
  cv_.notify_all();
}

void Clique::drain(int rank, double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, std::chrono::duration<double>(timeout_s),
               [&] { return in_flight_[rank] == 0; });
}

ncclResult_t Clique::async_error(int rank, std::string* why) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (why != nullptr) *why = error_why_[rank];
  return error_[rank];
}

}  // namespace kiln::sim::nccl
