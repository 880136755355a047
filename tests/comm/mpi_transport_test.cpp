// MPI transport, run under mpirun on 2 and 4 ranks (kiln_mpi_test): ranks and hosts, point to
// point exchanges (small and rendezvous-sized), any-source, byte counting, the error paths,
// MPI_Allreduce against a locally computed reference, and the timeout of a missing send.
//
// Every rank runs every test. Each rank can compute what any other rank sends (the values are
// a function of the sender's rank), so every check is exact.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <ctime>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "comm/mpi_transport.h"

using namespace kiln;
using namespace kiln::comm;

namespace {

using Clock = std::chrono::steady_clock;

// One transport for the whole test program (creating one is collective: MPI_Comm_dup).
Transport& mpi() {
  static std::shared_ptr<Transport> t = [] {
    auto tr = make_mpi_transport();
    tr->set_timeout_seconds(60);  // a bug fails in a minute with a message, not at ctest's limit
    return tr;
  }();
  return *t;
}

// What rank r sends as element i in the exchanges below.
double value_of(int r, int64_t i) { return r * 1000.0 + static_cast<double>(i % 977) * 0.5; }

}  // namespace

TEST(MpiTransport, RanksAndHostsComeFromMpi) {
  Transport& t = mpi();
  int world_rank = -1, world_size = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  EXPECT_STREQ(t.name(), "mpi");
  EXPECT_EQ(t.rank(), world_rank);
  EXPECT_EQ(t.size(), world_size);
  EXPECT_TRUE(t.device().is_cpu());
  EXPECT_FALSE(t.host().empty());
  // mpirun on one machine: every rank is on this host, and the local ranks are 0..size-1.
  EXPECT_EQ(t.local_size(), t.size());
  EXPECT_GE(t.local_rank(), 0);
  EXPECT_LT(t.local_rank(), t.local_size());
  std::vector<int> local_ranks(t.size());
  const int mine = t.local_rank();
  MPI_Allgather(&mine, 1, MPI_INT, local_ranks.data(), 1, MPI_INT, MPI_COMM_WORLD);
  EXPECT_EQ(std::set<int>(local_ranks.begin(), local_ranks.end()).size(),
            static_cast<size_t>(t.size())) << "two ranks of one host got the same local rank";
}

// Every rank sends to the next and receives from the previous, in one batch. With 8 MB the
// messages use MPI's rendezvous protocol: posting both halves together is what keeps it from
// deadlocking.
TEST(MpiTransport, RingExchangeSmallAndLarge) {
  Transport& t = mpi();
  const int n = t.size(), r = t.rank();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  for (int64_t count : {int64_t{1}, int64_t{1000}, int64_t{1} << 20}) {
    std::vector<double> out(count), in(count, -1);
    for (int64_t i = 0; i < count; ++i) out[i] = value_of(r, i);
    auto req = t.start({P2POp::send(out.data(), count * 8, next, 1),
                        P2POp::recv(in.data(), count * 8, prev, 1)});
    req->wait();
    EXPECT_EQ(req->source(1), prev);
    EXPECT_EQ(req->received_bytes(1), static_cast<size_t>(count * 8));
    int64_t wrong = 0;
    for (int64_t i = 0; i < count; ++i) wrong += in[i] != value_of(prev, i);
    EXPECT_EQ(wrong, 0) << "count " << count;
  }
}

TEST(MpiTransport, ReceivesFromOnePeerFillInPostingOrder) {
  Transport& t = mpi();
  if (t.rank() == 0) {
    int a = 0, b = 0, c = 0;
    t.run({P2POp::recv(&a, 4, 1, 8), P2POp::recv(&b, 4, 1, 8), P2POp::recv(&c, 4, 1, 8)});
    EXPECT_EQ(a, 11);
    EXPECT_EQ(b, 22);
    EXPECT_EQ(c, 33);
  } else if (t.rank() == 1) {
    const int v[3] = {11, 22, 33};
    for (const int& x : v) t.run({P2POp::send(&x, 4, 0, 8)});
  }
}

