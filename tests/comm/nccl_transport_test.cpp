// NCCL transport under mpirun (kiln_mpi_test, labels mpi and gpu): one GPU per rank, a ring
// exchange of GPU buffers, byte counting, ncclAllReduce against the reference, the errors for
// any-source receives and host buffers. Skips, saying why, on a machine without enough GPUs
// (every rank of the host decides the same way, so no rank waits for a skipped one).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/nccl_transport.h"
#include "engine/tensor.h"
#include "support/cuda_skip.h"

using namespace kiln;
using namespace kiln::comm;

namespace {

int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// One transport for the whole program (creating one is collective).
std::shared_ptr<Transport> nccl_ptr() {
  static std::shared_ptr<Transport> t = [] {
    auto tr = make_nccl_transport();
    tr->set_timeout_seconds(60);
    return tr;
  }();
  return t;
}
Transport& nccl() { return *nccl_ptr(); }

double value_of(int r, int64_t i) { return static_cast<double>((r * 5 + i * 3) % 11) + 0.5 * r; }

}  // namespace

// The small-integer inputs of the algorithm test: every partial sum is exact in f32.
float int_input(int r, int64_t i) { return static_cast<float>((r * 7 + i * 13) % 17 - 8); }

// One GPU per rank of this host (mpirun on one machine: local ranks = ranks).
#define SKIP_WITHOUT_A_GPU_PER_RANK() KILN_SKIP_WITHOUT_CUDA_DEVICES(world_size())

TEST(NcclTransport, UsesTheGpuOfItsLocalRank) {
  SKIP_WITHOUT_A_GPU_PER_RANK();
  Transport& t = nccl();
  EXPECT_STREQ(t.name(), "nccl");
  EXPECT_EQ(t.size(), world_size());
  EXPECT_EQ(t.device(), Device(DeviceType::CUDA, t.local_rank()));
}

TEST(NcclTransport, RingExchangeOfGpuBuffers) {
  SKIP_WITHOUT_A_GPU_PER_RANK();
  Transport& t = nccl();
  const int n = t.size(), r = t.rank();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  for (int64_t count : {int64_t{1}, int64_t{1000}, (int64_t{1} << 20) + 3}) {
    std::vector<float> host(count);
    for (int64_t i = 0; i < count; ++i) host[i] = static_cast<float>(value_of(r, i));
    Tensor out = Tensor::from_vector(host, {count}, t.device());
    Tensor in = Tensor::zeros({count}, DType::F32, t.device());
    const uint64_t before = t.bytes_sent();
    auto req = t.start({P2POp::send(out.raw_data(), count * 4, next, 0),
                        P2POp::recv(in.raw_data(), count * 4, prev, 0)});
    req->wait();
    EXPECT_EQ(t.bytes_sent() - before, static_cast<uint64_t>(count * 4));
    EXPECT_EQ(req->source(1), prev);
    EXPECT_EQ(req->received_bytes(1), static_cast<size_t>(count * 4));
    const std::vector<float> got = in.to_vector<float>();
    int64_t wrong = 0;
    for (int64_t i = 0; i < count; ++i) wrong += got[i] != static_cast<float>(value_of(prev, i));
    EXPECT_EQ(wrong, 0) << "count " << count;
  }
}

TEST(NcclTransport, NativeAllreduceMatchesTheReference) {
  SKIP_WITHOUT_A_GPU_PER_RANK();
  Transport& t = nccl();
  const int n = t.size();
  for (int64_t count : {int64_t{1}, int64_t{1000}, (int64_t{1} << 20) + 7}) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Average}) {
      std::vector<double> host(count);
      for (int64_t i = 0; i < count; ++i) host[i] = value_of(t.rank(), i);
      Tensor d = Tensor::from_vector(host, {count}, t.device());
      t.native_allreduce(Buffer{d.raw_data(), count, ElemType::F64, t.device()}, op);
      const std::vector<double> got = d.to_vector<double>();
      int64_t wrong = 0;
      for (int64_t i = 0; i < count; ++i) {
        double ref = 0;
        for (int q = 0; q < n; ++q) ref += value_of(q, i);
        if (op == ReduceOp::Average) ref /= n;
        wrong += std::abs(got[i] - ref) > 1e-12 * (std::abs(ref) + 1);
      }
      EXPECT_EQ(wrong, 0) << "count " << count << " " << reduce_op_name(op);
    }
  }
}

// The hand-written algorithms run unchanged over NCCL on GPU buffers (the reductions are then
// comm/reduce_cuda.cu's kernels); sums of small integers are exact whatever the order.
TEST(NcclTransport, EveryAlgorithmThroughTheCommunicator) {
  SKIP_WITHOUT_A_GPU_PER_RANK();
  Communicator comm(nccl_ptr());
  const int n = comm.size();
  for (Algorithm alg : {Algorithm::Ring, Algorithm::HalvingDoubling, Algorithm::ParameterServer,
                        Algorithm::Native}) {
    for (int64_t count : {int64_t{1}, int64_t{n + 1}, (int64_t{1} << 20) + 7}) {
      std::vector<float> host(count);
      for (int64_t i = 0; i < count; ++i) host[i] = int_input(comm.rank(), i);
      Tensor g = Tensor::from_vector(host, {count}, comm.transport().device());
      comm.allreduce(g, ReduceOp::Sum, alg);
      const std::vector<float> got = g.to_vector<float>();
      int64_t wrong = 0;
      for (int64_t i = 0; i < count; ++i) {
        float want = 0;
        for (int q = 0; q < n; ++q) want += int_input(q, i);
        wrong += got[i] != want;
      }
      EXPECT_EQ(wrong, 0) << algorithm_name(alg) << " count " << count;
    }
  }
}

TEST(NcclTransport, AnySourceAndHostBuffersAreErrors) {
  SKIP_WITHOUT_A_GPU_PER_RANK();
  Transport& t = nccl();
  Tensor g = Tensor::zeros({4}, DType::F32, t.device());
  try {
    t.start({P2POp::recv(g.raw_data(), 16, kAnySource, 0)});
    ADD_FAILURE() << "an any-source receive over nccl was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Usage);
    EXPECT_NE(std::string(e.what()).find("any-source"), std::string::npos) << e.what();
  }
  std::vector<float> host(4);
  EXPECT_THROW(t.start({P2POp::send(host.data(), 16, 0, 0)}), Error);
}

// Where this host has fewer GPUs than ranks (a CPU machine: none), creating the transport is a
// Usage error that says what NCCL needs, not a crash inside NCCL.
TEST(NcclTransport, FewerGpusThanRanksIsAUsageError) {
  if (cuda::device_count() >= world_size()) {
    GTEST_SKIP() << "skipped: this host has a GPU for every rank";
  }
  try {
    make_nccl_transport();
    ADD_FAILURE() << "make_nccl_transport() succeeded with " << cuda::device_count()
                  << " GPUs for " << world_size() << " ranks";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Usage);
    EXPECT_NE(std::string(e.what()).find("nccl needs one GPU per rank"), std::string::npos)
        << e.what();
  }
}
