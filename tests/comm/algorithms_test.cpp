// The allreduce algorithms (ring, halving-doubling, binary blocks, parameter server), the other
// collectives and
// the f16 conversions, over the local transport (ranks as threads).
//
// Every allreduce case runs N = 1..8 ranks on counts 0, 1, N - 1, N + 1, 1000 and 100003 (fewer
// elements than ranks, counts not divisible by N, a prime), f32 / f64 / f16 / bf16, Sum and
// Average.
// Rank r's input is a known function of (r, i) whose values are multiples of 1/8 in [-4, 4):
// exactly representable in every type, and so are their sums over 8 ranks, so a Sum must be
// EXACT (any lost, doubled or misplaced contribution shows); an Average is the exact sum
// divided by N, rounded: within a few ulps of the type. Every rank must end with the same bits.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <ios>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "comm/algorithms.h"
#include "comm/communicator.h"
#include "comm/local_transport.h"
#include "comm/parameter_server.h"
#include "engine/host_device.h"

using namespace kiln;
using namespace kiln::comm;

namespace {

// ---- inputs and references -----------------------------------------------------------------

double input_value(int rank, int64_t i) {
  return static_cast<double>((rank * 131 + i * 31 + 7) % 64 - 32) / 8.0;
}

// A host buffer of `count` elements of `type` holding rank r's input.
struct HostBuf {
  ElemType type;
  int64_t count;
  std::vector<char> bytes;
  HostBuf(ElemType t, int64_t n) : type(t), count(n), bytes(static_cast<size_t>(n) * elem_size(t)) {}
  Buffer buffer() {
    Buffer b;
    b.data = bytes.data();
    b.count = count;
    b.type = type;
    return b;
  }
  double get(int64_t i) const {
    switch (type) {
      case ElemType::F32: { float v; std::memcpy(&v, &bytes[i * 4], 4); return v; }
      case ElemType::F64: { double v; std::memcpy(&v, &bytes[i * 8], 8); return v; }
      case ElemType::F16: { uint16_t v; std::memcpy(&v, &bytes[i * 2], 2); return f16_to_f32(v); }
      case ElemType::BF16: { uint16_t v; std::memcpy(&v, &bytes[i * 2], 2); return bf16_to_f32(v); }
    }
    return 0;
  }
  void set(int64_t i, double x) {
    switch (type) {
      case ElemType::F32: { float v = static_cast<float>(x); std::memcpy(&bytes[i * 4], &v, 4); break; }
      case ElemType::F64: std::memcpy(&bytes[i * 8], &x, 8); break;
      case ElemType::F16: { uint16_t v = f32_to_f16(static_cast<float>(x)); std::memcpy(&bytes[i * 2], &v, 2); break; }
      case ElemType::BF16: { uint16_t v = f32_to_bf16(static_cast<float>(x)); std::memcpy(&bytes[i * 2], &v, 2); break; }
    }
  }
  void fill_input(int rank) {
    for (int64_t i = 0; i < count; ++i) set(i, input_value(rank, i));
  }
};

uint64_t fnv1a(const std::vector<char>& b) {
  uint64_t h = 1469598103934665603ull;
  for (char c : b) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

double tolerance(ElemType t, double magnitude) {
  const double eps = t == ElemType::F64   ? 0x1p-52
                     : t == ElemType::F32 ? 0x1p-23
                     : t == ElemType::F16 ? 0x1p-10
                                          : 0x1p-7;  // bf16
  return 2 * eps * magnitude + (t == ElemType::F16 ? 0x1p-24 : 0);
}

// Checks rank r's result against the reference; returns a failure description or "".
std::string check_result(const HostBuf& got, int n, ReduceOp op) {
  for (int64_t i = 0; i < got.count; ++i) {
    double sum = 0;
    for (int q = 0; q < n; ++q) sum += input_value(q, i);
    const double want = op == ReduceOp::Sum ? sum : sum / n;
    const double tol = op == ReduceOp::Sum ? 0.0 : tolerance(got.type, std::fabs(want));
    if (!(std::fabs(got.get(i) - want) <= tol))
      return "element " + std::to_string(i) + " is " + std::to_string(got.get(i)) + ", want " +
             std::to_string(want);
  }
  return "";
}

// ---- the algorithms under test ---------------------------------------------------------------

enum class Alg { Ring, RingSmallSub, HalvingDoubling, BinaryBlocks, PsColocated, Ps1Server, Ps2Servers };

const char* alg_name(Alg a) {
  switch (a) {
    case Alg::Ring: return "Ring";
    case Alg::RingSmallSub: return "RingSubchunk12B";
    case Alg::HalvingDoubling: return "HalvingDoubling";
    case Alg::BinaryBlocks: return "BinaryBlocks";
    case Alg::PsColocated: return "PsColocated";
    case Alg::Ps1Server: return "Ps1Server";
    case Alg::Ps2Servers: return "Ps2Servers";
  }
  return "?";
}

int servers_of(Alg a) { return a == Alg::Ps1Server ? 1 : a == Alg::Ps2Servers ? 2 : 0; }

void run_allreduce(Alg a, Transport& t, int n, const Buffer& b, ReduceOp op) {
  AlgorithmOptions o;
  switch (a) {
    case Alg::Ring: ring_allreduce(t, n, b, op, o); return;
    case Alg::RingSmallSub:
      o.ring_subchunk_bytes = 12;  // 3 f32, 1.5 f64 -> 1, 6 f16: many uneven sub-chunks
      ring_allreduce(t, n, b, op, o);
      return;
    case Alg::HalvingDoubling: halving_doubling_allreduce(t, n, b, op); return;
    case Alg::BinaryBlocks: binary_blocks_allreduce(t, n, b, op); return;
    case Alg::PsColocated:
    case Alg::Ps1Server:
    case Alg::Ps2Servers:
      o.ps_servers = servers_of(a);
      ps_allreduce(t, n, b, op, o);
      return;
  }
}

struct Case {
  int64_t count;
  ElemType type;
  ReduceOp op;
  std::string str() const {
    return std::to_string(count) + " x " + elem_name(type) + " " + reduce_op_name(op);
  }
};

std::vector<Case> cases_for(int n) {
  std::vector<Case> cases;
  for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{n - 1}, int64_t{n + 1}, int64_t{1000},
                        int64_t{100003}})
    for (ElemType type : {ElemType::F32, ElemType::F64, ElemType::F16, ElemType::BF16})
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Average}) cases.push_back({count, type, op});
  return cases;
}