TEST(MpiTransport, AnySourceReportsTheSender) {
  Transport& t = mpi();
  if (t.rank() != 0) {
    const int v = 500 + t.rank();
    t.run({P2POp::send(&v, sizeof v, 0, 9)});
    return;
  }
  std::set<int> sources;
  for (int i = 1; i < t.size(); ++i) {
    int v = -1;
    auto req = t.start({P2POp::recv(&v, sizeof v, kAnySource, 9)});
    req->wait();
    EXPECT_EQ(v, 500 + req->source(0));
    EXPECT_EQ(req->received_bytes(0), sizeof v);
    sources.insert(req->source(0));
  }
  EXPECT_EQ(static_cast<int>(sources.size()), t.size() - 1);
}

TEST(MpiTransport, ZeroByteMessageAndTest) {
  Transport& t = mpi();
  if (t.rank() == 0) {
    char buf[4] = {7, 7, 7, 7};
    auto req = t.start({P2POp::recv(buf, sizeof buf, 1, 10)});
    // Rank 1 sends only after our "go": the receive cannot be complete yet.
    EXPECT_FALSE(req->test());
    t.run({P2POp::send(nullptr, 0, 1, 11)});
    req->wait();
    EXPECT_TRUE(req->test());
    EXPECT_EQ(req->received_bytes(0), 0u);
    EXPECT_EQ(req->source(0), 1);
    EXPECT_EQ(buf[0], 7);
  } else if (t.rank() == 1) {
    t.run({P2POp::recv(nullptr, 0, 0, 11)});
    t.run({P2POp::send(nullptr, 0, 0, 10)});
  }
}

TEST(MpiTransport, BytesSentCountsPayloadOfSends) {
  Transport& t = mpi();
  const int n = t.size(), r = t.rank();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  const uint64_t before = t.bytes_sent();
  std::vector<char> out(100 * (r + 1), 'x'), in(1000);
  auto req = t.start({P2POp::send(out.data(), out.size(), next, 12),
                      P2POp::recv(in.data(), in.size(), prev, 12)});
  req->wait();
  EXPECT_EQ(t.bytes_sent() - before, out.size());
  EXPECT_EQ(req->received_bytes(1), 100u * (prev + 1));
}

TEST(MpiTransport, MessageLargerThanTheBufferIsAnError) {
  Transport& t = mpi();
  if (t.rank() == 1) {
    const double big[2] = {1, 2};
    t.run({P2POp::send(big, sizeof big, 0, 13)});
  } else if (t.rank() == 0) {
    double small = 0;
    try {
      t.run({P2POp::recv(&small, sizeof small, 1, 13)});
      ADD_FAILURE() << "a 16-byte message into an 8-byte buffer did not throw";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("does not fit the receive buffer of 8 bytes"),
                std::string::npos) << e.what();
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(MpiTransport, BadOpsAreErrorsBeforeAnythingIsPosted) {
  Transport& t = mpi();
  int v = 0;
  EXPECT_THROW(t.start({P2POp::send(&v, 4, t.size(), 0)}), Error);
  EXPECT_THROW(t.start({P2POp::send(&v, 4, kAnySource, 0)}), Error);
  EXPECT_THROW(t.start({P2POp::recv(&v, 4, 0, -3)}), Error);
  // Over MPI's int count: refused with a message, never truncated (nothing is read).
  try {
    t.start({P2POp::send(&v, static_cast<size_t>(INT_MAX) + 1, 0, 0)});
    ADD_FAILURE() << "a message over INT_MAX bytes was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("send it in parts"), std::string::npos) << e.what();
  }
}

// MPI_Allreduce against the sum computed locally from every rank's known input.
TEST(MpiTransport, NativeAllreduceMatchesTheReference) {
  Transport& t = mpi();
  ASSERT_TRUE(t.has_native_allreduce());
  const int n = t.size();
  for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{1000}, (int64_t{1} << 20) + 7}) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Average}) {
      std::vector<double> d(count);
      std::vector<float> f(count);
      for (int64_t i = 0; i < count; ++i) {
        d[i] = value_of(t.rank(), i);
        f[i] = static_cast<float>(value_of(t.rank(), i));
      }
      t.native_allreduce(Buffer{d.data(), count, ElemType::F64, Device()}, op);
      t.native_allreduce(Buffer{f.data(), count, ElemType::F32, Device()}, op);
      int64_t wrong_d = 0, wrong_f = 0;
      for (int64_t i = 0; i < count; ++i) {
        double ref = 0;
        for (int r = 0; r < n; ++r) ref += value_of(r, i);
        if (op == ReduceOp::Average) ref /= n;
        wrong_d += std::abs(d[i] - ref) > 1e-9 * std::abs(ref) + 1e-12;
        wrong_f += std::abs(f[i] - ref) > 1e-5 * std::abs(ref) + 1e-6;
      }
      EXPECT_EQ(wrong_d, 0) << "f64 count " << count << " " << reduce_op_name(op);
      EXPECT_EQ(wrong_f, 0) << "f32 count " << count << " " << reduce_op_name(op);
    }
  }
  uint16_t h[4] = {};
  for (ElemType type : {ElemType::F16, ElemType::BF16}) {
    try {
      t.native_allreduce(Buffer{h, 4, type, Device()}, ReduceOp::Sum);
      ADD_FAILURE() << elem_name(type) << " native allreduce over mpi did not throw";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Usage);
      EXPECT_NE(std::string(e.what()).find("ring"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(elem_name(type)), std::string::npos) << e.what();
    }
  }
}

