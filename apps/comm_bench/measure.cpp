// measure.cpp: see measure.h.
#include "apps/comm_bench/measure.h"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>

#include "comm/algorithms.h"
#include "engine/tensor.h"

namespace kiln::apps::comm_bench {

using namespace kiln::comm;

namespace {

using Clock = std::chrono::steady_clock;

// The number of timed allreduces: --iters, or fewer when the slowest rank's first allreduce
// says they would not fit in --max-seconds (at least 1).
int timed_iterations(double slowest, const Options& o) {
  int iters = o.iters;
  if (slowest * iters > o.max_seconds) {
    iters = std::max(1, static_cast<int>(o.max_seconds / std::max(slowest, 1e-9)));
  }
  return iters;
}

}  // namespace

std::vector<double> allgather(Transport& t, int n, const std::vector<double>& values) {
  const int64_t k = static_cast<int64_t>(values.size());
  Tensor in = Tensor::from_vector(values, {k}, t.device());
  Tensor out = Tensor::zeros({k * n}, DType::F64, t.device());
  ring_allgather(t, n, buffer_of(in, t), buffer_of(out, t));
  return out.to_vector<double>();
}

Gathered gather_stats(Transport& t, int n, double time, double bytes, bool ok,
                      const std::vector<double>& iteration) {
  std::vector<double> mine{time, bytes, ok ? 1.0 : 0.0};
  mine.insert(mine.end(), iteration.begin(), iteration.end());
  const size_t k = mine.size();
  const std::vector<double> all = allgather(t, n, mine);
  Gathered g;
  std::vector<double> slowest(iteration.size(), 0.0);
  for (int r = 0; r < n; ++r) {
    const double* a = &all[k * r];
    g.max_time = std::max(g.max_time, a[0]);
    g.sum_bytes += a[1];
    g.max_bytes = std::max(g.max_bytes, a[1]);
    g.all_ok = g.all_ok && a[2] == 1.0;
    for (size_t i = 0; i < iteration.size(); ++i) slowest[i] = std::max(slowest[i], a[3 + i]);
  }
  if (!slowest.empty()) {
    std::sort(slowest.begin(), slowest.end());
    const size_t m = slowest.size();
    g.median_time = m % 2 ? slowest[m / 2] : 0.5 * (slowest[m / 2 - 1] + slowest[m / 2]);
  }
  return g;
}

Measured measure(Communicator& comm, int n, Message& m, Algorithm alg, const Options& o) {
  Transport& t = comm.transport();
  Measured out;
  // Correctness.
  fill_pattern(t, m, t.rank());
  comm.allreduce_now(m.buf, ReduceOp::Sum, alg);
  const bool ok = check_sum(t, m, n, &out.error);
  m.data.zero_();
  // One untimed allreduce decides how many fit in --max-seconds (the same on every rank: the
  // slowest rank's time, allgathered).
  barrier(t, n);
  auto t0 = Clock::now();
  comm.allreduce_now(m.buf, ReduceOp::Sum, alg);
  const double first = std::chrono::duration<double>(Clock::now() - t0).count();
  const double slowest = gather_stats(t, n, first, 0, true).max_time;
  const int iters = timed_iterations(slowest, o);
  const int warm = std::max(0, std::min(o.warmup - 1, iters));
  for (int i = 0; i < warm; ++i) comm.allreduce_now(m.buf, ReduceOp::Sum, alg);
  // Timed.
  barrier(t, n);
  const uint64_t b0 = t.bytes_sent();
  std::vector<double> each(static_cast<size_t>(iters));
  t0 = Clock::now();
  auto prev = t0;
  for (int i = 0; i < iters; ++i) {
    comm.allreduce_now(m.buf, ReduceOp::Sum, alg);
    const auto now = Clock::now();
    each[i] = std::chrono::duration<double>(now - prev).count();
    prev = now;
  }
  const double secs = std::chrono::duration<double>(prev - t0).count();
  const double bytes = static_cast<double>(t.bytes_sent() - b0) / iters;
  out.g = gather_stats(t, n, secs / iters, bytes, ok, each);
  out.iters = iters;
  return out;
}

}  // namespace kiln::apps::comm_bench
