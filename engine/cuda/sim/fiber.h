// sim/fiber.h: fibers, the user-space threads that simulated GPU threads run on (internal).
// Models no CUDA API: the mechanism under scheduler.cpp, which gives each GPU thread of a block
// its own stack so that it can stop at a barrier and resume there.
//
// A fiber is a stack plus a saved register set. fiber_switch(from, to) saves the running
// context into `from` and resumes `to`; nothing else is involved (no kernel call, no signal
// mask), which is why a switch costs a few nanoseconds and a kernel with 1M GPU threads can
// afford two switches per thread.
//
// Two implementations (fiber.cpp):
//   - x86-64: a dozen instructions of assembly saving the System V callee-saved registers
//     (rbx, rbp, r12-r15, the stack pointer) and the SSE/x87 control words;
//   - elsewhere, or with env KILN_SIM_UCONTEXT=1 (or -DKILN_SIM_FORCE_UCONTEXT): POSIX
//     ucontext (makecontext/swapcontext), portable but ~100x slower (a syscall per switch).
// Under AddressSanitizer every switch tells ASan which stack is now in use
// (__sanitizer_start/finish_switch_fiber), otherwise it reports false stack overflows; under
// ThreadSanitizer each fiber is a TSan thread of its own and a switch orders nothing
// (__tsan_switch_to_fiber_no_sync): the scheduler models CUDA's synchronisation explicitly.
#pragma once

#include <ucontext.h>

#include <cstddef>
#include <memory>
#include <vector>

namespace kiln::sim {

struct FiberContext {
  FiberContext() = default;
  FiberContext(const FiberContext&) = delete;
  FiberContext& operator=(const FiberContext&) = delete;
  ~FiberContext();  // frees the TSan fiber it created
  void* sp = nullptr;  // saved stack pointer (assembly switch): registers live on the stack
  std::unique_ptr<ucontext_t> uc;  // saved context (ucontext fallback only; kept out of line so
                                   // the hot fibers stay small and close together in memory)
  // The stack this context runs on, for ASan (null for an OS thread's own stack until learned).
  const void* stack_lo = nullptr;
  size_t stack_size = 0;
  void* asan_fake_stack = nullptr;  // ASan's per-fiber "fake stack" for use-after-return
  void* tsan_fiber = nullptr;       // ThreadSanitizer's handle for this context
  bool owns_tsan_fiber = false;     // created by fiber_make (not an OS thread's own)
  void (*entry)(void*) = nullptr;   // what a fresh fiber calls (ucontext fallback reads these)
  void* arg = nullptr;
};

// Prepares `ctx` to call entry(arg) on the stack [stack_lo, stack_lo + stack_size) the next time
// it is switched to. `entry` must never return: a fiber ends by switching away for good.
void fiber_make(FiberContext* ctx, void* stack_lo, size_t stack_size, void (*entry)(void*),
                void* arg);

// Saves the running context into `from` and resumes `to`. Returns when something switches back.
void fiber_switch(FiberContext* from, FiberContext* to);

// The first call of every fiber entry: completes the switch that started it (ASan learns the
// bounds of the stack it came from, which it records in `from`).
void fiber_entered(FiberContext* from);

// Names the fiber in ThreadSanitizer's reports (e.g. "block (0,0,0) thread (5,0,0)"); TSan
// copies the name. No-op without TSan.
void fiber_set_name(FiberContext* ctx, const char* name);

// Whether the ucontext fallback is in use (env KILN_SIM_UCONTEXT, or not x86-64).
bool fiber_uses_ucontext();

// Fiber stacks of one OS thread, created on first use and reused by every later block and
// launch. Each is mmap'd with an inaccessible guard page below it, so a stack overflow is a
// segmentation fault at the guard instead of silent corruption of the neighbour. Size: env
// KILN_SIM_STACK_KB (default 64 KiB, 256 KiB under ASan, whose frames are larger).
class StackPool {
 public:
  StackPool() = default;
  StackPool(const StackPool&) = delete;
  StackPool& operator=(const StackPool&) = delete;
  ~StackPool();
  void* stack(size_t index);  // the lowest usable address of stack `index`
  static size_t stack_bytes();

 private:
  std::vector<void*> mappings_;  // each: guard page + stack
};

// Makes a previously used stack look fresh to ASan (no stale poisoned redzones of abandoned
// frames). No-op without ASan.
void fiber_stack_reset(void* stack_lo, size_t stack_size);

}  // namespace kiln::sim
