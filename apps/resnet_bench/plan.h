// plan.h: how resnet_bench cuts the ResNet into pipeline pieces: the blocks' times measured on
// the first device at a micro-batch size, then a balanced partition (or the tutorial's cut).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "apps/resnet_bench/runs.h"
#include "engine/device.h"
#include "models/pipeline/partition.h"

namespace kiln::apps {

struct Plan {
  Partition partition;
  std::vector<double> block_ms;
  std::string text;
  std::string cut;  // the first block of every piece but the first, e.g. "layer4.0"
};

// The ms of every block of a fresh model of `w` on devices[0] for micro-batches of `rows`
// rows, with `threads` CPU threads. A block's share of the time depends on the rows (a small
// batch leaves layer4's small images and large weights less efficient than layer1's), so each
// split size gets the cut measured at its own size.
std::vector<double> profile_blocks(const Workload& w, const std::vector<Device>& devices,
                                   int threads, int64_t rows);

// An Error (Usage) unless a model of `blocks` blocks can be cut into `pieces` pieces.
void check_pieces(const Workload& w, int blocks, int pieces);

// The model cut into `pieces` pieces by `balance` (time: the measured block_ms, params, or
// tutorial: conv1..layer2 | layer3..fc, two pieces only); piece i runs on devices[i % p]
// (pieces = p x chunks for the interleaved schedule, models/pipeline/pipeline.h).
Plan make_plan(const Workload& w, const std::string& balance, const std::vector<Device>& devices,
               std::vector<double> block_ms, int pieces);

}  // namespace kiln::apps
