// mpi_transport.cpp: Transport::start() as MPI_Isend / MPI_Irecv, one rank per process.
//
// The whole transport is a thin layer over non-blocking MPI point-to-point:
//
//   start(ops)  posts one MPI_Isend or MPI_Irecv per op and returns at once;
//   wait()      polls MPI_Testall until the batch is done, sleeping between polls.
//
// Why poll instead of MPI_Waitall? Two reasons. (1) A timeout: MPI_Waitall waits forever when a
// peer is stuck, while a poll loop can give up after timeout_seconds() with an error that names
// the peer and the tag. (2) The CPU: Open MPI's MPI_Waitall busy-spins in its progress engine.
// On a small machine the communicator's worker thread would then steal the core that the
// compute thread (backward) needs, and the "overlap" of communication with computation would
// make both slower. The sleep starts at a few microseconds (latency stays low for small
// messages) and grows to ~200 us (a long wait costs almost no CPU).
//
// Everything runs on a duplicate of MPI_COMM_WORLD (our tags never collide with another
// library's messages on MPI_COMM_WORLD) whose error handler is MPI_ERRORS_RETURN, so a failed
// MPI call becomes a kiln::Error naming the call instead of MPI's default abort.
//
// A dead peer. Every rank tells the others its (host, pid) when the transport starts; a wait
// that is not done checks, every kPeerCheckSeconds, whether a peer on this host has died, and
// then throws an error naming it (comm/peer_liveness.h). The transport also installs a SIGTERM
// handler that says which same-host rank died when the launcher ends the job.
//
// MPI is initialised here unless the program did it already (the MPI test main does), with
// MPI_THREAD_MULTIPLE when the library has it; the Communicator only ever needs SERIALIZED
// (one thread talks to MPI at a time). Whoever initialised MPI finalises it: we do at exit.
#include "comm/mpi_transport.h"

#include <cstdint>
#include <utility>

#include "comm/peer_liveness.h"

#if KILN_WITH_MPI
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace kiln::comm {
namespace {

using Clock = std::chrono::steady_clock;

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<size_t>(len));
}

[[noreturn]] void throw_mpi_error(int code, const char* call, const char* file, int line) {
  throw Error(std::string("MPI error: ") + call + " failed: " + mpi_error_string(code) + " at " +
              file + ":" + std::to_string(line));
}

}  // namespace
}  // namespace kiln::comm

