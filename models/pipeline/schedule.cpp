// schedule.cpp: the action lists of naive, GPipe, 1F1B, ZB-H1, ZB-H2 and interleaved 1F1B.
#include "models/pipeline/schedule.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "engine/error.h"

namespace kiln {

const char* schedule_name(Schedule s) {
  switch (s) {
    case Schedule::Naive: return "naive";
    case Schedule::GPipe: return "gpipe";
    case Schedule::OneFOneB: return "1f1b";
    case Schedule::ZeroBubbleH1: return "zb-h1";
    case Schedule::ZeroBubbleH2: return "zb-h2";
    case Schedule::Interleaved: return "interleaved";
  }
  return "?";
}

Schedule parse_schedule(const std::string& name) {
  if (name == "naive") return Schedule::Naive;
  if (name == "gpipe") return Schedule::GPipe;
  if (name == "1f1b") return Schedule::OneFOneB;
  if (name == "zb-h1") return Schedule::ZeroBubbleH1;
  if (name == "zb-h2") return Schedule::ZeroBubbleH2;
  if (name == "interleaved") return Schedule::Interleaved;
  throw Error("unknown pipeline schedule '" + name +
                  "': use naive, gpipe, 1f1b, zb-h1, zb-h2 or interleaved",
              ErrorKind::Usage);
}

bool splits_backward(Schedule s) {
  return s == Schedule::ZeroBubbleH1 || s == Schedule::ZeroBubbleH2;
}

namespace {

using Actions = std::vector<PipelineAction>;

void forward(Actions& a, int i, int chunk = 0) { a.push_back({PipelineAction::Forward, i, chunk}); }
void backward(Actions& a, int i, int chunk = 0) {
  a.push_back({PipelineAction::Backward, i, chunk});
}
void weight(Actions& a, int i) { a.push_back({PipelineAction::Weight, i, 0}); }

Actions gpipe(int m) {
  Actions a;
  for (int i = 0; i < m; ++i) forward(a, i);
  for (int i = m - 1; i >= 0; --i) backward(a, i);
  return a;
}

// 1F1B: stage s can run p - s - 1 forwards before the first backward reaches it.
Actions one_f_one_b(int s, int p, int m) {
  Actions a;
  const int warmup = std::min(p - s - 1, m);
  for (int i = 0; i < warmup; ++i) forward(a, i);
  for (int i = 0; i < m - warmup; ++i) {
    forward(a, warmup + i);
    backward(a, i);
  }
  for (int i = m - warmup; i < m; ++i) backward(a, i);
  return a;
}

// ZB-H1: 1F1B's F's and B's; the first s B's of stage s are not followed by their W, every
// later B is followed by the oldest waiting W, and the held-back W's close the step.
Actions zero_bubble_h1(int s, int p, int m) {
  Actions a;
  const int warmup = std::min(p - s - 1, m);
  int weights_done = 0;
  auto backward_then_weight = [&](int i) {
    backward(a, i);
    if (i >= s) weight(a, weights_done++);
  };
  for (int i = 0; i < warmup; ++i) forward(a, i);
  for (int i = 0; i < m - warmup; ++i) {
    forward(a, warmup + i);
    backward_then_weight(i);
  }
  for (int i = m - warmup; i < m; ++i) backward_then_weight(i);
  while (weights_done < m) weight(a, weights_done++);
  return a;
}

// ZB-H2: every stage, one unit of time after another, runs its next B if its gradient has
// arrived, else its next F if fewer than 2p - 1 micro-batches are in flight and its activation
// has arrived, else its oldest waiting W. Played out once with unit times for all stages; the
// resulting orders are valid for any times, since each stage only waits on its neighbours.
Actions zero_bubble_h2(int stage, int p, int m) {
  const int cap = 2 * p - 1;
  const int never = -1;
  // forward_end[s][i] / backward_end[s][i]: the time F i / B i ends on stage s (never: not yet).
  std::vector<std::vector<int>> forward_end(p, std::vector<int>(m, never));
  std::vector<std::vector<int>> backward_end(p, std::vector<int>(m, never));
  std::vector<int> forwards(p, 0), backwards(p, 0), weights(p, 0);
  Actions mine;
  auto arrived = [&](int end, int t) { return end != never && end <= t; };
  for (int t = 0; weights[stage] < m; ++t) {
    for (int s = 0; s < p; ++s) {
      const int f = forwards[s], b = backwards[s];
      PipelineAction next{PipelineAction::Weight, -1, 0};
      if (b < f && arrived(s == p - 1 ? forward_end[s][b] : backward_end[s + 1][b], t)) {
        next = {PipelineAction::Backward, b, 0};
        backward_end[s][b] = t + 1;
        ++backwards[s];
      } else if (f < m && f - weights[s] < cap && (s == 0 || arrived(forward_end[s - 1][f], t))) {
        next = {PipelineAction::Forward, f, 0};
        forward_end[s][f] = t + 1;
        ++forwards[s];
      } else if (weights[s] < b) {
        next.micro_batch = weights[s]++;
      }
      if (s == stage && next.micro_batch >= 0) mine.push_back(next);
    }
  }
  return mine;
}

// Interleaved 1F1B after Megatron-LM. The device's k-th forward (and k-th backward) in terms of
// (micro-batch, chunk): rounds of micro-batches, each round through chunk 0, then chunk 1, ...
// (backwards from chunk v - 1 down). Megatron's rounds hold p micro-batches; for any m we take
// max(1, m / p) rounds whose sizes differ by at most one, larger first, which keeps every
// round at least p wide (or the whole of m when m < p).
Actions interleaved(int d, int p, int m, int v) {
  const int rounds = std::max(1, m / p);
  std::vector<int> round_size(rounds, m / rounds);
  for (int r = 0; r < m % rounds; ++r) ++round_size[r];
  std::vector<std::pair<int, int>> order;  // (micro-batch, position of the chunk in the round)
  int first = 0;
  for (int size : round_size) {
    for (int c = 0; c < v; ++c)
      for (int i = 0; i < size; ++i) order.push_back({first + i, c});
    first += size;
  }
  const int n = m * v;
  // Device d waits 2 (p - d - 1) units for the first backward to come back, plus the
  // (v - 1) chunks' forwards of the first round that come before micro-batch 0's last chunk.
  const int warmup = std::min((v - 1) * round_size[0] + 2 * (p - d - 1), n);
  Actions a;
  auto fwd = [&](int k) { forward(a, order[k].first, order[k].second); };
  auto bwd = [&](int k) { backward(a, order[k].first, v - 1 - order[k].second); };
  for (int k = 0; k < warmup; ++k) fwd(k);
  for (int k = 0; k < n - warmup; ++k) {
    fwd(warmup + k);
    bwd(k);
  }
  for (int k = n - warmup; k < n; ++k) bwd(k);
  return a;
}

}  // namespace

std::vector<PipelineAction> stage_actions(Schedule schedule, int stage, int stages,
                                          int micro_batches, int chunks) {
  if (chunks < 1 || (chunks > 1 && schedule != Schedule::Interleaved)) {
    throw Error(detail::str("pipeline: ", chunks, " model chunks per device with schedule ",
                            schedule_name(schedule),
                            ": more than one chunk needs the interleaved schedule, and at "
                            "least one chunk is needed"),
                ErrorKind::Usage);
  }
  KILN_CHECK(stages >= 1 && stage >= 0 && stage < stages, "stage ", stage, " of ", stages);
  KILN_CHECK(micro_batches >= 1, "a step needs at least one micro-batch");
  KILN_CHECK(schedule != Schedule::Naive || micro_batches == 1,
             "the naive schedule runs the whole batch as one micro-batch");
  const int s = stage, p = stages, m = micro_batches;
  switch (schedule) {
    case Schedule::Naive:
    case Schedule::GPipe: return gpipe(m);
    case Schedule::OneFOneB: return one_f_one_b(s, p, m);
    case Schedule::ZeroBubbleH1: return zero_bubble_h1(s, p, m);
    case Schedule::ZeroBubbleH2: return zero_bubble_h2(s, p, m);
    case Schedule::Interleaved:
      return chunks == 1 ? one_f_one_b(s, p, m) : interleaved(s, p, m, chunks);
  }
  return {};
}

int peak_in_flight(const std::vector<PipelineAction>& actions) {
  // A micro-batch's activations live from its forward until the pass that ends its backward:
  // the weight pass when the list has them, else the backward.
  const bool split = std::any_of(actions.begin(), actions.end(), [](const PipelineAction& a) {
    return a.kind == PipelineAction::Weight;
  });
  const PipelineAction::Kind last = split ? PipelineAction::Weight : PipelineAction::Backward;
  int live = 0, peak = 0;
  for (const PipelineAction& a : actions) {
    if (a.kind == PipelineAction::Forward) ++live;
    if (a.kind == last) --live;
    peak = std::max(peak, live);
  }
  return peak;
}

}  // namespace kiln
