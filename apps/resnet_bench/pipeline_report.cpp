// pipeline_report.cpp: resnet_bench's traced bubble and memory comparison.
#include "apps/resnet_bench/pipeline_report.h"
#include "apps/resnet_bench/schedules.h"

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "engine/error.h"
#include "models/pipeline/pipeline.h"
#include "models/pipeline/schedule_sim.h"

namespace kiln::apps {
namespace {

std::string mib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

double mean(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return v.empty() ? 0 : sum / static_cast<double>(v.size());
}

}  // namespace

trace::StageUtilisation traced_step(PipelineRun& run, const Batch& batch, int stages,
                                    const std::string& path) {
  trace::Tracer& tracer = trace::Tracer::global();
  tracer.clear();
  tracer.enable();
  run.step(batch);
  run.finish();
  tracer.enable(false);
  trace::StageUtilisation u = trace::stage_utilisation(tracer.spans(), stages);
  if (!path.empty()) tracer.write_chrome_json(path, "--trace");
  tracer.clear();
  return u;
}

trace::StageUtilisation traced_steps(PipelineRun& run, const Batch& batch, int stages,
                                     int steps) {
  run.finish();  // nothing of earlier steps in the window
  trace::Tracer& tracer = trace::Tracer::global();
  tracer.clear();
  tracer.enable();
  for (int i = 0; i < steps; ++i) run.step(batch);
  run.finish();
  tracer.enable(false);
  // step = -1: the spans of every step, over the window of all of them.
  trace::StageUtilisation u = trace::stage_utilisation(tracer.spans(), stages, -1);
  tracer.clear();
  return u;
}

nlohmann::json traced_bubble_report(PipelineRun& run, const SweepSchedule& sc,
                                    const Batch& batch, int stages, const std::string& path,
                                    bool fastest) {
  const trace::StageUtilisation one = traced_step(run, batch, stages, path);
  const trace::StageUtilisation many = traced_steps(run, batch, stages, kOverlappedSteps);
  const double ideal = formula_bubble(sc, stages, run.micro_batches);
  const double ideal_many =
      ideal_bubble(sc.schedule, stages, run.micro_batches, sc.chunks, kOverlappedSteps);
  const std::string name = sc.chunks > 1 ? detail::str(sc.name, " v", sc.chunks) : sc.name;
  std::printf("  %-16s split %3lld (%3d micro-batches): bubble measured %5.1f%%, ideal %5.1f%% "
              "(1 step); %d overlapping steps: measured %5.1f%%, ideal %5.1f%%; busy per stage "
              "(1 step):", name.c_str(), static_cast<long long>(run.split),
              run.micro_batches, 100 * one.bubble_fraction, 100 * ideal, kOverlappedSteps,
              100 * many.bubble_fraction, 100 * ideal_many);
  for (double b : one.busy_us) std::printf(" %.0f", b / 1000);
  std::printf(" of %.0f ms%s\n", one.window_us / 1000, fastest ? "   (fastest)" : "");
  return {{"schedule", sc.name}, {"chunks", sc.chunks}, {"split_size", run.split},
          {"micro_batches", run.micro_batches}, {"step_s_mean", mean(run.step_seconds)},
          {"bubble_measured", one.bubble_fraction}, {"bubble_ideal", ideal},
          {"busy_us", one.busy_us}, {"window_us", one.window_us},
          {"overlapped_steps", kOverlappedSteps},
          {"bubble_measured_overlapped", many.bubble_fraction},
          {"bubble_ideal_overlapped", ideal_many},
          {"busy_us_overlapped", many.busy_us}, {"window_us_overlapped", many.window_us}};
}

nlohmann::json memory_comparison(const Workload& w, const std::vector<Device>& devices,
                                 int threads, int64_t split,
                                 const std::vector<SweepSchedule>& schedules, const Batch& batch,
                                 const std::function<Plan(int pieces)>& plan_for) {
  const int p = static_cast<int>(devices.size());
  struct MemCase { std::string name; Schedule schedule; int chunks; bool recompute; };
  std::vector<MemCase> cases = {{"gpipe", Schedule::GPipe, 1, false},
                                {"1f1b", Schedule::OneFOneB, 1, false}};
  for (const SweepSchedule& sc : schedules) {
    if (sc.schedule == Schedule::GPipe || sc.schedule == Schedule::OneFOneB) continue;
    cases.push_back({sc.chunks > 1 ? detail::str(sc.name, " v", sc.chunks) : sc.name, sc.schedule,
                     sc.chunks, false});
  }
  cases.push_back({"gpipe+recompute", Schedule::GPipe, 1, true});
  std::printf("\npeak activation memory per stage at split %lld: MiB (allocator peak above "
              "the step's start) and\n(in brackets) micro-batches held at once\n  %-16s",
              static_cast<long long>(split), "schedule");
  for (int s = 0; s < p; ++s) std::printf("  %14s", detail::str("stage ", s).c_str());
  std::printf("\n");
  nlohmann::json jmem = nlohmann::json::array();
  for (const MemCase& c : cases) {
    PipelineRun mr(w, plan_for(p * c.chunks).partition, devices,
                   pipeline_options(c.schedule, c.chunks, split, c.recompute, threads));
    mr.step(batch);
    mr.step(batch);
    mr.finish();
    const PipelineStepStats& st = mr.pipeline().last_step();
    std::printf("  %-16s", c.name.c_str());
    for (int s = 0; s < p; ++s) {
      std::printf("  %14s", detail::str(mib(st.peak_activation_bytes[s]), " MiB (",
                                         st.peak_live_micro_batches[s], ")").c_str());
    }
    std::printf("\n");
    jmem.push_back({{"schedule", c.recompute ? c.name : schedule_name(c.schedule)},
                    {"chunks", c.chunks},
                    {"peak_activation_bytes", st.peak_activation_bytes},
                    {"peak_live_micro_batches", st.peak_live_micro_batches}});
  }
  return jmem;
}

}  // namespace kiln::apps
