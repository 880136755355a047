// sim/scheduler.cpp: one thread block = one fiber per GPU thread, run by a tiny scheduler.
// Models the Programming Guide's "SIMT Architecture" with independent thread scheduling (lanes
// of a warp progress separately and meet only at barriers and warp operations):
// https://docs.nvidia.com/cuda/cuda-c-programming-guide/#simt-architecture
//
// The schedule, warp by warp (the order a GPU's warp scheduler might also pick):
//   for each warp w (in order, or shuffled):
//     repeat: resume each Ready lane of w (in order, or shuffled); it runs until it reaches
//             __syncthreads (-> AtBarrier), a warp operation (-> AtWarp), an mbarrier poll
//             (-> Polling) or the end (-> Done); then, if lanes wait at a warp operation (and
//             none of the lanes it names polls), exchange their values and make them Ready
//             again; until no lane of w is Ready.
//   threads that poll an mbarrier (poll_yield: a wait whose condition another thread sets)
//     are made Ready for the next round, as long as a round changes something; two rounds in
//     a row that change nothing are a deadlock, reported naming what a poller waits on;
//   now every thread waits at __syncthreads or has exited:
//     all exited: the block is done; all waiting: release them and start over;
//     a mix: the threads disagree about the barrier - on a GPU a hang or undefined; here an
//     error naming a waiting and an exited thread.
// Fibers are persistent: after the kernel body returns, a fiber parks (switches back without
// finishing), and the next block resumes it to run the body again, so a block costs two
// context switches per thread and no stack set-up. Only fibers abandoned inside the body
// (after an error) are rebuilt.
//
// Shared memory is two arenas per OS thread, reset at every block start: the launch's dynamic
// shared memory, and the static shared variables (KILN_SHARED), bump-allocated in the order the
// block's threads first reach their declarations. Both are NaN-filled (a GPU's shared memory
// holds whatever the last block left) and every variable is followed by a guard zone that
// AddressSanitizer reports on.
//
// Under ThreadSanitizer every fiber is a TSan thread and a fiber switch orders nothing, so the
// CUDA memory model is stated here explicitly with release/acquire on sync objects:
//   - block start: each fiber acquires what the OS thread released after preparing the block
//     (the launch's host-side writes, the previous block on this OS thread, the NaN fills);
//   - __syncthreads(): each arriving thread releases into the barrier's object, each leaving
//     thread acquires it. Two objects, alternating by barrier generation: a fast thread already
//     past barrier k and arriving at k+1 must not leak its new writes into a slow thread that
//     has yet to leave barrier k;
//   - warp operations: the same among the lanes taking part (per warp, by generation);
//   - block end: each fiber releases, the OS thread acquires (then the launch's completion).
// Two GPU threads touching the same address with no such edge between them, one writing, is a
// TSan data race report naming both fibers ("block (x,y,z) thread (x,y,z)") - like
// compute-sanitizer's racecheck, for global memory too.
// This file is compiled without TSan instrumentation (engine/CMakeLists.txt): its own
// bookkeeping crosses fibers without CUDA-level synchronisation.
#include "engine/cuda/sim/scheduler.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/cuda/sim/fiber.h"
#include "engine/error.h"

#include "engine/sanitizer.h"

