// measure.h: one measured (size, algorithm), on every member rank: check, warm up, time, and
// the slowest rank's numbers gathered to every rank.
//
//   check   each rank fills the buffer with its pattern, one allreduce (sum), every element
//           compared with the exact sum (message.h).
//   time    one untimed allreduce, then up to --warmup - 1 more, then --iters timed ones (fewer
//           when one allreduce takes more than --max-seconds / --iters; at least 1). A rank's
//           time is its loop time / iterations after a barrier; the reported time is the
//           slowest rank's (allgathered), as nccl-tests does; the median is over the
//           iterations of the slowest rank's time of each.
//   bytes   Transport::bytes_sent() over the timed loop / iterations, per rank.
// The timed allreduces run on zeros (a sum of zeros stays zero, so repeated in-place sums never
// overflow; zeros cost what any other value costs).
#pragma once

#include <string>
#include <vector>

#include "apps/comm_bench/message.h"
#include "apps/comm_bench/options.h"
#include "comm/communicator.h"
#include "comm/transport.h"

namespace kiln::apps::comm_bench {

// Every member's `values` (same length on all), concatenated in rank order, on every member.
std::vector<double> allgather(comm::Transport& t, int n, const std::vector<double>& values);

struct Gathered {
  double max_time = 0, sum_bytes = 0, max_bytes = 0;
  double median_time = 0;  // median over iterations of the slowest rank's iteration time
  bool all_ok = true;
};

// Every member's (time, bytes, ok, per-iteration times...) to every member; `iteration` has
// the same length on every rank.
Gathered gather_stats(comm::Transport& t, int n, double time, double bytes, bool ok,
                      const std::vector<double>& iteration = {});

// One measured (size, algorithm): check, warm up, time. Runs on every member rank.
struct Measured {
  Gathered g;
  int iters = 0;
  std::string error;  // this rank's check failure, if any
};

// Allreduces `m` over the n members of `comm` with `alg`, as the block comment above says.
Measured measure(comm::Communicator& comm, int n, Message& m, comm::Algorithm alg,
                 const Options& o);

}  // namespace kiln::apps::comm_bench
