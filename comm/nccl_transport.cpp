// nccl_transport.cpp: Transport::start() as a group of ncclSend / ncclRecv on our own stream.
//
//   start(ops):  ncclGroupStart; one ncclSend or ncclRecv per op; ncclGroupEnd; record an
//                event on the stream. The group makes NCCL post all the ops together, which is
//                what lets "send to next, receive from prev" on every rank at once progress
//                (ncclSend alone blocks the stream until the peer's ncclRecv arrives).
//   wait():      polls the event, sleeping between polls (2 us growing to 200 us), and asks
//                NCCL for an asynchronous error (a peer died, a network error) on each poll.
//                A batch not done after timeout_seconds() throws the timeout error; the job
//                should then abort(), because the NCCL kernels of the batch are still queued.
//                Every kPeerCheckSeconds it also asks the bootstrap whether a peer is known
//                dead (Transport::check_peers), and then throws naming it.
//
//   rendezvous:  over the bootstrap transport (MPI processes, or local threads): rank 0's
//                ncclUniqueId travels through it, then every rank calls ncclCommInitRank.
//
// NCCL and the CUDA runtime report errors as return codes: every call goes through
// KILN_NCCL_CHECK / KILN_CUDA_CHECK, which throw kiln::Error naming the call.
#include "comm/nccl_transport.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "comm/local_transport.h"
#include "comm/mpi_transport.h"
#include "engine/cuda/check.h"
#include "engine/cuda/context.h"
#include "engine/cuda/nccl.h"
#include "engine/cuda/sync_calls.h"

namespace kiln::comm {
namespace {

[[noreturn]] void throw_nccl_error(ncclResult_t rc, const char* call, const char* file,
                                   int line) {
  // ncclGetLastError: NCCL's own account of the failure (it ignores the comm argument).
  const std::string detail = ncclGetLastError(nullptr);
  throw Error(std::string("NCCL error: ") + call + " failed: " + ncclGetErrorString(rc) +
              (detail.empty() ? "" : " (" + detail + ")") + " at " + file + ":" +
              std::to_string(line));
}

}  // namespace
}  // namespace kiln::comm