namespace kiln::sim {

namespace {

// Polling: the thread waits for a condition another thread sets (an mbarrier's phase, poll_yield)
// and gets its next turn in the next round.
enum class Status { Ready, AtBarrier, AtWarp, Polling, Done };

// One simulated GPU thread. ThreadState (what threadIdx reads) is its base, so the builtins'
// detail::t_thread pointer leads straight back here.
struct SimThread : ThreadState {
  FiberContext ctx;
  Status status = Status::Done;
  bool made = false;       // ctx can start a fresh run of the kernel (new, or parked after one)
  bool in_kernel = false;  // the fiber is inside the kernel body
  int predicate = 0;       // its __syncthreads_count contribution
  detail::WarpOp op = detail::WarpOp::Sync;  // the pending warp operation:
  unsigned int mask = 0;                     //   its lane mask,
  uint64_t value = 0;                        //   its value (the result when released),
  int src = -1;                              //   the lane it reads (-1: none)
  unsigned int voters = 0;  // the lanes it synchronised with at its last warp operation
  const void* poll_object = nullptr;                       // what it polls (Polling), and
  std::string (*describe_poll)(const void*) = nullptr;     //   how to name it in a deadlock
};

// Thrown by KILN_SHARED when the block's static + dynamic shared memory exceeds the kernel's
// limit: a launch error, passed through as it is (not as "the kernel threw").
struct SharedMemoryLimitError : Error {
  using Error::Error;
};

std::string hex(unsigned int v) {
  char s[16];
  std::snprintf(s, sizeof s, "0x%08x", v);
  return s;
}

std::string str3(uint3 v) {
  return "(" + std::to_string(v.x) + "," + std::to_string(v.y) + "," + std::to_string(v.z) + ")";
}

// splitmix64: a small, good-enough generator for the debug shuffle.
struct Rng {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  void shuffle(std::vector<unsigned>& v) {  // Fisher-Yates
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[next() % i]);
  }
};

class BlockRunner {
 public:
  BlockRunner() = default;
  BlockRunner(const BlockRunner&) = delete;
  BlockRunner& operator=(const BlockRunner&) = delete;
  ~BlockRunner() {
    free_dynamic_shared();
    if (static_arena_ != nullptr) {
      KILN_ASAN_UNPOISON(static_arena_, kStaticArenaBytes);
      std::free(static_arena_);
    }
  }

  void run(const KernelLaunch& launch, uint3 block_idx, uint64_t shuffle_seed);

  // Called from inside fibers (the builtins of kernel.h).
  int barrier(int predicate);
  uint64_t warp_exchange(detail::WarpOp op, unsigned int mask, uint64_t value, int src);
  unsigned int active_mask();
  void* static_shared(const void* key, size_t bytes, size_t align);
  void poll_yield(const void* object, std::string (*describe)(const void*));
  void note_progress() { ++progress_; }
  bool in_shared_memory(const void* p, size_t bytes) const;

 private:
  static void fiber_main(void* arg);
  void prepare(const KernelLaunch& launch, uint3 block_idx);
  void resume(SimThread& t);
  void run_warp(unsigned w);
  bool resolve_warp(unsigned w);
  void release_barrier();
  void release_abandoned(SimThread& t);
  [[noreturn]] void report_deadlock() const;
  SimThread& current() { return *static_cast<SimThread*>(detail::t_thread); }
  std::string where(const SimThread& t) const {
    return "block " + str3(::blockIdx) + " thread " + str3(t.thread_idx);
  }

