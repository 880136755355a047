// schedule_sim.h: plays out the action lists of a pipeline schedule with given pass durations,
// to see its bubble without a device, and to check that it cannot deadlock.
//
// Each device runs its list in order. Virtual stage k = c p + d is chunk c of device d. A
// forward of virtual stage k, micro-batch i, starts once the forward of k - 1, i has ended (plus
// the transfer time); a backward once the backward of k + 1, i has ended (plus the transfer;
// the last virtual stage: once its own forward has ended); a weight pass once its backward has.
// A deadlock (actions left, none can start) throws an Error naming the stuck devices and their
// next actions: the validity check of a schedule.
#pragma once

#include <string>
#include <vector>

#include "models/pipeline/schedule.h"

namespace kiln {

// The time of one pass of one chunk (an interleaved device's v chunks each take these times).
struct ScheduleTimes {
  double forward = 1;
  double backward_input = 1;   // B; a schedule that does not split runs B and W as one Backward
  double backward_weight = 1;  // W
  double transfer = 0;         // between two virtual stages
};

struct TimedAction {
  PipelineAction action;
  double start, end;
};

struct SimulatedStep {
  double makespan = 0;
  std::vector<double> busy;  // per device
  // 1 - sum(busy) / (devices * makespan): the idle share, as trace::stage_utilisation measures.
  double bubble = 0;
  std::vector<std::vector<TimedAction>> timeline;  // per device, in list order
};

// The times go by reference: GCC 12.2 with -march=native on an AVX-512 machine built a
// by-value default ScheduleTimes{} argument as four 1's (a transfer of 1).
SimulatedStep simulate(Schedule s, int stages, int micro_batches, int chunks = 1,
                       const ScheduleTimes& t = ScheduleTimes{});

// The same for action lists given directly, one per device (lists.size() devices, `chunks`
// chunks each); `split`: whether a Backward is B alone (W follows as a Weight action). `what`
// names the schedule in a deadlock's error.
SimulatedStep simulate_lists(const std::vector<std::vector<PipelineAction>>& lists, int chunks,
                             bool split, const ScheduleTimes& t = ScheduleTimes{},
                             const std::string& what = "given");

// simulate(...).bubble with unit times: the share a perfectly balanced pipeline would idle.
double ideal_bubble(Schedule s, int stages, int micro_batches, int chunks = 1);

// The same over `steps` consecutive steps that overlap (Pipeline::submit_step): each device's
// list of one step repeated `steps` times, the micro-batches of repeat r numbered from
// r * micro_batches, simulated with unit times. One step's fill and drain are filled by its
// neighbours, so the bubble falls with `steps`; steps = 1 is ideal_bubble above.
double ideal_bubble(Schedule s, int stages, int micro_batches, int chunks, int steps);

}  // namespace kiln