#define KILN_NCCL_CHECK(call)                                                     \
  do {                                                                            \
    const ncclResult_t kiln_nccl_rc_ = (call);                                    \
    if (kiln_nccl_rc_ != ncclSuccess) {                                           \
      ::kiln::comm::throw_nccl_error(kiln_nccl_rc_, #call, __FILE__, __LINE__);   \
    }                                                                             \
  } while (0)

namespace kiln::comm {
namespace {

using Clock = std::chrono::steady_clock;

std::string op_name(const P2POp& op) {
  return std::string(op.kind == P2POp::Send ? "a send to rank " : "a receive from rank ") +
         std::to_string(op.peer) + " (tag " + std::to_string(op.tag) + ", " +
         std::to_string(op.bytes) + " bytes)";
}

class NcclTransport;

// A batch (or a native allreduce): done when its event, recorded after the NCCL calls on the
// transport's stream, is reached.
class NcclRequest : public Request {
 public:
  NcclRequest(NcclTransport& t, std::vector<P2POp> ops, std::string what, cuda::Event done)
      : t_(t), ops_(std::move(ops)), what_(std::move(what)), done_event_(std::move(done)) {}
  void wait() override;
  bool test() override;
  int source(size_t op) const override {
    KILN_CHECK(op < ops_.size(), "nccl transport: op ", op, " of a batch of ", ops_.size());
    return ops_[op].kind == P2POp::Recv ? ops_[op].peer : -1;
  }
  // NCCL receives exactly the posted size (counts must match on both sides).
  size_t received_bytes(size_t op) const override {
    KILN_CHECK(op < ops_.size(), "nccl transport: op ", op, " of a batch of ", ops_.size());
    return ops_[op].kind == P2POp::Recv ? ops_[op].bytes : 0;
  }

 private:
  NcclTransport& t_;
  std::vector<P2POp> ops_;
  std::string what_;  // for the timeout message
  cuda::Event done_event_;
  bool done_ = false;
};

// The Usage error for a host with fewer GPUs than the ranks it runs, saying what to start.
void check_gpu_per_rank(const std::string& host, int ranks, bool threads) {
  const int ndev = cuda::device_count();
  const std::string other = threads ? "local" : "mpi";
  if (ndev == 0) {
    throw Error("nccl needs one GPU per rank: host " + host + " has none (" +
                cuda::unavailable_reason() + "); use the " + other + " transport",
                ErrorKind::Usage);
  }
  if (ndev < ranks) {
    const std::string n = std::to_string(ndev);
    const std::string fewer = threads ? "use at most " + n + " ranks (nccl:" + n + ")"
                                      : "start at most " + n + " ranks per host (mpirun -H "
                                        "host:" + n + ")";
    throw Error("nccl needs one GPU per rank: host " + host + " runs " + std::to_string(ranks) +
                " ranks but has " + n + " GPUs; " + fewer + " or use the " + other +
                " transport", ErrorKind::Usage);
  }
}

class NcclTransport : public Transport {
 public:
  explicit NcclTransport(std::shared_ptr<Transport> bootstrap) : boot_(std::move(bootstrap)) {
    check_gpu_per_rank(boot_->host(), boot_->local_size(),
                       std::string(boot_->name()) == "local");
    device_ = boot_->local_rank();
    cuda::DeviceGuard guard(device_);
    KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));

    // Rendezvous: rank 0's unique id travels to every rank through the bootstrap.
    ncclUniqueId id;
    if (boot_->rank() == 0) {
      KILN_NCCL_CHECK(ncclGetUniqueId(&id));
      std::vector<P2POp> sends;
      for (int r = 1; r < boot_->size(); ++r) sends.push_back(P2POp::send(&id, sizeof id, r, 0));
      boot_->run(sends);
    } else {
      boot_->run({P2POp::recv(&id, sizeof id, 0, 0)});
    }
    KILN_NCCL_CHECK(ncclCommInitRank(&comm_, boot_->size(), id, boot_->rank()));
  }

  ~NcclTransport() override {
    cuda::DeviceGuard guard(device_);
    if (comm_ != nullptr && !abort_called_) {
      if (aborted_) {
        ncclCommAbort(comm_);
      } else {
        // Teardown: the collectives still queued on the comm stream finish before their
        // communicator goes.
        cuda::AllowSync allow("NcclTransport teardown: the comm stream drains first");
        (void)cuda::stream_synchronize_nothrow(stream_);
        ncclCommDestroy(comm_);
      }
    }
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  }

  const char* name() const override { return "nccl"; }
  int rank() const override { return boot_->rank(); }
  int size() const override { return boot_->size(); }
  int local_rank() const override { return boot_->local_rank(); }
  int local_size() const override { return boot_->local_size(); }
  std::string host() const override { return boot_->host(); }
  Device device() const override { return Device(DeviceType::CUDA, device_); }

  std::unique_ptr<Request> start(const std::vector<P2POp>& ops) override {
    for (const P2POp& op : ops) check_op(op);
    cuda::DeviceGuard guard(device_);
    order_after_caller();
    size_t sent = 0;
    std::string what = ops.empty() ? std::string("an empty batch") : op_name(ops.front());
    if (ops.size() > 1) what += " and " + std::to_string(ops.size() - 1) + " more ops";
    try {
      KILN_NCCL_CHECK(ncclGroupStart());
      for (const P2POp& op : ops) {
        // Empty messages are left out on both sides (their sizes match, so both skip them).
        if (op.bytes == 0) continue;
        if (op.kind == P2POp::Send) {
          KILN_NCCL_CHECK(ncclSend(op.data, op.bytes, ncclInt8, op.peer, comm_, stream_));
          sent += op.bytes;
        } else {
          KILN_NCCL_CHECK(ncclRecv(op.data, op.bytes, ncclInt8, op.peer, comm_, stream_));
        }
      }
      KILN_NCCL_CHECK(ncclGroupEnd());
    } catch (const Error&) {
      check_peers(what);  // an aborted communicator: name the dead peer if the bootstrap knows
      throw;
    }
    count_sent(sent);
    return std::make_unique<NcclRequest>(*this, ops, what, record_done());
  }

  bool has_native_allreduce() const override { return true; }

  void native_allreduce(const Buffer& buf, ReduceOp op) override {
    KILN_CHECK(buf.device == device(), "allreduce 'native' over nccl: the buffer must be on ",
               device().str(), ", got one on ", buf.device.str());
    if (buf.count == 0) return;
    const ncclDataType_t type = buf.type == ElemType::F32   ? ncclFloat32
                                : buf.type == ElemType::F64 ? ncclFloat64
                                : buf.type == ElemType::F16 ? ncclFloat16
                                                            : ncclBfloat16;
    cuda::DeviceGuard guard(device_);
    order_after_caller();
    KILN_NCCL_CHECK(ncclAllReduce(buf.data, buf.data, static_cast<size_t>(buf.count), type,
                                  op == ReduceOp::Average ? ncclAvg : ncclSum, comm_, stream_));
    NcclRequest req(*this, {}, std::string("ncclAllReduce of ") + std::to_string(buf.count) +
                    " " + elem_name(buf.type) + " elements", record_done());
    req.wait();
  }

  void abort(const std::string& why) noexcept override {
    std::fprintf(stderr, "kiln: rank %d/%d (nccl, cuda:%d) on %s aborts the job: %s\n", rank(),
                 size(), device_, host().c_str(), why.c_str());
    std::fflush(stderr);
    // The handle stays (another thread of this rank may be reading it); it is dead now.
    if (comm_ != nullptr && !abort_called_.exchange(true)) ncclCommAbort(comm_);
    boot_->abort(why);  // MPI_Abort ends every rank of the job; local fails the group's waits
  }

  // A dead peer, as the bootstrap sees it: a failed local rank, or an MPI rank on this host
  // whose process is gone. Real NCCL tells the survivors nothing when a peer's process dies
  // (its kernels wait for the peer's data forever), so the waits ask this too.
  void check_peers(const std::string& waiting_for) const override {
    boot_->check_peers(waiting_for);
  }

  // Throws if NCCL reported an asynchronous error on the communicator (e.g. a peer vanished).
  void check_async_error() {
    ncclResult_t async = ncclSuccess;
    KILN_NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
    if (async != ncclSuccess && async != ncclInProgress) {
      aborted_ = true;
      throw Error("nccl transport: rank " + std::to_string(rank()) + ": the NCCL communicator "
                  "failed: " + ncclGetErrorString(async) + " (" + ncclGetLastError(comm_) +
                  "); a peer has died or the network failed");
    }
  }

 private:
  void check_op(const P2POp& op) const {
    if (op.kind == P2POp::Recv && op.peer == kAnySource) {
      throw Error("nccl transport: NCCL has no any-source receive; name the peer, or use the "
                  "mpi transport (e.g. for dedicated parameter servers)", ErrorKind::Usage);
    }
    KILN_CHECK(op.peer >= 0 && op.peer < size(), "nccl transport: rank ", rank(), ": peer ",
               op.peer, " is not a rank of this job of ", size());
    KILN_CHECK(op.tag >= 0, "nccl transport: tags must be >= 0, got ", op.tag);
    if (op.bytes == 0) return;
    // A host pointer here would make NCCL fault on the GPU: say so now.
    cudaPointerAttributes attr{};
    KILN_CUDA_CHECK(cudaPointerGetAttributes(&attr, op.data));
    KILN_CHECK(attr.type == cudaMemoryTypeDevice && attr.device == device_, "nccl transport: ",
               op_name(op), ": the buffer is not memory of cuda:", device_, " (NCCL moves GPU "
               "memory of this rank's GPU only)");
  }

  // The transfers read what the calling thread's kernels wrote: our stream waits for the work
  // queued so far on the caller's current stream (without blocking the host). The caller is
  // the Communicator's worker thread, whose stream the Communicator has ordered after the
  // stream of the thread that submitted the operation (Communicator::submit).
  void order_after_caller() {
    cuda::Event ready;
    ready.record(cuda::current_stream(device_));
    ready.wait(stream_);
  }

  cuda::Event record_done() {
    cuda::Event e;
    e.record(stream_);
    return e;
  }

  std::shared_ptr<Transport> boot_;  // rank, size, host; the unique id; abort
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  ncclComm_t comm_ = nullptr;
  bool aborted_ = false;  // the communicator failed: abort it instead of destroying it
  std::atomic<bool> abort_called_{false};
};

bool NcclRequest::test() {
  if (done_) return true;
  try {
    cuda::DeviceGuard guard(t_.device().index);
    done_ = done_event_.query();
  } catch (const Error&) {
    t_.check_async_error();  // the stream failed: NCCL's reason says more than the fault
    throw;
  }
  if (!done_) t_.check_async_error();
  return done_;
}

void NcclRequest::wait() {
  if (done_) return;
  // The host waits for the device here (by polling, so that a dead peer can be noticed): a
  // wait the sync debug mode reports like a synchronisation.
  cuda::check_sync(cuda::SyncSite().named("NcclRequest::wait()").waiting_by("polling its event"));
  const double timeout = t_.timeout_seconds();
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout);
  int polls = 0;
  std::chrono::microseconds nap(2);
  const auto check_every = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(kPeerCheckSeconds));
  auto next_check = Clock::now() + check_every;
  for (;;) {
    try {
      if (test()) return;
    } catch (const Error&) {
      t_.check_peers(what_);  // "rank 1 failed" says more than "the communicator was aborted"
      throw;
    }
    const auto now = Clock::now();
    if (now >= deadline) throw timeout_error(t_, what_, timeout);
    if (now >= next_check) {
      t_.check_peers(what_);
      next_check = now + check_every;
    }
    if (++polls > 16) {
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, std::chrono::microseconds(200));
    }
  }
}

}  // namespace

