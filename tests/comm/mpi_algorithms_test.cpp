// Every allreduce algorithm over the MPI transport, run under mpirun on 2, 3 and 4 ranks
// (kiln_mpi_test; binary blocks also on 5, 6 and 7): ring, halving-doubling (3 ranks: the
// non-power-of-two fold), binary blocks (3 = 2 + 1 ranks: two blocks), parameter
// server with co-located and with dedicated server ranks, and MPI's own (native); the other
// collectives through the Communicator's worker thread.
//
// Closed-form checks: rank r's input element i is a known function of (r, i), so every rank
// computes the expected result of the whole group locally. The inputs are small integers plus
// quarters, so every partial sum is exact in f32 and f64 and Sum must match exactly whatever
// order an algorithm adds in; Average (a division by N) is checked to a rounding tolerance.
// Every rank must also end with bit-identical results (compared through a checksum).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "comm/algorithms.h"
#include "comm/communicator.h"
#include "comm/mpi_transport.h"
#include "comm/parameter_server.h"
#include "engine/optim/sgd.h"

using namespace kiln;
using namespace kiln::comm;

namespace {

std::shared_ptr<Transport> mpi() {
  static std::shared_ptr<Transport> t = [] {
    auto tr = make_mpi_transport();
    tr->set_timeout_seconds(60);
    return tr;
  }();
  return t;
}

// Rank r's input element i: an integer in [-8, 8] plus r/4 (exact in f32 sums of a few ranks).
double input(int r, int64_t i) { return static_cast<double>((r * 7 + i * 13) % 17 - 8) + 0.25 * r; }

template <typename T>
std::vector<T> inputs_of(int r, int64_t count) {
  std::vector<T> v(count);
  for (int64_t i = 0; i < count; ++i) v[i] = static_cast<T>(input(r, i));
  return v;
}

// The expected result over ranks [0, n).
double expected(int n, int64_t i, ReduceOp op) {
  double s = 0;
  for (int r = 0; r < n; ++r) s += input(r, i);
  return op == ReduceOp::Average ? s / n : s;
}

// True when `bytes` are identical on ranks [0, n) of MPI_COMM_WORLD (every rank must call it).
bool identical_on_all_ranks(const void* data, size_t bytes) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  const unsigned char* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  uint64_t lo = h, hi = h;
  MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  return lo == hi;
}

template <typename T>
ElemType elem_type_of() { return sizeof(T) == 4 ? ElemType::F32 : ElemType::F64; }

// Runs one allreduce on the members [0, n) of `comm` and checks it against the reference.
// Returns the number of wrong elements (0 on ranks outside the members).
template <typename T>
int64_t check_allreduce(Communicator& comm, Algorithm alg, ReduceOp op, int64_t count) {
  const int n = comm.size(), r = comm.rank();
  std::vector<T> data = inputs_of<T>(r, count);
  comm.allreduce_now(Buffer{data.data(), count, elem_type_of<T>(), Device()}, op, alg);
  const double tol = sizeof(T) == 4 ? 1e-6 : 1e-14;
  int64_t wrong = 0;
  for (int64_t i = 0; i < count; ++i) {
    const double want = expected(n, i, op);
    const double got = static_cast<double>(data[i]);
    const bool ok = op == ReduceOp::Sum ? got == want
                                        : std::abs(got - want) <= tol * (std::abs(want) + 1);
    if (!ok && wrong++ < 3) {
      ADD_FAILURE() << algorithm_name(alg) << " " << reduce_op_name(op) << " "
                    << elem_name(elem_type_of<T>()) << " count " << count << ": element " << i
                    << " is " << got << ", expected " << want;
    }
  }
  return wrong;
}

std::vector<int64_t> counts_for(int n) {
  return {0, 1, n - 1, 1000, (int64_t{1} << 20) + 7};
}

}  // namespace

class MpiAlgorithms : public ::testing::TestWithParam<Algorithm> {};

// Every member rank runs the algorithm on every count, type and op; the result matches the
// reference and is bit-identical on every rank.
TEST_P(MpiAlgorithms, AllreduceMatchesTheReferenceOnEveryRank) {
  const Algorithm alg = GetParam();
  Communicator comm(mpi());
  for (int64_t count : counts_for(comm.size())) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Average}) {
      EXPECT_EQ(check_allreduce<float>(comm, alg, op, count), 0);
      EXPECT_EQ(check_allreduce<double>(comm, alg, op, count), 0);
      // The same again, to compare the results of all ranks bit for bit.
      std::vector<double> d = inputs_of<double>(comm.rank(), count);
      comm.allreduce_now(Buffer{d.data(), count, ElemType::F64, Device()}, op, alg);
      EXPECT_TRUE(identical_on_all_ranks(d.data(), d.size() * sizeof(double)))
          << algorithm_name(alg) << " " << reduce_op_name(op) << " count " << count
          << ": the ranks ended with different results";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllAlgorithms, MpiAlgorithms,
                         ::testing::Values(Algorithm::Ring, Algorithm::HalvingDoubling,
                                           Algorithm::BinaryBlocks, Algorithm::ParameterServer,
                                           Algorithm::Native),
                         [](const ::testing::TestParamInfo<Algorithm>& info) {
                           return std::string(algorithm_name(info.param));
                         });

