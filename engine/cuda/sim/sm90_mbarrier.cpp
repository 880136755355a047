// sim/sm90_mbarrier.cpp: the simulator's Hopper mbarriers (the model: sim/sm90_mbarrier.h).
//
// Under ThreadSanitizer an arrival releases into the barrier and a wait that returns acquires
// from it (the ordering the PTX memory model gives mbarrier arrive and test_wait/try_wait), and
// a landing copy's writes are the simulator's, invisible to TSan, like the NaN fills. The staged
// bytes pass from the issuing thread to the landing one through the barrier's table entry (a
// release when the copy is issued, an acquire when it lands): the landing thread so also sees
// what the issuer wrote before issuing the copy, a little more ordering than a GPU promises.
#include "engine/cuda/sim/sm90_mbarrier.h"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/cuda/sim/kernel.h"
#include "engine/cuda/sim/scheduler.h"
#include "engine/error.h"
#include "engine/sanitizer.h"

namespace kiln::sim::sm90 {

namespace {

constexpr int64_t kMaxCount = (1 << 20) - 1;  // the arrival and transaction counts' limit

struct PendingCopy {
  unsigned char* dst;
  std::vector<unsigned char> bytes;
};

struct Barrier {
  uint32_t arrivals = 0;  // expected per phase
  uint32_t pending = 0;   // arrivals still missing in the current phase
  int64_t tx = 0;         // the current phase's transaction count (expected - completed bytes)
  uint32_t phase = 0;     // phases completed; the current phase's parity is phase & 1
  std::vector<PendingCopy> copies;  // issued, not yet landed
};

// The barriers of the block running on this OS thread (blocks never share an OS thread at
// once, and fibers never change OS threads); cleared when a new block starts.
struct Table {
  uint64_t serial = 0;
  std::unordered_map<const void*, Barrier> barriers;
};
thread_local Table t_table;

std::string address(const void* p) {
  char s[32];
  std::snprintf(s, sizeof s, "%p", p);
  return s;
}

[[noreturn]] void fail(const char* fn, const void* bar, const std::string& what) {
  throw Error(std::string("kiln::cuda::sm90::") + fn + " (mbarrier at " + address(bar) + "): " +
              what);
}

std::unordered_map<const void*, Barrier>& barriers() {
  if (t_table.serial != detail::t_block.serial) {
    t_table.barriers.clear();
    t_table.serial = detail::t_block.serial;
  }
  return t_table.barriers;
}

void check_object(const char* fn, const void* bar) {
  if (!inside_kernel()) fail(fn, bar, "called outside a kernel");
  if (reinterpret_cast<uintptr_t>(bar) % 8 != 0)
    fail(fn, bar, "an mbarrier object must be 8-byte aligned");
  if (!in_shared_memory(bar, 8))
    fail(fn, bar, "an mbarrier object must live in shared memory (KILN_SHARED or the dynamic "
                  "shared memory)");
}

Barrier& find(const char* fn, const void* bar) {
  check_object(fn, bar);
  auto& table = barriers();
  auto it = table.find(bar);
  if (it == table.end())
    fail(fn, bar, "the barrier was not initialised in this block: one thread calls "
                  "mbarrier_init, then fence_mbarrier_init() and __syncthreads() before any "
                  "thread uses it");
  return it->second;
}

void complete_phase_if_done(Barrier& b) {
  if (b.pending != 0 || b.tx != 0) return;
  ++b.phase;
  b.pending = b.arrivals;
  note_progress();
}

void add_tx(const char* fn, const void* bar, Barrier& b, int64_t delta) {
  const int64_t tx = b.tx + delta;
  if (tx > kMaxCount || tx < -kMaxCount)
    fail(fn, bar, "the transaction count would reach " + std::to_string(tx) +
                      " bytes, outside the PTX ISA's range [-(2^20 - 1), 2^20 - 1] (expect_tx "
                      "more bytes than one phase may carry, or copies completing bytes no "
                      "expect_tx announced)");
  b.tx = tx;
}

// The copies issued against b land now (the model's moment of completion).
void land_copies(const char* fn, const void* bar, Barrier& b) {
  if (b.copies.empty()) return;
  KILN_TSAN_ACQUIRE(&b);  // the issuers' staged bytes
  std::vector<PendingCopy> copies = std::move(b.copies);
  b.copies.clear();
  for (PendingCopy& c : copies) {
    KILN_TSAN_IGNORE_WRITES_BEGIN();
    std::memcpy(c.dst, c.bytes.data(), c.bytes.size());
    KILN_TSAN_IGNORE_WRITES_END();
    add_tx(fn, bar, b, -static_cast<int64_t>(c.bytes.size()));
  }
  note_progress();
  complete_phase_if_done(b);
}

// Whether the phase of parity `parity` has completed (landing pending copies first).
bool phase_done(const char* fn, void* bar, uint32_t parity) {
  if (parity > 1)
    fail(fn, bar, "the phase parity is " + std::to_string(parity) + ", not 0 or 1 (pass the "
                  "phase counter's low bit, phase & 1)");
  Barrier& b = find(fn, bar);
  land_copies(fn, bar, b);
  if ((b.phase & 1u) == parity) return false;
  KILN_TSAN_ACQUIRE(bar);
  return true;
}

// For the deadlock report: the barrier's state.
std::string describe(const void* bar) {
  auto& table = barriers();
  auto it = table.find(bar);
  if (it == table.end()) return "the mbarrier at " + address(bar);
  const Barrier& b = it->second;
  return "the mbarrier at " + address(bar) + " (phase " + std::to_string(b.phase) +
         ", parity " + std::to_string(b.phase & 1u) + ": " + std::to_string(b.pending) + " of " +
         std::to_string(b.arrivals) + " arrivals missing, " + std::to_string(b.tx) +
         " transaction bytes outstanding)";
}

}  // namespace

void mbarrier_init(void* bar, uint32_t arrivals) {
  const char* fn = "mbarrier_init";
  check_object(fn, bar);
  if (arrivals < 1 || arrivals > kMaxCount)
    fail(fn, bar, "the arrival count " + std::to_string(arrivals) +
                      " is outside the PTX ISA's range [1, 2^20 - 1]");
  Barrier& b = barriers()[bar];
  if (!b.copies.empty())
    fail(fn, bar, "re-initialised while TMA copies issued against it are in flight");
  b = Barrier{};
  b.arrivals = b.pending = arrivals;
  note_progress();
}

void mbarrier_arrive(void* bar, uint32_t tx_bytes) {
  const char* fn = tx_bytes ? "mbarrier_arrive_expect_tx" : "mbarrier_arrive";
  Barrier& b = find(fn, bar);
  if (b.pending == 0)
    fail(fn, bar, "every arrival of the current phase (" + std::to_string(b.arrivals) +
                      ") has been made and the phase waits only for transaction bytes: one more "
                      "arrival underflows the count (undefined behaviour on a GPU)");
  add_tx(fn, bar, b, tx_bytes);
  KILN_TSAN_RELEASE(bar);
  --b.pending;
  note_progress();
  complete_phase_if_done(b);
}

bool mbarrier_try_wait(void* bar, uint32_t parity) {
  const char* fn = "mbarrier_try_wait";
  if (phase_done(fn, bar, parity)) return true;
  poll_yield(bar, &describe);
  return phase_done(fn, bar, parity);
}

void mbarrier_wait(void* bar, uint32_t parity) {
  const char* fn = "mbarrier_wait";
  while (!phase_done(fn, bar, parity)) poll_yield(bar, &describe);
}

void mbarrier_add_copy(void* bar, unsigned char* dst, std::vector<unsigned char> bytes,
                       const char* fn) {
  Barrier& b = find(fn, bar);
  b.copies.push_back(PendingCopy{dst, std::move(bytes)});
  KILN_TSAN_RELEASE(&b);
  note_progress();
}

}  // namespace kiln::sim::sm90
