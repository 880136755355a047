// schedules.cpp: resnet_bench's --schedule list and the ideal bubbles.
#include "apps/resnet_bench/schedules.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <sstream>

#include "engine/error.h"
#include "models/pipeline/schedule_sim.h"

namespace kiln::apps {

PipelineOptions pipeline_options(Schedule schedule, int chunks, int64_t split, bool recompute,
                                 int threads) {
  PipelineOptions po;
  po.schedule = schedule;
  po.chunks = chunks;
  po.split_size = split;
  po.recompute = recompute;
  po.threads_per_stage = threads;
  return po;
}

const char* const kScheduleNames = "gpipe, 1f1b, zb-h1, zb-h2, interleaved";

std::vector<SweepSchedule> parse_schedules(const std::string& list, int chunks) {
  std::vector<SweepSchedule> out;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    const bool known = item == "gpipe" || item == "1f1b" || item == "zb-h1" || item == "zb-h2" ||
                       item == "interleaved";
    KILN_CHECK_INPUT(known, "--schedule: each must be one of ", kScheduleNames, " (got ", item,
                     "; the naive schedule is --modes model-parallel)");
    const Schedule s = parse_schedule(item);
    auto same = [&](const SweepSchedule& seen) { return seen.schedule == s; };
    if (std::any_of(out.begin(), out.end(), same)) continue;
    out.push_back({s, s == Schedule::Interleaved ? chunks : 1, item});
  }
  KILN_CHECK_INPUT(!out.empty(), "--schedule \"", list, "\" names no schedule: give one or more "
                   "of ", kScheduleNames, ", comma-separated");
  return out;
}

double formula_bubble(const SweepSchedule& s, int stages, int micro_batches) {
  return ideal_bubble(s.schedule, stages, micro_batches, s.chunks);
}

std::string trace_path_for(const std::string& base, const std::string& name, bool several) {
  if (!several) return base;
  const size_t slash = base.find_last_of('/');
  const size_t dot = base.find_last_of('.');
  const bool has_ext = dot != std::string::npos && (slash == std::string::npos || dot > slash + 1);
  return has_ext ? base.substr(0, dot) + "_" + name + base.substr(dot) : base + "_" + name;
}

}  // namespace kiln::apps
