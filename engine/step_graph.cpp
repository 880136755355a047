// step_graph.cpp: eager warm-up, one capture, replays (step_graph.h).
#include "engine/step_graph.h"

#include <cstddef>
#include <cstdint>
#include <exception>
#include <utility>

#include "engine/build_config.h"
#include "engine/error.h"

#if KILN_WITH_CUDA
#include "engine/cuda/context.h"
#include "engine/cuda/graph.h"
#include "engine/cuda/kernels/copy.h"
#endif

namespace kiln {

struct StepGraph::Impl {
  Device device;
  StepGraphOptions options;
  std::vector<Generator*> generators;
  int64_t calls = 0;
  int64_t replays = 0;
  std::vector<Tensor> outputs;  // what the captured step returned
#if KILN_WITH_CUDA
  std::unique_ptr<cuda::Graph> graph;
  // Per generator: the device counter its captured kernels add to their Philox base, the
  // counters one replay consumes, and the value the device counter will hold when the queued
  // work has run (the graph advances it at its end).
  std::vector<Tensor> rng_offsets;
  std::vector<uint64_t> rng_consumed;
  std::vector<uint64_t> rng_on_device;

  uint64_t* counter(size_t i) {
    return reinterpret_cast<uint64_t*>(rng_offsets[i].data<int64_t>());
  }

  void capture(const std::function<std::vector<Tensor>()>& step) {
    cuda::DeviceGuard on(device.index);
    rng_offsets.clear();
    for (size_t i = 0; i < generators.size(); ++i)  // allocated before the capture: eager memory
      rng_offsets.push_back(Tensor::zeros({1}, DType::I64, device));
    for (size_t i = 0; i < generators.size(); ++i) generators[i]->begin_capture(counter(i));
    auto end_rng_capture = [&] {
      rng_consumed.clear();
      for (Generator* g : generators) rng_consumed.push_back(g->end_capture());
    };
    auto g = std::make_unique<cuda::Graph>();
    try {
      g->capture([&] {
        outputs = step();
        // The graph's last kernels move each counter past the numbers this replay drew, so the
        // next replay draws new ones without the host writing anything.
        for (size_t i = 0; i < generators.size(); ++i) {
          const uint64_t drawn = generators[i]->offset();  // counted from the capture's start
          if (drawn > 0) cuda::advance_counter(counter(i), drawn);
        }
      });
    } catch (...) {
      end_rng_capture();
      outputs.clear();
      throw;
    }
    end_rng_capture();
    rng_on_device.assign(generators.size(), 0);
    graph = std::move(g);
  }

  void replay() {
    cuda::DeviceGuard on(device.index);
    for (size_t i = 0; i < generators.size(); ++i) {
      // An eager step since the last replay drew numbers (or this is the first replay): tell
      // the device where the generator stands. Queued before the graph on the same stream.
      const uint64_t offset = generators[i]->offset();
      if (rng_on_device[i] != offset) cuda::set_counter(counter(i), offset);
      generators[i]->advance(rng_consumed[i]);
      rng_on_device[i] = offset + rng_consumed[i];
    }
    graph->replay();
    ++replays;
  }
#endif
};

StepGraph::StepGraph(Device device, StepGraphOptions options, std::vector<Generator*> generators)
    : impl_(std::make_unique<Impl>()) {
  KILN_CHECK_INPUT(options.warmup_steps >= 0, "StepGraph: warmup_steps must be >= 0, got ",
                   options.warmup_steps);
  impl_->device = device;
  impl_->options = options;
  impl_->generators = std::move(generators);
  if (impl_->generators.empty()) impl_->generators.push_back(&default_generator());
}

StepGraph::~StepGraph() = default;

bool StepGraph::graphs_enabled() const {
  return kWithCuda && impl_->options.enabled && impl_->device.type == DeviceType::CUDA;
}

bool StepGraph::captured() const {
#if KILN_WITH_CUDA
  return impl_->graph != nullptr;
#else
  return false;
#endif
}

int64_t StepGraph::replays() const { return impl_->replays; }

std::vector<Tensor> StepGraph::run(const std::function<std::vector<Tensor>()>& step) {
  const int64_t call = impl_->calls++;
  if (!graphs_enabled() || call < impl_->options.warmup_steps) return step();
#if KILN_WITH_CUDA
  if (!impl_->graph) impl_->capture(step);
  impl_->replay();
#endif
  return impl_->outputs;
}

}  // namespace kiln