  std::vector<std::unique_ptr<SimThread>> threads_;  // stable addresses: fibers point at them
  StackPool stacks_;
  FiberContext scheduler_;  // the OS thread's own context, where fibers switch back to
  const KernelLaunch* launch_ = nullptr;
  std::exception_ptr kernel_error_;  // an exception a kernel body threw
  unsigned n_ = 0;                   // threads in the current block
  int barrier_count_ = 0;            // the last released barrier's __syncthreads_count
  unsigned barrier_generation_ = 0;  // __syncthreads released so far (its parity picks the
                                     // TSan sync object)
  uint64_t progress_ = 0;  // counts the events that can unblock a polling thread (an arrival,
                           // a barrier or warp operation reached, an exit, note_progress)
  uint64_t block_serial_ = 0;  // blocks this OS thread has started (BlockState::serial)
  bool shuffle_ = false;
  Rng rng_{0};
  std::vector<unsigned> order_;  // scratch for shuffled orders
  // Dynamic shared memory: an arena of exactly the launch's bytes between two guard zones that
  // AddressSanitizer reports on (an index past the end of extern __shared__ is caught), filled
  // with NaN bytes (0xFF) at the start of every block, as a GPU's shared memory holds whatever
  // the last block left: a kernel that reads before it writes sees garbage, not zeros.
  static constexpr size_t kSharedGuard = 64;
  // The dynamic arena starts 1024 bytes (its front guard) into a 1024-aligned allocation, so
  // its addresses agree modulo 1024 with the shared-memory offsets sm90_wgmma.cpp encodes in a
  // wgmma descriptor: a tile a kernel aligns to the 1024-byte swizzle atom by its pointer is
  // also atom-aligned in the offsets the swizzle is computed on.
  static constexpr size_t kDynamicFront = 1024;
  void* dynamic_shared_ = nullptr;  // the arena itself (after the front guard)
  size_t dynamic_shared_bytes_ = 0;
  void free_dynamic_shared() {
    if (dynamic_shared_ == nullptr) return;
    char* base = static_cast<char*>(dynamic_shared_) - kDynamicFront;
    KILN_ASAN_UNPOISON(base, kDynamicFront + dynamic_shared_bytes_ + kSharedGuard);
    std::free(base);
    dynamic_shared_ = nullptr;
  }
  // Static shared memory (KILN_SHARED): one arena, allocated on first use and kept. Layout:
  // guard, variable, guard, variable, guard, ... (each variable aligned to 16 bytes, or to its
  // type's alignment when that is larger, up to 64). Unused parts
  // stay poisoned for ASan. static_bytes_ is what counts against the limit (no guards).
  static constexpr size_t kStaticArenaBytes = 320 * 1024;  // 227 KiB + guards of 1500 variables
  struct StaticSlot {
    const void* key;  // identifies the declaration (KILN_SHARED's per-declaration static)
    size_t offset;
  };
  char* static_arena_ = nullptr;
  std::vector<StaticSlot> static_slots_;
  size_t static_end_ = 0;    // arena bytes in use, guards included
  size_t static_bytes_ = 0;  // the block's static shared bytes, alignment included
  void reset_static_shared();
  // ThreadSanitizer's sync objects (only their addresses matter; see the top of the file).
  struct WarpSync {
    unsigned generation = 0;  // warp operations completed (its parity picks the objects)
    char all[2];              // every lane that arrived releases here ...
    char lane[2][32];         // ... and into its own object, for lanes that synchronise a subset
  };
  char block_start_sync_ = 0, block_end_sync_ = 0, barrier_sync_[2] = {0, 0};
  WarpSync warp_sync_[32];
};

// The runner of this OS thread while it runs a block (fibers reach it through this).
thread_local BlockRunner* t_runner = nullptr;

// The registered BlockHooks (filled before any launch, read-only afterwards).
std::vector<detail::BlockHooks>& block_hooks() {
  static std::vector<detail::BlockHooks> hooks;
  return hooks;
}

BlockRunner& this_thread_runner() {
  static thread_local BlockRunner runner;
  return runner;
}

void BlockRunner::fiber_main(void* arg) {
  auto& t = *static_cast<SimThread*>(arg);
  BlockRunner& r = *t_runner;  // fibers never leave the OS thread (and runner) that made them
  fiber_entered(&r.scheduler_);
  for (;;) {
    KILN_TSAN_ACQUIRE(&r.block_start_sync_);
    t.in_kernel = true;
    // Exceptions must not unwind past a fiber's first frame (there is no caller to return
    // to): catch here and let the scheduler rethrow on the OS thread's own stack.
    try {
      r.launch_->invoke(r.launch_->payload.get());
      for (const detail::BlockHooks& h : block_hooks())
        if (h.thread_exit != nullptr) h.thread_exit();
    } catch (...) {
      r.kernel_error_ = std::current_exception();
    }
    t.in_kernel = false;
    t.status = Status::Done;
    ++r.progress_;
    KILN_TSAN_RELEASE(&r.block_end_sync_);
    fiber_switch(&t.ctx, &r.scheduler_);  // park; the next block resumes here
  }
}

void BlockRunner::prepare(const KernelLaunch& l, uint3 block_idx) {
  launch_ = &l;
  n_ = l.block.x * l.block.y * l.block.z;
  // The dynamic shared memory: exactly shared_bytes between guards (kept while launches ask
  // the same size), NaN-filled for every block.
  if (dynamic_shared_bytes_ != l.shared_bytes || (dynamic_shared_ == nullptr && l.shared_bytes)) {
    free_dynamic_shared();
    dynamic_shared_bytes_ = l.shared_bytes;
    void* base = nullptr;
    if (l.shared_bytes > 0) {
      if (posix_memalign(&base, kDynamicFront, kDynamicFront + l.shared_bytes + kSharedGuard) != 0)
        throw Error("CUDA simulator: cannot allocate " + std::to_string(l.shared_bytes) +
                    " bytes of dynamic shared memory");
      dynamic_shared_ = static_cast<char*>(base) + kDynamicFront;
      KILN_ASAN_POISON(base, kDynamicFront);
      KILN_ASAN_POISON(static_cast<char*>(dynamic_shared_) + l.shared_bytes, kSharedGuard);
    }
  }
  if (dynamic_shared_ != nullptr) std::memset(dynamic_shared_, 0xFF, l.shared_bytes);
  reset_static_shared();
  detail::t_block = BlockState{dynamic_shared_, l.shared_bytes, ++block_serial_};
  for (const detail::BlockHooks& h : block_hooks())
    if (h.block_start != nullptr) h.block_start(n_);
  ::blockIdx = block_idx;
  ::blockDim = l.block;
  ::gridDim = l.grid;
  while (threads_.size() < n_) threads_.push_back(std::make_unique<SimThread>());
  const unsigned bx = l.block.x, bxy = l.block.x * l.block.y;
  for (unsigned i = 0; i < n_; ++i) {
    SimThread& t = *threads_[i];
    t.thread_idx = uint3{i % bx, (i / bx) % l.block.y, i / bxy};
    t.linear = i;
    t.lane = i % 32;
    t.status = Status::Ready;
    if (!t.made) {
      void* stack = stacks_.stack(i);
      fiber_stack_reset(stack, StackPool::stack_bytes());
      // Stack colouring: stacks are a whole number of pages apart, so their tops would all
      // fall on the same cache sets and evict each other; starting each fiber a different
      // number of cache lines below its top spreads them (measured: ~1.5x faster switches).
      const size_t colour = (i % 64) * 64;
      fiber_make(&t.ctx, stack, StackPool::stack_bytes() - colour, &BlockRunner::fiber_main, &t);
      t.made = true;
    }
#if KILN_TSAN
    // A race report names both GPU threads (a fiber keeps the name of its current block).
    // Formatted by hand: snprintf is intercepted by TSan and cost a fifth of the run time.
    char name[80], *e = name;
    const unsigned v[6] = {block_idx.x,     block_idx.y,     block_idx.z,
                           t.thread_idx.x, t.thread_idx.y, t.thread_idx.z};
    for (int k = 0; k < 6; ++k) {
      const char* pre = k == 0 ? "block (" : k == 3 ? ") thread (" : ",";
      while (*pre) *e++ = *pre++;
      char digits[10];
      int d = 0;
      for (unsigned x = v[k]; d == 0 || x != 0; x /= 10) digits[d++] = static_cast<char>('0' + x % 10);
      while (d > 0) *e++ = digits[--d];
    }
    *e++ = ')';
    *e = '\0';
    fiber_set_name(&t.ctx, name);
#endif
  }
}

void BlockRunner::resume(SimThread& t) {
  detail::t_thread = &t;
  ::threadIdx = t.thread_idx;
  fiber_switch(&scheduler_, &t.ctx);
  detail::t_thread = nullptr;
  if (kernel_error_) {
    KILN_TSAN_ACQUIRE(&block_end_sync_);  // the exception was made by t, which then released
    std::exception_ptr e = std::exchange(kernel_error_, nullptr);
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(e);
    } catch (const SharedMemoryLimitError&) {
      throw;  // a launch error, not the kernel's own
    } catch (const std::exception& ex) {
      what = ex.what();
    } catch (...) {
    }
    throw Error("CUDA simulator: the kernel threw an exception in " + where(t) + ": " + what +
                " (kernel code must not throw: a GPU has no exceptions)");
  }
}