// Rank 1 "forgets" a send: rank 0's receive throws the timeout error after the short timeout,
// naming the peer and the tag. The abandoned receive is withdrawn (the request's destructor
// cancels it), then all ranks meet at a barrier and the transport keeps working.
TEST(MpiTransport, AMissingSendTimesOut) {
  Transport& t = mpi();
  if (t.rank() == 0) {
    const double saved = t.timeout_seconds();
    t.set_timeout_seconds(0.3);
    double v = 0;
    const auto t0 = Clock::now();
    std::string message;
    try {
      t.run({P2POp::recv(&v, sizeof v, 1, 42)});
    } catch (const Error& e) {
      message = e.what();
    }
    const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
    t.set_timeout_seconds(saved);
    EXPECT_NE(message.find("(mpi): a receive from rank 1 (tag 42, 8 bytes) did not complete "
                           "within 0.3 s"), std::string::npos) << message;
    EXPECT_GE(waited, 0.3);
    EXPECT_LT(waited, 10.0);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  // The group is still in step: a ring exchange on the same tag works and is not eaten by the
  // withdrawn receive.
  const int n = t.size(), r = t.rank();
  int out = r, in = -1;
  t.run({P2POp::send(&out, 4, (r + 1) % n, 42), P2POp::recv(&in, 4, (r + n - 1) % n, 42)});
  EXPECT_EQ(in, (r + n - 1) % n);
}

// A long wait sleeps between polls instead of spinning: on a 2-core machine a spinning comm
// thread would take the core the compute thread needs. Rank 1 sends after 1 s; rank 0's
// waiting thread may use only a small fraction of that second of CPU.
TEST(MpiTransport, WaitingDoesNotBusySpin) {
  Transport& t = mpi();
  if (t.rank() == 0) {
    int v = 0;
    auto req = t.start({P2POp::recv(&v, sizeof v, 1, 14)});
    timespec c0{}, c1{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
    const auto t0 = Clock::now();
    req->wait();
    const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
    const double cpu = (c1.tv_sec - c0.tv_sec) + (c1.tv_nsec - c0.tv_nsec) * 1e-9;
    EXPECT_EQ(v, 77);
    EXPECT_GT(wall, 0.8);
    EXPECT_LT(cpu, 0.25 * wall) << "the wait used " << cpu << " s of CPU in " << wall << " s";
  } else if (t.rank() == 1) {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    const int v = 77;
    t.run({P2POp::send(&v, sizeof v, 0, 14)});
  }
  MPI_Barrier(MPI_COMM_WORLD);
}
