// schedule_sim.cpp: the event simulation of a pipeline schedule's action lists.
#include "models/pipeline/schedule_sim.h"

#include <algorithm>
#include <cstddef>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "engine/error.h"

namespace kiln {

SimulatedStep simulate(Schedule schedule, int stages, int micro_batches, int chunks,
                       const ScheduleTimes& t) {
  std::vector<std::vector<PipelineAction>> lists(stages);
  for (int d = 0; d < stages; ++d) {
    lists[d] = stage_actions(schedule, d, stages, micro_batches, chunks);
  }
  return simulate_lists(lists, chunks, splits_backward(schedule), t,
                        detail::str(schedule_name(schedule), " with ", stages, " stages, ",
                                    micro_batches, " micro-batches, ", chunks, " chunks"));
}

SimulatedStep simulate_lists(const std::vector<std::vector<PipelineAction>>& lists, int chunks,
                             bool split, const ScheduleTimes& t, const std::string& what) {
  const int p = static_cast<int>(lists.size()), v = chunks;
  KILN_CHECK(p >= 1 && v >= 1, "simulate: ", p, " devices, ", v, " chunks");
  const int last_virtual = v * p - 1;

  // When each (kind, virtual stage, micro-batch) ended.
  std::map<std::tuple<int, int, int>, double> ended;
  auto end_of = [&](PipelineAction::Kind kind, int virtual_stage, int i, double* end) {
    auto it = ended.find({kind, virtual_stage, i});
    if (it == ended.end()) return false;
    *end = it->second;
    return true;
  };

  SimulatedStep step;
  step.busy.assign(p, 0);
  step.timeline.resize(p);
  std::vector<size_t> next(p, 0);
  std::vector<double> clock(p, 0);
  for (;;) {
    bool progressed = false, finished = true;
    for (int d = 0; d < p; ++d) {
      for (; next[d] < lists[d].size(); ++next[d]) {
        const PipelineAction& a = lists[d][next[d]];
        const int k = a.chunk * p + d;
        double ready = 0, duration = 0;
        bool can = true;
        switch (a.kind) {
          case PipelineAction::Forward:
            duration = t.forward;
            if (k > 0) {
              can = end_of(PipelineAction::Forward, k - 1, a.micro_batch, &ready);
              ready += t.transfer;
            }
            break;
          case PipelineAction::Backward:
            duration = split ? t.backward_input : t.backward_input + t.backward_weight;
            if (k < last_virtual) {
              can = end_of(PipelineAction::Backward, k + 1, a.micro_batch, &ready);
              ready += t.transfer;
            } else {
              can = end_of(PipelineAction::Forward, k, a.micro_batch, &ready);
            }
            break;
          case PipelineAction::Weight:
            duration = t.backward_weight;
            can = end_of(PipelineAction::Backward, k, a.micro_batch, &ready);
            break;
        }
        if (!can) break;
        const double start = std::max(clock[d], ready);
        clock[d] = start + duration;
        step.busy[d] += duration;
        ended[{a.kind, k, a.micro_batch}] = clock[d];
        step.timeline[d].push_back({a, start, clock[d]});
        progressed = true;
      }
      if (next[d] < lists[d].size()) finished = false;
    }
    if (finished) break;
    if (!progressed) {
      static const char* kind_name[] = {"F", "B", "W"};
      std::string stuck;
      for (int d = 0; d < p; ++d) {
        if (next[d] == lists[d].size()) continue;
        const PipelineAction& a = lists[d][next[d]];
        stuck += detail::str(stuck.empty() ? "" : ", ", "device ", d, " at ", kind_name[a.kind],
                             " ", a.micro_batch, " chunk ", a.chunk);
      }
      throw Error(detail::str("pipeline schedule ", what, " deadlocks: ", stuck));
    }
  }
  step.makespan = *std::max_element(clock.begin(), clock.end());
  double busy = 0;
  for (double b : step.busy) busy += b;
  step.bubble = step.makespan > 0 ? 1 - busy / (p * step.makespan) : 0;
  return step;
}

double ideal_bubble(Schedule s, int stages, int micro_batches, int chunks) {
  return simulate(s, stages, micro_batches, chunks).bubble;
}

double ideal_bubble(Schedule s, int stages, int micro_batches, int chunks, int steps) {
  KILN_CHECK(steps >= 1, "ideal_bubble: steps must be >= 1, got ", steps);
  std::vector<std::vector<PipelineAction>> lists(stages);
  for (int d = 0; d < stages; ++d) {
    const std::vector<PipelineAction> one = stage_actions(s, d, stages, micro_batches, chunks);
    for (int r = 0; r < steps; ++r) {
      for (PipelineAction a : one) {
        a.micro_batch += r * micro_batches;
        lists[d].push_back(a);
      }
    }
  }
  return simulate_lists(lists, chunks, splits_backward(s), ScheduleTimes{},
                        detail::str(schedule_name(s), " over ", steps, " steps"))
      .bubble;
}

}  // namespace kiln