// KILN_MPI_CHECK(call): every MPI call of the transport; a failure throws kiln::Error naming it.
#define KILN_MPI_CHECK(call)                                                   \
  do {                                                                         \
    const int kiln_mpi_rc_ = (call);                                           \
    if (kiln_mpi_rc_ != MPI_SUCCESS) {                                         \
      ::kiln::comm::throw_mpi_error(kiln_mpi_rc_, #call, __FILE__, __LINE__);  \
    }                                                                          \
  } while (0)

namespace kiln::comm {
namespace {

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
  }
  return "an unknown thread level";
}

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

// Initialises MPI once per process (unless someone else did) and checks the thread level.
void ensure_mpi_initialized() {
  static std::once_flag once;
  std::call_once(once, [] {
    int initialized = 0;
    KILN_MPI_CHECK(MPI_Initialized(&initialized));
    int provided = MPI_THREAD_SINGLE;
    if (initialized) {
      int finalized = 0;
      KILN_MPI_CHECK(MPI_Finalized(&finalized));
      KILN_CHECK(!finalized, "mpi transport: MPI was already finalized in this process; create "
                 "the transport before MPI_Finalize");
      KILN_MPI_CHECK(MPI_Query_thread(&provided));
    } else {
      KILN_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
      std::atexit(finalize_at_exit);
    }
    if (provided < MPI_THREAD_SERIALIZED) {
      throw Error(std::string("mpi transport: this MPI library provides only ") +
                  thread_level_name(provided) + "; the communicator's worker thread needs "
                  "MPI_THREAD_SERIALIZED or better (an Open MPI built with threads, or "
                  "MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...) if the program initialises MPI)");
    }
  });
}

std::string peer_name(int peer) {
  return peer == kAnySource ? std::string("any rank") : "rank " + std::to_string(peer);
}

class MpiTransport;

// One posted batch: an MPI request per op.
class MpiRequest : public Request {
 public:
  MpiRequest(const MpiTransport& t, std::vector<P2POp> ops, std::vector<MPI_Request> reqs)
      : t_(t), ops_(std::move(ops)), reqs_(std::move(reqs)), statuses_(reqs_.size()) {}
  ~MpiRequest() override;
  void wait() override;
  bool test() override;
  int source(size_t op) const override {
    check_done(op);
    return ops_[op].kind == P2POp::Recv ? statuses_[op].MPI_SOURCE : -1;
  }
  size_t received_bytes(size_t op) const override {
    check_done(op);
    if (ops_[op].kind != P2POp::Recv) return 0;
    int count = 0;
    MPI_Get_count(&statuses_[op], MPI_BYTE, &count);
    return count == MPI_UNDEFINED ? 0 : static_cast<size_t>(count);
  }

 private:
  void check_done(size_t op) const {
    KILN_CHECK(op < ops_.size(), "mpi transport: op ", op, " of a batch of ", ops_.size());
    KILN_CHECK(done_, "mpi transport: source()/received_bytes() before the request completed");
  }
  void throw_status_errors() const;
  std::string describe_pending() const;

  const MpiTransport& t_;
  std::vector<P2POp> ops_;
  std::vector<MPI_Request> reqs_;
  std::vector<MPI_Status> statuses_;
  bool done_ = false;
};

class MpiTransport : public Transport {
 public:
  MpiTransport() {
    ensure_mpi_initialized();
    KILN_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm_));
    KILN_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    KILN_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    KILN_MPI_CHECK(MPI_Comm_size(comm_, &size_));
    // The ranks that share memory with us are the ranks of this host.
    MPI_Comm shared;
    KILN_MPI_CHECK(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &shared));
    KILN_MPI_CHECK(MPI_Comm_rank(shared, &local_rank_));
    KILN_MPI_CHECK(MPI_Comm_size(shared, &local_size_));
    KILN_MPI_CHECK(MPI_Comm_free(&shared));
    char name[MPI_MAX_PROCESSOR_NAME];
    int len = 0;
    KILN_MPI_CHECK(MPI_Get_processor_name(name, &len));
    host_.assign(name, static_cast<size_t>(len));
    // The largest tag this MPI accepts (the standard promises at least 32767).
    int* ub = nullptr;
    int found = 0;
    KILN_MPI_CHECK(MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &found));
    tag_ub_ = found && ub != nullptr ? *ub : 32767;
    exchange_peer_processes();
    install_sigterm_report(peers_, size_, "mpi");
  }

  ~MpiTransport() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }

  const char* name() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  std::string host() const override { return host_; }

  std::unique_ptr<Request> start(const std::vector<P2POp>& ops) override {
    for (const P2POp& op : ops) check_op(op);
    if (!ops.empty() && !known_dead().empty()) {
      throw peer_died_error(*this, known_dead(), "a new transfer with " + peer_name(ops[0].peer));
    }
    std::vector<MPI_Request> reqs(ops.size(), MPI_REQUEST_NULL);
    size_t sent = 0;
    for (size_t i = 0; i < ops.size(); ++i) {
      const P2POp& op = ops[i];
      if (op.kind == P2POp::Send) {
        KILN_MPI_CHECK(MPI_Isend(op.data, static_cast<int>(op.bytes), MPI_BYTE, op.peer, op.tag,
                                 comm_, &reqs[i]));
        sent += op.bytes;
      } else {
        // No send is larger than INT_MAX bytes (check_op), so a larger buffer can take any.
        const int capacity = static_cast<int>(std::min<size_t>(op.bytes, INT_MAX));
        const int source = op.peer == kAnySource ? MPI_ANY_SOURCE : op.peer;
        KILN_MPI_CHECK(MPI_Irecv(op.data, capacity, MPI_BYTE, source, op.tag, comm_, &reqs[i]));
      }
    }
    count_sent(sent);
    return std::make_unique<MpiRequest>(*this, ops, std::move(reqs));
  }

  bool has_native_allreduce() const override { return true; }

  // MPI_Allreduce in place. It is a blocking MPI call: no timeout of ours applies (Open MPI's
  // launcher ends the job when a rank dies), and it busy-waits inside MPI as MPI does.
  void native_allreduce(const Buffer& buf, ReduceOp op) override {
    KILN_CHECK(buf.device.is_cpu(), "allreduce 'native' over mpi: the buffer must be in CPU "
               "memory, got one on ", buf.device.str());
    if (buf.type == ElemType::F16 || buf.type == ElemType::BF16) {
      throw Error(std::string("allreduce 'native' over mpi: MPI has no ") + elem_name(buf.type) +
                  " type; use ring, hd or ps for compressed gradients", ErrorKind::Usage);
    }
    const MPI_Datatype type = buf.type == ElemType::F32 ? MPI_FLOAT : MPI_DOUBLE;
    // MPI counts are ints: reduce at most INT_MAX elements per call.
    for (int64_t offset = 0; offset < buf.count; offset += INT_MAX) {
      const Buffer part = buf.slice(offset, std::min<int64_t>(INT_MAX, buf.count - offset));
      KILN_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, part.data, static_cast<int>(part.count), type,
                                   MPI_SUM, comm_));
    }
    if (op == ReduceOp::Average) {
      if (buf.type == ElemType::F32) {
        float* p = static_cast<float*>(buf.data);
        const float s = 1.0f / static_cast<float>(size_);
        for (int64_t i = 0; i < buf.count; ++i) p[i] *= s;
      } else {
        double* p = static_cast<double*>(buf.data);
        const double s = 1.0 / size_;
        for (int64_t i = 0; i < buf.count; ++i) p[i] *= s;
      }
    }
  }

  // Same-host peers whose process is gone or a zombie (peer_liveness.h). Once one is found the
  // answer is kept: start() then fails at once, so the collectives queued behind the one that
  // noticed the death do not each wait kPeerCheckSeconds to find it again.
  void check_peers(const std::string& waiting_for) const override {
    if (peers_.local_peers() == 0) return;
    std::string dead = known_dead();
    if (dead.empty()) {
      dead = peers_.dead_peers();
      if (dead.empty()) return;
      std::lock_guard<std::mutex> lock(dead_mu_);
      dead_ = dead;
    }
    throw peer_died_error(*this, dead, waiting_for);
  }

  std::string known_dead() const {
    std::lock_guard<std::mutex> lock(dead_mu_);
    return dead_;
  }

  void abort(const std::string& why) noexcept override {
    std::fprintf(stderr, "kiln: rank %d/%d (mpi) on %s aborts the job: %s\n", rank_, size_,
                 host_.c_str(), why.c_str());
    std::fflush(stderr);
    quiet_sigterm_report();  // the launcher's SIGTERM that follows needs no second line
    MPI_Abort(MPI_COMM_WORLD, 1);
    std::_Exit(1);  // MPI_Abort does not return; in case an MPI library does
  }

 private:
  void check_op(const P2POp& op) const {
    const bool any_ok = op.kind == P2POp::Recv && op.peer == kAnySource;
    KILN_CHECK(any_ok || (op.peer >= 0 && op.peer < size_), "mpi transport: rank ", rank_,
               ": peer ", op.peer, " is not a rank of this job of ", size_);
    KILN_CHECK(op.tag >= 0 && op.tag <= tag_ub_, "mpi transport: tag ", op.tag, " is outside "
               "[0, ", tag_ub_, "] (MPI_TAG_UB of this MPI)");
    KILN_CHECK(op.bytes == 0 || op.data != nullptr, "mpi transport: a null buffer of ", op.bytes,
               " bytes");
    // MPI counts are ints. Splitting a message would break the matching rules for receives
    // that wait for any source, so messages over 2 GiB are refused: split the buffer.
    KILN_CHECK(op.kind == P2POp::Recv || op.bytes <= static_cast<size_t>(INT_MAX),
               "mpi transport: a message of ", op.bytes, " bytes to rank ", op.peer, " is larger "
               "than MPI's limit of ", INT_MAX, " bytes per message; send it in parts");
  }

  // Every rank's (host key, pid, start time), so that a rank waiting for a peer on its own host
  // can tell a dead peer from a slow one (comm/peer_liveness.h). Fixed-size records.
  void exchange_peer_processes() {
    struct Record {
      char host_key[232];
      int32_t pid;
      uint64_t start_time;
    };
    Record mine{};
    std::strncpy(mine.host_key, this_host_key().c_str(), sizeof mine.host_key - 1);
    mine.pid = static_cast<int32_t>(::getpid());
    mine.start_time = process_start_time(mine.pid);
    std::vector<Record> all(static_cast<size_t>(size_));
    KILN_MPI_CHECK(MPI_Allgather(&mine, sizeof mine, MPI_BYTE, all.data(), sizeof mine, MPI_BYTE,
                                 comm_));
    std::vector<PeerProcess> procs;
    for (int r = 0; r < size_; ++r) {
      const Record& rec = all[static_cast<size_t>(r)];
      procs.push_back(PeerProcess{r, std::string(rec.host_key, strnlen(rec.host_key,
                                  sizeof rec.host_key)), rec.pid, rec.start_time});
    }
    peers_ = PeerTable(rank_, std::move(procs));
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  PeerTable peers_;
  mutable std::mutex dead_mu_;
  mutable std::string dead_;  // the dead peers check_peers() found; "" while none
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1, tag_ub_ = 32767;
  std::string host_;
};

