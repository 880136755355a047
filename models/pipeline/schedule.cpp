// schedule.cpp: naive, GPipe and 1F1B action lists.
#include "models/pipeline/schedule.h"

#include <algorithm>

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

std::vector<PipelineAction> stage_actions(Schedule schedule, int stage, int stages,
                                          int micro_batches, int chunks) {
  KILN_CHECK(chunks == 1, "pipeline: chunks > 1 needs the interleaved schedule");
  KILN_CHECK(schedule == Schedule::Naive || schedule == Schedule::GPipe ||
                 schedule == Schedule::OneFOneB,
             "pipeline: schedule ", schedule_name(schedule), " is not built yet");
  KILN_CHECK(stages >= 1 && stage >= 0 && stage < stages, "stage ", stage, " of ", stages);
  KILN_CHECK(micro_batches >= 1, "a step needs at least one micro-batch");
  KILN_CHECK(schedule != Schedule::Naive || micro_batches == 1,
             "the naive schedule runs the whole batch as one micro-batch");
  const int m = micro_batches;
  std::vector<PipelineAction> actions;
  auto forward = [&](int i) { actions.push_back({PipelineAction::Forward, i}); };
  auto backward = [&](int i) { actions.push_back({PipelineAction::Backward, i}); };
  if (schedule != Schedule::OneFOneB) {
    for (int i = 0; i < m; ++i) forward(i);
    for (int i = m - 1; i >= 0; --i) backward(i);
    return actions;
  }
  // 1F1B: stage s can run p - s - 1 forwards before the first backward reaches it.
  const int warmup = std::min(stages - stage - 1, m);
  for (int i = 0; i < warmup; ++i) forward(i);
  for (int i = 0; i < m - warmup; ++i) {
    forward(warmup + i);
    backward(i);
  }
  for (int i = m - warmup; i < m; ++i) backward(i);
  return actions;
}

int peak_in_flight(const std::vector<PipelineAction>& actions) {
  int live = 0, peak = 0;
  for (const PipelineAction& a : actions) {
    live += a.kind == PipelineAction::Forward ? 1 : -1;
    peak = std::max(peak, live);
  }
  return peak;
}

}  // namespace kiln