class Allreduce : public ::testing::TestWithParam<std::tuple<Alg, int>> {};

// Every case over one group: workers run them in order; dedicated servers serve until every
// worker shut down. Results are checked on each rank and their hashes compared across ranks.
TEST_P(Allreduce, MatchesReferenceOnEveryRankBitIdentical) {
  const Alg alg = std::get<0>(GetParam());
  const int n = std::get<1>(GetParam());
  const int servers = servers_of(alg);
  const std::vector<Case> cases = cases_for(n);
  std::vector<std::vector<uint64_t>> hashes(cases.size(), std::vector<uint64_t>(n));
  std::mutex mu;
  std::vector<std::string> failures;
  run_local(n + servers, [&](std::shared_ptr<Transport> t) {
    const PsOptions ps{n, servers, false, 0};
    if (t->rank() >= n) {
      serve(*t, ps);
      return;
    }
    for (size_t c = 0; c < cases.size(); ++c) {
      HostBuf buf(cases[c].type, cases[c].count);
      buf.fill_input(t->rank());
      run_allreduce(alg, *t, n, buf.buffer(), cases[c].op);
      const std::string err = check_result(buf, n, cases[c].op);
      if (!err.empty()) {
        std::lock_guard<std::mutex> lock(mu);
        failures.push_back("rank " + std::to_string(t->rank()) + ", " + cases[c].str() + ": " + err);
      }
      hashes[c][t->rank()] = fnv1a(buf.bytes);
    }
    if (servers > 0) ps_shutdown(*t, ps);
  });
  for (const std::string& f : failures) ADD_FAILURE() << f;
  for (size_t c = 0; c < cases.size(); ++c)
    for (int r = 1; r < n; ++r)
      EXPECT_EQ(hashes[c][r], hashes[c][0]) << cases[c].str() << ": rank " << r
                                            << " differs from rank 0";
}

