// A rank that dies in the middle of a collective: every other rank must stop within a bound
// and its error must name the dead rank, for each algorithm over the local transport (ring,
// halving-doubling, binary blocks, parameter server with co-located and dedicated servers,
// the asynchronous parameter server, DataParallel with its worker thread). Also the pieces of
// the MPI transport's liveness check that run without mpirun (comm/peer_liveness.h: /proc
// states of a real child process, the SIGTERM report) and KILN_FAULT's parsing.
//
// How a rank dies here: DyingTransport wraps rank D's transport and throws from its k-th
// start(): the rank has sent and received part of the collective's messages, then its
// thread fails, as a bug or an out-of-memory error would make it. The timeouts are set to
// 60 s, so a survivor that stops within kBoundSeconds was stopped by the failure, not by a
// timeout.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "comm/algorithms.h"
#include "comm/communicator.h"
#include "comm/data_parallel.h"
#include "comm/fault_injection.h"
#include "comm/local_transport.h"
#include "comm/parameter_server.h"
#include "comm/peer_liveness.h"
#include "engine/ops.h"
#include "engine/optim/sgd.h"
#include "support/comm_buffers.h"

using namespace kiln;
using namespace kiln::comm;

namespace {

using Clock = std::chrono::steady_clock;
constexpr double kBoundSeconds = 5.0;   // a survivor stops this soon after the death
constexpr double kTimeoutSeconds = 60;  // the transports' timeout: far above the bound

// Rank `inner->rank()`'s transport, which fails at its `die_at`-th start() (counting from 1)
// and at every later one: the rank's thread throws in the middle of a collective.
class DyingTransport : public Transport {
 public:
  DyingTransport(std::shared_ptr<Transport> inner, int die_at, std::atomic<int64_t>* died_at_ns)
      : inner_(std::move(inner)), die_at_(die_at), died_at_ns_(died_at_ns) {}
  const char* name() const override { return inner_->name(); }
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  int local_rank() const override { return inner_->local_rank(); }
  int local_size() const override { return inner_->local_size(); }
  std::string host() const override { return inner_->host(); }
  std::unique_ptr<Request> start(const std::vector<P2POp>& ops) override {
    if (++starts_ >= die_at_) {
      died_at_ns_->store(Clock::now().time_since_epoch().count());
      throw Error("rank " + std::to_string(rank()) + " died in the test");
    }
    return inner_->start(ops);
  }
  void check_peers(const std::string& w) const override { inner_->check_peers(w); }
  void abort(const std::string& why) noexcept override { inner_->abort(why); }

 private:
  std::shared_ptr<Transport> inner_;
  int die_at_, starts_ = 0;
  std::atomic<int64_t>* died_at_ns_;
};

// What each rank's thread ended with.
struct Outcome {
  std::string error;     // "" when it returned normally
  double seconds = -1;   // from the death to this rank's error
};

// Runs body(transport) on n local ranks; rank `dead` dies at its die_at-th start(). Returns
// each rank's outcome and checks run_local's rethrown error is the dead rank's own.
std::vector<Outcome> run_with_death(int n, int dead, int die_at,
                                    const std::function<void(std::shared_ptr<Transport>)>& body) {
  std::vector<Outcome> out(n);
  std::mutex mu;
  std::atomic<int64_t> died_at_ns{0};
  try {
    run_local(n, [&](std::shared_ptr<Transport> t) {
      t->set_timeout_seconds(kTimeoutSeconds);
      const int r = t->rank();
      if (r == dead) t = std::make_shared<DyingTransport>(t, die_at, &died_at_ns);
      try {
        body(t);
      } catch (const std::exception& e) {
        const auto now = Clock::now().time_since_epoch().count();
        std::lock_guard<std::mutex> lock(mu);
        out[r].error = e.what();
        out[r].seconds = died_at_ns.load() == 0 ? -1 : (now - died_at_ns.load()) * 1e-9;
        throw;
      }
    });
    ADD_FAILURE() << "run_local returned although rank " << dead << " died";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "rank " + std::to_string(dead) + " died in the test");
  }
  return out;
}

