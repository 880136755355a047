// partition.cpp: stage partitions (given, balanced, the tutorial's) and block profiling.
#include "models/pipeline/partition.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <sstream>

#include "engine/autograd.h"
#include "engine/cuda/sync_debug.h"
#include "engine/error.h"
#include "models/resnet.h"

#if KILN_WITH_CUDA
#include "engine/cuda/context.h"
#endif

namespace kiln {

std::vector<Block> resnet_blocks(const ResNet& model) {
  std::vector<Block> blocks;
  for (const ResNetPiece& piece : model.pieces()) blocks.push_back({piece.name, piece.module});
  return blocks;
}

Partition partition_at(int64_t blocks, const std::vector<int64_t>& starts) {
  auto usage = [](const std::string& why) { return Error("stage partition: " + why, ErrorKind::Usage); };
  if (starts.empty()) throw usage("no stages");
  if (starts[0] != 0) throw usage("the first stage must start at block 0");
  for (size_t s = 1; s < starts.size(); ++s) {
    if (starts[s] <= starts[s - 1]) {
      throw usage(detail::str("stage ", s, " starts at block ", starts[s], ", not after stage ",
                              s - 1, "'s start ", starts[s - 1], ": every stage needs a block"));
    }
  }
  if (starts.back() >= blocks) {
    throw usage(detail::str("the last stage starts at block ", starts.back(), " but the model has ",
                            blocks, " blocks (0..", blocks - 1, ")"));
  }
  Partition p;
  p.bounds = starts;
  p.bounds.push_back(blocks);
  return p;
}

Partition balance(const std::vector<double>& costs, int stages) {
  const int64_t n = static_cast<int64_t>(costs.size());
  if (stages < 1 || stages > n) {
    throw Error(detail::str("stage partition: cannot cut ", n, " blocks into ", stages,
                            " non-empty stages"), ErrorKind::Usage);
  }
  std::vector<double> prefix(n + 1, 0.0);
  for (int64_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + costs[i];
  const double inf = std::numeric_limits<double>::infinity();
  // best[k][j]: the smallest possible largest-stage cost of blocks [0, j) in k stages;
  // cut[k][j]: where the k-th stage starts in that optimum.
  std::vector<std::vector<double>> best(stages + 1, std::vector<double>(n + 1, inf));
  std::vector<std::vector<int64_t>> cut(stages + 1, std::vector<int64_t>(n + 1, 0));
  best[0][0] = 0;
  for (int k = 1; k <= stages; ++k) {
    for (int64_t j = k; j <= n; ++j) {
      for (int64_t i = k - 1; i < j; ++i) {
        double cost = std::max(best[k - 1][i], prefix[j] - prefix[i]);
        if (cost <= best[k][j]) {  // "<=": on a tie the later cut wins (lighter later stages)
          best[k][j] = cost;
          cut[k][j] = i;
        }
      }
    }
  }
  Partition p;
  p.bounds.assign(stages + 1, 0);
  p.bounds[stages] = n;
  for (int k = stages, j = static_cast<int>(n); k >= 1; --k) {
    p.bounds[k - 1] = cut[k][j];
    j = static_cast<int>(cut[k][j]);
  }
  return p;
}

std::vector<double> parameter_costs(const std::vector<Block>& blocks) {
  std::vector<double> costs;
  for (const Block& b : blocks) costs.push_back(static_cast<double>(b.module->num_parameters()));
  return costs;
}

namespace {

void wait_for_device(Device device) {
#if KILN_WITH_CUDA
  if (device.is_cuda()) {
    cuda::DeviceGuard guard(device.index);
    cuda::synchronize();
  }
#else
  (void)device;
#endif
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

std::vector<double> block_times_ms(const std::vector<Block>& blocks, const Tensor& sample,
                                   Device device, int repeats) {
  KILN_CHECK(repeats >= 1, "block_times_ms: repeats must be >= 1");
  // Timing a block on the host clock waits for the device before and after it (and the sample
  // is uploaded each round): the waits are the measurement.
  cuda::AllowSync allow("block_times_ms: each block is timed on the host clock");
  using Clock = std::chrono::steady_clock;
  auto ms_since = [](Clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  };
  std::vector<std::vector<double>> times(blocks.size());
  for (int r = 0; r < repeats + 1; ++r) {  // round 0 warms up (allocator, oneDNN primitives)
    Tensor x = sample.to(device);
    for (size_t b = 0; b < blocks.size(); ++b) {
      Tensor input = x.detach();
      input.set_requires_grad(true);
      wait_for_device(device);
      Clock::time_point t0 = Clock::now();
      Tensor out = blocks[b].module->forward(input);
      out.backward(Tensor::ones(out.shape(), out.dtype(), out.device()));
      wait_for_device(device);
      if (r > 0) times[b].push_back(ms_since(t0));
      x = out.detach();
    }
    for (const Block& b : blocks) b.module->zero_grad();
  }
  std::vector<double> result;
  for (auto& t : times) result.push_back(median(t));
  return result;
}

Partition tutorial_partition(const std::vector<Block>& blocks) {
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (blocks[i].name.rfind("layer3", 0) == 0) {
      return partition_at(static_cast<int64_t>(blocks.size()), {0, static_cast<int64_t>(i)});
    }
  }
  throw Error("the tutorial's partition cuts a ResNet before layer3; these blocks have no "
              "layer3 (use --balance params or time)", ErrorKind::Usage);
}

std::string describe(const Partition& partition, const std::vector<Block>& blocks,
                     const std::vector<Device>& devices, const std::vector<double>& block_ms) {
  std::ostringstream os;
  char line[256];
  std::snprintf(line, sizeof line, "%-6s %-8s %-24s %7s %12s%s\n", "stage", "device", "blocks",
                "count", "parameters", block_ms.empty() ? "" : "   ms (fwd+bwd)");
  os << line;
  for (int s = 0; s < partition.stages(); ++s) {
    int64_t params = 0;
    double ms = 0;
    for (int64_t b = partition.first(s); b < partition.end(s); ++b) {
      params += blocks[b].module->num_parameters();
      if (!block_ms.empty()) ms += block_ms[b];
    }
    std::string range = blocks[partition.first(s)].name + " .. " + blocks[partition.end(s) - 1].name;
    std::string dev = s < static_cast<int>(devices.size()) ? devices[s].str() : "?";
    std::snprintf(line, sizeof line, "%-6d %-8s %-24s %7lld %12lld", s, dev.c_str(),
                  range.c_str(), static_cast<long long>(partition.end(s) - partition.first(s)),
                  static_cast<long long>(params));
    os << line;
    if (!block_ms.empty()) {
      std::snprintf(line, sizeof line, "   %14.2f", ms);
      os << line;
    }
    os << "\n";
  }
  return os.str();
}

}  // namespace kiln
