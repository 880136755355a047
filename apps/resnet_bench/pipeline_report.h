// pipeline_report.h: what resnet_bench reports about a pipeline beyond its step time: the
// bubble of one traced step and of consecutive overlapping steps, and peak activation memory per stage schedule by schedule.
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

// `steps` consecutive steps of `run` submitted at once (they overlap: Pipeline::submit_step)
// and traced: the stages' busy time over the window from the first span of the first step to
// the last span of the last, and the bubble 1 - sum busy / (stages x window).
trace::StageUtilisation traced_steps(PipelineRun& run, const Batch& batch, int stages,
                                     int steps);

// The traced bubble of `run` (schedule `sc`), printed on one line and returned as JSON: one
// step alone (bubble_measured, beside bubble_ideal, the unit-time simulation of one step), and
// kOverlappedSteps consecutive overlapping steps (bubble_measured_overlapped beside
// bubble_ideal_overlapped: ideal_bubble over that many steps). `path`: one step's trace.
constexpr int kOverlappedSteps = 3;
nlohmann::json traced_bubble_report(PipelineRun& run, const SweepSchedule& sc,
                                    const Batch& batch, int stages, const std::string& path,
                                    bool fastest);

// Peak activation memory per stage at one split size for gpipe, 1f1b, the other schedules of
// the sweep (zb-h1, zb-h2, interleaved) and gpipe with re-materialisation: two steps each, the
// second's figures, printed and returned as JSON. `plan_for(pieces)` gives the cut into that
// many pieces at that split size.
nlohmann::json memory_comparison(const Workload& w, const std::vector<Device>& devices,
                                 int threads, int64_t split,
                                 const std::vector<SweepSchedule>& schedules, const Batch& batch,
                                 const std::function<Plan(int pieces)>& plan_for);

}  // namespace kiln::apps