// Every survivor failed soon, with an error naming the dead rank.
void expect_survivors_name(const std::vector<Outcome>& out, int dead, const std::string& what) {
  for (size_t r = 0; r < out.size(); ++r) {
    if (static_cast<int>(r) == dead) continue;
    SCOPED_TRACE(what + ", survivor rank " + std::to_string(r));
    EXPECT_NE(out[r].error.find("rank " + std::to_string(dead) + " failed"), std::string::npos)
        << "the error does not name the dead rank: '" << out[r].error << "'";
    EXPECT_GE(out[r].seconds, 0.0);
    EXPECT_LT(out[r].seconds, kBoundSeconds) << "the survivor did not stop promptly";
  }
}

using kiln::testing::f32_buffer;

// Allreduces in a loop on the calling thread, over `members` ranks of the communicator.
void allreduce_loop(std::shared_ptr<Transport> t, Algorithm alg, int members,
                    AlgorithmOptions ao = {}) {
  Communicator comm(t, members, ao);
  std::vector<float> v(4099, 1.0f + t->rank());
  for (int i = 0; i < 50; ++i) comm.allreduce_now(f32_buffer(v), ReduceOp::Sum, alg);
}

}  // namespace

// Ring, halving-doubling, binary blocks and the co-located parameter server, on 3 ranks (a
// non-power of two: hd's fold, bb's blocks of 2 and 1) and 4: the dead rank has sent some of
// its messages (its 3rd, 6th, 11th start) when it dies.
TEST(RankDeath, EveryAllreduceAlgorithmStopsTheSurvivorsNamingTheDeadRank) {
  for (Algorithm alg : {Algorithm::Ring, Algorithm::HalvingDoubling, Algorithm::BinaryBlocks,
                        Algorithm::ParameterServer}) {
    for (int n : {3, 4}) {
      for (int die_at : {3, 6, 11}) {
        const int dead = 1;
        const auto out = run_with_death(n, dead, die_at, [&](std::shared_ptr<Transport> t) {
          allreduce_loop(t, alg, n);
        });
        expect_survivors_name(out, dead, std::string(algorithm_name(alg)) + " N=" +
                                             std::to_string(n) + " die_at=" +
                                             std::to_string(die_at));
      }
    }
  }
}

// The synchronous parameter server with a dedicated server rank: a dying worker stops the
// server and the other workers; a dying server stops every worker.
TEST(RankDeath, DedicatedParameterServerOrWorkerDies) {
  const int W = 3, S = 1;
  for (int dead : {1, 3}) {
    const auto out = run_with_death(W + S, dead, 4, [&](std::shared_ptr<Transport> t) {
      if (t->rank() >= W) {
        serve(*t, PsOptions{W, S, false, 0});
        return;
      }
      AlgorithmOptions ao;
      ao.ps_servers = S;
      allreduce_loop(t, Algorithm::ParameterServer, W, ao);
      ps_shutdown(*t, PsOptions{W, S, false, 0});
    });
    expect_survivors_name(out, dead, dead < W ? "a worker dies" : "the server dies");
  }
}

// The asynchronous parameter server: the workers never wait for each other, only for the
// server, so a dead worker must still stop the other worker (at its next exchange) and the
// server.
TEST(RankDeath, AsynchronousParameterServerWorkerDies) {
  const int W = 2, S = 1;
  const PsOptions o{W, S, true, 2};
  const int64_t count = 1000;
  const auto out = run_with_death(W + S, 1, 5, [&](std::shared_ptr<Transport> t) {
    if (t->rank() >= W) {
      serve(*t, o, [](std::vector<Tensor> p) { return std::make_unique<SGD>(std::move(p), 0.1); });
      return;
    }
    AsyncPsWorker worker(*t, o, count);
    std::vector<float> params(count, 0.5f), grad(count, 0.01f);
    worker.init(params.data());
    // Worker 0 keeps going far beyond the death; the staleness bound makes it wait for 1.
    for (int i = 0; i < 1000; ++i) worker.push_pull(grad.data(), params.data(), 0.1);
    worker.finish();
  });
  expect_survivors_name(out, 1, "async parameter server");
}

