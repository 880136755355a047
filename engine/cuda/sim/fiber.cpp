// sim/fiber.cpp: context switching and fiber stacks (see fiber.h).
// Models no CUDA API (the mechanism under the simulated GPU threads).
#include "engine/cuda/sim/fiber.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "engine/error.h"

#include "engine/sanitizer.h"
#if KILN_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

// ThreadSanitizer must be told about fibers too, or it mixes up their shadow stacks. Each
// fiber is its own TSan thread and a switch orders nothing (__tsan_switch_to_fiber_no_sync):
// two GPU threads of a block are unordered, as on a GPU, unless the scheduler's explicit
// release/acquire (a barrier, a warp operation) orders them. This file and scheduler.cpp are
// compiled without TSan instrumentation (engine/CMakeLists.txt): their bookkeeping crosses
// fibers without CUDA-level synchronisation and is not the kernel's.

#if defined(__x86_64__) && !defined(KILN_SIM_FORCE_UCONTEXT)
#define KILN_SIM_ASM_SWITCH 1
#endif

namespace kiln::sim {

namespace {
// makecontext passes only int arguments: the FiberContext pointer travels as two halves.
void ucontext_trampoline(unsigned int hi, unsigned int lo) {
  auto* ctx = reinterpret_cast<FiberContext*>((static_cast<uintptr_t>(hi) << 32) | lo);
  ctx->entry(ctx->arg);
  std::abort();  // entries never return
}
}  // namespace

#if KILN_SIM_ASM_SWITCH
// kiln_sim_switch(void** save_sp, void* new_sp): the whole context switch.
//   1. push the callee-saved registers (rbp, rbx, r12-r15) on the current stack;
//   2. store the stack pointer into *save_sp (that one pointer is the saved context);
//   3. load new_sp and pop the other context's registers from its stack, then `ret` pops its
//      return address: execution continues where that context called kiln_sim_switch.
// Caller-saved registers need no saving: the C++ caller already assumes the call clobbers them.
// The SSE/x87 control words (rounding mode, denormals) are callee-saved too, but every fiber
// of a thread runs with the same ones (CUDA code cannot change a rounding mode: it picks one
// per instruction, __fadd_rd & co), so they are not switched: saving and restoring them took
// ~80% of the switch time when measured.
// A fresh fiber's stack is prepared by fiber_make so that the `ret` lands in
// kiln_sim_fiber_start with r12 = argument, r13 = entry function.
extern "C" void kiln_sim_switch(void** save_sp, void* new_sp);
extern "C" void kiln_sim_fiber_start();
asm(R"(
  .text
  .globl kiln_sim_switch
  .type kiln_sim_switch, @function
  .p2align 4
kiln_sim_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size kiln_sim_switch, .-kiln_sim_switch

  .globl kiln_sim_fiber_start
  .type kiln_sim_fiber_start, @function
  .p2align 4
kiln_sim_fiber_start:
  .cfi_startproc
  .cfi_undefined rip   /* the outermost frame: debuggers and unwinders stop here */
  movq %r12, %rdi
  callq *%r13
  ud2
  .cfi_endproc
  .size kiln_sim_fiber_start, .-kiln_sim_fiber_start
)");
#endif

namespace {
// Read once at start-up (a branch on a constant per switch, not a function call).
const bool g_use_ucontext = [] {
#if KILN_SIM_ASM_SWITCH
  const char* env = std::getenv("KILN_SIM_UCONTEXT");
  return env != nullptr && std::strcmp(env, "0") != 0 && env[0] != '\0';
#else
  return true;
#endif
}();
}  // namespace

bool fiber_uses_ucontext() { return g_use_ucontext; }

void fiber_make(FiberContext* ctx, void* stack_lo, size_t stack_size, void (*entry)(void*),
                void* arg) {
  ctx->stack_lo = stack_lo;
  ctx->stack_size = stack_size;
  ctx->asan_fake_stack = nullptr;
  ctx->entry = entry;
  ctx->arg = arg;
#if KILN_TSAN
  if (ctx->tsan_fiber) __tsan_destroy_fiber(ctx->tsan_fiber);  // an abandoned fiber, rebuilt
  ctx->tsan_fiber = __tsan_create_fiber(0);
  ctx->owns_tsan_fiber = true;
#endif
  if (g_use_ucontext) {
    if (!ctx->uc) ctx->uc = std::make_unique<ucontext_t>();
    getcontext(ctx->uc.get());
    ctx->uc->uc_stack.ss_sp = stack_lo;
    ctx->uc->uc_stack.ss_size = stack_size;
    ctx->uc->uc_link = nullptr;
    const auto p = reinterpret_cast<uintptr_t>(ctx);
    makecontext(ctx->uc.get(), reinterpret_cast<void (*)()>(&ucontext_trampoline), 2,
                static_cast<unsigned int>(p >> 32), static_cast<unsigned int>(p & 0xffffffffu));
    return;
  }
#if KILN_SIM_ASM_SWITCH
  // The initial frame, read by the second half of kiln_sim_switch (lowest address first):
  //   [sp+0..40] r15 r14 r13 r12 rbx rbp   [sp+48] return address = kiln_sim_fiber_start
  // After `ret` the stack pointer is sp+56, which must be 16-byte aligned so that the `call`
  // in kiln_sim_fiber_start enters `entry` with the alignment the ABI requires.
  auto top = (reinterpret_cast<uintptr_t>(stack_lo) + stack_size) & ~uintptr_t{15};
  auto* frame = reinterpret_cast<uint64_t*>(top - 16 - 56);
  std::memset(frame, 0, 56);
  frame[3] = reinterpret_cast<uint64_t>(arg);    // r12
  frame[2] = reinterpret_cast<uint64_t>(entry);  // r13
  frame[6] = reinterpret_cast<uint64_t>(&kiln_sim_fiber_start);
  ctx->sp = frame;
#endif
}

void fiber_switch(FiberContext* from, FiberContext* to) {
#if KILN_ASAN
  __sanitizer_start_switch_fiber(&from->asan_fake_stack, to->stack_lo, to->stack_size);
#endif
#if KILN_TSAN
  if (!from->tsan_fiber) from->tsan_fiber = __tsan_get_current_fiber();  // an OS thread's own
  __tsan_switch_to_fiber(to->tsan_fiber, __tsan_switch_to_fiber_no_sync);
#endif
#if KILN_SIM_ASM_SWITCH
  if (!g_use_ucontext) {
    kiln_sim_switch(&from->sp, to->sp);
  } else
#endif
  {
    if (!from->uc) from->uc = std::make_unique<ucontext_t>();  // an OS thread's own context
    swapcontext(from->uc.get(), to->uc.get());
  }
#if KILN_ASAN
  __sanitizer_finish_switch_fiber(from->asan_fake_stack, nullptr, nullptr);
#endif
}

FiberContext::~FiberContext() {
#if KILN_TSAN
  if (owns_tsan_fiber && tsan_fiber) __tsan_destroy_fiber(tsan_fiber);
#endif
}

void fiber_set_name(FiberContext* ctx, const char* name) {
#if KILN_TSAN
  if (ctx->tsan_fiber) __tsan_set_fiber_name(ctx->tsan_fiber, name);
#else
  (void)ctx;
  (void)name;
#endif
}

void fiber_entered(FiberContext* from) {
#if KILN_ASAN
  const void* lo = nullptr;
  size_t size = 0;
  __sanitizer_finish_switch_fiber(nullptr, &lo, &size);
  from->stack_lo = lo;
  from->stack_size = size;
#else
  (void)from;
#endif
}

void fiber_stack_reset(void* stack_lo, size_t stack_size) {
#if KILN_ASAN
  __asan_unpoison_memory_region(stack_lo, stack_size);
#else
  (void)stack_lo;
  (void)stack_size;
#endif
}

// ---- Stacks -------------------------------------------------------------------------------
size_t StackPool::stack_bytes() {
  static const size_t bytes = [] {
#if KILN_ASAN
    size_t kb = 256;
#else
    size_t kb = 64;
#endif
    if (const char* env = std::getenv("KILN_SIM_STACK_KB")) {
      const long v = std::strtol(env, nullptr, 10);
      if (v >= 16) kb = static_cast<size_t>(v);
    }
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    return (kb * 1024 + page - 1) / page * page;
  }();
  return bytes;
}

void* StackPool::stack(size_t index) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  while (mappings_.size() <= index) {
    // MAP_NORESERVE: only the pages a fiber actually touches cost memory (usually one or two).
    void* p = mmap(nullptr, page + stack_bytes(), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (p == MAP_FAILED) {
      throw Error("CUDA simulator: cannot map a fiber stack of " + std::to_string(stack_bytes()) +
                  " bytes (" + std::strerror(errno) + ")");
    }
    mprotect(p, page, PROT_NONE);  // the guard page: an overflow faults here
    mappings_.push_back(p);
  }
  return static_cast<char*>(mappings_[index]) + page;
}

StackPool::~StackPool() {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  for (void* p : mappings_) {
    // A finished fiber's last frames are never unwound, so their redzones stay poisoned in
    // ASan's shadow. Clear them before unmapping: a thread stack (and its TLS) that the system
    // maps here later would inherit them and be reported as a stack-buffer underflow.
    fiber_stack_reset(static_cast<char*>(p) + page, stack_bytes());
    munmap(p, page + stack_bytes());
  }
}

}  // namespace kiln::sim
