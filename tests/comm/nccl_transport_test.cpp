// NCCL transport: one GPU per rank, a ring exchange of GPU buffers, byte counting,
// ncclAllReduce against the reference, every allreduce algorithm through the Communicator,
// f16 and bf16 buffers (native and hand algorithms),
// the errors for any-source receives and host buffers, and the GPU order of submitted work
// (a collective must wait for the kernels that write its tensor on the submitting thread's
// stream). Built twice (tests/comm/transport_tests.cmake):
//   nccl_transport_test          ranks as threads (run_nccl_local): label sim under the CUDA
//                                simulator, gpu on a real multi-GPU machine. Ranks: env
//                                KILN_TEST_NCCL_RANKS, default 2.
//   nccl_transport_mpi_test      under mpirun (KILN_NCCL_TEST_MPI, labels mpi and gpu).
// Skips, saying why, on a machine without enough GPUs (every rank of the host decides the same
// way, so no rank waits for a skipped one).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/nccl_transport.h"
#include "comm/wire_format.h"
#include "engine/ops.h"
#include "engine/tensor.h"
#include "support/cuda_skip.h"

#if KILN_NCCL_TEST_MPI
#include <mpi.h>
#endif

using namespace kiln;
using namespace kiln::comm;

namespace {

#if KILN_NCCL_TEST_MPI

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

// This process is one rank: the body runs once, here.
void on_every_rank(const std::function<void(const std::shared_ptr<Transport>&)>& body) {
  body(nccl_ptr());
}

std::shared_ptr<Transport> make_transport_with_too_few_gpus() { return make_nccl_transport(); }

#else  // ranks as threads

int world_size() {
  const char* env = std::getenv("KILN_TEST_NCCL_RANKS");
  return env != nullptr ? std::atoi(env) : 2;
}

// The body runs on world_size() threads, one per rank, each with its own GPU.
void on_every_rank(const std::function<void(const std::shared_ptr<Transport>&)>& body) {
  run_nccl_local(world_size(), [&](std::shared_ptr<Transport> t) {
    t->set_timeout_seconds(60);
    body(t);
  });
}

std::shared_ptr<Transport> make_transport_with_too_few_gpus() {
  run_nccl_local(cuda::device_count() + 1, [](std::shared_ptr<Transport>) {});
  return nullptr;
}

#endif

double value_of(int r, int64_t i) { return static_cast<double>((r * 5 + i * 3) % 11) + 0.5 * r; }

// The small-integer inputs of the algorithm test: every partial sum is exact in f32.
float int_input(int r, int64_t i) { return static_cast<float>((r * 7 + i * 13) % 17 - 8); }

}  // namespace

// One GPU per rank of this host (mpirun on one machine: local ranks = ranks).
#define SKIP_WITHOUT_A_GPU_PER_RANK() KILN_SKIP_WITHOUT_CUDA_DEVICES(world_size())

TEST(NcclTransport, UsesTheGpuOfItsLocalRank) {
  SKIP_WITHOUT_A_GPU_PER_RANK();
  on_every_rank([](const std::shared_ptr<Transport>& t) {
    EXPECT_STREQ(t->name(), "nccl");
    EXPECT_EQ(t->size(), world_size());
    EXPECT_EQ(t->device(), Device(DeviceType::CUDA, t->local_rank()));
  });
}

TEST(NcclTransport, RingExchangeOfGpuBuffers) {
  SKIP_WITHOUT_A_GPU_PER_RANK();
  on_every_rank([](const std::shared_ptr<Transport>& tp) {
    Transport& t = *tp;
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
  });
}

TEST(NcclTransport, NativeAllreduceMatchesTheReference) {
  SKIP_WITHOUT_A_GPU_PER_RANK();
  on_every_rank([](const std::shared_ptr<Transport>& tp) {
    Transport& t = *tp;
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
  });
}