void BlockRunner::run_warp(unsigned w) {
  const unsigned lo = w * 32, hi = n_ < lo + 32 ? n_ : lo + 32;
  do {
    if (shuffle_) {
      order_.clear();
      for (unsigned i = lo; i < hi; ++i) order_.push_back(i);
      rng_.shuffle(order_);
      for (unsigned i : order_)
        if (threads_[i]->status == Status::Ready) resume(*threads_[i]);
    } else {
      for (unsigned i = lo; i < hi; ++i)
        if (threads_[i]->status == Status::Ready) resume(*threads_[i]);
    }
  } while (resolve_warp(w));
}

// Completes the warp operation the lanes of warp w wait at. False if none waits.
// Works on bit masks of the warp's lanes, so one call is O(32) whatever the operation.
bool BlockRunner::resolve_warp(unsigned w) {
  const unsigned lo = w * 32, count = (n_ - lo) < 32 ? n_ - lo : 32;
  unsigned arrived = 0, at_barrier = 0, polling = 0, votes = 0, by_op[4] = {0, 0, 0, 0};
  for (unsigned b = 0; b < count; ++b) {
    const SimThread& t = *threads_[lo + b];
    if (t.status == Status::AtWarp) {
      arrived |= 1u << b;
      by_op[static_cast<int>(t.op)] |= 1u << b;
      if (t.value) votes |= 1u << b;  // the predicate, for ballot / all
    } else if (t.status == Status::AtBarrier) {
      at_barrier |= 1u << b;
    } else if (t.status == Status::Polling) {
      polling |= 1u << b;
    }
  }
  if (arrived == 0) return false;
  // A lane named in a waiting lane's mask that polls an mbarrier has yet to reach the warp
  // operation: the operation waits for it (the next round resumes it).
  for (unsigned b = 0; b < count; ++b)
    if ((arrived >> b & 1u) && (threads_[lo + b]->mask & polling)) return false;
  uint64_t result[32];
  for (unsigned b = 0; b < count; ++b) {
    if (!(arrived >> b & 1u)) continue;
    SimThread& t = *threads_[lo + b];
    // Lanes named in the mask must be at the same warp operation (exited ones are excused).
    if (const unsigned bad = t.mask & at_barrier)
      throw Error("CUDA simulator: warp divergence in " + where(t) + ": it waits at a warp "
                  "operation (mask " + hex(t.mask) + ") that includes thread " +
                  str3(threads_[lo + __builtin_ctz(bad)]->thread_idx) +
                  ", which waits at __syncthreads()");
    if (const unsigned bad = t.mask & arrived & ~by_op[static_cast<int>(t.op)])
      throw Error("CUDA simulator: the lanes of a warp wait at different warp operations in " +
                  where(t) + " and thread " + str3(threads_[lo + __builtin_ctz(bad)]->thread_idx) +
                  " (e.g. __shfl_sync in one, __ballot_sync in the other)");
    // Lanes taking part with t: in its mask and waiting now (t itself always counts).
    const unsigned voters = (arrived & t.mask) | (1u << b);
    t.voters = voters == arrived ? ~0u : voters;  // ~0u: every lane that arrived
    switch (t.op) {
      case detail::WarpOp::Shuffle:
        result[b] = t.src >= 0 && t.src < 32 && (voters >> t.src & 1u) ? threads_[lo + t.src]->value
                                                                       : t.value;
        break;
      case detail::WarpOp::Ballot: result[b] = votes & voters; break;
      case detail::WarpOp::All: result[b] = (votes & voters) == voters; break;
      case detail::WarpOp::Sync: result[b] = 0; break;
    }
  }
  for (unsigned b = 0; b < count; ++b) {
    if (!(arrived >> b & 1u)) continue;
    threads_[lo + b]->value = result[b];
    threads_[lo + b]->status = Status::Ready;
  }
  ++warp_sync_[w].generation;
  return true;
}

