// schedules.h: the pipeline schedules resnet_bench sweeps (--schedule gpipe,1f1b,zb-h1,...),
// the bubble each would have with ideal stages, and where each one's trace goes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "models/pipeline/pipeline.h"
#include "models/pipeline/schedule.h"

namespace kiln::apps {

// The options of one timed pipeline: the schedule and its chunks per device, rows per
// micro-batch, re-materialisation and each CPU stage's threads.
PipelineOptions pipeline_options(Schedule schedule, int chunks, int64_t split, bool recompute,
                                 int threads);

struct SweepSchedule {
  Schedule schedule;
  int chunks = 1;    // model chunks per device: --chunks for interleaved, 1 for the others
  std::string name;  // schedule_name(): "gpipe", "zb-h1", ...
  // The pieces the model is cut into on `devices` devices.
  int pieces(int devices) const { return devices * chunks; }
};

// The names of --schedule: a comma list, in order, duplicates dropped. Anything else (naive
// included: that is --modes model-parallel) is an Error (Usage) naming the valid ones.
extern const char* const kScheduleNames;  // "gpipe, 1f1b, zb-h1, zb-h2, interleaved"
std::vector<SweepSchedule> parse_schedules(const std::string& list, int chunks);

// The bubble fraction of the schedule's action lists played out with unit forward,
// input-gradient and weight-gradient times on `stages` devices (ideal_bubble of
// models/pipeline/schedule_sim.h; (p - 1) / (m + p - 1) for gpipe and 1f1b): what the measured
// bubble is compared with.
double formula_bubble(const SweepSchedule& s, int stages, int micro_batches);

// Where the traced step of schedule `name` goes: `base` itself when the sweep runs one
// schedule, else base with "_<name>" before its extension (trace.json -> trace_zb-h1.json).
std::string trace_path_for(const std::string& base, const std::string& name, bool several);

}  // namespace kiln::apps
