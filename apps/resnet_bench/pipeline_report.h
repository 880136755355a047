// pipeline_report.h: what resnet_bench reports about a pipeline beyond its step time: the
// bubble of one traced step, and peak activation memory per stage schedule by schedule.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/resnet_bench/plan.h"
#include "apps/resnet_bench/runs.h"
#include "apps/resnet_bench/schedules.h"
#include "engine/device.h"
#include "engine/trace.h"

namespace kiln::apps {

// One step of `run` traced: its stages' busy time and bubble; the trace written to `path`
// when given.
trace::StageUtilisation traced_step(PipelineRun& run, const Batch& batch, int stages,
                                    const std::string& path);

// Peak activation memory per stage at one split size for gpipe, 1f1b, the other schedules of
// the sweep (zb-h1, zb-h2, interleaved) and gpipe with re-materialisation: two steps each, the
// second's figures, printed and returned as JSON. `plan_for(pieces)` gives the cut into that
// many pieces at that split size.
nlohmann::json memory_comparison(const Workload& w, const std::vector<Device>& devices,
                                 int threads, int64_t split,
                                 const std::vector<SweepSchedule>& schedules, const Batch& batch,
                                 const std::function<Plan(int pieces)>& plan_for);

}  // namespace kiln::apps