// The ring's traffic is exactly 2 (N-1)/N * K elements per rank when N divides K: N-1 steps
// of reduce-scatter and N-1 of allgather, each sending one chunk of K/N.
TEST(MpiRing, SendsExactly2NMinus1OverNOfTheBuffer) {
  Transport& t = *mpi();
  Communicator comm(mpi());
  const int n = comm.size();
  for (ElemType type : {ElemType::F32, ElemType::F64}) {
    const int64_t K = int64_t{n} * 12345;
    std::vector<char> bytes(static_cast<size_t>(K) * elem_size(type), 0);
    const uint64_t before = t.bytes_sent();
    comm.allreduce_now(Buffer{bytes.data(), K, type, Device()}, ReduceOp::Sum, Algorithm::Ring);
    const uint64_t want = 2ull * (n - 1) * (K / n) * elem_size(type);
    EXPECT_EQ(t.bytes_sent() - before, want) << "rank " << t.rank() << ", " << elem_name(type);
  }
}

// Binary blocks' traffic is its cost model (comm/binary_blocks.cpp) when every block divides
// K: a rank of a block of b sends (1 - 1/b) K in each in-block phase, plus K/b up to the next
// larger block (all but the largest) and K/b down to the next smaller one (all but the smallest).
TEST(MpiBinaryBlocks, SendsItsCostModel) {
  Transport& t = *mpi();
  Communicator comm(mpi());
  const int n = comm.size(), r = comm.rank();
  std::vector<int> sizes;  // the blocks, largest first on the lowest ranks
  for (int k = 30; k >= 0; --k)
    if ((n >> k) & 1) sizes.push_back(1 << k);
  size_t j = 0;
  for (int first = 0; r >= first + sizes[j];) first += sizes[j++];
  for (ElemType type : {ElemType::F32, ElemType::F64}) {
    const int64_t K = int64_t{64} * 1001;  // divisible by every block up to 64 ranks
    const int64_t b = sizes[j];
    const int64_t elems = 2 * (K - K / b) + (j > 0 ? K / b : 0) + (j + 1 < sizes.size() ? K / b : 0);
    std::vector<char> bytes(static_cast<size_t>(K) * elem_size(type), 0);
    const uint64_t before = t.bytes_sent();
    comm.allreduce_now(Buffer{bytes.data(), K, type, Device()}, ReduceOp::Sum,
                       Algorithm::BinaryBlocks);
    EXPECT_EQ(t.bytes_sent() - before, static_cast<uint64_t>(elems) * elem_size(type))
        << "rank " << r << " of " << n << " (block of " << b << "), " << elem_name(type);
  }
}

// Dedicated parameter servers: the first W ranks are workers, the last S serve (np 2: 1 + 1,
// np 3: 2 + 1, np 4: 2 + 2). The workers' allreduce equals the sum over the workers only.
TEST(MpiParameterServer, DedicatedServersSumTheWorkersGradients) {
  Transport& t = *mpi();
  PsOptions ps;
  ps.servers = t.size() / 2;
  ps.workers = t.size() - ps.servers;
  if (t.rank() >= ps.workers) {
    serve(t, ps);  // until every worker called ps_shutdown
  } else {
    AlgorithmOptions options;
    options.ps_servers = ps.servers;
    Communicator comm(mpi(), ps.workers, options);
    for (int64_t count : counts_for(ps.workers)) {
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Average}) {
        EXPECT_EQ(check_allreduce<float>(comm, Algorithm::ParameterServer, op, count), 0);
        EXPECT_EQ(check_allreduce<double>(comm, Algorithm::ParameterServer, op, count), 0);
      }
    }
    ps_shutdown(t, ps);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// The asynchronous parameter server over MPI, in lock-step (staleness 0): each worker pushes
