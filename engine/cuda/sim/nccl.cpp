// sim/nccl.cpp: the simulated NCCL API (sim/nccl.h): unique ids, communicator handles, the
// argument checks every call makes at once, and groups. The rendezvous itself and the data
// movement are nccl_clique.cpp's.
// Follows the NCCL user guide and API (https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/),
// "Communicator Creation and Management" and "Group Calls".
//
// A call (or a whole group, at its outermost ncclGroupEnd) is issued in two steps on the
// calling thread: Clique::issue stamps its ops with their match numbers, then enqueue()
// queues Clique::run on the stream, with the ops and the clique captured by value. A failure
// on the stream (a mismatch, an abort) is the stream's fault and the rank's async error; with
// KILN_SIM_SYNC=1 the call waits for its work and returns that error itself.
#include "engine/cuda/sim/nccl.h"

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "engine/cuda/sim/internal.h"
#include "engine/cuda/sim/nccl_clique.h"

struct ncclComm {
  std::shared_ptr<kiln::sim::nccl::Clique> clique;
  int rank;
  int device;
};

namespace kiln::sim::nccl {
namespace {

// The id: a marker, the process that made it, and a number unique within that process.
constexpr char kIdMarker[] = "kiln-sim-nccl-id";
struct IdFields {
  char marker[sizeof kIdMarker];
  int64_t pid;
  uint64_t number;
};
static_assert(sizeof(IdFields) <= NCCL_UNIQUE_ID_BYTES, "the id fields must fit the id");

std::atomic<uint64_t> g_next_id{1};

// Cliques being joined, by id number; a clique leaves once every rank has joined.
// Never destroyed: communicators may be destroyed by static objects while the process exits.
std::mutex& g_mu = *new std::mutex;
std::unordered_map<uint64_t, std::shared_ptr<Clique>>& g_joining =
    *new std::unordered_map<uint64_t, std::shared_ptr<Clique>>;
std::unordered_set<ncclComm*>& g_comms = *new std::unordered_set<ncclComm*>;  // live handles

thread_local std::string t_last_error;

double timeout_seconds() {
  static const double s = static_cast<double>(env_size("KILN_SIM_NCCL_TIMEOUT_S", 300));
  return s;
}

ncclResult_t fail(ncclResult_t code, std::string why) {
  t_last_error = std::move(why);
  return code;
}

// A copy of a live handle's fields (the handle may be destroyed while its work runs).
bool lookup(ncclComm_t comm, ncclComm* out) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (comm == nullptr || g_comms.count(comm) == 0) return false;
  *out = *comm;
  return true;
}

// The current device of this thread, switched for a scope (NCCL works on the comm's device).
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    cudaGetDevice(&previous_);
    cudaSetDevice(device);
  }
  ~DeviceScope() { cudaSetDevice(previous_); }

 private:
  int previous_ = 0;
};

// Held by the queued work: if the stream drops it without running it (the device has a sticky
// fault, or enqueue refused it), its destruction tells the clique the run will never come.
class RunToken {
 public:
  RunToken(std::shared_ptr<Clique> clique, int rank) : clique_(std::move(clique)), rank_(rank) {}
  ~RunToken() {
    if (!ran_) clique_->cancel(rank_);
  }
  RunToken(const RunToken&) = delete;
  RunToken& operator=(const RunToken&) = delete;
  void run(const std::vector<Op>& ops, double timeout_s) {
    ran_ = true;
    clique_->run(rank_, ops, timeout_s);
  }

 private:
  std::shared_ptr<Clique> clique_;
  int rank_;
  bool ran_ = false;
};

// ---- Groups -----------------------------------------------------------------------------------
struct Pending {
  ncclComm comm;
  cudaStream_t stream;
  Op op;
};
thread_local int t_group_depth = 0;
thread_local std::vector<Pending> t_group;
thread_local ncclResult_t t_group_error = ncclSuccess;