MpiRequest::~MpiRequest() {
  // A batch abandoned before completion (its wait threw): withdraw the receives so no late
  // message lands in a buffer that may be gone; let the sends finish in the background.
  for (size_t i = 0; i < reqs_.size(); ++i) {
    if (reqs_[i] == MPI_REQUEST_NULL) continue;
    if (ops_[i].kind == P2POp::Recv) {
      MPI_Cancel(&reqs_[i]);
      MPI_Wait(&reqs_[i], MPI_STATUS_IGNORE);
    } else {
      MPI_Request_free(&reqs_[i]);
    }
  }
}

bool MpiRequest::test() {
  if (done_) return true;
  int flag = 0;
  const int rc = MPI_Testall(static_cast<int>(reqs_.size()), reqs_.data(), &flag,
                             statuses_.data());
  if (rc == MPI_ERR_IN_STATUS) throw_status_errors();
  if (rc != MPI_SUCCESS) throw_mpi_error(rc, "MPI_Testall", __FILE__, __LINE__);
  if (flag) done_ = true;
  return done_;
}

void MpiRequest::throw_status_errors() const {
  for (size_t i = 0; i < ops_.size(); ++i) {
    const int err = statuses_[i].MPI_ERROR;
    if (err == MPI_SUCCESS || err == MPI_ERR_PENDING) continue;
    const P2POp& op = ops_[i];
    int err_class = err;
    MPI_Error_class(err, &err_class);
    if (op.kind == P2POp::Recv && err_class == MPI_ERR_TRUNCATE) {
      throw Error("mpi transport: rank " + std::to_string(t_.rank()) + ": a message from " +
                  peer_name(op.peer) + " (tag " + std::to_string(op.tag) + ") does not fit the "
                  "receive buffer of " + std::to_string(op.bytes) + " bytes");
    }
    throw Error("mpi transport: rank " + std::to_string(t_.rank()) + ": " +
                (op.kind == P2POp::Send ? "a send to " : "a receive from ") + peer_name(op.peer) +
                " (tag " + std::to_string(op.tag) + ") failed: " + mpi_error_string(err));
  }
  throw Error("mpi transport: MPI_Testall reported an error in a status, but none was set");
}