// a constant gradient, (w + 1) * (i % 3 + 1), for T steps with SGD at lr 0.5, from worker 0's
// initial parameters i % 7. Whatever order the servers apply the pushes in, the last pull of
// every worker comes after all W * T pushes: p = p0 - 0.5 * T * sum_w (w + 1) * (i % 3 + 1),
// exact in f32. (Only init may see worker 0's first push already applied: see below.)
TEST(MpiParameterServer, AsynchronousLockStepEndsWithEveryPushApplied) {
  Transport& t = *mpi();
  PsOptions ps;
  ps.servers = t.size() / 2;
  ps.workers = t.size() - ps.servers;
  ps.async = true;
  ps.staleness = 0;
  const int64_t count = 1001;
  const int steps = 5;
  const double lr = 0.5;
  if (t.rank() >= ps.workers) {
    serve(t, ps, [](std::vector<Tensor> p) { return std::make_unique<SGD>(p, 0.1); });
  } else {
    const int w = t.rank();
    std::vector<float> params(count), grad(count);
    for (int64_t i = 0; i < count; ++i) {
      params[i] = w == 0 ? static_cast<float>(i % 7) : -1000.0f;  // others get worker 0's
      grad[i] = static_cast<float>((w + 1) * (i % 3 + 1));
    }
    AsyncPsWorker worker(t, ps, count);
    worker.init(params.data());
    // init returns each server's current shard: worker 0's parameters, or (asynchronous!)
    // them after worker 0's first push, if that reached the server first. Staleness 0 allows no
    // more: worker 0's second push waits for its first pull, which waits for every worker's
    // first push. Server s holds the balanced chunk s of the vector (as the ring's chunks).
    int64_t begin = 0;
    for (int srv = 0; srv < ps.servers; ++srv) {
      const int64_t len = count / ps.servers + (srv < count % ps.servers ? 1 : 0);
      int64_t wrong_k0 = 0, wrong_k1 = 0;
      for (int64_t i = begin; i < begin + len; ++i) {
        wrong_k0 += params[i] != static_cast<float>(i % 7);
        wrong_k1 += params[i] != static_cast<float>(i % 7 - lr * (i % 3 + 1));
      }
      EXPECT_TRUE(wrong_k0 == 0 || (w > 0 && wrong_k1 == 0))
          << "init: worker " << w << " got neither worker 0's parameters nor them after one "
          << "push from server " << ps.workers + srv << ": " << params[begin] << " ...";
      begin += len;
    }
    for (int s = 0; s < steps; ++s) worker.push_pull(grad.data(), params.data(), lr);
    const int sum_w = ps.workers * (ps.workers + 1) / 2;  // sum of (w + 1)
    int64_t wrong = 0;
    for (int64_t i = 0; i < count; ++i) {
      const double want = i % 7 - lr * steps * sum_w * (i % 3 + 1);
      wrong += params[i] != static_cast<float>(want);
    }
    EXPECT_EQ(wrong, 0) << "worker " << w << " after " << steps << " lock-step pushes";
    EXPECT_EQ(worker.max_staleness_seen(), 0);
    worker.finish();
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// The other collectives, through the Communicator's worker thread, on tensors.
TEST(MpiCollectives, BroadcastAllgatherReduceScatterBarrier) {
  Communicator comm(mpi());
  const int n = comm.size(), r = comm.rank();
  const int64_t m = 1001;

  // broadcast from the last rank
  std::vector<double> mine(m);
  for (int64_t i = 0; i < m; ++i) mine[i] = input(r, i);
  Tensor b = Tensor::from_vector(mine, {m});
  comm.broadcast(b, n - 1);
  std::vector<double> got = b.to_vector<double>();
  int64_t wrong = 0;
  for (int64_t i = 0; i < m; ++i) wrong += got[i] != input(n - 1, i);
  EXPECT_EQ(wrong, 0) << "broadcast";

  // allgather: block q of the output is rank q's input
  Tensor in = Tensor::from_vector(mine, {m});
  Tensor out = Tensor::zeros({n * m}, DType::F64);
  comm.allgather(in, out);
  got = out.to_vector<double>();
  wrong = 0;
  for (int q = 0; q < n; ++q)
    for (int64_t i = 0; i < m; ++i) wrong += got[q * m + i] != input(q, i);
  EXPECT_EQ(wrong, 0) << "allgather";

  // reduce_scatter: rank r gets the sum over ranks of block r; element j of the input of
  // rank q is input(q, j)
  std::vector<double> full(n * m);
  for (int64_t j = 0; j < n * m; ++j) full[j] = input(r, j);
  Tensor rs_in = Tensor::from_vector(full, {n * m});
  Tensor rs_out = Tensor::zeros({m}, DType::F64);
  comm.reduce_scatter(rs_in, rs_out, ReduceOp::Sum);
  got = rs_out.to_vector<double>();
  wrong = 0;
  for (int64_t i = 0; i < m; ++i) wrong += got[i] != expected(n, r * m + i, ReduceOp::Sum);
  EXPECT_EQ(wrong, 0) << "reduce_scatter";

  comm.barrier();

  // allreduce through the worker thread, asynchronously
  Tensor a = Tensor::from_vector(mine, {m});
  auto work = comm.allreduce_async(a, ReduceOp::Sum, Algorithm::Ring);
  work->wait();
  got = a.to_vector<double>();
  wrong = 0;
  for (int64_t i = 0; i < m; ++i) wrong += got[i] != expected(n, i, ReduceOp::Sum);
  EXPECT_EQ(wrong, 0) << "allreduce_async";
}
