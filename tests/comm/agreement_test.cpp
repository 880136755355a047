// agreement_test.cpp: comm::any_rank (comm/agreement.h) and loss scaling across ranks, over the
// local transport (ranks as threads).
//
//   1. any_rank on 3 ranks for every combination of flags: true everywhere iff any rank's is.
//   2. Two ranks each check their own gradients (before any averaging), and only rank 1 gets
//      an inf (at steps 2 and 7; rank 0 a NaN at step 9): with any_rank both skip exactly those
//      steps, follow the same scale history and keep identical parameters. The test also checks
//      that the ranks' own findings did differ, so the agreement is what kept them together.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "comm/agreement.h"
#include "comm/communicator.h"
#include "comm/local_transport.h"
#include "engine/optim/grad_scaler.h"
#include "engine/optim/sgd.h"
#include "engine/parallel.h"

namespace kiln::comm {
namespace {

TEST(AnyRank, TrueOnEveryRankWhenAnyRankSaysSo) {
  constexpr int n = 3;
  for (int mask = 0; mask < (1 << n); ++mask) {
    std::vector<int> got(n, -1);
    run_local(n, [&](std::shared_ptr<Transport> t) {
      Communicator comm(t);
      got[comm.rank()] = any_rank(comm, (mask >> comm.rank()) & 1) ? 1 : 0;
    });
    for (int r = 0; r < n; ++r) EXPECT_EQ(got[r], mask != 0 ? 1 : 0) << "mask " << mask << " rank " << r;
  }
}

TEST(AnyRank, TwoRanksSkipTheSameStepsWhenOnlyOneHasAnInf) {
  constexpr int n = 2, kSteps = 14;
  constexpr double kInf = std::numeric_limits<double>::infinity();
  const std::set<int> rank1_inf = {2, 7}, rank0_nan = {9};
  std::vector<std::vector<int>> local(n), skipped(n);
  std::vector<std::vector<std::pair<int64_t, double>>> history(n);
  std::vector<std::vector<float>> final_params(n);
  run_local(n, [&](std::shared_ptr<Transport> t) {
    set_num_threads(1);
    Communicator comm(t);
    const int rank = comm.rank();
    Tensor p = Tensor::full({6}, 1.0).set_requires_grad(true);
    SGD opt({p}, 0.5);
    GradScalerOptions o;
    o.init_scale = 1024;
    o.growth_interval = 3;
    GradScaler scaler(o);
    for (int step = 0; step < kSteps; ++step) {
      // The same scaled gradient on both ranks (as after an average), but for the injections.
      std::vector<float> g(6, static_cast<float>(0.25 * scaler.scale_value()));
      if (rank == 1 && rank1_inf.count(step)) g[step % 6] = static_cast<float>(-kInf);
      if (rank == 0 && rank0_nan.count(step)) g[5] = NAN;
      p.set_grad(Tensor::from_vector(g, {6}));
      const bool mine = scaler.unscale_({p});
      if (mine) local[rank].push_back(step);
      if (scaler.update(any_rank(comm, mine))) {
        opt.step();
      } else {
        skipped[rank].push_back(step);
      }
    }
    for (const auto& c : scaler.history()) history[rank].emplace_back(c.step, c.scale);
    final_params[rank] = p.to_vector<float>();
  });
  EXPECT_EQ(local[0], (std::vector<int>{9}));
  EXPECT_EQ(local[1], (std::vector<int>{2, 7}));
  for (int r = 0; r < n; ++r) EXPECT_EQ(skipped[r], (std::vector<int>{2, 7, 9})) << "rank " << r;
  EXPECT_EQ(history[1], history[0]);
  EXPECT_EQ(final_params[1], final_params[0]);
  // 14 steps, 3 skipped: 11 updates of 0.5 * 0.25 each.
  EXPECT_EQ(final_params[0], std::vector<float>(6, 1.0f - 11 * 0.125f));
}

}  // namespace
}  // namespace kiln::comm
