// communicator.cpp: the worker thread that runs every operation in order, and the dispatch
// from a collective to its algorithm (comm/algorithms.h).
#include "comm/communicator.h"

#include <chrono>
#include <exception>
#include <string>
#include <utility>

#include "comm/algorithms.h"
#include "comm/mpi_transport.h"
#if KILN_WITH_NCCL
#include "comm/nccl_transport.h"
#endif
#include "engine/trace.h"

namespace kiln::comm {

const char* algorithm_name(Algorithm a) {
  switch (a) {
    case Algorithm::Ring: return "ring";
    case Algorithm::HalvingDoubling: return "hd";
    case Algorithm::BinaryBlocks: return "bb";
    case Algorithm::ParameterServer: return "ps";
    case Algorithm::Native: return "native";
  }
  return "?";
}

Algorithm parse_algorithm(const std::string& name) {
  if (name == "ring") return Algorithm::Ring;
  if (name == "hd") return Algorithm::HalvingDoubling;
  if (name == "bb") return Algorithm::BinaryBlocks;
  if (name == "ps") return Algorithm::ParameterServer;
  if (name == "native") return Algorithm::Native;
  throw Error("unknown allreduce algorithm '" + name + "': use ring, hd (halving-doubling), bb "
              "(binary blocks), ps (parameter server) or native (MPI_Allreduce / ncclAllReduce)", ErrorKind::Usage);
}

// ---- Work ----------------------------------------------------------------------------------

void Work::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_; });
  if (error_) std::rethrow_exception(error_);
}

bool Work::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

double Work::seconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return seconds_;
}

// ---- Communicator --------------------------------------------------------------------------

Communicator::Communicator(std::shared_ptr<Transport> transport, int members,
                           AlgorithmOptions options)
    : transport_(std::move(transport)),
      members_(members < 0 ? transport_->size() : members),
      options_(options) {
  KILN_CHECK(members_ >= 1 && members_ <= transport_->size(), "Communicator: members = ",
             members_, " is not in [1, ", transport_->size(), "]");
  // In a trace, the worker's row is "<the owner thread's label> allreduce" ("rank 1 allreduce").
  const std::string owner = trace::thread_label();
  worker_ = std::thread([this, owner] {
    if (!owner.empty()) trace::set_thread_label(owner + " allreduce");
    worker_loop();
  });
}

Communicator::~Communicator() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

void Communicator::worker_loop() {
  for (;;) {
    std::shared_ptr<Work> w;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything submitted has run
      w = queue_.front();
      queue_.pop_front();
    }
    const auto start = std::chrono::steady_clock::now();
    std::exception_ptr error;
    try {
#if KILN_WITH_CUDA
      if (w->caller_ready_.recorded()) {  // GPU order: after the submitter's queued writes
        const int device = w->caller_ready_.device();
        cuda::DeviceGuard guard(device);
        w->caller_ready_.wait(cuda::current_stream(device));
      }
#endif
      w->fn_();
    } catch (...) {
      error = std::current_exception();
    }
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    {
      std::lock_guard<std::mutex> lock(w->mu_);
      w->done_ = true;
      w->error_ = error;
      w->seconds_ = secs;
      w->fn_ = nullptr;
      w->keep_alive_ = Tensor();
    }
    w->cv_.notify_all();
  }
}

std::shared_ptr<Work> Communicator::submit(std::function<void()> fn, Tensor keep_alive) {
  auto w = std::make_shared<Work>();
  w->fn_ = std::move(fn);
  w->keep_alive_ = std::move(keep_alive);
#if KILN_WITH_CUDA
  const Device device = transport_->device();
  if (device.is_cuda()) {
    cuda::DeviceGuard guard(device.index);
    w->caller_ready_.record(cuda::current_stream(device.index));
  }
#endif
  {
    std::lock_guard<std::mutex> lock(mu_);
    KILN_CHECK(!stopping_, "Communicator: submit after shutdown");
    queue_.push_back(w);
  }
  cv_.notify_all();
  return w;
}

Buffer buffer_of(const Tensor& t, const Transport& transport) {
  KILN_CHECK(t.defined(), "comm: the tensor is undefined");
  KILN_CHECK(t.dtype() == DType::F32 || t.dtype() == DType::F64,
             "comm: collectives take f32 or f64 tensors, got ", t.str());
  KILN_CHECK(t.device() == transport.device(), "comm: the ", transport.name(),
             " transport moves tensors on ", transport.device().str(), ", got ", t.str(),
             ": copy it there first");
  Buffer b;
  b.data = t.raw_data();
  b.count = t.numel();
  b.type = t.dtype() == DType::F32 ? ElemType::F32 : ElemType::F64;
  b.device = t.device();
  return b;
}

