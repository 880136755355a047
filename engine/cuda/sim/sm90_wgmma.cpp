// sim/sm90_wgmma.cpp: the simulator's warpgroup MMA (the model: sim/sm90_wgmma.h).
//
// A warpgroup mma is one operation issued by 128 threads. The warpgroup's first thread to issue
// it (mma i of its group g) decodes the descriptors and snapshots the operands into a record the
// warpgroup shares (a SharedMma); the other threads' issues of it must name the same descriptors,
// shape and type (else a fault at once) and record only their own part: their d and its old
// value. Groups are counted per thread in commit order. A group completes warpgroup-wide, as on
// a GPU: the first thread whose wait_group must retire group g waits (poll_yield) until all 128
// threads of its warpgroup have committed g, then executes g for all of them at once: each mma's
// operands are read from shared memory once and compared with the snapshot, and every thread's
// share of the accumulator layout (by its index in the warpgroup) is computed from them.
// So when one thread's wait returns, the operands have been read, as a warp-specialised kernel
// that frees a stage after one thread's wait assumes. Each thread's share waits in its records
// (a Result) and reaches its d at the thread's own wait that retires g: until then its
// accumulators read NaN, whoever executed the group. What a GPU does warpgroup-wide is also
// checked from each thread's records: every thread keeps a running hash of its wgmma calls
// (kind and arguments, not its d), and when the last thread of a warpgroup exits, all 128
// hashes must agree (a thread that skipped or changed a call, or exited early, breaks it).
// Per-thread state lives in vectors of the OS thread running the block (a block's fibers never
// leave it), reset by the block-start hook.
//
// ThreadSanitizer: a thread's records are also touched by the thread of its warpgroup that
// executes a group, so the threads of a warpgroup take turns on them: each wgmma call acquires
// the warpgroup's sync object first and releases it last. This orders the warpgroup's threads
// at every wgmma call, a little more than a GPU promises.
//
// Arithmetic: inputs widened to f32 (exact), each product exact in f32, and each accumulator
// sums onto its old value (or 0) the 16 products in order k = 0..15, rounding after every add.
#include "engine/cuda/sim/sm90_wgmma.h"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "engine/cuda/sim/kernel.h"
#include "engine/cuda/sim/scheduler.h"
#include "engine/cuda/sim/sm90_setmaxnreg.h"
#include "engine/cuda/sm90/swizzle.h"
#include "engine/error.h"
#include "engine/host_device.h"
#include "engine/sanitizer.h"

