// communicator.h: collectives over a Transport, blocking or asynchronous.
//
//   comm::Communicator comm(comm::make_transport("mpi"));  // or "nccl"; local ranks: the
//                                                          // transport run_local() passes
//   comm.allreduce(grad, ReduceOp::Average, Algorithm::Ring);
//   std::shared_ptr<Work> w = comm.allreduce_async(bucket, ReduceOp::Sum, Algorithm::Ring);
//   ... backward continues ...
//   w->wait();
//
// Every operation, blocking or not, runs on the communicator's own worker thread in the order
// it was submitted. That gives three properties at once: (1) asynchronous collectives overlap
// with whatever the caller does next (DataParallel starts a bucket's allreduce from a
// grad-ready hook while backward continues); (2) all ranks run their collectives in the same
// order as long as they submit them in the same order (the MPI rule); (3) only one thread
// talks to the transport at a time, which is all MPI_THREAD_SERIALIZED asks.
//
// Members: collectives run over ranks [0, members()) of the transport, by default all of them.
// With dedicated parameter-server ranks (comm/parameter_server.h) the workers are the first
// W ranks and the servers the rest: the workers' communicator has members() == W.
//
// Tensors passed to collectives are contiguous f32 or f64 tensors on the transport's device
// (the CPU for local and mpi; this rank's GPU for nccl); an async call keeps its tensor alive
// until the Work completes, and the caller must not touch it before wait().
//
// GPU order. CUDA streams are per host thread (engine/cuda/context.h): the tensor a caller
// submits may still be being written by kernels queued on the CALLER's current stream, which
// the worker thread's stream knows nothing about. So for a transport on a GPU, submit() records
// an event on the caller's current stream, and the worker makes its own current stream wait for
// that event before it runs the operation. Everything the operation queues afterwards (the
// nccl transport's transfers, ordered after the worker's stream; the CUDA reductions of the
// hand algorithms, on the worker's stream) thus starts only once the caller's writes are done.
// In the other direction nothing is needed: an operation returns only once its GPU work is.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "comm/algorithms.h"
#include "comm/transport.h"
#include "engine/tensor.h"
#if KILN_WITH_CUDA
#include "engine/cuda/context.h"
#endif

namespace kiln::comm {

// How an allreduce is computed (comm/algorithms.h). Native: the transport's own.
enum class Algorithm : uint8_t { Ring, HalvingDoubling, BinaryBlocks, ParameterServer, Native };
const char* algorithm_name(Algorithm a);  // "ring", "hd", "bb", "ps", "native"
// "ring" | "hd" | "bb" | "ps" | "native"; anything else is a Usage error listing these.
Algorithm parse_algorithm(const std::string& name);

// The handle of an asynchronous operation.
class Work {
 public:
  // Blocks until the operation finished; rethrows its error. Idempotent.
  void wait();
  bool done() const;
  // Seconds the operation ran on the worker thread (valid after wait()).
  double seconds() const;

 private:
  friend class Communicator;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
  double seconds_ = 0;
  std::function<void()> fn_;
  Tensor keep_alive_;
#if KILN_WITH_CUDA
  cuda::Event caller_ready_;  // GPU transports: the submitting thread's stream at submit()
#endif
};

class Communicator {
 public:
  // members: ranks [0, members) take part in collectives (-1: all).
  explicit Communicator(std::shared_ptr<Transport> transport, int members = -1,
                        AlgorithmOptions options = {});
  ~Communicator();  // drains the queue, joins the worker
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return transport_->rank(); }
  int size() const { return members_; }  // members of the collectives
  int local_rank() const { return transport_->local_rank(); }
  bool is_member() const { return rank() < members_; }
  Transport& transport() const { return *transport_; }
  const std::shared_ptr<Transport>& transport_ptr() const { return transport_; }
  const AlgorithmOptions& options() const { return options_; }
  uint64_t bytes_sent() const { return transport_->bytes_sent(); }

  // Point to point, blocking, on whole tensors (recv: `t` has the expected size).
  void send(const Tensor& t, int dst, int tag = 0);
  void recv(Tensor& t, int src, int tag = 0);

  // Collectives, blocking. In place where the result has the input's shape.
  void allreduce(Tensor& t, ReduceOp op = ReduceOp::Sum, Algorithm alg = Algorithm::Ring);
  void broadcast(Tensor& t, int root = 0);
  // out: size() * in.numel() elements, rank r's `in` at [r * n, (r + 1) * n).
  void allgather(const Tensor& in, Tensor& out);
  // in: size() * out.numel() elements; out = the reduction of every rank's block `rank()`.
  void reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op = ReduceOp::Sum);
  void barrier();

  // Asynchronous versions: queued behind earlier operations; the tensor stays alive until done.
  std::shared_ptr<Work> allreduce_async(Tensor t, ReduceOp op = ReduceOp::Sum,
                                        Algorithm alg = Algorithm::Ring);
  std::shared_ptr<Work> broadcast_async(Tensor t, int root = 0);
  // Any operation on the worker thread (used by DataParallel for buffers that are not tensors).
  // With a GPU transport it runs after the work queued so far on the calling thread's current
  // stream (see "GPU order" above).
  std::shared_ptr<Work> submit(std::function<void()> fn, Tensor keep_alive = Tensor());

  // The allreduce itself on a raw buffer, run on the calling thread (the worker thread calls
  // it; so do tests of the algorithms).
  void allreduce_now(const Buffer& buf, ReduceOp op, Algorithm alg);

 private:
  void worker_loop();
  std::shared_ptr<Transport> transport_;
  int members_;
  AlgorithmOptions options_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Work>> queue_;
  bool stopping_ = false;
  std::thread worker_;
};

// A Buffer over a contiguous f32/f64 tensor (checks the dtype and the device).
Buffer buffer_of(const Tensor& t, const Transport& transport);

// "local:N" is not created here (see run_local in comm/local_transport.h), nor "nccl:N" (see
// run_nccl_local in comm/nccl_transport.h). "mpi": initialises MPI on first use; "nccl": MPI
// for the rendezvous, then NCCL on GPU local_rank. A transport
// this build lacks is a Usage error saying how to get it.
std::shared_ptr<Transport> make_transport(const std::string& name);

}  // namespace kiln::comm