// Queues the ops of one communicator, one run per stream, in the order they were called.
ncclResult_t issue(const std::vector<Pending>& calls) {
  if (calls.empty()) return ncclSuccess;
  const ncclComm& comm = calls.front().comm;
  for (const Pending& p : calls) {
    if (p.comm.clique != comm.clique || p.comm.rank != comm.rank) {
      return fail(ncclInvalidUsage, "ncclGroupEnd: the simulator takes the calls of one "
                  "communicator rank per group (one rank per host thread)");
    }
  }
  std::vector<cudaStream_t> streams;
  for (const Pending& p : calls) {
    bool seen = false;
    for (cudaStream_t s : streams) seen = seen || s == p.stream;
    if (!seen) streams.push_back(p.stream);
  }
  // A collective's run is matched with the other ranks' when it is issued, once; a graph would
  // replay it. The simulator does not model NCCL in graphs (a GPU allows it): the call fails
  // and the capture is invalidated.
  for (cudaStream_t stream : streams) {
    if (capturing(stream)) {
      invalidate_capture(stream);
      return fail(ncclInvalidUsage, std::string(op_name(calls.front().op.kind)) +
                  ": the simulator does not capture NCCL calls into CUDA graphs");
    }
  }
  for (cudaStream_t stream : streams) {
    std::vector<Op> ops;
    for (const Pending& p : calls) {
      if (p.stream == stream) ops.push_back(p.op);
    }
    std::string why;
    if (const ncclResult_t rc = comm.clique->issue(comm.rank, ops, &why); rc != ncclSuccess) {
      return fail(rc, why);
    }
    auto token = std::make_shared<RunToken>(comm.clique, comm.rank);
    const double timeout = timeout_seconds();
    DeviceScope scope(comm.device);
    const cudaError_t rc = enqueue(stream, op_name(ops.front().kind),
                                   [token, ops, timeout] { token->run(ops, timeout); });
    token.reset();  // the queue holds the work (and the token) now, or has dropped it
    if (rc != cudaSuccess) {
      // KILN_SIM_SYNC=1: the work ran and failed; else the device had failed before.
      std::string async_why;
      const ncclResult_t async = comm.clique->async_error(comm.rank, &async_why);
      if (async != ncclSuccess) return fail(async, async_why);
      return fail(ncclUnhandledCudaError, std::string(op_name(ops.front().kind)) + ": the "
                  "stream failed (" + cudaGetErrorString(rc) + "): " + fault_message());
    }
  }
  return ncclSuccess;
}

// ---- Argument checks ----------------------------------------------------------------------
bool check_comm(ncclComm_t comm, const char* call, ncclComm* out, ncclResult_t* rc) {
  if (!lookup(comm, out)) {
    *rc = fail(ncclInvalidArgument, std::string(call) + ": the communicator is not a live "
               "handle from ncclCommInitRank (null, destroyed or aborted)");
    return false;
  }
  return true;
}

// `p` must hold `bytes` bytes of device memory of `device` (live, one allocation).
bool check_buffer(const void* p, size_t bytes, int device, const char* call, const char* which,
                  ncclResult_t* rc) {
  if (bytes == 0) return true;
  const Region r = find_region(p);
  const char* c = static_cast<const char*>(p);
  std::string why;
  if (p == nullptr) {
    why = "is null";
  } else if (r.kind != MemoryKind::Device) {
    why = "is not device memory (NCCL moves GPU memory; a host or freed pointer would fault)";
  } else if (r.device != device) {
    why = "is memory of device " + std::to_string(r.device) + ", not of the communicator's "
          "device " + std::to_string(device);
  } else if (c + bytes > r.begin + r.size) {
    why = "holds " + std::to_string(r.begin + r.size - c) + " bytes, the call needs " +
          std::to_string(bytes);
  } else {
    return true;
  }
  *rc = fail(ncclInvalidArgument, std::string(call) + ": " + which + " " + why);
  return false;
}

bool check_stream(cudaStream_t stream, int device, const char* call, ncclResult_t* rc) {
  int d = device;
  DeviceScope scope(device);  // the null stream is the legacy stream of the comm's device
  if (!stream_device(stream, &d)) {
    *rc = fail(ncclInvalidArgument, std::string(call) + ": the stream is not a live stream");
    return false;
  }
  if (d != device) {
    *rc = fail(ncclInvalidArgument, std::string(call) + ": the stream belongs to device " +
               std::to_string(d) + ", the communicator to device " + std::to_string(device));
    return false;
  }
  return true;
}

bool check_type(ncclDataType_t type, const char* call, ncclResult_t* rc) {
  if (type_size(type) != 0) return true;
  *rc = fail(ncclInvalidArgument, std::string(call) + ": data type " + std::to_string(type) +
             " is not one the simulator moves (int8/uint8/int32/uint32/int64/uint64/float16/"
             "bfloat16/float32/float64)");
  return false;
}

bool check_rank(int peer, int nranks, const char* call, const char* what, ncclResult_t* rc) {
  if (peer >= 0 && peer < nranks) return true;
  *rc = fail(ncclInvalidArgument, std::string(call) + ": " + what + " " + std::to_string(peer) +
             " is not a rank of this communicator of " + std::to_string(nranks));
  return false;
}