// DataParallel: the allreduces run on the communicator's worker thread while the training
// thread waits in synchronize(); the dead rank's error reaches the survivors' training threads.
TEST(RankDeath, DataParallelWithItsWorkerThread) {
  for (int die_at : {2, 7}) {
    const auto out = run_with_death(3, 1, die_at, [&](std::shared_ptr<Transport> t) {
      Tensor w1 = Tensor::full({300}, 0.1).set_requires_grad(true);
      Tensor w2 = Tensor::full({700}, 0.2).set_requires_grad(true);
      DataParallelOptions dpo;
      dpo.bucket_bytes = 1024;  // several buckets, launched from the hooks during backward
      DataParallel dp(std::make_shared<Communicator>(t), {w1, w2}, {}, dpo);
      const Tensor x1 = Tensor::full({300}, 1.0 + t->rank());
      const Tensor x2 = Tensor::full({700}, 2.0);
      for (int step = 0; step < 50; ++step) {
        Tensor loss = add(sum(mul(w1, x1)), sum(mul(w2, x2)));
        loss.backward();
        dp.synchronize();
        w1.set_grad(Tensor());
        w2.set_grad(Tensor());
      }
    });
    expect_survivors_name(out, 1, "DataParallel die_at=" + std::to_string(die_at));
  }
}

// ---- KILN_FAULT ---------------------------------------------------------------------------

TEST(FaultPlan, ParsesTheThreeKinds) {
  EXPECT_FALSE(parse_fault_plan("").enabled());
  const FaultPlan a = parse_fault_plan("rank=1,step=5");
  EXPECT_EQ(a.rank, 1);
  EXPECT_EQ(a.step, 5);
  EXPECT_EQ(a.kind, FaultKind::Throw);
  EXPECT_EQ(parse_fault_plan("step=2,rank=0,how=kill").kind, FaultKind::Kill);
  EXPECT_EQ(parse_fault_plan("rank=3,step=1,how=exit").kind, FaultKind::Exit);
}

TEST(FaultPlan, MalformedSpecsAreUsageErrorsNamingTheVariable) {
  for (const char* bad : {"rank=1", "step=2", "rank=x,step=1", "rank=1,step=0", "rank=-1,step=1",
                          "rank=1,step=1,how=segv", "rank=1,step=1,when=now", "rank1,step=1"}) {
    try {
      parse_fault_plan(bad);
      ADD_FAILURE() << "'" << bad << "' was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Usage) << bad;
      EXPECT_NE(std::string(e.what()).find("KILN_FAULT"), std::string::npos) << e.what();
    }
  }
}

// ---- /proc liveness ----------------------------------------------------------------------

namespace {

pid_t spawn_sleeper() {
  const pid_t pid = fork();
  if (pid == 0) {
    for (;;) pause();
  }
  return pid;
}

}  // namespace

// A real child process: alive, then a zombie once SIGKILLed (not yet reaped, as a rank killed
// under mpirun can be for a moment), then gone once reaped.
TEST(PeerLiveness, AliveThenZombieThenGone) {
  const pid_t child = spawn_sleeper();
  ASSERT_GT(child, 0);
  const std::string me = this_host_key();
  const PeerProcess peer{1, me, child, process_start_time(child)};
  ASSERT_NE(peer.start_time, 0u);
  EXPECT_EQ(peer_state(peer, me), PeerState::Alive);
  const PeerTable table(0, {PeerProcess{0, me, getpid(), process_start_time(getpid())}, peer});
  EXPECT_EQ(table.local_peers(), 1);
  EXPECT_EQ(table.dead_peers(), "");

  ASSERT_EQ(kill(child, SIGKILL), 0);
  siginfo_t info{};
  ASSERT_EQ(waitid(P_PID, child, &info, WEXITED | WNOWAIT), 0);  // dead, not reaped
  EXPECT_EQ(peer_state(peer, me), PeerState::Zombie);
  EXPECT_NE(table.dead_peers().find("rank 1 (pid " + std::to_string(child) + " on this host) "
                                    "has died (a zombie"), std::string::npos)
      << table.dead_peers();

  ASSERT_EQ(waitpid(child, nullptr, 0), child);  // reaped
  EXPECT_EQ(peer_state(peer, me), PeerState::Gone);
  EXPECT_NE(table.dead_peers().find("rank 1 (pid " + std::to_string(child) + " on this host) "
                                    "has died (its process is gone)"), std::string::npos);
}

