// sim/sm90_setmaxnreg.cpp: the block's register pool for setmaxnreg (the model:
// sim/sm90_setmaxnreg.h). The state is the simulator's bookkeeping (no kernel memory): under
// ThreadSanitizer this file is not instrumented (sim/CMakeLists.txt), so moving registers
// orders nothing between warpgroups, as on a GPU.
#include "engine/cuda/sim/sm90_setmaxnreg.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/cuda/sim/kernel.h"
#include "engine/cuda/sim/scheduler.h"
#include "engine/error.h"

namespace kiln::sim::sm90 {

namespace {

constexpr unsigned kBlockRegisters = 65536;  // the register file a block may use
constexpr unsigned kStartLimitCap = 248;     // the largest starting count, a multiple of 8

// The pool of the block running on this OS thread (its fibers never leave it), reset at every
// block start.
struct Pool {
  unsigned free = 0;                // registers no warpgroup holds
  std::vector<unsigned> limit;      // per warpgroup: its per-thread register count now
  std::vector<unsigned> wanted;     // per warpgroup: the count an .inc waits for (0: none)
  std::vector<uint32_t> applied;    // per warpgroup: its setmaxnreg calls applied so far
  std::vector<uint32_t> calls;      // per thread: its setmaxnreg calls so far
  bool touched = false;             // calls changed since the last reset
};
thread_local Pool t_pool;

[[noreturn]] void fail(const char* fn, const std::string& what) {
  throw Error(std::string("kiln::cuda::sm90::") + fn + ": " + what);
}

void block_start(unsigned threads) {
  const unsigned warpgroups = (threads + 127) / 128;
  unsigned start = kBlockRegisters / (warpgroups * 128) / 8 * 8;
  if (start > kStartLimitCap) start = kStartLimitCap;
  t_pool.free = kBlockRegisters - warpgroups * 128 * start;
  t_pool.limit.assign(warpgroups, start);
  t_pool.wanted.assign(warpgroups, 0);
  t_pool.applied.assign(warpgroups, 0);
  if (t_pool.touched || t_pool.calls.size() < threads) {
    t_pool.calls.assign(threads, 0);
    t_pool.touched = false;
  }
}

// For the deadlock report: the .inc that waits and what the pool holds.
std::string describe(const void* object) {
  const auto w = static_cast<size_t>(static_cast<const unsigned*>(object) - t_pool.limit.data());
  std::string held;
  for (size_t g = 0; g < t_pool.limit.size(); ++g)
    held += (g ? ", " : "") + std::to_string(t_pool.limit[g]);
  const unsigned need = (t_pool.wanted[w] - t_pool.limit[w]) * 128;
  return "setmaxnreg.inc of warpgroup " + std::to_string(w) + " from " +
         std::to_string(t_pool.limit[w]) + " to " + std::to_string(t_pool.wanted[w]) +
         " registers per thread, which needs " + std::to_string(need) +
         " registers while the block's pool of " + std::to_string(kBlockRegisters) + " has " +
         std::to_string(t_pool.free) + " free (the warpgroups hold " + held +
         " per thread; 128 threads each); only a setmaxnreg.dec of another warpgroup returns "
         "registers to the pool";
}

const bool registered = (detail::add_block_hooks({&block_start, nullptr}), true);

}  // namespace

void change_register_limit(bool increase, int regs) {
  (void)registered;
  const char* fn = increase ? "setmaxnreg_inc" : "setmaxnreg_dec";
  const unsigned linear = detail::t_thread->linear, w = linear / 128;
  const auto r = static_cast<unsigned>(regs);
  t_pool.touched = true;
  const uint32_t call = t_pool.calls[linear]++;
  for (;;) {
    if (call < t_pool.applied[w]) return;  // another thread of the warpgroup applied it
    const unsigned current = t_pool.limit[w];
    if (increase ? r < current : r > current)
      fail(fn, std::string("setmaxnreg.") + (increase ? "inc" : "dec") + " to " +
                   std::to_string(r) + " registers per thread, but warpgroup " +
                   std::to_string(w) + " holds " + std::to_string(current) + " (.inc may only " +
                   "raise the count, .dec only lower it; the PTX ISA's setmaxnreg)");
    const unsigned delta = (increase ? r - current : current - r) * 128;
    if (!increase || delta <= t_pool.free) {
      t_pool.free = increase ? t_pool.free - delta : t_pool.free + delta;
      t_pool.limit[w] = r;
      t_pool.wanted[w] = 0;
      ++t_pool.applied[w];
      note_progress();
      return;
    }
    t_pool.wanted[w] = r;
    poll_yield(&t_pool.limit[w], &describe);
  }
}

}  // namespace kiln::sim::sm90
