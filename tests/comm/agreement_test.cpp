// agreement_test.cpp: comm::check_ranks_agree and comm::any_rank (comm/agreement.h), and loss
// scaling across ranks, over the local transport (ranks as threads).
//
//   check_ranks_agree: equal lists pass on every rank; a value that differs, a name one rank
//   lacks or adds, whole lists of another length and a list in another order are refused on
//   every rank with the same message (naming the flags and the ranks, ranges of ranks grouped),
//   within seconds (each rank's timeout is cut to 10 s, so a hang fails the test instead of
//   stalling it); ranks past `members` take no part; the same verdicts over NCCL (bytes staged
//   through the GPUs; the sim tree runs it); the encoding's round trip and its refusal of
//   foreign bytes.
//   any_rank:
//   1. any_rank on 3 ranks for every combination of flags: true everywhere iff any rank's is.
//   2. Two ranks each check their own gradients (before any averaging), and only rank 1 gets
//      an inf (at steps 2 and 7; rank 0 a NaN at step 9): with any_rank both skip exactly those
//      steps, follow the same scale history and keep identical parameters. The test also checks
//      that the ranks' own findings did differ, so the agreement is what kept them together.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
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
#if KILN_WITH_NCCL
#include "comm/nccl_transport.h"
#include "support/cuda_skip.h"
#endif

namespace kiln::comm {
namespace {

// Each rank's outcome of check_ranks_agree with the settings settings_of(rank) gives: "" when it
// returned, else its error's message (a non-Usage error is marked, so that the test fails).
std::vector<std::string> agree_on(int n, const std::function<std::vector<Setting>(int)>& settings_of,
                                  int members = -1) {
  std::vector<std::string> out(n, "(did not run)");
  const auto start = std::chrono::steady_clock::now();
  run_local(n, [&](std::shared_ptr<Transport> t) {
    t->set_timeout_seconds(10);  // a hang fails the test within seconds
    try {
      check_ranks_agree(*t, settings_of(t->rank()), members);
      out[t->rank()] = "";
    } catch (const Error& e) {
      out[t->rank()] = e.kind() == ErrorKind::Usage ? e.what() : std::string("NOT USAGE: ") + e.what();
    }
  });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 5.0) << "check_ranks_agree took " << seconds << " s on " << n << " ranks";
  return out;
}

const std::vector<Setting> kRun = {{"--model", "cnn"}, {"--allreduce", "ring"},
                                   {"--batch-size", "128"}, {"--precision", "fp32"}};

std::vector<Setting> with(std::vector<Setting> s, const std::string& name, const std::string& value) {
  for (Setting& x : s) {
    if (x.name == name) x.value = value;
  }
  return s;
}

TEST(CheckRanksAgree, EqualSettingsPassOnEveryRank) {
  for (int n : {1, 2, 3}) {
    const std::vector<std::string> got = agree_on(n, [](int) { return kRun; });
    for (int r = 0; r < n; ++r) EXPECT_EQ(got[r], "") << "rank " << r << " of " << n;
  }
  // An empty list is a list too.
  for (const std::string& e : agree_on(2, [](int) { return std::vector<Setting>{}; })) {
    EXPECT_EQ(e, "");
  }
}

TEST(CheckRanksAgree, ADifferentValueIsRefusedOnEveryRankNamingTheFlagAndRanks) {
  const std::vector<std::string> got =
      agree_on(2, [](int r) { return r == 1 ? with(kRun, "--model", "mlp") : kRun; });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(got[r], "ranks disagree on --model: rank 0 cnn, rank 1 mlp; every rank must be "
                      "started with the same flags") << "rank " << r;
  }
}

TEST(CheckRanksAgree, SeveralFlagsAndGroupsOfRanks) {
  // 5 ranks: ranks 1-3 use another batch size, rank 4 another algorithm.
  const std::vector<std::string> got = agree_on(5, [](int r) {
    if (r >= 1 && r <= 3) return with(kRun, "--batch-size", "64");
    if (r == 4) return with(kRun, "--allreduce", "hd");
    return kRun;
  });
  for (int r = 0; r < 5; ++r) {
    EXPECT_EQ(got[r], "ranks disagree on --allreduce: ranks 0-3 ring, rank 4 hd; on --batch-size: "
                      "ranks 0, 4 128, ranks 1-3 64; every rank must be started with the same "
                      "flags") << "rank " << r;
  }
}

