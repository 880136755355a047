// refine.cpp: the cut refined by timing the pipeline (refine.h says why block times mislead).
#include "apps/resnet_bench/refine.h"

#include <cstdint>
#include <algorithm>
#include <chrono>
#include <map>

namespace kiln::apps {

double fastest_step_s(Run& run, const Batch& batch, int warmup, int steps) {
  for (int i = 0; i < warmup; ++i) run.step(batch);
  double best = 1e30;
  for (int i = 0; i < steps; ++i) {
    run.finish();  // the clock starts once the work queued before is done
    auto t0 = std::chrono::steady_clock::now();
    run.step(batch);
    run.finish();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
                              .count());
  }
  return best;
}

Refinement refine_cut(const Partition& start, int rounds, double min_gain,
                      const std::function<double(const Partition&)>& step_s) {
  std::map<std::vector<int64_t>, double> seen;  // bounds -> step seconds: each cut timed once
  Refinement r;
  auto time_cut = [&](const Partition& p) {
    auto it = seen.find(p.bounds);
    if (it != seen.end()) return it->second;
    const double s = step_s(p);
    seen[p.bounds] = s;
    r.tried.push_back({p, s});
    return s;
  };
  r.start = {start, time_cut(start)};
  r.best = r.start;
  const int stages = start.stages();
  for (int round = 0; round < rounds; ++round) {
    bool moved = false;
    for (int b = 1; b < stages; ++b) {  // boundary b: the first block of piece b
      TriedCut best_here = r.best;
      for (int64_t delta : {-1, 1}) {
        Partition p = r.best.partition;
        p.bounds[b] += delta;
        if (p.bounds[b] <= p.bounds[b - 1] || p.bounds[b] >= p.bounds[b + 1]) continue;
        const double s = time_cut(p);
        if (s < best_here.step_s) best_here = {p, s};
      }
      if (best_here.step_s < r.best.step_s * (1 - min_gain)) {
        r.best = best_here;
        moved = true;
      }
    }
    if (!moved) break;
  }
  return r;
}

std::vector<std::string> cut_names(const Partition& partition, const std::vector<Block>& blocks) {
  std::vector<std::string> names;
  for (int s = 0; s < partition.stages(); ++s) names.push_back(blocks.at(partition.first(s)).name);
  return names;
}

std::string cut_text(const Partition& partition, const std::vector<Block>& blocks) {
  std::string text;
  for (int s = 1; s < partition.stages(); ++s) {
    if (s > 1) text += ", ";
    text += blocks.at(partition.first(s)).name;
  }
  return text;
}

}  // namespace kiln::apps
