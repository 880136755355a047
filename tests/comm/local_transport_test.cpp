// Local transport (ranks as threads): MPI's matching rules, any-source receives, sizes,
// byte counting, and the failure paths: a rank that throws, a rank that never sends.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "comm/local_transport.h"

using namespace kiln;
using namespace kiln::comm;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Sends/receives one int.
void send_int(Transport& t, int value, int peer, int tag) {
  t.run({P2POp::send(&value, sizeof value, peer, tag)});
}
int recv_int(Transport& t, int peer, int tag) {
  int v = -1;
  t.run({P2POp::recv(&v, sizeof v, peer, tag)});
  return v;
}

}  // namespace

// Three receives from one peer with one tag, posted before the messages arrive, fill in the
// order they were posted; a receive with another tag is not confused with them.
TEST(LocalTransport, ReceivesPostedFirstFillInPostingOrder) {
  run_local(2, [](std::shared_ptr<Transport> t) {
    if (t->rank() == 1) {
      int a = 0, b = 0, c = 0, other = 0;
      auto req = t->start({P2POp::recv(&a, sizeof a, 0, 5), P2POp::recv(&other, sizeof other, 0, 6),
                           P2POp::recv(&b, sizeof b, 0, 5), P2POp::recv(&c, sizeof c, 0, 5)});
      send_int(*t, 0, 0, 99);  // "my receives are posted"
      req->wait();
      EXPECT_EQ(a, 10);
      EXPECT_EQ(b, 20);
      EXPECT_EQ(c, 30);
      EXPECT_EQ(other, 66);
    } else {
      recv_int(*t, 1, 99);
      for (int v : {10, 20}) send_int(*t, v, 1, 5);
      send_int(*t, 66, 1, 6);
      send_int(*t, 30, 1, 5);
    }
  });
}

// Messages that arrive before their receives are queued and matched oldest first.
TEST(LocalTransport, MessagesSentFirstAreMatchedOldestFirst) {
  run_local(2, [](std::shared_ptr<Transport> t) {
    if (t->rank() == 0) {
      for (int v : {1, 2, 3}) send_int(*t, v, 1, 4);
      send_int(*t, 0, 1, 98);  // "all sent"
    } else {
      recv_int(*t, 0, 98);     // every tag-4 message is now queued at rank 1
      EXPECT_EQ(recv_int(*t, 0, 4), 1);
      EXPECT_EQ(recv_int(*t, 0, 4), 2);
      EXPECT_EQ(recv_int(*t, 0, 4), 3);
    }
  });
}

// kAnySource takes the message of whichever rank sent; source() says which.
TEST(LocalTransport, AnySourceReportsTheSender) {
  const int n = 4;
  run_local(n, [&](std::shared_ptr<Transport> t) {
    if (t->rank() != 0) {
      send_int(*t, 100 + t->rank(), 0, 3);
      return;
    }
    std::set<int> sources;
    for (int i = 1; i < n; ++i) {
      int v = -1;
      auto req = t->start({P2POp::recv(&v, sizeof v, kAnySource, 3)});
      req->wait();
      EXPECT_EQ(v, 100 + req->source(0));
      EXPECT_EQ(req->received_bytes(0), sizeof v);
      sources.insert(req->source(0));
    }
    EXPECT_EQ(sources, (std::set<int>{1, 2, 3}));
  });
}

TEST(LocalTransport, MessageLargerThanTheBufferIsAnError) {
  run_local(2, [](std::shared_ptr<Transport> t) {
    if (t->rank() == 0) {
      const double big[2] = {1, 2};
      t->run({P2POp::send(big, sizeof big, 1, 0)});
    } else {
      double small = 0;
      try {
        t->run({P2POp::recv(&small, sizeof small, 0, 0)});
        ADD_FAILURE() << "a 16-byte message into an 8-byte buffer did not throw";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("does not fit the receive buffer of 8 bytes"),
                  std::string::npos) << e.what();
      }
    }
  });
}

TEST(LocalTransport, ZeroByteMessages) {
  run_local(2, [](std::shared_ptr<Transport> t) {
    if (t->rank() == 0) {
      t->run({P2POp::send(nullptr, 0, 1, 2)});
      EXPECT_EQ(t->bytes_sent(), 0u);
    } else {
      char buf[4] = {7, 7, 7, 7};
      auto req = t->start({P2POp::recv(buf, sizeof buf, kAnySource, 2)});
      req->wait();
      EXPECT_EQ(req->received_bytes(0), 0u);
      EXPECT_EQ(req->source(0), 0);
      EXPECT_EQ(buf[0], 7);  // untouched
    }
  });
}