// The hand-written algorithms run unchanged over NCCL on GPU buffers (the reductions are then
// comm/reduce_cuda.cu's kernels); sums of small integers are exact whatever the order.
TEST(NcclTransport, EveryAlgorithmThroughTheCommunicator) {
  SKIP_WITHOUT_A_GPU_PER_RANK();
  on_every_rank([](const std::shared_ptr<Transport>& tp) {
    Communicator comm(tp);
    const int n = comm.size();
    for (Algorithm alg : {Algorithm::Ring, Algorithm::HalvingDoubling, Algorithm::BinaryBlocks,
                          Algorithm::ParameterServer, Algorithm::Native}) {
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
  });
}

// Gradients compressed to f16 or bf16 (comm/wire_format.h) travel over NCCL too: through
// ncclAllReduce (ncclFloat16 / ncclBfloat16) and through the hand algorithms, whose reductions
// are then comm/reduce_cuda.cu's 16-bit kernels. Small integers are exact in both formats.
TEST(NcclTransport, SixteenBitBuffersAllreduceExactly) {
  SKIP_WITHOUT_A_GPU_PER_RANK();
  on_every_rank([](const std::shared_ptr<Transport>& tp) {
    Communicator comm(tp);
    const int n = comm.size();
    for (DType dt : {DType::F16, DType::BF16}) {
      for (Algorithm alg : {Algorithm::Native, Algorithm::Ring, Algorithm::HalvingDoubling}) {
        for (int64_t count : {int64_t{1}, int64_t{n + 1}, int64_t{70001}}) {
          std::vector<float> host(count);
          for (int64_t i = 0; i < count; ++i) host[i] = int_input(comm.rank(), i);
          Tensor g = Tensor::from_vector(host, {count}).to(dt).to(comm.transport().device());
          const Buffer buf{g.raw_data(), count, elem_type_of(dt), g.device()};
          comm.submit([&] { comm.allreduce_now(buf, ReduceOp::Sum, alg); }, g)->wait();
          const std::vector<float> got = g.to(Device()).to(DType::F32).to_vector<float>();
          int64_t wrong = 0;
          for (int64_t i = 0; i < count; ++i) {
            float want = 0;
            for (int q = 0; q < n; ++q) want += int_input(q, i);
            wrong += got[i] != want;
          }
          EXPECT_EQ(wrong, 0) << dtype_name(dt) << " " << algorithm_name(alg) << " count " << count;
        }
      }
    }
  });
}

// GPU order (communicator.h): the tensor of a collective is still being written by a GEMM on
// the submitting thread's stream when the collective is submitted. The collective runs on the
// Communicator's worker thread (another stream) and must wait for that GEMM: without the
// submit-time event it reads the tensor before it is written (NaN: the caching allocator fills
// fresh blocks with it). Streams that run asynchronously are what make this visible, as on a
// GPU; under synchronous simulated streams the GEMM is finished when the launch returns.
TEST(NcclTransport, CollectivesWaitForTheSubmittersKernels) {
  SKIP_WITHOUT_A_GPU_PER_RANK();
  on_every_rank([](const std::shared_ptr<Transport>& tp) {
    auto comm = std::make_shared<Communicator>(tp);
    const int n = comm->size(), r = comm->rank();
    const Device dev = tp->device();
    constexpr int64_t k = 256;  // a GEMM of k x k x k: long for the simulator, exact in f32
    // Every element of a @ b is k * (r + 1).
    const Tensor a = Tensor::full({k, k}, r + 1.0, DType::F32, dev);
    const Tensor b = Tensor::ones({k, k}, DType::F32, dev);
    const float sum = static_cast<float>(k * n * (n + 1) / 2);
    for (Algorithm alg : {Algorithm::Native, Algorithm::Ring}) {
      Tensor g = matmul(a, b);  // queued on this thread's stream
      comm->allreduce(g, ReduceOp::Sum, alg);
      const std::vector<float> got = g.to_vector<float>();
      int64_t wrong = 0;
      for (float v : got) wrong += v != sum;
      EXPECT_EQ(wrong, 0) << algorithm_name(alg) << " on rank " << r << ": " << got[0]
                          << " where every element is " << sum;
    }
    // broadcast (DataParallel's start, and the replica check at the end) likewise.
    Tensor p = matmul(a, b);
    comm->broadcast(p, 0);
    const std::vector<float> got = p.to_vector<float>();
    int64_t wrong = 0;
    for (float v : got) wrong += v != static_cast<float>(k);
    EXPECT_EQ(wrong, 0) << "broadcast on rank " << r << ": " << got[0];
  });
}

TEST(NcclTransport, AnySourceAndHostBuffersAreErrors) {
  SKIP_WITHOUT_A_GPU_PER_RANK();
  on_every_rank([](const std::shared_ptr<Transport>& tp) {
    Transport& t = *tp;
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
  });
}

// Where this host has fewer GPUs than ranks (a CPU machine: none), creating the transport is a
// Usage error that says what NCCL needs, not a crash inside NCCL.
TEST(NcclTransport, FewerGpusThanRanksIsAUsageError) {
#if KILN_NCCL_TEST_MPI
  if (cuda::device_count() >= world_size()) {
    GTEST_SKIP() << "skipped: this host has a GPU for every rank";
  }
#endif
  try {
    make_transport_with_too_few_gpus();
    ADD_FAILURE() << "an nccl transport was made with " << cuda::device_count()
                  << " GPUs for more ranks";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Usage);
    EXPECT_NE(std::string(e.what()).find("nccl needs one GPU per rank"), std::string::npos)
        << e.what();
  }
}

#if !KILN_NCCL_TEST_MPI
// A rank that fails while the others wait for it inside NCCL: run_nccl_local aborts the NCCL
// communicator, the waiting ranks' requests fail, and the failing rank's own error is the one
// reported. The simulator's NCCL releases them at once; a real NCCL may only notice at the
// transport's timeout (60 s here). Last in this file: it leaves a fault on the devices.
TEST(NcclTransport, AFailingRankReleasesTheRanksWaitingForIt) {
  SKIP_WITHOUT_A_GPU_PER_RANK();
  const auto start = std::chrono::steady_clock::now();
  try {
    on_every_rank([](const std::shared_ptr<Transport>& tp) {
      if (tp->rank() == 0) throw Error("rank 0 gives up");
      Tensor g = Tensor::ones({1000}, DType::F32, tp->device());
      tp->native_allreduce(Buffer{g.raw_data(), 1000, ElemType::F32, tp->device()},
                           ReduceOp::Sum);
      ADD_FAILURE() << "rank " << tp->rank() << "'s allreduce completed without rank 0";
    });
    ADD_FAILURE() << "run_nccl_local returned although rank 0 failed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0 gives up"), std::string::npos) << e.what();
  }
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
#if KILN_CUDA_SIM
  EXPECT_LT(waited, 30.0);
#else
  EXPECT_LT(waited, 120.0);
#endif
}
#endif