INSTANTIATE_TEST_SUITE_P(
    AllAlgorithms, Allreduce,
    ::testing::Combine(::testing::Values(Alg::Ring, Alg::RingSmallSub, Alg::HalvingDoubling,
                                         Alg::BinaryBlocks, Alg::PsColocated, Alg::Ps1Server, Alg::Ps2Servers),
                       ::testing::Range(1, 9)),
    [](const auto& info) {
      return std::string(alg_name(std::get<0>(info.param))) + "_N" +
             std::to_string(std::get<1>(info.param));
    });

// ---- bytes on the wire -------------------------------------------------------------------------

// Elements rank r sends in a ring allreduce of K over N: every chunk but (r + 1) in the
// reduce-scatter, every chunk but (r + 2) in the allgather.
int64_t ring_elems_sent(int64_t K, int n, int r) {
  if (n == 1) return 0;
  auto len = [&](int c) { c %= n; return K / n + (c < K % n ? 1 : 0); };
  return (K - len(r + 1)) + (K - len(r + 2));
}

// Bytes sent per rank, measured by the transport, for one allreduce.
std::vector<uint64_t> measure_bytes(Alg alg, int n, int64_t count, ElemType type) {
  std::vector<uint64_t> sent(n);
  run_local(n, [&](std::shared_ptr<Transport> t) {
    HostBuf buf(type, count);
    buf.fill_input(t->rank());
    const uint64_t before = t->bytes_sent();
    run_allreduce(alg, *t, n, buf.buffer(), ReduceOp::Sum);
    sent[t->rank()] = t->bytes_sent() - before;
  });
  return sent;
}

TEST(AllreduceBytes, RingSendsTwoNMinusOneOverNTimesKExactly) {
  for (int n = 1; n <= 8; ++n) {
    for (ElemType type : {ElemType::F32, ElemType::F64, ElemType::F16, ElemType::BF16}) {
      // Divisible: the textbook 2 (N - 1) K / N, the same on every rank.
      const int64_t K = 1000 * n;
      for (Alg alg : {Alg::Ring, Alg::RingSmallSub}) {
        const std::vector<uint64_t> sent = measure_bytes(alg, n, K, type);
        for (int r = 0; r < n; ++r)
          EXPECT_EQ(sent[r], 2 * (n - 1) * (K / n) * elem_size(type))
              << alg_name(alg) << " N=" << n << " " << elem_name(type) << " rank " << r;
      }
      // Not divisible: every chunk but two, per rank.
      for (int64_t K2 : {int64_t{1}, int64_t{n + 1}, int64_t{100003}}) {
        const std::vector<uint64_t> sent = measure_bytes(Alg::Ring, n, K2, type);
        for (int r = 0; r < n; ++r)
          EXPECT_EQ(sent[r], ring_elems_sent(K2, n, r) * elem_size(type))
              << "N=" << n << " K=" << K2 << " rank " << r;
      }
    }
  }
}