void Communicator::allreduce_now(const Buffer& buf, ReduceOp op, Algorithm alg) {
  KILN_CHECK(is_member(), "allreduce: rank ", rank(), " is not a member of this communicator "
             "(members are ranks 0..", members_ - 1, ")");
  switch (alg) {
    case Algorithm::Ring: ring_allreduce(*transport_, members_, buf, op, options_); return;
    case Algorithm::HalvingDoubling: halving_doubling_allreduce(*transport_, members_, buf, op); return;
    case Algorithm::BinaryBlocks: binary_blocks_allreduce(*transport_, members_, buf, op); return;
    case Algorithm::ParameterServer: ps_allreduce(*transport_, members_, buf, op, options_); return;
    case Algorithm::Native:
      KILN_CHECK(members_ == transport_->size(), "allreduce 'native' runs over every rank; with "
                 "dedicated parameter servers use --allreduce ps", "");
      transport_->native_allreduce(buf, op);
      return;
  }
}

std::shared_ptr<Work> Communicator::allreduce_async(Tensor t, ReduceOp op, Algorithm alg) {
  const Buffer buf = buffer_of(t, *transport_);
  return submit([this, buf, op, alg] { allreduce_now(buf, op, alg); }, t);
}

std::shared_ptr<Work> Communicator::broadcast_async(Tensor t, int root) {
  const Buffer buf = buffer_of(t, *transport_);
  return submit([this, buf, root] { tree_broadcast(*transport_, members_, buf, root); }, t);
}

void Communicator::allreduce(Tensor& t, ReduceOp op, Algorithm alg) {
  allreduce_async(t, op, alg)->wait();
}

void Communicator::broadcast(Tensor& t, int root) { broadcast_async(t, root)->wait(); }

void Communicator::allgather(const Tensor& in, Tensor& out) {
  const Buffer bin = buffer_of(in, *transport_), bout = buffer_of(out, *transport_);
  KILN_CHECK(bin.type == bout.type && bout.count == bin.count * members_, "allgather: out must "
             "hold ", members_, " x ", bin.count, " elements of ", elem_name(bin.type), ", got ",
             out.str());
  submit([&] { ring_allgather(*transport_, members_, bin, bout); })->wait();
}

void Communicator::reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op) {
  const Buffer bin = buffer_of(in, *transport_), bout = buffer_of(out, *transport_);
  KILN_CHECK(bin.type == bout.type && bin.count == bout.count * members_, "reduce_scatter: in "
             "must hold ", members_, " x ", bout.count, " elements of ", elem_name(bout.type),
             ", got ", in.str());
  submit([&] { ring_reduce_scatter(*transport_, members_, bin, bout, op); })->wait();
}

void Communicator::barrier() {
  submit([&] { comm::barrier(*transport_, members_); })->wait();
}

void Communicator::send(const Tensor& t, int dst, int tag) {
  const Buffer b = buffer_of(t, *transport_);
  submit([&] { transport_->run({P2POp::send(b.data, b.bytes(), dst, tag)}); })->wait();
}

void Communicator::recv(Tensor& t, int src, int tag) {
  const Buffer b = buffer_of(t, *transport_);
  submit([&] {
    auto req = transport_->start({P2POp::recv(b.data, b.bytes(), src, tag)});
    req->wait();
    KILN_CHECK(req->received_bytes(0) == b.bytes(), "recv: expected ", b.bytes(), " bytes from "
               "rank ", src, " (tag ", tag, "), got ", req->received_bytes(0));
  })->wait();
}

std::shared_ptr<Transport> make_transport(const std::string& name) {
  if (name == "mpi") return make_mpi_transport();
  if (name == "nccl") {
#if KILN_WITH_NCCL
    return make_nccl_transport();
#else
    throw Error("transport 'nccl': this build has no NCCL (it needs a CUDA build with NCCL "
                "installed, or the CUDA simulator: -DKILN_CUDA_SIM=ON): use mpi or local",
                ErrorKind::Usage);
#endif
  }
  throw Error("unknown transport '" + name + "': use local:N (threads), mpi or nccl",
              ErrorKind::Usage);
}

}  // namespace kiln::comm