TEST(CheckRanksAgree, ListsOfOtherLengthsNeitherHangNorMismatchABuffer) {
  // Rank 1 lacks a setting, rank 2 has one more, and rank 3's list is much longer: each list
  // travels with its own length, so none can overflow or starve a receive.
  const std::vector<std::string> got = agree_on(4, [](int r) {
    std::vector<Setting> s = kRun;
    if (r == 1) s.pop_back();
    if (r == 2) s.push_back({"--bucket-mb", "25"});
    if (r == 3) {
      for (int i = 0; i < 2000; ++i) s.push_back({"--extra-" + std::to_string(i), std::string(40, 'x')});
    }
    return s;
  });
  for (int r = 0; r < 4; ++r) {
    EXPECT_NE(got[r].find("ranks disagree on --precision: ranks 0, 2-3 fp32, rank 1 (not set)"),
              std::string::npos) << "rank " << r << ": " << got[r];
    EXPECT_NE(got[r].find("on --bucket-mb: ranks 0-1, 3 (not set), rank 2 25"), std::string::npos)
        << "rank " << r << ": " << got[r];
    EXPECT_NE(got[r].find("on --extra-0: ranks 0-2 (not set), rank 3 " + std::string(40, 'x')),
              std::string::npos) << "rank " << r;
    EXPECT_EQ(got[r], got[0]) << "rank " << r;
  }
}

TEST(CheckRanksAgree, AnEmptyValueAndAnotherOrderAreDifferencesToo) {
  std::vector<std::string> got =
      agree_on(2, [](int r) { return r == 1 ? with(kRun, "--model", "") : kRun; });
  EXPECT_EQ(got[1], "ranks disagree on --model: rank 0 cnn, rank 1 \"\"; every rank must be "
                    "started with the same flags");
  got = agree_on(2, [](int r) {
    std::vector<Setting> s = kRun;
    if (r == 1) std::swap(s[0], s[1]);
    return s;
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(got[r].find("rank 1 lists its settings in another order than rank 0"),
              std::string::npos) << got[r];
  }
}

TEST(CheckRanksAgree, RanksPastMembersTakeNoPart) {
  // 3 ranks, 2 members: rank 2 (a parameter server, say) holds no model and passes nothing;
  // it returns at once and the members still compare their own lists.
  std::vector<std::string> got = agree_on(
      3, [](int r) { return r == 2 ? std::vector<Setting>{} : kRun; }, /*members=*/2);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(got[r], "") << "rank " << r;
  got = agree_on(
      3, [](int r) { return r == 1 ? with(kRun, "--model", "mlp") : kRun; }, /*members=*/2);
  EXPECT_NE(got[0].find("rank 0 cnn, rank 1 mlp"), std::string::npos) << got[0];
  EXPECT_EQ(got[1], got[0]);
  EXPECT_EQ(got[2], "");
}

#if KILN_WITH_NCCL
// Over NCCL, ranks as threads on cuda:0 and cuda:1 (the CUDA simulator runs it in the sim tree;
// a real build needs two GPUs): the bytes are staged through each rank's GPU, and every receive
// is sized exactly, as NCCL requires.
TEST(CheckRanksAgree, OverNcclTheSameVerdicts) {
  KILN_SKIP_WITHOUT_CUDA_DEVICES(2);
  const std::vector<std::function<std::vector<Setting>(int)>> cases = {
      [](int) { return kRun; },
      [](int r) { return r == 1 ? with(kRun, "--model", "mlp") : kRun; },
      [](int r) {
        std::vector<Setting> s = kRun;
        if (r == 1) s.push_back({"--bucket-mb", "25"});
        return s;
      },
  };
  const std::vector<std::string> expected = {
      "",
      "ranks disagree on --model: rank 0 cnn, rank 1 mlp; every rank must be started with the "
      "same flags",
      "ranks disagree on --bucket-mb: rank 0 (not set), rank 1 25; every rank must be started "
      "with the same flags",
  };
  for (size_t c = 0; c < cases.size(); ++c) {
    std::vector<std::string> got(2, "(did not run)");
    run_nccl_local(2, [&](std::shared_ptr<Transport> t) {
      t->set_timeout_seconds(30);
      try {
        check_ranks_agree(*t, cases[c](t->rank()));
        got[t->rank()] = "";
      } catch (const Error& e) {
        got[t->rank()] = e.what();
      }
    });
    for (int r = 0; r < 2; ++r) EXPECT_EQ(got[r], expected[c]) << "case " << c << " rank " << r;
  }
}
#endif

TEST(CheckRanksAgree, EncodingRoundTripsAndRefusesForeignBytes) {
  const std::vector<Setting> s = {{"--model", "cnn"}, {"", ""}, {"a\nb", std::string(3, '\0')}};
  std::vector<Setting> back;
  ASSERT_TRUE(decode_settings(encode_settings(s), back));
  ASSERT_EQ(back.size(), s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    EXPECT_EQ(back[i].name, s[i].name);
    EXPECT_EQ(back[i].value, s[i].value);
  }
  const std::string good = encode_settings(s);
  EXPECT_FALSE(decode_settings("", back));
  EXPECT_FALSE(decode_settings("hello, rank 0", back));
  EXPECT_FALSE(decode_settings(good.substr(0, good.size() - 1), back));  // cut short
  EXPECT_FALSE(decode_settings(good + "x", back));                      // trailing bytes
  std::string huge_count = good;
  huge_count[15] = '\xff';  // the count's low byte, right after the magic word
  EXPECT_FALSE(decode_settings(huge_count, back));
}

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