// All warps have stopped: release __syncthreads, or report threads that can never meet there.
void BlockRunner::release_barrier() {
  int count = 0;
  const SimThread* waiting = nullptr;
  const SimThread* exited = nullptr;
  for (unsigned i = 0; i < n_; ++i) {
    const SimThread& t = *threads_[i];
    if (t.status == Status::AtBarrier) {
      count += t.predicate;
      if (!waiting) waiting = &t;
    } else if (!exited) {
      exited = &t;
    }
  }
  if (waiting && exited)
    throw Error("CUDA simulator: barrier divergence in " + where(*waiting) +
                ": it waits at __syncthreads() but thread " + str3(exited->thread_idx) +
                " has exited. Every thread of a block must reach every __syncthreads() (an early "
                "`return` before a barrier is the usual cause; on a GPU this hangs or corrupts)");
  barrier_count_ = count;
  ++barrier_generation_;
  for (unsigned i = 0; i < n_; ++i)
    if (threads_[i]->status == Status::AtBarrier) threads_[i]->status = Status::Ready;
}

void BlockRunner::run(const KernelLaunch& l, uint3 block_idx, uint64_t shuffle_seed) {
  t_runner = this;
  shuffle_ = shuffle_seed != 0;
  rng_ = Rng{shuffle_seed};
  try {
    prepare(l, block_idx);
    KILN_TSAN_RELEASE(&block_start_sync_);
    const unsigned warps = (n_ + 31) / 32;
    std::vector<unsigned> warp_order;
    for (unsigned w = 0; w < warps; ++w) warp_order.push_back(w);
    int idle_rounds = 0;  // consecutive rounds with polling threads and no progress
    for (;;) {
      if (shuffle_) rng_.shuffle(warp_order);
      const uint64_t progress_before = progress_;
      for (unsigned w : warp_order) run_warp(w);
      // Threads polling an mbarrier get another turn. Two rounds in a row that change nothing
      // can never end: every thread waits for another. (One is not enough: a try_wait that
      // yielded once returns false on its next turn, and its thread may then go on.)
      bool any_polling = false;
      for (unsigned i = 0; i < n_ && !any_polling; ++i)
        any_polling = threads_[i]->status == Status::Polling;
      if (any_polling) {
        idle_rounds = progress_ == progress_before ? idle_rounds + 1 : 0;
        if (idle_rounds >= 2) report_deadlock();
        for (unsigned i = 0; i < n_; ++i)
          if (threads_[i]->status == Status::Polling) threads_[i]->status = Status::Ready;
        continue;
      }
      idle_rounds = 0;
      bool any_waiting = false;
      for (unsigned i = 0; i < n_ && !any_waiting; ++i)
        any_waiting = threads_[i]->status == Status::AtBarrier;
      if (!any_waiting) break;  // every thread has exited
      release_barrier();
    }
    KILN_TSAN_ACQUIRE(&block_end_sync_);
  } catch (...) {
    // Fibers stopped inside the kernel body can never be resumed: rebuild them next time.
    for (auto& t : threads_) {
      if (!t->in_kernel) continue;
      release_abandoned(*t);
      t->made = t->in_kernel = false;
    }
    KILN_TSAN_ACQUIRE(&block_end_sync_);
    kernel_error_ = nullptr;
    detail::t_thread = nullptr;
    t_runner = nullptr;
    throw;
  }
  t_runner = nullptr;
}