// Halving-doubling on a power of two and co-located PS also send 2 (N - 1) K / N per rank;
// halving-doubling on other N adds the fold: K more for the pairs that fold.
TEST(AllreduceBytes, HalvingDoublingAndColocatedPsMatchTheModel) {
  for (int n : {1, 2, 4, 8}) {
    const int64_t K = 1024 * n;
    for (Alg alg : {Alg::HalvingDoubling, Alg::PsColocated}) {
      const std::vector<uint64_t> sent = measure_bytes(alg, n, K, ElemType::F32);
      for (int r = 0; r < n; ++r)
        EXPECT_EQ(sent[r], 2 * (n - 1) * (K / n) * 4) << alg_name(alg) << " N=" << n;
    }
  }
  // N = 3: p = 2, ranks 0 and 1 fold. Rank 1 sends K (fold); rank 0 sends K/2 + K/2 (halving,
  // doubling with rank 2) + K (unfold); rank 2 sends K/2 + K/2.
  const int64_t K = 4096;
  const std::vector<uint64_t> sent = measure_bytes(Alg::HalvingDoubling, 3, K, ElemType::F32);
  EXPECT_EQ(sent[0], 2 * K * 4);
  EXPECT_EQ(sent[1], K * 4);
  EXPECT_EQ(sent[2], K * 4);
}

// Elements rank r sends in a binary-blocks allreduce of K over N when every block size divides
// K (the cost model of comm/binary_blocks.cpp): the blocks are N's binary digits, largest first
// on the lowest ranks; a rank of a block of b sends (1 - 1/b) K in each in-block phase, plus
// K/b up (every block but the largest) and K/b down (every block but the smallest).
int64_t binary_blocks_elems_sent(int64_t K, int n, int r) {
  std::vector<int> sizes;
  for (int k = 30; k >= 0; --k)
    if ((n >> k) & 1) sizes.push_back(1 << k);
  size_t j = 0;
  int first = 0;
  while (r >= first + sizes[j]) first += sizes[j++];
  const int64_t b = sizes[j];
  int64_t e = 2 * (K - K / b);
  if (j > 0) e += K / b;                 // up, to the next larger block
  if (j + 1 < sizes.size()) e += K / b;  // down, to the next smaller block
  return e;
}

// Binary blocks: the model on every rank for every N (N = 3, 5, 6, 7 are the non-powers of two
// that show all three kinds of block: largest, middle, smallest), every type; and for counts
// not divisible by the blocks, 2 (N - 1) K over all ranks, like the ring, with no rank above 2K
// but for the odd elements that round up (at most one per step, 2 floor(log2 N) + 2 steps).
TEST(AllreduceBytes, BinaryBlocksMatchesItsCostModel) {
  for (int n = 1; n <= 8; ++n) {
    for (ElemType type : {ElemType::F32, ElemType::F64, ElemType::F16, ElemType::BF16}) {
      const int64_t K = 1000 * 8;  // divisible by every block size up to 8
      const std::vector<uint64_t> sent = measure_bytes(Alg::BinaryBlocks, n, K, type);
      for (int r = 0; r < n; ++r)
        EXPECT_EQ(sent[r], binary_blocks_elems_sent(K, n, r) * elem_size(type))
            << "N=" << n << " " << elem_name(type) << " rank " << r;
    }
    for (int64_t K : {int64_t{1}, int64_t{n - 1}, int64_t{n + 1}, int64_t{100003}}) {
      const std::vector<uint64_t> sent = measure_bytes(Alg::BinaryBlocks, n, K, ElemType::F32);
      int log2n = 0;
      while ((2 << log2n) <= n) ++log2n;
      uint64_t total = 0;
      for (int r = 0; r < n; ++r) {
        total += sent[r];
        EXPECT_LE(sent[r], static_cast<uint64_t>((2 * K + 2 * log2n + 2) * 4))
            << "N=" << n << " K=" << K << " rank " << r;
      }
      EXPECT_EQ(total, static_cast<uint64_t>(2 * (n - 1) * K * 4)) << "N=" << n << " K=" << K;
    }
  }
  // The figures of the cost model, spelled out (K = 4096 f32):
  const int64_t K = 4096;
  auto in_k = [](uint64_t bytes) { return bytes / 4.0 / 4096; };  // in units of K
  // N = 3 = 2 + 1: ranks 0-1 send K/2 (halving) + K/2 (down to rank 2) + K/2 (doubling);
  // rank 2 sends K (up) and nothing else.
  std::vector<uint64_t> s = measure_bytes(Alg::BinaryBlocks, 3, K, ElemType::F32);
  EXPECT_EQ(in_k(s[0]), 1.5); EXPECT_EQ(in_k(s[1]), 1.5); EXPECT_EQ(in_k(s[2]), 1.0);
  // N = 5 = 4 + 1: ranks 0-3 send 2K - K/4; rank 4 K (up), nothing else.
  s = measure_bytes(Alg::BinaryBlocks, 5, K, ElemType::F32);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(in_k(s[r]), 1.75) << "N=5 rank " << r;
  EXPECT_EQ(in_k(s[4]), 1.0);
  // N = 6 = 4 + 2: ranks 0-3 send 2K - K/4; ranks 4-5 2K - K/2.
  s = measure_bytes(Alg::BinaryBlocks, 6, K, ElemType::F32);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(in_k(s[r]), 1.75) << "N=6 rank " << r;
  EXPECT_EQ(in_k(s[4]), 1.5); EXPECT_EQ(in_k(s[5]), 1.5);
  // N = 7 = 4 + 2 + 1: ranks 0-3 2K - K/4; the middle block 2K; rank 6 K.
  s = measure_bytes(Alg::BinaryBlocks, 7, K, ElemType::F32);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(in_k(s[r]), 1.75) << "N=7 rank " << r;
  EXPECT_EQ(in_k(s[4]), 2.0); EXPECT_EQ(in_k(s[5]), 2.0); EXPECT_EQ(in_k(s[6]), 1.0);
}

