// plan.cpp: resnet_bench's pipeline cuts.
#include "apps/resnet_bench/plan.h"

#include <cstdint>
#include <memory>
#include <utility>

#include "engine/cuda/sync_debug.h"
#include "engine/error.h"
#include "engine/parallel.h"
#include "models/resnet.h"

namespace kiln::apps {

std::vector<double> profile_blocks(const Workload& w, const std::vector<Device>& devices,
                                   int threads, int64_t rows) {
  cuda::AllowSync allow("resnet_bench setup: a model is uploaded and its blocks timed");
  auto model = make_model(w);
  std::vector<Block> blocks = resnet_blocks(*model);
  model->to(devices[0]);
  Workload sample_w = w;
  sample_w.batch = rows;
  Batch sample = random_batch(sample_w, 7);
  const int previous = num_threads();
  set_num_threads(threads);
  std::vector<double> ms = block_times_ms(blocks, sample.x, devices[0], /*repeats=*/2);
  set_num_threads(previous);
  return ms;
}

void check_pieces(const Workload& w, int blocks, int pieces) {
  KILN_CHECK_INPUT(pieces <= blocks, "the pipeline needs ", pieces, " pieces (devices x --chunks) "
                   "but ", w.model, " has only ", blocks, " blocks: give fewer devices or a "
                   "smaller --chunks");
}

Plan make_plan(const Workload& w, const std::string& balance_by, const std::vector<Device>& devices,
               std::vector<double> block_ms, int pieces) {
  auto model = make_model(w);
  std::vector<Block> blocks = resnet_blocks(*model);
  check_pieces(w, static_cast<int>(blocks.size()), pieces);
  Plan plan;
  plan.block_ms = std::move(block_ms);
  if (balance_by == "tutorial") {
    KILN_CHECK_INPUT(pieces == 2, "--balance tutorial cuts the model in two: give two devices "
                     "(and no interleaved schedule, whose pieces are devices x --chunks)");
    plan.partition = tutorial_partition(blocks);
  } else if (balance_by == "params") {
    plan.partition = balance(parameter_costs(blocks), pieces);
  } else {
    plan.partition = balance(plan.block_ms, pieces);
  }
  std::vector<Device> piece_devices;
  for (int i = 0; i < pieces; ++i) piece_devices.push_back(devices[i % devices.size()]);
  plan.text = describe(plan.partition, blocks, piece_devices, plan.block_ms);
  for (int s = 1; s < pieces; ++s) {
    if (s > 1) plan.cut += ", ";
    plan.cut += blocks[plan.partition.first(s)].name;
  }
  return plan;
}

}  // namespace kiln::apps
