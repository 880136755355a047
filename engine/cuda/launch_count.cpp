// launch_count.cpp: the process's launch counter (see launch_count.h).
#include "engine/cuda/launch_count.h"

#include <atomic>
#include <cstdint>

namespace kiln::cuda {

namespace {

std::atomic<int64_t> launches{0};

}  // namespace

int64_t launch_count() { return launches.load(std::memory_order_relaxed); }

void count_launch() { launches.fetch_add(1, std::memory_order_relaxed); }

}  // namespace kiln::cuda