// A pid that now belongs to another process (its start time differs) is a dead peer; a peer on
// another host (or in another pid namespace) is never judged from this host's /proc.
TEST(PeerLiveness, ReusedPidIsGoneAndOtherHostsAreRemote) {
  const std::string me = this_host_key();
  const uint64_t mine = process_start_time(getpid());
  ASSERT_NE(mine, 0u);
  EXPECT_EQ(peer_state(PeerProcess{1, me, getpid(), mine}, me), PeerState::Alive);
  EXPECT_EQ(peer_state(PeerProcess{1, me, getpid(), mine + 1}, me), PeerState::Gone);
  EXPECT_EQ(peer_state(PeerProcess{1, "elsewhere pid:[1]", getpid(), mine}, me),
            PeerState::Remote);
  const PeerTable table(0, {PeerProcess{0, me, getpid(), mine},
                            PeerProcess{1, "elsewhere pid:[1]", 1, 1}});
  EXPECT_EQ(table.local_peers(), 0);
  EXPECT_EQ(table.dead_peers(), "");
}

// The SIGTERM report, in a child process: with a dead same-host peer it prints one line naming
// it and exits 1; with none it says the job was ended from outside and exits 143.
TEST(PeerLiveness, SigtermReportNamesTheDeadPeerAndExits1) {
  for (bool with_dead_peer : {true, false}) {
    SCOPED_TRACE(with_dead_peer ? "a dead peer" : "no dead peer");
    const pid_t victim = spawn_sleeper();
    ASSERT_GT(victim, 0);
    const uint64_t victim_start = process_start_time(victim);
    if (with_dead_peer) {
      kill(victim, SIGKILL);
      waitpid(victim, nullptr, 0);
    }
    int pipe_fd[2];
    ASSERT_EQ(pipe(pipe_fd), 0);
    const pid_t reporter = fork();
    if (reporter == 0) {
      dup2(pipe_fd[1], STDERR_FILENO);
      close(pipe_fd[0]);
      const std::string me = this_host_key();
      const PeerTable table(0, {PeerProcess{0, me, getpid(), process_start_time(getpid())},
                                PeerProcess{2, me, victim, victim_start}});
      if (!install_sigterm_report(table, 3, "mpi")) _exit(50);
      kill(getpid(), SIGTERM);
      _exit(51);  // the handler exits before this
    }
    close(pipe_fd[1]);
    std::string text;
    char buf[512];
    ssize_t n;
    while ((n = read(pipe_fd[0], buf, sizeof buf)) > 0) text.append(buf, static_cast<size_t>(n));
    close(pipe_fd[0]);
    int status = 0;
    ASSERT_EQ(waitpid(reporter, &status, 0), reporter);
    ASSERT_TRUE(WIFEXITED(status)) << "the reporter died of a signal: the handler did not run";
    if (with_dead_peer) {
      EXPECT_EQ(WEXITSTATUS(status), 1);
      EXPECT_EQ(text, "kiln: rank 0/3 (mpi): stopped by SIGTERM after rank 2 (pid " +
                          std::to_string(victim) + ") on this host died or exited\n");
    } else {
      EXPECT_EQ(WEXITSTATUS(status), 143);
      EXPECT_EQ(text.rfind("kiln: rank 0/3 (mpi): stopped by SIGTERM (the launcher", 0), 0u)
          << text;
      kill(victim, SIGKILL);
      waitpid(victim, nullptr, 0);
    }
  }
}