// A fiber abandoned inside the kernel never reaches its block end, so TSan would see the
// launching thread's next writes (the argument tuple's stack slot, buffers) race with what it
// did. Release on its behalf: switch to its TSan context alone (not its stack), release, back.
void BlockRunner::release_abandoned(SimThread& t) {
#if KILN_TSAN
  if (t.ctx.tsan_fiber == nullptr || scheduler_.tsan_fiber == nullptr) return;
  __tsan_switch_to_fiber(t.ctx.tsan_fiber, __tsan_switch_to_fiber_no_sync);
  __tsan_release(&block_end_sync_);
  __tsan_switch_to_fiber(scheduler_.tsan_fiber, __tsan_switch_to_fiber_no_sync);
#else
  (void)t;
#endif
}

int BlockRunner::barrier(int predicate) {
  SimThread& t = current();
  ++progress_;
  t.predicate = predicate;
  t.status = Status::AtBarrier;
  char* sync = &barrier_sync_[barrier_generation_ & 1];
  KILN_TSAN_RELEASE(sync);
  fiber_switch(&t.ctx, &scheduler_);
  KILN_TSAN_ACQUIRE(sync);
  return barrier_count_;
}

uint64_t BlockRunner::warp_exchange(detail::WarpOp op, unsigned int mask, uint64_t value, int src) {
  SimThread& t = current();
  t.op = op;
  t.mask = mask;
  t.value = value;
  t.src = src;
  t.status = Status::AtWarp;
  ++progress_;
#if KILN_TSAN
  WarpSync& ws = warp_sync_[t.linear / 32];
  const unsigned g = ws.generation & 1;
  KILN_TSAN_RELEASE(&ws.all[g]);
  KILN_TSAN_RELEASE(&ws.lane[g][t.lane]);
#endif
  fiber_switch(&t.ctx, &scheduler_);
#if KILN_TSAN
  if (t.voters == ~0u) {
    KILN_TSAN_ACQUIRE(&ws.all[g]);
  } else {
    for (unsigned v = t.voters; v != 0; v &= v - 1) KILN_TSAN_ACQUIRE(&ws.lane[g][__builtin_ctz(v)]);
  }
#endif
  return t.value;  // resolve_warp left the result here
}