namespace kiln::sim::sm90 {

namespace {

using ::kiln::cuda::sm90::Swizzle;
using ::kiln::cuda::sm90::swizzle_address;
using ::kiln::cuda::sm90::swizzle_atom_bytes;
using ::kiln::cuda::sm90::swizzle_row_bytes;

[[noreturn]] void fail(const char* fn, const std::string& what) {
  throw Error(std::string("kiln::cuda::sm90::") + fn + ": " + what);
}

std::string hex(uint64_t v) {
  char s[24];
  std::snprintf(s, sizeof s, "0x%llx", static_cast<unsigned long long>(v));
  return s;
}

// One operand of a recorded mma: where each of its rows x 16 elements lives, and their bits at
// the warpgroup's first issue.
struct Operand {
  const char* name;  // "A" or "B"
  uint64_t desc;
  int rows;
  std::vector<uint32_t> address;  // element (r, k) at [r * 16 + k]: its shared-memory offset
  std::vector<uint16_t> bits;     // the snapshot
};

// A warpgroup mma as the first of its threads to issue it recorded it.
struct SharedMma {
  int bn;
  bool bf16;
  unsigned first;  // the linear id of the thread that recorded it
  Operand a, b;
};

// One thread's part of a warpgroup mma (its index in the group is that of its SharedMma).
struct Mma {
  float* d;
  bool accumulate;
  bool has_c;          // c holds the accumulator's old value (else it is taken at execution)
  std::vector<float> c;
};

// The accumulators an executed mma leaves to one thread, which its d receives at the thread's
// own wait that retires the group (until then they read NaN there, as before execution).
struct Result {
  uint64_t group;
  float* d;
  std::vector<float> values;
};

struct ThreadState {
  bool fenced = false;              // wgmma_fence since kernel start or the last wait_group
  std::vector<Mma> open;            // issued, not yet committed
  // Committed and not yet executed, oldest first: groups[i] is the thread's group number
  // WarpgroupState::executed + i (every thread's pending groups start there).
  std::vector<std::vector<Mma>> groups;
  std::vector<Result> results;      // executed, not yet retired by this thread's wait
  uint64_t hash = 1469598103934665603ull;  // FNV-1a over the thread's wgmma calls
  uint64_t calls = 0;
};

struct WarpgroupState {
  uint64_t executed = 0;  // groups executed for the whole warpgroup (numbers 0 .. executed-1)
  // The issued mmas of groups executed, executed + 1, ...: pending[g - executed][i] is mma i of
  // group g, recorded by the first thread to issue it.
  std::deque<std::vector<SharedMma>> pending;
  // Bit t: thread t of the warpgroup has exited. Here rather than in ThreadState, which a block
  // without wgmma leaves as it is, so every block starts with none gone.
  uint64_t gone[2] = {0, 0};
  unsigned exited = 0;
  uint64_t hash = 0, calls = 0;
  unsigned first = 0;  // the linear id of the first thread to exit
  char tsan_sync = 0;  // fibers take turns on this record: say so to ThreadSanitizer
};

thread_local std::vector<ThreadState> t_threads;
thread_local std::vector<WarpgroupState> t_groups;
thread_local unsigned t_block_threads = 0;
// A ThreadState left its default since the last reset. Set by many fibers (TSan threads), so
// atomically: the fibers take no turns on it that ThreadSanitizer could see.
thread_local bool t_touched = false;

ThreadState& me() {
  __atomic_store_n(&t_touched, true, __ATOMIC_RELAXED);
  return t_threads[detail::t_thread->linear];
}

WarpgroupState& my_warpgroup() { return t_groups[detail::t_thread->linear / 128]; }

// A wgmma call's turn on its warpgroup's records (see the top of the file).
class Turn {
 public:
  explicit Turn(WarpgroupState& wg) : wg_(wg) { KILN_TSAN_ACQUIRE(&wg_.tsan_sync); }
  ~Turn() { KILN_TSAN_RELEASE(&wg_.tsan_sync); }
  Turn(const Turn&) = delete;
  Turn& operator=(const Turn&) = delete;