// ---- the other collectives ------------------------------------------------------------------

TEST(Collectives, ReduceScatterGivesEachRankItsBlockSum) {
  for (int n = 1; n <= 8; ++n)
    for (int64_t m : {int64_t{0}, int64_t{1}, int64_t{3}, int64_t{1001}})
      for (ElemType type : {ElemType::F32, ElemType::F64})
        for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Average}) {
          std::mutex mu;
          std::vector<std::string> failures;
          run_local(n, [&](std::shared_ptr<Transport> t) {
            HostBuf in(type, m * n), out(type, m);
            in.fill_input(t->rank());
            const std::vector<char> in_copy = in.bytes;
            ring_reduce_scatter(*t, n, in.buffer(), out.buffer(), op);
            for (int64_t i = 0; i < m; ++i) {
              double sum = 0;
              for (int q = 0; q < n; ++q) sum += input_value(q, t->rank() * m + i);
              const double want = op == ReduceOp::Sum ? sum : sum / n;
              const double tol = op == ReduceOp::Sum ? 0 : tolerance(type, std::fabs(want));
              if (!(std::fabs(out.get(i) - want) <= tol)) {
                std::lock_guard<std::mutex> lock(mu);
                failures.push_back("N=" + std::to_string(n) + " m=" + std::to_string(m) +
                                   " rank " + std::to_string(t->rank()) + " element " +
                                   std::to_string(i));
                break;
              }
            }
            if (in.bytes != in_copy) {
              std::lock_guard<std::mutex> lock(mu);
              failures.push_back("reduce_scatter modified its input");
            }
          });
          for (const auto& f : failures) ADD_FAILURE() << f;
        }
}