// One checked call: queued in the open group, or issued at once as a group of its own.
ncclResult_t submit(const ncclComm& comm, cudaStream_t stream, const Op& op) {
  if (op.count == 0) return ncclSuccess;  // nothing to move; NCCL returns at once too
  if (t_group_depth > 0) {
    t_group.push_back({comm, stream, op});
    return ncclSuccess;
  }
  return issue({Pending{comm, stream, op}});
}

// Inside a group, the first failed check fails the whole group at ncclGroupEnd.
ncclResult_t rejected(ncclResult_t rc) {
  if (t_group_depth > 0 && t_group_error == ncclSuccess) t_group_error = rc;
  return rc;
}

}  // namespace
}  // namespace kiln::sim::nccl

using namespace kiln::sim::nccl;

ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return fail(ncclInvalidArgument, "ncclGetVersion: version is null");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t comm) {
  thread_local std::string text;
  ncclComm c;
  std::string why;
  if (comm != nullptr && lookup(comm, &c) && c.clique->async_error(c.rank, &why) != ncclSuccess) {
    text = why;
  } else {
    text = t_last_error;
  }
  return text.c_str();
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* unique_id) {
  if (unique_id == nullptr) return fail(ncclInvalidArgument, "ncclGetUniqueId: id is null");
  IdFields f{};
  std::memcpy(f.marker, kIdMarker, sizeof kIdMarker);
  f.pid = static_cast<int64_t>(getpid());
  f.number = g_next_id.fetch_add(1);
  std::memset(unique_id, 0, sizeof *unique_id);
  std::memcpy(unique_id->internal, &f, sizeof f);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId comm_id, int rank) {
  if (comm == nullptr) return fail(ncclInvalidArgument, "ncclCommInitRank: comm is null");
  *comm = nullptr;
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    return fail(ncclInvalidArgument, "ncclCommInitRank: rank " + std::to_string(rank) +
                " of " + std::to_string(nranks) + " ranks");
  }
  IdFields f;
  std::memcpy(&f, comm_id.internal, sizeof f);
  if (std::memcmp(f.marker, kIdMarker, sizeof kIdMarker) != 0) {
    return fail(ncclInvalidArgument, "ncclCommInitRank: the id was not made by ncclGetUniqueId");
  }
  if (f.pid != static_cast<int64_t>(getpid())) {
    return fail(ncclInvalidUsage, "ncclCommInitRank: the id was made by another process; the "
                "simulator's NCCL connects ranks that are threads of one process");
  }
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    return fail(ncclUnhandledCudaError, "ncclCommInitRank: no CUDA device (KILN_SIM_DEVICES)");
  }
  std::shared_ptr<Clique> clique;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    std::shared_ptr<Clique>& slot = g_joining[f.number];
    if (!slot) slot = std::make_shared<Clique>(nranks);
    clique = slot;
  }
  std::string why;
  ncclResult_t rc = ncclInvalidArgument;
  if (clique->nranks() != nranks) {
    why = "ncclCommInitRank: rank " + std::to_string(rank) + " says the communicator has " +
          std::to_string(nranks) + " ranks, another rank said " +
          std::to_string(clique->nranks());
    clique->fail_join(why);
  } else {
    rc = clique->join(rank, device, timeout_seconds(), &why);
  }
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_joining.find(f.number);
    // Formed: the id is used up. A failed clique stays, so that a rank joining late fails too.
    if (rc == ncclSuccess && it != g_joining.end() && it->second == clique) g_joining.erase(it);
    if (rc != ncclSuccess) return fail(rc, why);
    *comm = new ncclComm{clique, rank, device};
    g_comms.insert(*comm);
  }
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  ncclComm c;
  ncclResult_t rc = ncclSuccess;
  if (!check_comm(comm, "ncclCommDestroy", &c, &rc)) return rc;
  c.clique->drain(c.rank, timeout_seconds());
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_comms.erase(comm) != 0) delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  ncclComm c;
  ncclResult_t rc = ncclSuccess;
  if (!check_comm(comm, "ncclCommAbort", &c, &rc)) return rc;
  c.clique->abort(c.rank);
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_comms.erase(comm) != 0) delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) {
  ncclComm c;
  ncclResult_t rc = ncclSuccess;
  if (!check_comm(comm, "ncclCommGetAsyncError", &c, &rc)) return rc;
  if (async_error == nullptr) return fail(ncclInvalidArgument, "ncclCommGetAsyncError: null");
  *async_error = c.clique->async_error(c.rank, nullptr);
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  ncclComm c;
  ncclResult_t rc = ncclSuccess;
  if (!check_comm(comm, "ncclCommCount", &c, &rc)) return rc;
  if (count == nullptr) return fail(ncclInvalidArgument, "ncclCommCount: count is null");
  *count = c.clique->nranks();
  return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  ncclComm c;
  ncclResult_t rc = ncclSuccess;
  if (!check_comm(comm, "ncclCommCuDevice", &c, &rc)) return rc;
  if (device == nullptr) return fail(ncclInvalidArgument, "ncclCommCuDevice: device is null");
  *device = c.device;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  ncclComm c;
  ncclResult_t rc = ncclSuccess;
  if (!check_comm(comm, "ncclCommUserRank", &c, &rc)) return rc;
  if (rank == nullptr) return fail(ncclInvalidArgument, "ncclCommUserRank: rank is null");
  *rank = c.rank;
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  const char* call = "ncclAllReduce";
  ncclComm c;
  ncclResult_t rc = ncclSuccess;
  if (!check_comm(comm, call, &c, &rc) || !check_type(datatype, call, &rc)) return rejected(rc);
  if (op < ncclSum || op >= ncclNumOps) {
    return rejected(fail(ncclInvalidArgument, "ncclAllReduce: reduction op " +
                         std::to_string(op) + " is not sum, prod, max, min or avg"));
  }
  const size_t bytes = count * type_size(datatype);
  if (!check_buffer(sendbuff, bytes, c.device, call, "sendbuff", &rc) ||
      !check_buffer(recvbuff, bytes, c.device, call, "recvbuff", &rc) ||
      !check_stream(stream, c.device, call, &rc)) {
    return rejected(rc);
  }
  Op o;
  o.kind = Op::AllReduce;
  o.send = sendbuff;
  o.recv = recvbuff;
  o.count = count;
  o.type = datatype;
  o.op = op;
  return submit(c, stream, o);
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  const char* call = "ncclBroadcast";
  ncclComm c;
  ncclResult_t rc = ncclSuccess;
  if (!check_comm(comm, call, &c, &rc) || !check_type(datatype, call, &rc) ||
      !check_rank(root, c.clique->nranks(), call, "root", &rc)) {
    return rejected(rc);
  }
  const size_t bytes = count * type_size(datatype);
  if ((c.rank == root && !check_buffer(sendbuff, bytes, c.device, call, "sendbuff", &rc)) ||
      !check_buffer(recvbuff, bytes, c.device, call, "recvbuff", &rc) ||
      !check_stream(stream, c.device, call, &rc)) {
    return rejected(rc);
  }
  Op o;
  o.kind = Op::Broadcast;
  o.send = sendbuff;
  o.recv = recvbuff;
  o.count = count;
  o.type = datatype;
  o.peer = root;
  return submit(c, stream, o);
}

