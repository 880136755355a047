// partition.h: cutting a model, given as a sequence of blocks, into pipeline stages.
//
// A stage is a run of consecutive blocks: stage s holds blocks [bounds[s], bounds[s + 1]).
// The cut decides the pipeline's speed: a step can go no faster than its slowest stage, so
// a balanced partition minimises the largest per-stage cost. The cost of a block is its
// parameter count (free to compute, a rough proxy for compute) or its measured forward +
// backward time on the target device (what actually matters; profiled once before training,
// as torchgpipe's balance_by_time does: https://torchgpipe.readthedocs.io/en/stable/guide.html).
//
//   std::vector<Block> blocks = resnet_blocks(*model);          // stem, every block, head
//   Partition p = balance(block_times(blocks, sample), 2);     // or by parameters, or:
//   Partition t = tutorial_partition(blocks);                   // conv1..layer2 | layer3..fc
//   std::cout << describe(p, blocks, devices, times);
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/device.h"
#include "engine/tensor.h"
#include "layers/module.h"

namespace kiln {

class ResNet;

// A named piece of a model in execution order: running the blocks one after another is the
// model's forward().
struct Block {
  std::string name;
  std::shared_ptr<Module> module;
};

// ResNet as blocks: "stem", "layer1.0", ..., "layer4.2", "head" (ResNet::pieces()).
std::vector<Block> resnet_blocks(const ResNet& model);

struct Partition {
  std::vector<int64_t> bounds;  // size stages + 1: 0 = b0 < b1 < ... < b_p = number of blocks
  int stages() const { return static_cast<int>(bounds.size()) - 1; }
  int64_t first(int stage) const { return bounds.at(stage); }
  int64_t end(int stage) const { return bounds.at(stage + 1); }
};

// The partition with stage s starting at block starts[s] (starts[0] must be 0, strictly
// increasing, each < blocks). Errors (Usage) name what is wrong.
Partition partition_at(int64_t blocks, const std::vector<int64_t>& starts);

// The partition of blocks with these costs into `stages` non-empty runs that minimises the
// largest run's total cost (exact, by dynamic programming over cut points: O(stages n^2)).
// Ties go to the partition whose later stages are the lightest, which leaves the last stage
// (it also computes the loss) the least work.
Partition balance(const std::vector<double>& costs, int stages);

// Block costs: parameter counts.
std::vector<double> parameter_costs(const std::vector<Block>& blocks);

// Block costs: measured forward + backward milliseconds of each block on `device` (where the
// blocks are now: the caller moves them), with a batch like `sample` (on any device: it is
// copied), run `repeats` times after one warm-up, median per block. Each block is timed alone:
// its input a leaf that requires grad, its backward driven by a gradient of ones.
std::vector<double> block_times_ms(const std::vector<Block>& blocks, const Tensor& sample,
                                   Device device, int repeats = 3);

// The cut of the PyTorch model-parallel tutorial for ResNet-50: conv1 .. layer2 on the first
// device, layer3 .. fc on the second ("Single-Machine Model Parallel Best Practices",
// https://pytorch.org/tutorials/intermediate/model_parallel_tutorial.html).
Partition tutorial_partition(const std::vector<Block>& blocks);

// The plan as a table: stage, device, first .. last block, parameters and, when given,
// ms per stage (sum of the blocks' costs in ms).
std::string describe(const Partition& partition, const std::vector<Block>& blocks,
                     const std::vector<Device>& devices,
                     const std::vector<double>& block_ms = {});

}  // namespace kiln