void BlockRunner::poll_yield(const void* object, std::string (*describe)(const void*)) {
  SimThread& t = current();
  t.poll_object = object;
  t.describe_poll = describe;
  t.status = Status::Polling;
  fiber_switch(&t.ctx, &scheduler_);
}

// A round of the block changed nothing and some threads poll: name one of them, what it waits
// for, and where the others are.
void BlockRunner::report_deadlock() const {
  const SimThread* poller = nullptr;
  unsigned at_barrier = 0, at_warp = 0, polling = 0, exited = 0;
  for (unsigned i = 0; i < n_; ++i) {
    const SimThread& t = *threads_[i];
    switch (t.status) {
      case Status::Polling:
        ++polling;
        if (!poller) poller = &t;
        break;
      case Status::AtBarrier: ++at_barrier; break;
      case Status::AtWarp: ++at_warp; break;
      default: ++exited; break;
    }
  }
  const std::string what = poller->describe_poll ? poller->describe_poll(poller->poll_object)
                                                 : std::string("a condition");
  throw Error("CUDA simulator: deadlock in " + where(*poller) + ": it waits on " + what +
              ", and no thread of the block can make progress (" + std::to_string(polling) +
              " threads poll (an mbarrier, a wgmma group, setmaxnreg), " +
              std::to_string(at_barrier) + " at __syncthreads(), " + std::to_string(at_warp) +
              " at a warp operation, " +
              std::to_string(exited) + " have exited; on a GPU the block hangs)");
}

bool BlockRunner::in_shared_memory(const void* p, size_t bytes) const {
  const char* c = static_cast<const char*>(p);
  auto inside = [&](const char* base, size_t size) {
    return base != nullptr && c >= base && bytes <= size && c - base <= static_cast<ptrdiff_t>(size - bytes);
  };
  return inside(static_cast<const char*>(dynamic_shared_), dynamic_shared_bytes_) ||
         inside(static_arena_, static_end_);
}

unsigned int BlockRunner::active_mask() {
  const unsigned lo = current().linear / 32 * 32;
  unsigned mask = 0;
  for (unsigned b = 0; b < 32 && lo + b < n_; ++b)
    if (threads_[lo + b]->status != Status::Done) mask |= 1u << b;
  return mask;
}

