// sync_debug.h: finding the host calls that wait for the device (the idea of PyTorch's
// torch.cuda.set_sync_debug_mode).
//
// A GPU runs ahead of the host only while the host keeps queueing work. Every host call that
// waits for the device (a stream or event synchronisation, a blocking copy, item(), cudaFree)
// drains that queue, and in the steady state of a training step such a wait costs a bubble per
// step. The sync debug mode reports every such call, with its call site:
//
//   KILN_SYNC_DEBUG=warn   one line per call site, the first time it waits, on stderr:
//                            kiln: sync debug: Tensor::item() (a blocking device->host copy)
//                            waits for the device at engine/optim/grad_scaler.cpp:66
//                          and, at exit, how often each reported site, and each named reason
//                          (AllowSync below), waited
//   KILN_SYNC_DEBUG=error  the same text as a kiln::Error (ErrorKind::Runtime), thrown before
//                          the wait, so a wait nobody named fails a CI run
//   unset, off, 0          nothing (a check costs one relaxed atomic load); 1 is warn, 2 error
//
// The environment variable is read once, at the first check; set_sync_debug_mode() overrides
// it (tests). The checks run in Kiln's own CUDA layer, not in the runtime, so they report the
// same on the simulator and on a GPU: every waiting call of Kiln goes through a wrapper of
// engine/cuda/sync_calls.h, or through an API that calls one (cuda::synchronize(),
// cuda::Event::synchronize(), Tensor::item() / to_vector() / to() / copy_() / from_vector()
// when a copy blocks, the allocators' release_cached()). tests/engine/sync_calls_check_test.cpp
// fails when a raw synchronising CUDA call appears anywhere else.
//
// A wait the program needs is named, and then not reported:
//
//   { cuda::AllowSync allow("the loss, read once per log interval");
//     const double loss = l.item(); }
//
// The allowance holds for the calling thread until the end of the scope; allowances nest.
// Name the reason: it is the documentation of why the wait is there.
//
// Call sites. The APIs that may wait take a trailing `SyncSite site = SyncSite()` argument. Its
// default arguments, __builtin_FILE() and __builtin_LINE() (g++, clang and nvcc's front end
// support them; C++20 calls this std::source_location::current()), are evaluated where the
// caller calls the API, so the report names the caller's line without any macro. An API that
// forwards to another passes its `site` on, and the outermost name wins ("Tensor::item()", not
// the copy it makes). Paths inside Kiln's source tree are printed relative to it.
//
// Destructors and other paths that must not throw use stream_synchronize_nothrow (or
// check_sync_nothrow): in error mode they print the report (once per site, as warn does) and carry on with the wait, which is
// nearly always needed (the memory a destructor frees may still be read by the device). The
// same holds for a check made while an exception unwinds the stack.
//
// What is not reported: calls that return at once by the CUDA runtime's own rules ("API
// synchronization behavior" in the CUDA Runtime API docs): cudaMemcpyAsync from or to pinned
// memory, device-to-device copies, cudaStreamWaitEvent, cudaEventQuery, cudaStreamDestroy and
// cudaEventDestroy (both return at once and release the object once its work is done). Nor are
// cudaMalloc and cudaHostAlloc, which may stall a GPU but are found with the allocators'
// statistics (the number of cudaMalloc calls) instead.
//
// Every build has this header; in a build without a CUDA backend nothing ever waits.
#pragma once

#include <cstdint>

namespace kiln::cuda {

enum class SyncDebug { Off, Warn, Error };

// The mode: set_sync_debug_mode()'s, or else KILN_SYNC_DEBUG's (read once). A value of
// KILN_SYNC_DEBUG other than off/warn/error/0/1/2 (or empty) is a kiln::Error (Usage) here.
SyncDebug sync_debug_mode();
void set_sync_debug_mode(SyncDebug mode);
// "off", "warn" or "error" (the accepted spellings of KILN_SYNC_DEBUG are these and 0, 1, 2).
const char* sync_debug_name(SyncDebug mode);
SyncDebug parse_sync_debug(const char* text);  // throws kiln::Error (Usage) naming the choices

// Where a waiting call was made, and what it was. Copied by value (a few words).
struct SyncSite {
  const char* file;
  int line;
  const char* what = nullptr;  // the API the caller called: "Tensor::item()"
  const char* how = nullptr;   // how it waits: "cudaStreamSynchronize", "a blocking ... copy"
  bool checked = false;        // check_sync(*this) was called already: the wrapper skips it
  // Without arguments: the location of the expression that constructs it, which for a default
  // argument is the caller's call.
  explicit SyncSite(const char* file = __builtin_FILE(), int line = __builtin_LINE())
      : file(file), line(line) {}
  // The same site, named: `what`/`how` are set only where not set yet (the outermost API wins).
  SyncSite named(const char* api) const {
    SyncSite s = *this;
    if (s.what == nullptr) s.what = api;
    return s;
  }
  SyncSite waiting_by(const char* mechanism) const {
    SyncSite s = *this;
    if (s.how == nullptr) s.how = mechanism;
    return s;
  }
  // For an API that checks before it starts work it cannot leave half done (a blocking copy
  // checks before it queues the copy) and waits later through a wrapper.
  SyncSite after_check() const {
    SyncSite s = *this;
    s.checked = true;
    return s;
  }
};

// Names a needed wait: while one lives on this thread, checks on this thread report nothing.
// `why` must outlive the scope (a string literal).
class AllowSync {
 public:
  explicit AllowSync(const char* why) noexcept;
  ~AllowSync();
  AllowSync(const AllowSync&) = delete;
  AllowSync& operator=(const AllowSync&) = delete;

 private:
  const char* previous_;
};
bool sync_allowed();            // inside an AllowSync on this thread
const char* sync_allowance();   // the innermost one's reason, or null

// The check every waiting call makes before it waits. Off or allowed: nothing. Warn: the
// report line, once per call site. Error: throws kiln::Error (Runtime) with the report.
void check_sync(SyncSite site);
// The same, never throwing: in error mode the report is printed as in warn mode.
void check_sync_nothrow(SyncSite site) noexcept;

// What the checks saw while the mode was not off, for tests and the summary at exit.
struct SyncDebugCounts {
  int64_t checked = 0;   // waiting calls
  int64_t allowed = 0;   // of those, inside an AllowSync
  int64_t reported = 0;  // of those, reported (printed or thrown)
  int64_t sites = 0;     // distinct call sites reported
};
SyncDebugCounts sync_debug_counts();
// Zeroes the counts and forgets the reported sites (a site's next wait prints again).
void reset_sync_debug_counts();

}  // namespace kiln::cuda
