// refine.h: resnet_bench's cut refined by timing the pipeline itself: the time-balanced cut and
// its neighbours (each stage boundary moved one block), the fastest kept.
//
// Why the measured block times mislead: partition.h's block_times_ms() times each block alone
// on one device, its backward driven by a gradient of ones. In a pipeline the last stage also
// computes the loss and its gradient, the stages run at once and share caches and memory
// bandwidth, a zero-bubble schedule splits each backward into an input-gradient and a
// weight-gradient pass, and every stage pays for the copies of its activations. A cut that
// balances the blocks' times alone can leave one stage ~15% heavier than the other in the
// pipeline, and the heaviest stage sets the step time. torchgpipe's balance_by_time has the
// same blind spot: it profiles layers alone, one device at a time
// (https://torchgpipe.readthedocs.io/en/stable/guide.html, "Automatic Balancing").
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "apps/resnet_bench/runs.h"
#include "models/pipeline/partition.h"

namespace kiln::apps {

// One cut tried: its partition and its measured step seconds.
struct TriedCut {
  Partition partition;
  double step_s = 0;
};

struct Refinement {
  TriedCut start;            // the cut refined from
  TriedCut best;             // the fastest cut tried (start when no neighbour beat it)
  std::vector<TriedCut> tried;  // every cut timed, in order, start first
};

// A step time of `run`: after `warmup` untimed steps, the fastest of `steps` steps, each
// timed from finish() to finish() (the noise of a shared machine only adds time).
double fastest_step_s(Run& run, const Batch& batch, int warmup, int steps);

// Coordinate descent over the cut: each boundary between pieces in turn moved one block left
// and right (every piece keeps at least one block), a move kept when the step is more than
// `min_gain` (a fraction) faster; at most `rounds` passes over the boundaries, stopping after
// a pass that moved nothing. step_s(partition) times one cut (called once per distinct cut).
Refinement refine_cut(const Partition& start, int rounds, double min_gain,
                      const std::function<double(const Partition&)>& step_s);

// The first block of every piece, e.g. {"conv1", "layer3.1"}.
std::vector<std::string> cut_names(const Partition& partition, const std::vector<Block>& blocks);
// The first block of every piece but the first, comma-separated: "layer3.1" (plan.h's cut).
std::string cut_text(const Partition& partition, const std::vector<Block>& blocks);

}  // namespace kiln::apps
