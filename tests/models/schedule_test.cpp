// Pipeline schedules as data: every schedule's action lists are complete, keep each stage
// boundary's FIFO order, never deadlock, hold the activations they promise, and idle as much as
// the closed forms say with unit pass times (models/pipeline/schedule_sim.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "engine/error.h"
#include "models/pipeline/schedule.h"
#include "models/pipeline/schedule_sim.h"

namespace kiln {
namespace {

using A = PipelineAction;

const Schedule kAll[] = {Schedule::GPipe,        Schedule::OneFOneB,     Schedule::ZeroBubbleH1,
                         Schedule::ZeroBubbleH2, Schedule::Interleaved};

std::string where(Schedule s, int p, int m, int v) {
  return std::string(schedule_name(s)) + " p=" + std::to_string(p) + " m=" + std::to_string(m) +
         " v=" + std::to_string(v);
}

// The chunk counts worth trying: more than one only for the interleaved schedule.
std::vector<int> chunk_counts(Schedule s) {
  return s == Schedule::Interleaved ? std::vector<int>{1, 2, 3} : std::vector<int>{1};
}

std::vector<std::vector<A>> all_lists(Schedule s, int p, int m, int v) {
  std::vector<std::vector<A>> lists;
  for (int d = 0; d < p; ++d) lists.push_back(stage_actions(s, d, p, m, v));
  return lists;
}

TEST(Schedule, EveryMicroBatchAndChunkOnceForwardBeforeBackwardBeforeWeight) {
  for (Schedule s : kAll) {
    for (int v : chunk_counts(s)) {
      for (int p = 1; p <= 5; ++p) {
        for (int m = 1; m <= 12; ++m) {
          const int passes = splits_backward(s) ? 3 : 2;
          for (int d = 0; d < p; ++d) {
            auto actions = stage_actions(s, d, p, m, v);
            ASSERT_EQ(actions.size(), static_cast<size_t>(passes * m * v)) << where(s, p, m, v);
            // seen[i][c]: how many passes of (micro-batch i, chunk c) ran, which must be in the
            // order F, B, W.
            std::vector<std::vector<int>> seen(m, std::vector<int>(v, 0));
            for (const A& a : actions) {
              ASSERT_TRUE(a.micro_batch >= 0 && a.micro_batch < m && a.chunk >= 0 && a.chunk < v)
                  << where(s, p, m, v);
              const int expected = a.kind == A::Forward ? 0 : a.kind == A::Backward ? 1 : 2;
              EXPECT_EQ(seen[a.micro_batch][a.chunk]++, expected) << where(s, p, m, v);
            }
          }
        }
      }
    }
  }
}

// Activations go from virtual stage k to k + 1 and gradients back through one FIFO channel per
// pair of neighbouring devices, so the order of the sends must be the order of the receives:
// per pair of neighbouring virtual stages, and per pair of neighbouring devices (the channel
// from device p - 1 to device 0 carries chunk c to chunk c + 1).
TEST(Schedule, SendsAndReceivesOfEveryBoundaryInTheSameOrder) {
  for (Schedule s : kAll) {
    for (int v : chunk_counts(s)) {
      for (int p = 1; p <= 5; ++p) {
        for (int m = 1; m <= 12; ++m) {
          auto lists = all_lists(s, p, m, v);
          const int last = v * p - 1;
          // order[kind][k]: the micro-batches of virtual stage k's passes of that kind, in order.
          std::vector<std::vector<int>> forwards(last + 1), backwards(last + 1);
          // Per device: the (micro-batch, target virtual stage) it sends, and receives.
          using Message = std::pair<int, int>;
          std::vector<std::vector<Message>> sent_f(p), got_f(p), sent_b(p), got_b(p);
          for (int d = 0; d < p; ++d) {
            for (const A& a : lists[d]) {
              const int k = a.chunk * p + d;
              if (a.kind == A::Forward) {
                forwards[k].push_back(a.micro_batch);
                if (k < last) sent_f[d].push_back({a.micro_batch, k + 1});
                if (k > 0) got_f[d].push_back({a.micro_batch, k});
              } else if (a.kind == A::Backward) {
                backwards[k].push_back(a.micro_batch);
                if (k > 0) sent_b[d].push_back({a.micro_batch, k - 1});
                if (k < last) got_b[d].push_back({a.micro_batch, k});
              }
            }
          }
          for (int k = 0; k < last; ++k) {
            EXPECT_EQ(forwards[k], forwards[k + 1]) << where(s, p, m, v) << " k=" << k;
            EXPECT_EQ(backwards[k + 1], backwards[k]) << where(s, p, m, v) << " k=" << k;
          }
          for (int d = 0; d < p; ++d) {
            EXPECT_EQ(sent_f[d], got_f[(d + 1) % p]) << where(s, p, m, v) << " device " << d;
            EXPECT_EQ(sent_b[(d + 1) % p], got_b[d]) << where(s, p, m, v) << " device " << d;
          }
        }
      }
    }
  }
}

TEST(Schedule, NoScheduleDeadlocksAndTheSimulatorCatchesOneThatDoes) {
  for (Schedule s : kAll)
    for (int v : chunk_counts(s))
      for (int p = 1; p <= 5; ++p)
        for (int m = 1; m <= 12; ++m) {
          SimulatedStep step;
          ASSERT_NO_THROW(step = simulate(s, p, m, v)) << where(s, p, m, v);
          EXPECT_GT(step.makespan, 0);
          // Times other than the unit ones run the same lists to completion too.
          ScheduleTimes uneven{1.0, 2.5, 0.5, 0.25};
          ASSERT_NO_THROW(simulate(s, p, m, v, uneven)) << where(s, p, m, v);
        }
  // 1F1B for two stages runs; swap the two stages' lists and stage 0 waits at B 0 for a
  // gradient that stage 1 computes only after F 1, which stage 0 would send after B 0.
  std::vector<std::vector<A>> lists = {
      {{A::Forward, 0}, {A::Forward, 1}, {A::Backward, 0}, {A::Backward, 1}},
      {{A::Forward, 0}, {A::Backward, 0}, {A::Forward, 1}, {A::Backward, 1}}};
  EXPECT_NO_THROW(simulate_lists(lists, 1, false));
  std::swap(lists[0], lists[1]);
  try {
    simulate_lists(lists, 1, false);
    ADD_FAILURE() << "no deadlock found";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("device 0 at B 0 chunk 0, device 1 at F 1 chunk 0"),
              std::string::npos)
        << message;
  }
  // The naive schedule with m == 1 is GPipe with one micro-batch: one stage at a time.
  SimulatedStep naive = simulate(Schedule::Naive, 3, 1);
  EXPECT_DOUBLE_EQ(naive.makespan, 3 * 3.0);
  EXPECT_NEAR(naive.bubble, 2.0 / 3.0, 1e-12);
}

TEST(Schedule, PeakInFlight) {
  for (int p = 1; p <= 5; ++p) {
    for (int m = 1; m <= 12; ++m) {
      const int one_f_one_b_stage0 = peak_in_flight(stage_actions(Schedule::OneFOneB, 0, p, m));
      for (int s = 0; s < p; ++s) {
        EXPECT_EQ(peak_in_flight(stage_actions(Schedule::OneFOneB, s, p, m)), std::min(p - s, m));
        EXPECT_EQ(peak_in_flight(stage_actions(Schedule::GPipe, s, p, m)), m);
        const int h1 = peak_in_flight(stage_actions(Schedule::ZeroBubbleH1, s, p, m));
        EXPECT_LE(h1, p) << "p=" << p << " m=" << m << " s=" << s;
        if (s == 0) {
          EXPECT_EQ(h1, one_f_one_b_stage0) << "p=" << p << " m=" << m;
        }
        EXPECT_LE(peak_in_flight(stage_actions(Schedule::ZeroBubbleH2, s, p, m)), 2 * p - 1)
            << "p=" << p << " m=" << m << " s=" << s;
      }
      // ZB-H2 uses the room: stage 0 warms up with 2p - 1 forwards when there are that many.
      EXPECT_EQ(peak_in_flight(stage_actions(Schedule::ZeroBubbleH2, 0, p, m)),
                std::min(2 * p - 1, m));
      // Interleaved, in Megatron's case (p divides m): device d holds its warm-up forwards
      // (v - 1) p + 2 (p - d - 1), plus the one forward of the steady phase before a backward.
      if (m % p != 0) continue;
      for (int v = 2; v <= 3; ++v) {
        for (int d = 0; d < p; ++d) {
          EXPECT_EQ(peak_in_flight(stage_actions(Schedule::Interleaved, d, p, m, v)),
                    std::min((v - 1) * p + 2 * (p - d - 1) + 1, m * v))
              << "p=" << p << " m=" << m << " v=" << v << " d=" << d;
        }
      }
    }
  }
}

// With F = B = W = 1 (an unsplit backward takes 2), the closed forms of the bubble.
TEST(Schedule, UnitTimeBubblesMatchTheClosedForms) {
  for (int p = 1; p <= 5; ++p) {
    for (int m = 1; m <= 12; ++m) {
      // GPipe and 1F1B: each stage idles the fill and the drain, (p - 1) (F + B + W) =
      // 3 (p - 1), beside its 3 m of work: (p - 1) / (m + p - 1).
      const double gpipe = (p - 1.0) / (m + p - 1.0);
      EXPECT_NEAR(ideal_bubble(Schedule::GPipe, p, m), gpipe, 1e-12);
      const double one_f_one_b = ideal_bubble(Schedule::OneFOneB, p, m);
      EXPECT_NEAR(one_f_one_b, gpipe, 1e-12);
      // ZB-H1: the W's fill all but (p - 1) of the 3 (p - 1) idle units per stage once m >= p,
      // a third of 1F1B's idle time: (p - 1) / (3 m + p - 1).
      const double h1 = ideal_bubble(Schedule::ZeroBubbleH1, p, m);
      if (p > 1) {
        EXPECT_LT(h1, one_f_one_b) << "p=" << p << " m=" << m;
      }
      if (m >= p) {
        EXPECT_NEAR(h1, (p - 1.0) / (3 * m + p - 1.0), 1e-12) << "p=" << p << " m=" << m;
      }
      // ZB-H2 with m >= 2p - 1: every device idles exactly the start offset, p - 1 units.
      SimulatedStep h2 = simulate(Schedule::ZeroBubbleH2, p, m);
      if (p > 1) {
        EXPECT_LT(h2.bubble, one_f_one_b);
      }
      if (m >= 2 * p - 1) {
        EXPECT_DOUBLE_EQ(h2.makespan, 3 * m + p - 1.0) << "p=" << p << " m=" << m;
        for (int d = 0; d < p; ++d) EXPECT_DOUBLE_EQ(h2.makespan - h2.busy[d], p - 1.0);
      }
      // Interleaved with v chunks when p divides m: the fill and drain shrink to 1/v,
      // (p - 1) / (v m + p - 1); one chunk is 1F1B.
      EXPECT_NEAR(ideal_bubble(Schedule::Interleaved, p, m, 1), gpipe, 1e-12);
      for (int v = 2; v <= 3; ++v) {
        const double inter = ideal_bubble(Schedule::Interleaved, p, m, v);
        if (m % p == 0) {
          EXPECT_NEAR(inter, (p - 1.0) / (v * m + p - 1.0), 1e-12);
        }
        if (p > 1 && m >= p) {
          EXPECT_LT(inter, one_f_one_b) << "p=" << p << " m=" << m;
        }
      }
    }
  }
}

// Consecutive steps that overlap: ZB-H2's step is a parallelogram (stage 0 ends p - 1 units
// before the last stage), so K steps tile and idle p - 1 units per device in all,
// (p - 1) / (3 K m + p - 1). In the others stage 0 ends a step last (its backward comes after
// every other stage's), so the next step cannot start earlier: K steps idle K times as much.
TEST(Schedule, ConsecutiveStepsTileOnlyForZeroBubbleH2) {
  for (int p = 1; p <= 4; ++p) {
    for (int m = 1; m <= 9; ++m) {
      for (int steps = 1; steps <= 3; ++steps) {
        SCOPED_TRACE(detail::str("p=", p, " m=", m, " steps=", steps));
        for (Schedule s : {Schedule::GPipe, Schedule::OneFOneB, Schedule::ZeroBubbleH1}) {
          EXPECT_NEAR(ideal_bubble(s, p, m, 1, steps), ideal_bubble(s, p, m), 1e-12);
        }
        EXPECT_NEAR(ideal_bubble(Schedule::Interleaved, p, m, 2, steps),
                    ideal_bubble(Schedule::Interleaved, p, m, 2), 1e-12);
        const double h2 = ideal_bubble(Schedule::ZeroBubbleH2, p, m, 1, steps);
        if (steps == 1) {
          EXPECT_NEAR(h2, ideal_bubble(Schedule::ZeroBubbleH2, p, m), 1e-12);
        }
        if (m >= 2 * p - 1) {
          EXPECT_NEAR(h2, (p - 1.0) / (3.0 * steps * m + p - 1), 1e-12);
        }
      }
    }
  }
}

// With equal unit times ZB-H1 and ZB-H2 both idle p - 1 units per device; ZB-H2's saved-up
// W's pay off once the passes differ or the transfers cost time.
TEST(Schedule, ZeroBubbleH2AheadOfH1WhenPassesDifferOrTransfersCost) {
  for (ScheduleTimes t : {ScheduleTimes{1, 2, 1, 0}, ScheduleTimes{1, 1, 0.5, 0},
                          ScheduleTimes{1, 1, 1, 0.2}}) {
    for (int p = 2; p <= 5; ++p) {
      for (int m = 2 * p - 1; m <= 12; ++m) {
        const double h1 = simulate(Schedule::ZeroBubbleH1, p, m, 1, t).bubble;
        const double h2 = simulate(Schedule::ZeroBubbleH2, p, m, 1, t).bubble;
        EXPECT_LT(h2, h1) << "p=" << p << " m=" << m << " B=" << t.backward_input;
        EXPECT_LT(h1, simulate(Schedule::OneFOneB, p, m, 1, t).bubble);
      }
    }
  }
}

// The pictures of schedule.h.
TEST(Schedule, PicturesOfTheHeader) {
  // 1F1B for p = 4, m = 6 on stage 1: two warm-up forwards.
  std::vector<A> expected = {{A::Forward, 0},  {A::Forward, 1},  {A::Forward, 2},
                             {A::Backward, 0}, {A::Forward, 3},  {A::Backward, 1},
                             {A::Forward, 4},  {A::Backward, 2}, {A::Forward, 5},
                             {A::Backward, 3}, {A::Backward, 4}, {A::Backward, 5}};
  EXPECT_EQ(stage_actions(Schedule::OneFOneB, 1, 4, 6), expected);
  // ZB-H1 for p = 3, m = 4, stage 1: F0 F1 . B0 F2 B1 W0 F3 B2 W1 B3 W2 W3, and 14 units long.
  expected = {{A::Forward, 0},  {A::Forward, 1}, {A::Backward, 0}, {A::Forward, 2},
              {A::Backward, 1}, {A::Weight, 0},  {A::Forward, 3},  {A::Backward, 2},
              {A::Weight, 1},   {A::Backward, 3}, {A::Weight, 2},  {A::Weight, 3}};
  EXPECT_EQ(stage_actions(Schedule::ZeroBubbleH1, 1, 3, 4), expected);
  SimulatedStep h1 = simulate(Schedule::ZeroBubbleH1, 3, 4);
  EXPECT_DOUBLE_EQ(h1.makespan, 14);
  EXPECT_DOUBLE_EQ(h1.timeline[0][3].start, 5);  // stage 0 idles 3..5 before B0
  // Interleaved, p = 2, v = 2, m = 4, device 0: forwards in rounds of 2 micro-batches per chunk.
  auto inter = stage_actions(Schedule::Interleaved, 0, 2, 4, 2);
  std::vector<std::pair<int, int>> forwards;
  for (const A& a : inter)
    if (a.kind == A::Forward) forwards.push_back({a.micro_batch, a.chunk});
  std::vector<std::pair<int, int>> rounds = {{0, 0}, {1, 0}, {0, 1}, {1, 1},
                                             {2, 0}, {3, 0}, {2, 1}, {3, 1}};
  EXPECT_EQ(forwards, rounds);
  // Warm-up (v - 1) p + 2 (p - d - 1) = 4 forwards, then the first backward: chunk 1 first.
  EXPECT_EQ(inter[4].kind, A::Forward);
  EXPECT_EQ(inter[5], (A{A::Backward, 0, 1}));
}

TEST(Schedule, NamesRoundTripAndBadInputIsAUsageError) {
  for (Schedule s : {Schedule::Naive, Schedule::GPipe, Schedule::OneFOneB,
                     Schedule::ZeroBubbleH1, Schedule::ZeroBubbleH2, Schedule::Interleaved}) {
    EXPECT_EQ(parse_schedule(schedule_name(s)), s);
  }
  EXPECT_TRUE(splits_backward(Schedule::ZeroBubbleH1));
  EXPECT_TRUE(splits_backward(Schedule::ZeroBubbleH2));
  EXPECT_FALSE(splits_backward(Schedule::OneFOneB));
  EXPECT_FALSE(splits_backward(Schedule::Interleaved));
  auto usage = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return e.kind() == ErrorKind::Usage;
    }
    return false;
  };
  EXPECT_TRUE(usage([] { parse_schedule("pipedream"); }));
  EXPECT_TRUE(usage([] { stage_actions(Schedule::OneFOneB, 0, 2, 4, 2); }));
  EXPECT_TRUE(usage([] { stage_actions(Schedule::ZeroBubbleH1, 0, 2, 4, 3); }));
  EXPECT_TRUE(usage([] { stage_actions(Schedule::Interleaved, 0, 2, 4, 0); }));
  EXPECT_FALSE(usage([] { stage_actions(Schedule::Interleaved, 0, 2, 4, 2); }));
  // One chunk of the interleaved schedule is 1F1B.
  EXPECT_EQ(stage_actions(Schedule::Interleaved, 1, 3, 5, 1),
            stage_actions(Schedule::OneFOneB, 1, 3, 5));
}

}  // namespace
}  // namespace kiln