// bytes_sent counts the payload this rank sent, and nothing it received.
TEST(LocalTransport, BytesSentCountsPayloadOfSends) {
  run_local(3, [](std::shared_ptr<Transport> t) {
    std::vector<char> data(100 * (t->rank() + 1), 'x');
    std::vector<char> in0(1000), in1(1000);
    const int next = (t->rank() + 1) % 3, prev = (t->rank() + 2) % 3;
    auto req = t->start({P2POp::send(data.data(), data.size(), next, 0),
                         P2POp::send(data.data(), 28, next, 1),
                         P2POp::recv(in0.data(), in0.size(), prev, 0),
                         P2POp::recv(in1.data(), in1.size(), prev, 1)});
    req->wait();
    EXPECT_EQ(t->bytes_sent(), data.size() + 28);
    EXPECT_EQ(req->received_bytes(2), 100u * (prev + 1));
    EXPECT_EQ(req->received_bytes(3), 28u);
    EXPECT_EQ(req->source(0), -1);  // a send
    EXPECT_EQ(req->received_bytes(0), 0u);
  });
}

// A rank that throws makes the others' waits throw "rank k failed" at once, long before the
// timeout; run_local rethrows the failed rank's own error.
TEST(LocalTransport, ARankThatThrowsStopsTheOthersPromptly) {
  std::mutex mu;
  std::vector<std::string> others;
  std::vector<double> waited;
  try {
    run_local(3, [&](std::shared_ptr<Transport> t) {
      t->set_timeout_seconds(60);
      if (t->rank() == 2) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        throw Error("rank two broke", ErrorKind::Usage);
      }
      const auto t0 = Clock::now();
      try {
        recv_int(*t, 2, 0);
      } catch (const Error& e) {
        std::lock_guard<std::mutex> lock(mu);
        others.push_back(e.what());
        waited.push_back(seconds_since(t0));
      }
    });
    FAIL() << "run_local did not rethrow the failed rank's error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "rank two broke");
    EXPECT_EQ(e.kind(), ErrorKind::Usage);  // the original exception, not a copy of its text
  }
  ASSERT_EQ(others.size(), 2u);
  for (size_t i = 0; i < others.size(); ++i) {
    EXPECT_NE(others[i].find("rank 2 failed: rank two broke"), std::string::npos) << others[i];
    EXPECT_LT(waited[i], 10.0) << "the waiting rank did not notice the failure promptly";
  }
}

// A rank that simply never sends: the waiting rank throws the timeout error, naming the peer,
// the tag and the timeout.
TEST(LocalTransport, APeerThatNeverSendsTimesOut) {
  std::string message;
  double waited = 0;
  run_local(2, [&](std::shared_ptr<Transport> t) {
    if (t->rank() == 0) return;  // never sends
    t->set_timeout_seconds(0.5);
    const auto t0 = Clock::now();
    try {
      recv_int(*t, 0, 7);
    } catch (const Error& e) {
      message = e.what();
    }
    waited = seconds_since(t0);
  });
  EXPECT_NE(message.find("rank 1/2 (local): a receive from rank 0 (tag 7) did not complete "
                         "within 0.5 s"), std::string::npos) << message;
  EXPECT_GE(waited, 0.45);
  EXPECT_LT(waited, 10.0);
}

// The first rank to fail is the error run_local reports; later "rank k failed" errors of the
// ranks it stopped are not.
TEST(LocalTransport, RunLocalRethrowsTheFirstFailure) {
  try {
    run_local(4, [](std::shared_ptr<Transport> t) {
      if (t->rank() == 1) throw Error("first failure");
      recv_int(*t, 1, 0);  // throws "rank 1 failed" on the others; run_local ignores those
    });
    FAIL() << "run_local returned normally";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "first failure");
  }
}

TEST(LocalTransport, BadPeerOrTagIsAnError) {
  run_local(2, [](std::shared_ptr<Transport> t) {
    int v = 0;
    EXPECT_THROW(t->start({P2POp::send(&v, sizeof v, 2, 0)}), Error);
    EXPECT_THROW(t->start({P2POp::send(&v, sizeof v, kAnySource, 0)}), Error);
    EXPECT_THROW(t->start({P2POp::recv(&v, sizeof v, 0, -1)}), Error);
  });
}