 private:
  WarpgroupState& wg_;
};

void mix(ThreadState& s, uint64_t v) {
  for (int i = 0; i < 8; ++i) {
    s.hash ^= (v >> (8 * i)) & 0xffu;
    s.hash *= 1099511628211ull;
  }
}

void record_call(ThreadState& s, uint64_t kind, uint64_t a = 0, uint64_t b = 0, uint64_t c = 0) {
  mix(s, kind);
  mix(s, a);
  mix(s, b);
  mix(s, c);
  ++s.calls;
}

// Every wgmma instruction is .sync.aligned over the warpgroup: the caller's warpgroup must be
// whole and its warp complete (the other warps are checked at exit, by the hashes).
void enter_warpgroup(const char* fn) {
  const unsigned linear = detail::t_thread->linear;
  const unsigned group_end = (linear / 128 + 1) * 128;
  if (t_block_threads < group_end)
    fail(fn, "a warpgroup instruction needs all 128 threads of an aligned warpgroup, but thread " +
                 std::to_string(linear) + " is in warpgroup " + std::to_string(linear / 128) +
                 " of a block of " + std::to_string(t_block_threads) +
                 " threads (make the block a multiple of 128 threads)");
  if (detail::active_mask() != 0xffffffffu)
    fail(fn, "every thread of the warpgroup must take part, but lanes of warp " +
                 std::to_string(linear / 32) + " have exited (an early return?)");
  __syncwarp();
}

Swizzle swizzle_of(unsigned code) {
  switch (code & 3u) {
    case 1: return Swizzle::B128;
    case 2: return Swizzle::B64;
    case 3: return Swizzle::B32;
    default: return Swizzle::None;
  }
}
const char* swizzle_name(Swizzle s) {
  return s == Swizzle::B128 ? "128B" : s == Swizzle::B64 ? "64B" : s == Swizzle::B32 ? "32B" : "no";
}

// Decodes a K-major descriptor of `rows` x 16 16-bit elements (the PTX ISA's canonical layouts,
// "Shared Memory Matrix Layout"): without swizzle, core matrices of 8 rows x 16 bytes, the next
// 8 k at +LBO, the next 8 rows at +SBO; swizzled, rows of 16/32/64/128 bytes (8 to an atom), k
// contiguous within the row, the next 8 rows at +SBO, and the address swizzled (on its own bits).
Operand decode(const char* name, uint64_t desc, int rows) {
  Operand op{name, desc, rows, {}, {}};
  const uint32_t start = static_cast<uint32_t>(desc & 0x3fffu) << 4;
  const uint32_t lbo = static_cast<uint32_t>((desc >> 16) & 0x3fffu) << 4;
  const uint32_t sbo = static_cast<uint32_t>((desc >> 32) & 0x3fffu) << 4;
  const unsigned base_offset = static_cast<unsigned>((desc >> 49) & 7u);
  const Swizzle sw = swizzle_of(static_cast<unsigned>(desc >> 62));
  const std::string what = std::string("operand ") + name + " (descriptor " + hex(desc) + ")";
  if (base_offset != 0)
    fail("wgmma_m64k16", what + " has a non-zero base offset (bits 49-51); tiles here start on "
                               "their swizzle atom, base offset 0");
  if (sw != Swizzle::None) {
    const uint32_t row = swizzle_row_bytes(sw), atom = swizzle_atom_bytes(sw);
    // The start may sit a k offset into the atom's first row (kernels step k16 by +32 bytes),
    // the atom itself on its boundary: the swizzle XORs the address's own row bits.
    if (start % atom + 32 > row)
      fail("wgmma_m64k16", what + ": a " + swizzle_name(sw) + "-swizzled operand starts at shared "
                                  "address " + hex(start) + ", which is not on a " +
                                  std::to_string(atom) + "-byte atom boundary plus a k offset "
                                  "within its " + std::to_string(row) + "-byte row");
  }
  const uint32_t limit = static_cast<uint32_t>(detail::t_block.dynamic_shared_bytes);
  op.address.resize(static_cast<size_t>(rows) * 16);
  for (int r = 0; r < rows; ++r)
    for (int k = 0; k < 16; ++k) {
      uint32_t at;
      if (sw == Swizzle::None) {
        at = start + (r / 8) * sbo + (k / 8) * lbo + (r % 8) * 16 + (k % 8) * 2;
      } else {
        at = swizzle_address(sw, start + (r / 8) * sbo + (r % 8) * swizzle_row_bytes(sw) + k * 2);
      }
      if (at + 2 > limit)
        fail("wgmma_m64k16", what + " reads element (" + std::to_string(r) + ", " +
                                 std::to_string(k) + ") at shared address " + hex(at) +
                                 ", past the block's " + std::to_string(limit) +
                                 " bytes of dynamic shared memory");
      op.address[static_cast<size_t>(r) * 16 + k] = at;
    }
  return op;
}

std::vector<uint16_t> read_bits(const Operand& op) {
  const auto* smem = static_cast<const unsigned char*>(detail::t_block.dynamic_shared);
  std::vector<uint16_t> bits(op.address.size());
  for (size_t i = 0; i < bits.size(); ++i) std::memcpy(&bits[i], smem + op.address[i], 2);
  return bits;
}

bool pending_on(const ThreadState& s, const float* d) {
  for (const Mma& m : s.open)
    if (m.d == d) return true;
  for (const auto& g : s.groups)
    for (const Mma& m : g)
      if (m.d == d) return true;
  return false;
}

// The next not-yet-run mma of this thread on the same accumulator (it takes over the result).
Mma* next_on(ThreadState& s, const float* d, size_t group, size_t index) {
  for (size_t g = group; g < s.groups.size(); ++g)
    for (size_t i = g == group ? index + 1 : 0; i < s.groups[g].size(); ++i)
      if (s.groups[g][i].d == d) return &s.groups[g][i];
  for (Mma& m : s.open)
    if (m.d == d) return &m;
  return nullptr;
}

void check_unchanged(const Operand& op, const std::vector<uint16_t>& now) {
  for (size_t i = 0; i < now.size(); ++i)
    if (now[i] != op.bits[i])
      fail("wgmma_wait_group",
           std::string("shared memory read by wgmma.mma_async was written before "
                       "wgmma.wait_group: operand ") +
               op.name + " (descriptor " + hex(op.desc) + "), element (" +
               std::to_string(i / 16) + ", " + std::to_string(i % 16) + ") at shared address " +
               hex(op.address[i]) + " (wait for the group before overwriting its operands)");
}

// Operand `op` of `m` as shared memory holds it now (which must be its snapshot), widened to f32.
std::vector<float> widened(const SharedMma& m, const Operand& op) {
  const std::vector<uint16_t> now = read_bits(op);
  check_unchanged(op, now);
  std::vector<float> values(now.size());
  for (size_t i = 0; i < now.size(); ++i)
    values[i] = m.bf16 ? bf16_to_f32(now[i]) : f16_to_f32(now[i]);
  return values;
}

// Runs thread `t`'s (its index in the warpgroup) share of mma `index` of its oldest pending
// group (number `group`), whose records are `s`, from the operands a (64 x 16) and b (bn x 16).
void execute(ThreadState& s, unsigned t, uint64_t group, size_t index, int bn,
             const std::vector<float>& a, const std::vector<float>& b) {
  Mma& m = s.groups[0][index];
  const unsigned w = t / 32, l = t % 32;
  const int n = bn / 2;
  std::vector<float> out(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    const unsigned row = 16 * w + l / 4 + 8 * ((i / 2) % 2);
    const unsigned col = 8 * (i / 4) + 2 * (l % 4) + (i % 2);
    const float* a_row = &a[row * 16];
    const float* b_col = &b[col * 16];
    float acc = !m.accumulate ? 0.0f : m.has_c ? m.c[static_cast<size_t>(i)] : m.d[i];
    for (unsigned k = 0; k < 16; ++k) acc += a_row[k] * b_col[k];
    out[static_cast<size_t>(i)] = acc;
  }
  if (Mma* next = next_on(s, m.d, 0, index)) {
    // A later mma accumulates onto this one: it gets the result, the registers stay undefined.
    next->c = std::move(out);
    next->has_c = true;
  } else {
    s.results.push_back(Result{group, m.d, std::move(out)});
  }
}

[[noreturn]] void different_calls(unsigned w, const std::string& what) {
  fail("wgmma_m64k16", "the threads of warpgroup " + std::to_string(w) +
                           " made different warpgroup calls: " + what +
                           ". wgmma_fence, wgmma_m64k16, commit, wait and setmaxnreg are called "
                           "by all 128 threads of the warpgroup with the same arguments");
}

// The first thread of warpgroup `w` that has not committed its group number wg.executed (128:
// all have).
unsigned first_uncommitted(unsigned w) {
  for (unsigned t = 0; t < 128; ++t)
    if (t_threads[w * 128 + t].groups.empty()) return t;
  return 128;
}

// Executes the warpgroup's oldest pending group (every thread has committed it) for all 128
// threads: the operands are read (and checked) now, each thread's share waits in its records.
void execute_group(unsigned w, WarpgroupState& wg) {
  std::vector<SharedMma> mmas;
  if (!wg.pending.empty()) {
    mmas = std::move(wg.pending.front());
    wg.pending.pop_front();
  }
  for (unsigned t = 0; t < 128; ++t) {
    const size_t issued = t_threads[w * 128 + t].groups[0].size();
    if (issued != mmas.size())
      different_calls(w, "thread " + std::to_string(mmas.empty() ? w * 128 : mmas[0].first) +
                             " issued " + std::to_string(mmas.size()) + " mmas in wgmma group " +
                             std::to_string(wg.executed) + ", thread " +
                             std::to_string(w * 128 + t) + " " + std::to_string(issued));
  }
  for (size_t i = 0; i < mmas.size(); ++i) {
    const std::vector<float> a = widened(mmas[i], mmas[i].a), b = widened(mmas[i], mmas[i].b);
    for (unsigned t = 0; t < 128; ++t)
      execute(t_threads[w * 128 + t], t, wg.executed, i, mmas[i].bn, a, b);
  }
  for (unsigned t = 0; t < 128; ++t) {
    ThreadState& s = t_threads[w * 128 + t];
    s.groups.erase(s.groups.begin());
  }
  ++wg.executed;
  note_progress();
}

// For the deadlock report: the group a waiter of warpgroup `object` needs.
std::string describe_group(const void* object) {
  const auto* wg = static_cast<const WarpgroupState*>(object);
  KILN_TSAN_ACQUIRE(&wg->tsan_sync);
  const auto w = static_cast<unsigned>(wg - t_groups.data());
  const unsigned missing = first_uncommitted(w);
  unsigned committed = 0;
  for (unsigned t = 0; t < 128; ++t) committed += t_threads[w * 128 + t].groups.empty() ? 0 : 1;
  const std::string absent = missing < 128 ? ", not thread " + std::to_string(w * 128 + missing)
                                           : std::string();
  return "wgmma group " + std::to_string(wg->executed) + " of warpgroup " + std::to_string(w) +
         " (wgmma_wait_group: " + std::to_string(committed) + " of its 128 threads have "
         "committed it" + absent + "; a group completes when every thread of the warpgroup has "
         "committed it)";
}

// Every block of every kernel passes here: the per-thread states are rebuilt only after a block
// that used wgmma (most kernels never do).
void block_start(unsigned threads) {
  t_block_threads = threads;
  if (__atomic_load_n(&t_touched, __ATOMIC_RELAXED) || t_threads.size() < threads) {
    t_threads.assign(threads, ThreadState{});
    __atomic_store_n(&t_touched, false, __ATOMIC_RELAXED);
  }
  t_groups.assign((threads + 127) / 128, WarpgroupState{});
}

void thread_exit() {
  if (t_threads.empty()) return;
  const unsigned linear = detail::t_thread->linear;
  WarpgroupState& g = t_groups[linear / 128];
  KILN_TSAN_ACQUIRE(&g.tsan_sync);
  const ThreadState& s = t_threads[linear];
  g.gone[linear % 128 / 64] |= uint64_t{1} << (linear % 64);
  if (!s.open.empty() || !s.groups.empty() || !s.results.empty())
    fail("wgmma_wait_group", "the kernel exited with wgmma.mma_async operations " +
                                 std::string(s.open.empty() ? "" : "never committed and ") +
                                 "never waited for (wgmma_commit_group, then "
                                 "wgmma_wait_group<0>, before the thread exits)");
  const bool first = g.exited++ == 0;
  if (first) {
    g.hash = s.hash;
    g.calls = s.calls;
    g.first = linear;
  }
  const uint64_t seen_hash = g.hash, seen_calls = g.calls;
  const unsigned seen_first = g.first;
  KILN_TSAN_RELEASE(&g.tsan_sync);
  if (!first && (seen_hash != s.hash || seen_calls != s.calls))
    different_calls(linear / 128, "thread " + std::to_string(seen_first) + " made " +
                                      std::to_string(seen_calls) + ", thread " +
                                      std::to_string(linear) + " " + std::to_string(s.calls) +
                                      " (or the same number with other arguments)");
}

// The calling thread's issue of the next mma of its open group: the first thread of the
// warpgroup to issue it records it (the operands as they are now), the others must match it.
void issue(WarpgroupState& wg, const ThreadState& s, uint64_t desc_a, uint64_t desc_b, int bn,
           bool bf16) {
  const size_t group = s.groups.size(), index = s.open.size();  // group: after wg.executed
  if (wg.pending.size() <= group) wg.pending.resize(group + 1);
  std::vector<SharedMma>& mmas = wg.pending[group];
  const unsigned linear = detail::t_thread->linear;
  if (index == mmas.size()) {
    SharedMma m{bn, bf16, linear, decode("A", desc_a, 64), decode("B", desc_b, bn)};
    m.a.bits = read_bits(m.a);
    m.b.bits = read_bits(m.b);
    mmas.push_back(std::move(m));
    return;
  }
  const SharedMma& m = mmas[index];
  if (m.a.desc == desc_a && m.b.desc == desc_b && m.bn == bn && m.bf16 == bf16) return;
  const auto call = [](uint64_t a, uint64_t b, int n, bool bf) {
    return "(A " + hex(a) + ", B " + hex(b) + ", N " + std::to_string(n) +
           (bf ? ", bf16)" : ", f16)");
  };
  different_calls(linear / 128,
                  "mma " + std::to_string(index) + " of wgmma group " +
                      std::to_string(wg.executed + group) + " is " +
                      call(m.a.desc, m.b.desc, m.bn, m.bf16) + " in thread " +
                      std::to_string(m.first) + ", " + call(desc_a, desc_b, bn, bf16) +
                      " in thread " + std::to_string(linear));
}

const bool registered = (detail::add_block_hooks({&block_start, &thread_exit}), true);

}  // namespace

uint64_t make_smem_desc(const void* smem, unsigned swizzle_code, uint32_t leading_byte_offset,
                        uint32_t stride_byte_offset) {
  (void)registered;
  const auto* base = static_cast<const unsigned char*>(detail::t_block.dynamic_shared);
  const auto* p = static_cast<const unsigned char*>(smem);
  const size_t bytes = detail::t_block.dynamic_shared_bytes;
  if (base == nullptr || p < base || p >= base + bytes)
    fail("make_smem_desc", "the pointer is not in the block's dynamic shared memory; the "
                           "simulator's shared addresses for wgmma are offsets into it, so "
                           "operands live in KILN_DYNAMIC_SHARED memory");
  const auto offset = static_cast<uint32_t>(p - base);
  if (offset % 16 != 0)
    fail("make_smem_desc", "the matrix start address " + hex(offset) + " is not 16-byte aligned");
  for (uint32_t v : {leading_byte_offset, stride_byte_offset})
    if (v % 16 != 0 || v >= (1u << 18))
      fail("make_smem_desc", "a byte offset of " + std::to_string(v) +
                                 " is not a multiple of 16 below 2^18 (the field holds it >> 4 "
                                 "in 14 bits)");
  return static_cast<uint64_t>(offset >> 4) | static_cast<uint64_t>(leading_byte_offset >> 4) << 16 |
         static_cast<uint64_t>(stride_byte_offset >> 4) << 32 |
         static_cast<uint64_t>(swizzle_code & 3u) << 62;
}

void wgmma_fence() {
  enter_warpgroup("wgmma_fence");
  const Turn turn(my_warpgroup());
  ThreadState& s = me();
  s.fenced = true;
  record_call(s, 1);
}

void wgmma_mma_async(float* d, int bn, bool bf16, uint64_t desc_a, uint64_t desc_b,
                     bool accumulate) {
  enter_warpgroup("wgmma_m64k16");
  WarpgroupState& wg = my_warpgroup();
  const Turn turn(wg);
  ThreadState& s = me();
  if (!s.fenced)
    fail("wgmma_m64k16", "wgmma.mma_async without a wgmma_fence() before it (since the kernel "
                         "started or the last wgmma_wait_group): the PTX ISA requires the fence "
                         "before the first mma_async and after registers were touched");
  record_call(s, 2, desc_a, desc_b,
              static_cast<uint64_t>(bn) << 2 | static_cast<uint64_t>(bf16) << 1 | accumulate);
  issue(wg, s, desc_a, desc_b, bn, bf16);
  Mma m{d, accumulate, false, {}};
  const int n = bn / 2;
  auto result = s.results.begin();
  while (result != s.results.end() && result->d != d) ++result;
  if (result != s.results.end()) {
    // An executed mma on d whose group this thread has not retired: this one takes over d.
    if (accumulate) {
      m.c = std::move(result->values);
      m.has_c = true;
    }
    s.results.erase(result);
  } else if (accumulate && !pending_on(s, d)) {
    m.c.assign(d, d + n);
    m.has_c = true;
  }
  for (int i = 0; i < n; ++i) d[i] = std::numeric_limits<float>::quiet_NaN();
  s.open.push_back(std::move(m));
}

void wgmma_commit_group() {
  enter_warpgroup("wgmma_commit_group");
  const Turn turn(my_warpgroup());
  ThreadState& s = me();
  record_call(s, 3);
  s.groups.push_back(std::move(s.open));
  s.open.clear();
}

void wgmma_wait_group(int n) {
  enter_warpgroup("wgmma_wait_group");
  const unsigned linear = detail::t_thread->linear, w = linear / 128;
  WarpgroupState& wg = t_groups[w];
  KILN_TSAN_ACQUIRE(&wg.tsan_sync);
  ThreadState& s = me();
  record_call(s, 4, static_cast<uint64_t>(n));
  // This thread's groups are numbered in commit order; it retires all but the n newest.
  const uint64_t committed = wg.executed + s.groups.size();
  const uint64_t retire = committed > static_cast<uint64_t>(n) ? committed - n : 0;
  while (wg.executed < retire) {
    const unsigned missing = first_uncommitted(w);
    if (missing == 128) {
      execute_group(w, wg);
      continue;
    }
    const unsigned other = w * 128 + missing;
    if (wg.gone[missing / 64] >> (missing % 64) & 1u)
      fail("wgmma_wait_group",
           "the threads of warpgroup " + std::to_string(w) + " made different warpgroup calls: "
           "thread " + std::to_string(linear) + " waits for wgmma group " +
           std::to_string(wg.executed) + ", which thread " + std::to_string(other) +
           " exited without committing (a group completes when all 128 threads have committed "
           "it; wgmma calls are made by the whole warpgroup)");
    KILN_TSAN_RELEASE(&wg.tsan_sync);
    poll_yield(&wg, &describe_group);
    KILN_TSAN_ACQUIRE(&wg.tsan_sync);
  }
  // The retired groups' accumulators reach this thread's registers now.
  for (auto r = s.results.begin(); r != s.results.end();) {
    if (r->group >= retire) {
      ++r;
      continue;
    }
    std::memcpy(r->d, r->values.data(), sizeof(float) * r->values.size());
    r = s.results.erase(r);
  }
  s.fenced = false;
  KILN_TSAN_RELEASE(&wg.tsan_sync);
}

void setmaxnreg(bool increase, int regs) {
  const char* fn = increase ? "setmaxnreg_inc" : "setmaxnreg_dec";
  if (regs % 8 != 0 || regs < 24 || regs > 256)
    fail(fn, "the register count " + std::to_string(regs) +
                 " must be a multiple of 8 in [24, 256]");
  enter_warpgroup(fn);
  {
    const Turn turn(my_warpgroup());
    record_call(me(), increase ? 5 : 6, static_cast<uint64_t>(regs));
  }
  change_register_limit(increase, regs);
}

}  // namespace kiln::sim::sm90