namespace {
ncclResult_t point_to_point(Op::Kind kind, void* buf, size_t count, ncclDataType_t datatype,
                            int peer, ncclComm_t comm, cudaStream_t stream) {
  const char* call = op_name(kind);
  ncclComm c;
  ncclResult_t rc = ncclSuccess;
  if (!check_comm(comm, call, &c, &rc) || !check_type(datatype, call, &rc) ||
      !check_rank(peer, c.clique->nranks(), call, "peer", &rc) ||
      !check_buffer(buf, count * type_size(datatype), c.device, call,
                    kind == Op::Send ? "sendbuff" : "recvbuff", &rc) ||
      !check_stream(stream, c.device, call, &rc)) {
    return rejected(rc);
  }
  Op o;
  o.kind = kind;
  o.send = kind == Op::Send ? buf : nullptr;
  o.recv = kind == Op::Recv ? buf : nullptr;
  o.count = count;
  o.type = datatype;
  o.peer = peer;
  return submit(c, stream, o);
}
}  // namespace

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return point_to_point(Op::Send, const_cast<void*>(sendbuff), count, datatype, peer, comm,
                        stream);
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return point_to_point(Op::Recv, recvbuff, count, datatype, peer, comm, stream);
}

ncclResult_t ncclGroupStart() {
  if (t_group_depth++ == 0) {
    t_group.clear();
    t_group_error = ncclSuccess;
  }
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (t_group_depth == 0) {
    return fail(ncclInvalidUsage, "ncclGroupEnd without a matching ncclGroupStart");
  }
  if (--t_group_depth > 0) return ncclSuccess;
  std::vector<Pending> calls;
  calls.swap(t_group);
  if (t_group_error != ncclSuccess) return t_group_error;  // nothing of the group is issued
  return issue(calls);
}
