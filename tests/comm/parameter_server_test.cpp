// The parameter server (comm/parameter_server.h) over the local transport: the synchronous
// mode is an allreduce, summed in worker order; the asynchronous mode converges on a quadratic,
// broadcasts worker 0's initial parameters, keeps every worker within the staleness bound of the
// slowest (checked with counters the workers keep themselves, not only with the server's own
// report), runs in lock step with staleness 0, and lets the others go on when one finishes.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "comm/algorithms.h"
#include "comm/local_transport.h"
#include "comm/parameter_server.h"
#include "engine/optim/sgd.h"
#include "support/comm_buffers.h"

using namespace kiln;
using namespace kiln::comm;

namespace {

using kiln::testing::f32_buffer;

std::vector<float> random_floats(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(gen);
  return v;
}

OptimizerFactory sgd_factory() {
  return [](std::vector<Tensor> p) { return std::make_unique<SGD>(std::move(p), 0.1); };
}

// Synchronous, dedicated servers: the result is the sum in worker order, bit for bit (the
// server adds worker 0, 1, 2, ... in float), and equals the ring allreduce within rounding.
TEST(ParameterServerSync, EqualsAllreduce) {
  for (int servers : {1, 2, 3}) {
    const int W = 3;
    const int64_t K = 10007;
    std::vector<std::vector<float>> ps_out(W), ring_out(W);
    run_local(W + servers, [&](std::shared_ptr<Transport> t) {
      const PsOptions o{W, servers, false, 0};
      if (t->rank() >= W) {
        serve(*t, o);
        return;
      }
      AlgorithmOptions ao;
      ao.ps_servers = servers;
      std::vector<float> a = random_floats(K, 100 + t->rank()), b = a;
      ps_allreduce(*t, W, f32_buffer(a), ReduceOp::Sum, ao);
      ring_allreduce(*t, W, f32_buffer(b), ReduceOp::Sum, AlgorithmOptions());
      ps_out[t->rank()] = a;
      ring_out[t->rank()] = b;
      ps_shutdown(*t, o);
    });
    std::vector<std::vector<float>> in(W);
    for (int w = 0; w < W; ++w) in[w] = random_floats(K, 100 + w);
    for (int w = 0; w < W; ++w) {
      for (int64_t i = 0; i < K; ++i) {
        float want = in[0][i];
        for (int q = 1; q < W; ++q) want += in[q][i];
        ASSERT_EQ(ps_out[w][i], want) << servers << " servers, worker " << w << ", element " << i;
        ASSERT_NEAR(ps_out[w][i], ring_out[w][i], 1e-6f) << "element " << i;
      }
    }
  }
}

// Asynchronous: minimise ||w - target||^2 with gradient 2 (w - target), pushed by each worker;
// the servers' SGD (lr 0.1) drives w to the target.
TEST(ParameterServerAsync, ConvergesOnAQuadratic) {
  const int W = 3, S = 2;
  const int64_t K = 11;
  std::vector<float> target(K);
  for (int64_t i = 0; i < K; ++i) target[i] = 0.5f * static_cast<float>(i) - 2.0f;
  std::vector<std::vector<float>> final_w(W);
  run_local(W + S, [&](std::shared_ptr<Transport> t) {
    const PsOptions o{W, S, true, 2};
    if (t->rank() >= W) {
      serve(*t, o, sgd_factory());
      return;
    }
    AsyncPsWorker worker(*t, o, K);
    std::vector<float> w(K, t->rank() == 0 ? 0.0f : 123.0f), g(K);  // only worker 0's counts
    worker.init(w.data());
    for (int64_t i = 0; i < K; ++i) EXPECT_EQ(w[i], 0.0f) << "init did not broadcast";
    for (int step = 0; step < 60; ++step) {
      for (int64_t i = 0; i < K; ++i) g[i] = 2 * (w[i] - target[i]);
      worker.push_pull(g.data(), w.data(), 0.1);
    }
    worker.finish();
    final_w[t->rank()] = w;
  });
  for (int r = 0; r < W; ++r)
    for (int64_t i = 0; i < K; ++i) EXPECT_NEAR(final_w[r][i], target[i], 1e-4) << "worker " << r;
}

// Runs W async workers for `steps` steps; worker `slow` sleeps before each push. After every
// push_pull a worker checks, with the counters the others keep, that each unfinished worker
// has started at least (its step - staleness) pushes. Returns each worker's max_staleness_seen.
std::vector<int> run_bounded(int W, int staleness, int steps, int slow, int slow_ms) {
  std::vector<std::atomic<int>> started(W);
  for (auto& s : started) s = 0;
  std::vector<int> seen(W);
  std::atomic<int> violations{0};
  run_local(W + 1, [&](std::shared_ptr<Transport> t) {
    t->set_timeout_seconds(60);
    const PsOptions o{W, 1, true, staleness};
    if (t->rank() == W) {
      serve(*t, o, sgd_factory());
      return;
    }
    AsyncPsWorker worker(*t, o, 5);
    std::vector<float> w(5, 1.0f), g(5, 0.01f);
    worker.init(w.data());
    for (int k = 1; k <= steps; ++k) {
      if (t->rank() == slow) std::this_thread::sleep_for(std::chrono::milliseconds(slow_ms));
      started[t->rank()]++;
      worker.push_pull(g.data(), w.data(), 0.1);
      for (int q = 0; q < W; ++q)
        if (started[q].load() < k - staleness) ++violations;
    }
    seen[t->rank()] = worker.max_staleness_seen();
    worker.finish();
  });
  EXPECT_EQ(violations.load(), 0) << "a worker ran more than " << staleness << " steps ahead";
  return seen;
}

TEST(ParameterServerAsync, FastWorkerStaysWithinTheStalenessBound) {
  const std::vector<int> seen = run_bounded(2, 2, 15, /*slow=*/1, /*slow_ms=*/10);
  EXPECT_LE(seen[0], 2);
  EXPECT_GE(seen[0], 1) << "the fast worker never ran ahead: the bound was not exercised";
  EXPECT_LE(seen[1], 2);
}

TEST(ParameterServerAsync, StalenessZeroIsLockStep) {
  const std::vector<int> seen = run_bounded(3, 0, 10, /*slow=*/2, /*slow_ms=*/5);
  for (int s : seen) EXPECT_EQ(s, 0);
}

// Worker 1 stops after 3 steps; with staleness 0 worker 0 would wait for it forever if finish()
// did not release it.
TEST(ParameterServerAsync, FinishOfOneWorkerDoesNotBlockTheOthers) {
  std::atomic<int> steps0{0};
  run_local(3, [&](std::shared_ptr<Transport> t) {
    t->set_timeout_seconds(20);
    const PsOptions o{2, 1, true, 0};
    if (t->rank() == 2) {
      serve(*t, o, sgd_factory());
      return;
    }
    AsyncPsWorker worker(*t, o, 4);
    std::vector<float> w(4, 0.0f), g(4, 1.0f);
    worker.init(w.data());
    const int steps = t->rank() == 0 ? 20 : 3;
    for (int k = 0; k < steps; ++k) {
      worker.push_pull(g.data(), w.data(), 0.1);
      if (t->rank() == 0) ++steps0;
    }
    if (t->rank() == 1) worker.finish();
    // worker 0 finishes in its destructor
  });
  EXPECT_EQ(steps0.load(), 20);
}

// More servers than elements: a server with an empty shard still takes part in every round.
TEST(ParameterServerAsync, FewerElementsThanServers) {
  const int W = 2, S = 3;
  std::vector<std::vector<float>> final_w(W);
  run_local(W + S, [&](std::shared_ptr<Transport> t) {
    const PsOptions o{W, S, true, 1};
    if (t->rank() >= W) {
      serve(*t, o, sgd_factory());
      return;
    }
    AsyncPsWorker worker(*t, o, 1);
    float w = t->rank() == 0 ? 5.0f : -1.0f, g = 0;
    worker.init(&w);
    EXPECT_EQ(w, 5.0f);
    for (int step = 0; step < 40; ++step) {
      g = 2 * (w - 1.0f);
      worker.push_pull(&g, &w, 0.1);
    }
    final_w[t->rank()] = {w};
  });
  for (int r = 0; r < W; ++r) EXPECT_NEAR(final_w[r][0], 1.0f, 1e-4) << "worker " << r;
}

TEST(ParameterServerErrors, AsyncServerWithoutFactoryIsAUsageError) {
  auto group = make_local_group(2);
  try {
    serve(*group[1], PsOptions{1, 1, true, 2});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Usage);
  }
  EXPECT_THROW(serve(*group[1], PsOptions{2, 1, false, 2}), Error);  // 3 ranks needed
}

}  // namespace
