// sweep.h: comm_bench's default mode. For every size from --min-bytes to --max-bytes (times
// --step-factor) and every algorithm of --allreduce, on every member rank: measure (measure.h),
// then rank 0 prints a table row, a CSV row and a JSON row, and at the end a summary: ring vs
// native busbw at >= 16 MiB (our target: >= 0.9 with 2 ranks) and the bytes each rank
// sent against the ring's model 2(N-1)K/N.
//
//   algbw = size / time;   busbw = algbw * 2(N-1)/N: the bandwidth each rank's link carries
//   for a bandwidth-optimal allreduce, comparable across N (nccl-tests' definition).
//
// With --ps-servers S > 0 the last S ranks are dedicated parameter servers: they serve while
// the other ranks (the members) run every algorithm.
#pragma once

#include <memory>

#include "apps/comm_bench/options.h"
#include "apps/comm_bench/report.h"
#include "comm/transport.h"

namespace kiln::apps::comm_bench {

// One rank's part of the sweep. Returns 1 when an allreduce result was wrong (on every rank),
// else 0; throws a Usage error for flags that do not fit the number of ranks.
int sweep_rank(std::shared_ptr<comm::Transport> tp, const Options& o, Report& report);

}  // namespace kiln::apps::comm_bench