TEST(Collectives, AllgatherPutsRankRsBlockAtR) {
  for (int n = 1; n <= 8; ++n)
    for (int64_t m : {int64_t{0}, int64_t{1}, int64_t{5}, int64_t{1001}}) {
      std::mutex mu;
      std::vector<std::string> failures;
      run_local(n, [&](std::shared_ptr<Transport> t) {
        HostBuf in(ElemType::F64, m), out(ElemType::F64, m * n);
        in.fill_input(t->rank());
        ring_allgather(*t, n, in.buffer(), out.buffer());
        for (int q = 0; q < n; ++q)
          for (int64_t i = 0; i < m; ++i)
            if (out.get(q * m + i) != input_value(q, i)) {
              std::lock_guard<std::mutex> lock(mu);
              failures.push_back("N=" + std::to_string(n) + " m=" + std::to_string(m) + " rank " +
                                 std::to_string(t->rank()) + " block " + std::to_string(q));
              return;
            }
      });
      for (const auto& f : failures) ADD_FAILURE() << f;
    }
}

TEST(Collectives, BroadcastFromEveryRoot) {
  for (int n = 1; n <= 8; ++n)
    for (int root = 0; root < n; ++root)
      for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{777}}) {
        std::atomic<int> wrong{0};
        run_local(n, [&](std::shared_ptr<Transport> t) {
          HostBuf buf(ElemType::F32, count);
          buf.fill_input(t->rank());  // every rank starts with different data
          tree_broadcast(*t, n, buf.buffer(), root);
          for (int64_t i = 0; i < count; ++i)
            if (buf.get(i) != input_value(root, i)) {
              ++wrong;
              return;
            }
        });
        EXPECT_EQ(wrong.load(), 0) << "N=" << n << " root " << root << " count " << count;
      }
}

// A barrier: nobody leaves before everybody arrived. Ranks arrive at staggered times; each
// checks on leaving that all N have arrived. Repeated, so a barrier that lets a fast rank run
// into the next round early would be caught too.
TEST(Collectives, BarrierHoldsEveryRankUntilAllArrive) {
  for (int n = 1; n <= 8; ++n) {
    std::atomic<int> arrived[3] = {{0}, {0}, {0}};
    std::atomic<int> early{0};
    run_local(n, [&](std::shared_ptr<Transport> t) {
      for (int round = 0; round < 3; ++round) {
        std::this_thread::sleep_for(std::chrono::milliseconds(((t->rank() + round) % n) * 3));
        ++arrived[round];
        barrier(*t, n);
        if (arrived[round].load() != n) ++early;
      }
    });
    EXPECT_EQ(early.load(), 0) << "N=" << n;
  }
}

// ---- errors ---------------------------------------------------------------------------------

TEST(AllreduceErrors, NativeOverLocalIsAUsageError) {
  std::atomic<int> usage{0};
  EXPECT_THROW(run_local(2, [&](std::shared_ptr<Transport> t) {
                 Communicator comm(t);
                 HostBuf buf(ElemType::F32, 8);
                 try {
                   comm.allreduce_now(buf.buffer(), ReduceOp::Sum, Algorithm::Native);
                 } catch (const Error& e) {
                   if (e.kind() == ErrorKind::Usage &&
                       std::string(e.what()).find("ring") != std::string::npos)
                     ++usage;
                   throw;
                 }
               }),
               Error);
  EXPECT_GE(usage.load(), 1);
}

// Ranks that disagree on the count fail with an error naming the problem instead of hanging.
TEST(AllreduceErrors, MismatchedCountsFailClearly) {
  for (Alg alg : {Alg::Ring, Alg::HalvingDoubling, Alg::BinaryBlocks, Alg::PsColocated}) {
    try {
      run_local(2, [&](std::shared_ptr<Transport> t) {
        t->set_timeout_seconds(20);
        HostBuf buf(ElemType::F32, t->rank() == 0 ? 100 : 102);
        run_allreduce(alg, *t, 2, buf.buffer(), ReduceOp::Sum);
      });
      ADD_FAILURE() << alg_name(alg) << ": no error";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_TRUE(what.find("bytes") != std::string::npos) << alg_name(alg) << ": " << what;
    }
  }
}