// At block start, on the OS thread's own context (allocating from a fiber would make the
// allocation a write of that GPU thread, racing with the others' first accesses under TSan).
void BlockRunner::reset_static_shared() {
  if (static_arena_ == nullptr) {
    void* p = nullptr;
    if (posix_memalign(&p, 64, kStaticArenaBytes) != 0)
      throw Error("CUDA simulator: cannot allocate the static shared memory arena");
    static_arena_ = static_cast<char*>(p);
    KILN_ASAN_POISON(static_arena_, kStaticArenaBytes);
    static_slots_.reserve(64);  // no reallocation from inside a fiber in the usual case
  }
  KILN_ASAN_POISON(static_arena_, static_end_);
  static_slots_.clear();
  static_end_ = kSharedGuard;  // the front guard
  static_bytes_ = 0;
}

// The storage of the static shared variable `key` in this block: the first thread to reach the
// declaration allocates and NaN-fills it, the others find it.
void* BlockRunner::static_shared(const void* key, size_t bytes, size_t align) {
  for (const StaticSlot& s : static_slots_)
    if (s.key == key) return static_arena_ + s.offset;
  if (align < 16) align = 16;
  if (align > 64 || (align & (align - 1)) != 0)
    throw Error("CUDA simulator: a KILN_SHARED variable asks for " + std::to_string(align) +
                "-byte alignment; the simulator's arena gives powers of two up to 64");
  const size_t total = (static_bytes_ + align - 1) / align * align + bytes;
  const size_t limit = shared_memory_limit(launch_->kernel);
  if (total + launch_->shared_bytes > limit)
    throw SharedMemoryLimitError(
        "CUDA kernel launch failed (simulator): too much shared memory: " +
        std::to_string(total) + " B static (KILN_SHARED) + " +
        std::to_string(launch_->shared_bytes) + " B dynamic, the kernel's limit is " +
        std::to_string(limit) + " B (above 48 KiB a kernel must opt in with "
        "cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), up to "
        "227 KiB, for static and dynamic together)");
  const size_t offset = (static_end_ + align - 1) / align * align;  // the arena is 64-aligned
  if (offset + bytes + kSharedGuard > kStaticArenaBytes)
    throw SharedMemoryLimitError("CUDA simulator: too many static shared variables in one block");
  char* p = static_arena_ + offset;
  KILN_ASAN_UNPOISON(p, bytes);
  // The fill is the simulator's, not a GPU thread's: invisible to TSan, or every other thread's
  // first access would race with the thread that happened to allocate.
  KILN_TSAN_IGNORE_WRITES_BEGIN();
  std::memset(p, 0xFF, bytes);
  KILN_TSAN_IGNORE_WRITES_END();
  static_slots_.push_back({key, offset});
  static_end_ = offset + bytes + kSharedGuard;
  static_bytes_ = total;
  return p;
}

}  // namespace

void run_block(const KernelLaunch& launch, uint3 block_idx, uint64_t shuffle_seed) {
  this_thread_runner().run(launch, block_idx, shuffle_seed);
}

bool inside_kernel() { return detail::t_thread != nullptr; }

namespace detail {
void add_block_hooks(BlockHooks hooks) { block_hooks().push_back(hooks); }
int block_barrier(int predicate) { return t_runner->barrier(predicate); }
uint64_t warp_exchange(WarpOp op, unsigned int mask, uint64_t value, int src_lane) {
  return t_runner->warp_exchange(op, mask, value, src_lane);
}
unsigned int active_mask() { return t_runner->active_mask(); }
void* static_shared(const void* key, size_t bytes, size_t align) {
  if (t_runner == nullptr || detail::t_thread == nullptr)
    throw Error("CUDA simulator: a KILN_SHARED variable declared outside a kernel");
  return t_runner->static_shared(key, bytes, align);
}
}  // namespace detail

void poll_yield(const void* object, std::string (*describe)(const void*)) {
  if (t_runner == nullptr || detail::t_thread == nullptr)
    throw Error("CUDA simulator: an mbarrier wait outside a kernel");
  t_runner->poll_yield(object, describe);
}
void note_progress() {
  if (t_runner != nullptr) t_runner->note_progress();
}
bool in_shared_memory(const void* p, size_t bytes) {
  return t_runner != nullptr && t_runner->in_shared_memory(p, bytes);
}

}  // namespace kiln::sim
