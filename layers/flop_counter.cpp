// flop_counter.cpp: the thread's chain of live FlopCounters.
#include "layers/flop_counter.h"

#include <cstdint>

namespace kiln {

namespace {
thread_local FlopCounter* t_innermost = nullptr;
}  // namespace

FlopCounter::FlopCounter() : outer_(t_innermost) { t_innermost = this; }

FlopCounter::~FlopCounter() { t_innermost = outer_; }

void FlopCounter::add(int64_t flops) {
  for (FlopCounter* c = t_innermost; c != nullptr; c = c->outer_) c->flops_ += flops;
}

}  // namespace kiln
