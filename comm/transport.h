// transport.h: how bytes move between ranks. The one thing a transport must do.
//
// A Transport connects `size()` ranks and moves bytes between two of them. Everything else in
// comm/ (ring, halving-doubling, the parameter server, DataParallel) is written once on top of
// `start()`, so each algorithm runs unchanged over every transport:
//
//   local   N ranks as threads of one process, mailboxes in shared memory (comm/local_transport.h)
//   mpi     Open MPI point-to-point, one rank per process, any number of hosts (comm/mpi_transport.h)
//   nccl    GPU memory to GPU memory with ncclSend/ncclRecv (comm/nccl_transport.h)
//
// start() posts a batch of sends and receives at once and returns a Request; the batch
// progresses as a whole. Posting both directions of an exchange together is what makes an
// exchange deadlock-free on every transport: MPI_Send of a large message, and ncclSend always,
// block until the peer posts the matching receive, so "send to next, then receive from prev"
// written as two blocking calls deadlocks as soon as every rank does it at once.
//
// Matching is MPI's: a receive matches the oldest unmatched send from its `peer` (or from any
// rank, kAnySource) with the same `tag`; messages between two ranks with one tag never overtake
// each other. A receive's buffer must be at least as large as the message; the bytes that came
// are in Request::received_bytes().
//
// Failures never hang: a Request that is not complete after the transport's timeout throws
// kiln::Error naming this rank, the peer, the tag and the timeout (KILN_COMM_TIMEOUT_S, default
// 300 s). A peer known to be dead ends a wait at once, with an error naming it (check_peers()):
// a local group whose rank failed makes every other rank's wait throw; an MPI rank whose process
// on the same host is gone or a zombie is noticed within kPeerCheckSeconds
// (comm/peer_liveness.h); NCCL waits ask their bootstrap transport the same.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/device.h"
#include "engine/error.h"

namespace kiln::comm {

constexpr int kAnySource = -1;

// The element types that travel: the gradients' f32/f64, and f16 / bf16 for compression on the
// wire (comm/wire_format.h; stored as the engine's Half / BFloat16, reductions add in f32).
enum class ElemType : uint8_t { F32, F64, F16, BF16 };
size_t elem_size(ElemType t);
const char* elem_name(ElemType t);

enum class ReduceOp : uint8_t { Sum, Average };  // Average: the sum divided by the group size
const char* reduce_op_name(ReduceOp op);

// A typed span of memory on `device` (the transport's device(): host memory for local and mpi,
// the rank's GPU for nccl).
struct Buffer {
  void* data = nullptr;
  int64_t count = 0;  // elements
  ElemType type = ElemType::F32;
  Device device;
  size_t bytes() const { return static_cast<size_t>(count) * elem_size(type); }
  // Elements [offset, offset + n) of this buffer.
  Buffer slice(int64_t offset, int64_t n) const;
};

// One half of a point-to-point transfer.
struct P2POp {
  enum Kind : uint8_t { Send, Recv } kind;
  void* data;    // Send: read from; Recv: written to. Untouched by the caller until the wait.
  size_t bytes;  // Send: the message size; Recv: the buffer's capacity
  int peer;      // Recv may use kAnySource
  int tag;       // >= 0
  static P2POp send(const void* data, size_t bytes, int peer, int tag) {
    return {Send, const_cast<void*>(data), bytes, peer, tag};
  }
  static P2POp recv(void* data, size_t bytes, int peer, int tag) {
    return {Recv, data, bytes, peer, tag};
  }
};

// A posted batch of P2POps.
class Request {
 public:
  virtual ~Request();
  // Blocks until every op of the batch is complete. Throws kiln::Error on a timeout or when the
  // group failed. Calling it again after it returned is a no-op.
  virtual void wait() = 0;
  // Non-blocking: true when every op is complete (wait() then returns at once).
  virtual bool test() = 0;
  // After completion: the rank that sent the message op i received (useful with kAnySource),
  // and how many bytes came. -1 / 0 for sends.
  virtual int source(size_t op) const = 0;
  virtual size_t received_bytes(size_t op) const = 0;
};

class Transport {
 public:
  virtual ~Transport();
  virtual const char* name() const = 0;  // "local", "mpi", "nccl"
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual int local_rank() const = 0;  // rank among the ranks of this host
  virtual int local_size() const = 0;
  virtual std::string host() const = 0;
  // Where the buffers passed to start() must live: the CPU, or this rank's GPU for nccl.
  virtual Device device() const { return Device(); }

  // Posts the ops (sends and receives, to and from any peers) and returns at once.
  virtual std::unique_ptr<Request> start(const std::vector<P2POp>& ops) = 0;
  // Convenience: start(ops)->wait().
  void run(const std::vector<P2POp>& ops);

  // The library's own allreduce (MPI_Allreduce, ncclAllReduce), for comparison: Algorithm
  // "native". Transports without one throw a Usage error saying which algorithms work.
  virtual bool has_native_allreduce() const { return false; }
  virtual void native_allreduce(const Buffer& buf, ReduceOp op);

  // Throws kiln::Error (Runtime) naming a peer that is known to have died, with `waiting_for`
  // (what this rank was waiting for, e.g. "a receive from rank 1 (tag 3)") in the message;
  // returns when none is known dead. local: a rank whose function failed; mpi: a rank on this
  // host whose process is gone or a zombie (peers on other hosts are not seen: the timeout
  // covers them); nccl: its bootstrap's answer. Cheap (a few /proc reads): waits call it every
  // kPeerCheckSeconds.
  virtual void check_peers(const std::string& waiting_for) const { (void)waiting_for; }

  // Stops the whole group after an unrecoverable error on this rank: the local transport makes
  // every other rank's wait throw `why`; MPI calls MPI_Abort. Never returns for MPI.
  virtual void abort(const std::string& why) noexcept = 0;

  // Bytes this rank has sent through start() (payload only), since construction.
  uint64_t bytes_sent() const { return bytes_sent_.load(std::memory_order_relaxed); }
  // Seconds a Request may wait before it fails (KILN_COMM_TIMEOUT_S, default 300).
  double timeout_seconds() const { return timeout_seconds_; }
  void set_timeout_seconds(double s) { timeout_seconds_ = s; }

 protected:
  Transport();
  void count_sent(size_t bytes) { bytes_sent_.fetch_add(bytes, std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> bytes_sent_{0};
  double timeout_seconds_;
};

// How often a wait that is not done asks check_peers() (seconds).
constexpr double kPeerCheckSeconds = 0.1;

// The error check_peers() throws: "rank 0/3 (mpi): <dead>; this rank stopped waiting for
// <waiting_for>. ..."
Error peer_died_error(const Transport& t, const std::string& dead, const std::string& waiting_for);

// The timeout read from KILN_COMM_TIMEOUT_S (seconds, > 0), else 300. A malformed value is a
// Usage error naming the variable.
double default_timeout_seconds();

// The error every transport throws for a wait that ran out of time.
Error timeout_error(const Transport& t, const std::string& what, double waited_seconds);

}  // namespace kiln::comm