std::string MpiRequest::describe_pending() const {
  for (size_t i = 0; i < reqs_.size(); ++i) {
    int flag = 1;
    MPI_Request_get_status(reqs_[i], &flag, MPI_STATUS_IGNORE);
    if (!flag) {
      const P2POp& op = ops_[i];
      return std::string(op.kind == P2POp::Send ? "a send to " : "a receive from ") +
             peer_name(op.peer) + " (tag " + std::to_string(op.tag) + ", " +
             std::to_string(op.bytes) + " bytes)";
    }
  }
  return "a batch of " + std::to_string(ops_.size()) + " ops";
}

void MpiRequest::wait() {
  if (done_) return;
  const auto start = Clock::now();
  const double timeout = t_.timeout_seconds();
  const auto deadline = start + std::chrono::duration<double>(timeout);
  // Backoff: poll without sleeping for the first 50 us (a small message's whole round trip:
  // a sleep there would cost a scheduler tick, ~60 us, per step of an allreduce), then sleep
  // 5 us doubling up to 200 us between polls (a long wait costs almost no CPU).
  const auto spin_until = start + std::chrono::microseconds(50);
  std::chrono::microseconds nap(5);
  const auto check_every = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(kPeerCheckSeconds));
  auto next_check = start + check_every;
  for (;;) {
    try {
      if (test()) return;
    } catch (const Error&) {
      t_.check_peers(describe_pending());  // a dead peer explains a failed transfer best
      throw;
    }
    const auto now = Clock::now();
    if (now >= deadline) throw timeout_error(t_, describe_pending(), timeout);
    if (now >= next_check) {  // a dead peer on this host ends the wait at once, naming it
      t_.check_peers(describe_pending());
      next_check = now + check_every;
    }
    if (now >= spin_until) {
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, std::chrono::microseconds(200));
    }
  }
}

}  // namespace

std::shared_ptr<Transport> make_mpi_transport() { return std::make_shared<MpiTransport>(); }

}  // namespace kiln::comm

#else  // a build without MPI

namespace kiln::comm {

std::shared_ptr<Transport> make_mpi_transport() {
  throw Error("transport 'mpi': this build has no MPI. Install Open MPI (apt-get install "
              "libopenmpi-dev openmpi-bin, or tools/setup.sh) and reconfigure; or use --dist "
              "local:N (ranks as threads of one process)", ErrorKind::Usage);
}

}  // namespace kiln::comm

#endif  // KILN_WITH_MPI