std::shared_ptr<Transport> make_nccl_transport(std::shared_ptr<Transport> bootstrap) {
  KILN_CHECK(bootstrap != nullptr, "make_nccl_transport: the bootstrap transport is null");
  return std::make_shared<NcclTransport>(std::move(bootstrap));
}

std::shared_ptr<Transport> make_nccl_transport() {
  std::shared_ptr<Transport> mpi = make_mpi_transport();
#if KILN_CUDA_SIM
  if (mpi->size() > 1) {
    throw Error("nccl over mpirun: the CUDA simulator's NCCL connects ranks that are threads of "
                "one process, not processes; run one process with nccl:N instead (e.g. "
                "mnist_train --dist nccl:2)", ErrorKind::Usage);
  }
#endif
  return make_nccl_transport(std::move(mpi));
}

void run_nccl_local(int n, const std::function<void(std::shared_ptr<Transport>)>& fn) {
  if (n < 1) throw Error("nccl:N needs N >= 1 ranks, got " + std::to_string(n), ErrorKind::Usage);
  check_gpu_per_rank("localhost", n, /*threads=*/true);
  // The error to report is the one that started it: the ranks released by the abort fail too,
  // and one of them may finish failing first.
  std::mutex mu;
  std::exception_ptr first;
  try {
    run_local(n, [&](std::shared_ptr<Transport> local) {
      std::shared_ptr<Transport> t = make_nccl_transport(std::move(local));
      try {
        fn(t);
      } catch (const std::exception& e) {
        {
          std::lock_guard<std::mutex> lock(mu);
          if (!first) first = std::current_exception();
        }
        t->abort(e.what());  // the other ranks may be waiting for this one inside NCCL
        throw;
      }
    });
  } catch (...) {
    if (first) std::rethrow_exception(first);
    throw;
  }
}

}  // namespace kiln::comm
