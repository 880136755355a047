// sim/nccl_clique.h: where the ranks of a simulated NCCL communicator meet (internal to the
// simulator; the API is sim/nccl.h, implemented in nccl.cpp).
// The matching rules are NCCL's (user guide, "Collective Operations" and "Point-to-point
// communication": https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/usage.html).
//
// A Clique is the state the ranks of one communicator share. Matching is decided on the host
// thread that issues the calls, in issue order, as NCCL requires every rank to issue its
// collectives in the same order: the k-th collective of rank r meets the k-th collective of
// every other rank, and the k-th send from a to b meets the k-th receive of b from a (issue()
// stamps each op with that k). The bytes move later, on the stream: run() is the work queued
// there. It posts the rank's ops; the rank that completes a match (the last to arrive at a
// collective, the second side of a send/receive pair) moves the bytes for everyone involved,
// outside the lock, and the others wait for it. All ops of one run() are posted before it
// waits for any, which is what makes a group's send+receive ring progress.
//
// run() never references the caller's stack: the ops are values, the clique is shared, so the
// work may run on the issuing thread (synchronous streams) or on a stream's worker thread.
// A mismatch fails the op on every rank involved; abort() and the rendezvous timeout fail
// every op still waiting. A failed run() records the rank's asynchronous error and throws
// kiln::Error (the stream's fault).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "engine/cuda/sim/nccl.h"

namespace kiln::sim::nccl {

struct Op {
  enum Kind { AllReduce, Broadcast, Send, Recv } kind = AllReduce;
  const void* send = nullptr;  // AllReduce, Broadcast (root), Send
  void* recv = nullptr;        // AllReduce, Broadcast, Recv
  size_t count = 0;            // elements of `type`
  ncclDataType_t type = ncclFloat32;
  ncclRedOp_t op = ncclSum;    // AllReduce
  int peer = 0;                // Send/Recv: the other rank; Broadcast: the root
  uint64_t seq = 0;            // stamped by issue()
};

const char* op_name(Op::Kind kind);  // "ncclAllReduce", ...
const char* type_name(ncclDataType_t type);
size_t type_size(ncclDataType_t type);  // 0 for a type the simulator does not move

class Clique {
 public:
  explicit Clique(int nranks);
  int nranks() const { return nranks_; }

  // ncclCommInitRank: joins `rank` on `device`, then waits until every rank has joined.
  // ncclSuccess, or an error with *why set.
  ncclResult_t join(int rank, int device, double timeout_s, std::string* why);

  // On the issuing thread: stamps the ops with their match numbers and counts one queued
  // run() for `rank`. ncclRemoteError (and *why) once the clique is aborted.
  ncclResult_t issue(int rank, std::vector<Op>& ops, std::string* why);
  // The work on the stream: posts `ops` for `rank`, waits for the matches, moves the bytes.
  void run(int rank, const std::vector<Op>& ops, double timeout_s);
  // A queued run() that will never run (the stream dropped it): uncounts it.
  void cancel(int rank);

  // ncclCommAbort by `rank`: every waiting op fails, the other ranks' async error becomes
  // ncclRemoteError.
  void abort(int rank);
  // A rank's ncclCommInitRank failed (`why`): the ranks waiting to join fail at once.
  void fail_join(const std::string& why);
  // ncclCommDestroy: waits (up to timeout_s) until the rank's queued runs have finished.
  void drain(int rank, double timeout_s);
  ncclResult_t async_error(int rank, std::string* why) const;

 private:
  struct CollSlot {
    std::vector<Op> ops;           // per rank
    std::vector<char> posted;      // per rank
    int arrived = 0, left = 0;     // left: ranks that have not collected the result yet
    bool running = false, done = false;
    std::string error;
  };
  struct P2PSlot {
    Op send, recv;
    bool send_posted = false, recv_posted = false;
    int left = 2;
    bool running = false, done = false;
    std::string error;
  };
  using P2PKey = std::tuple<int, int, uint64_t>;  // (source, destination, match number)

  // Each returns true when this post completed the match and the caller must move the bytes.
  bool post_collective(int rank, const Op& op);
  bool post_p2p(int rank, const Op& op);
  void move_collective(uint64_t seq);  // outside the lock: the slot is `running`
  void move_p2p(const P2PKey& key);
  void fail_rank(int rank, ncclResult_t code, const std::string& why);

  const int nranks_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int> devices_;  // -1 until joined
  int joined_ = 0;
  bool aborted_ = false;
  std::string abort_reason_;
  std::vector<uint64_t> next_coll_;      // per rank
  std::vector<uint64_t> next_send_;      // [src * n + dst]
  std::vector<uint64_t> next_recv_;      // [dst * n + src]
  std::vector<int> in_flight_;           // per rank: issued runs not finished
  std::vector<ncclResult_t> error_;      // per rank: the asynchronous error
  std::vector<std::string> error_why_;
  std::map<uint64_t, CollSlot> colls_;
  std::map<P2PKey, P2PSlot> p2p_;
};

}  // namespace kiln::sim::nccl