TEST(AllreduceErrors, RankOutsideTheMembersIsRejected) {
  EXPECT_THROW(run_local(3, [&](std::shared_ptr<Transport> t) {
                 if (t->rank() < 2) return;
                 HostBuf buf(ElemType::F32, 4);
                 ring_allreduce(*t, 2, buf.buffer(), ReduceOp::Sum, AlgorithmOptions());
               }),
               Error);
}

// ---- element helpers ------------------------------------------------------------------------

TEST(Reduce, ReduceIntoAndScaleOnTheCpu) {
  for (ElemType type : {ElemType::F32, ElemType::F64, ElemType::F16, ElemType::BF16}) {
    for (int64_t n : {int64_t{0}, int64_t{7}, int64_t{(1 << 20) + 3}}) {  // the last: OpenMP
      HostBuf a(type, n), b(type, n);
      a.fill_input(0);
      b.fill_input(1);
      reduce_into(a.buffer(), b.buffer());
      for (int64_t i = 0; i < n; i += 9973)
        ASSERT_EQ(a.get(i), input_value(0, i) + input_value(1, i)) << elem_name(type) << " " << i;
      scale(a.buffer(), 0.25);
      for (int64_t i = 0; i < n; i += 9973)
        ASSERT_EQ(a.get(i), (input_value(0, i) + input_value(1, i)) / 4) << elem_name(type);
    }
  }
  HostBuf a(ElemType::F32, 4), b(ElemType::F64, 4);
  EXPECT_THROW(reduce_into(a.buffer(), b.buffer()), Error);
}

// ---- f16 conversions ------------------------------------------------------------------------

TEST(Fp16, EveryHalfRoundTripsThroughFloat) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    const bool nan = (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0;
    if (nan) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << h;
      const uint16_t back = f32_to_f16(f);
      ASSERT_TRUE((back & 0x7c00u) == 0x7c00u && (back & 0x3ffu) != 0) << std::hex << h;
    } else {
      ASSERT_EQ(f32_to_f16(f), h) << std::hex << h << " -> " << f;
    }
  }
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(f16_to_f32(0x0400), std::ldexp(1.0f, -14));  // smallest normal
  EXPECT_TRUE(std::isinf(f16_to_f32(0xfc00)) && f16_to_f32(0xfc00) < 0);
}

TEST(Fp16, RoundsToNearestEven) {
  EXPECT_EQ(f32_to_f16(1.0f + 0x1p-11f), 0x3c00);           // halfway, even below
  EXPECT_EQ(f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);       // halfway, even above
  EXPECT_EQ(f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);  // just above halfway
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);                  // below the overflow threshold
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);                  // rounds to infinity
  EXPECT_EQ(f32_to_f16(0x1p-25f), 0x0000);                  // halfway to the first subnormal: 0
  EXPECT_EQ(f32_to_f16(0x1p-25f * 1.5f), 0x0001);
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_f16(3 * 0x1p-25f), 0x0002);              // 1.5 ulp subnormal: tie to even
}

#if defined(__FLT16_MAX__)
// Against the compiler's own _Float16 conversion (IEEE round to nearest even) on random bit
// patterns of every exponent, and all floats near the subnormal and overflow boundaries.
TEST(Fp16, AgreesWithTheCompilersFloat16) {
  std::mt19937 gen(12345);
  auto check = [](uint32_t bits) {
    float f;
    std::memcpy(&f, &bits, 4);
    if (std::isnan(f)) return;
    const _Float16 ref = static_cast<_Float16>(f);
    uint16_t want;
    std::memcpy(&want, &ref, 2);
    ASSERT_EQ(f32_to_f16(f), want) << std::hex << bits;
  };
  for (int i = 0; i < 2000000; ++i) check(gen());
  for (uint32_t b = 0x33000000u - 4096; b < 0x38800000u + 4096; b += 7) check(b);
  for (uint32_t b = 0x477fe000u - 4096; b < 0x47800000u + 4096; ++b) check(b);
}
#endif

}  // namespace
