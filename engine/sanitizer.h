// sanitizer.h: the sanitizers' manual annotations, as no-ops in builds without them.
//
// AddressSanitizer. KILN_ASAN_POISON(p, n) marks n bytes at p as unaddressable: any access is
// reported at once. Used where memory that a real GPU would not let a kernel touch is ordinary
// host memory under the CUDA simulator (the slack of rounded allocator blocks, guard zones
// around shared memory).
//
// ThreadSanitizer (KILN_TSAN). The CUDA simulator runs the threads of a block as fibers of one
// OS thread and tells TSan about each one (its fiber API, sanitizer/tsan_interface.h), with
// switches that order nothing; the synchronisation CUDA defines (__syncthreads, warp
// operations, kernel boundaries) is then modelled explicitly:
//   KILN_TSAN_RELEASE(p)  everything the calling fiber did so far happens before ...
//   KILN_TSAN_ACQUIRE(p)  ... whatever the caller does next, once it acquires the same address;
//   KILN_TSAN_IGNORE_WRITES_BEGIN/END()  writes in between are invisible to TSan (the
//                                        simulator's own fill of shared memory).
// See https://clang.llvm.org/docs/ThreadSanitizer.html and the fiber API's comments in
// compiler-rt's tsan_interface.h.
#pragma once

#if defined(__SANITIZE_ADDRESS__)
#define KILN_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KILN_ASAN 1
#endif
#endif

#if defined(__SANITIZE_THREAD__) || defined(KILN_SANITIZE_THREAD)  // the latter: see CMakeLists.txt
#define KILN_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KILN_TSAN 1
#endif
#endif

// For `if` in ordinary code (a test that scales its work down, or leaves out a figure that
// means nothing under a sanitizer).
#if KILN_TSAN
#define KILN_TSAN_ENABLED true
#else
#define KILN_TSAN_ENABLED false
#endif
#if KILN_ASAN
#define KILN_ASAN_ENABLED true
#else
#define KILN_ASAN_ENABLED false
#endif

#if KILN_ASAN
#include <sanitizer/asan_interface.h>
#define KILN_ASAN_POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define KILN_ASAN_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define KILN_ASAN_POISON(p, n) ((void)(p), (void)(n))
#define KILN_ASAN_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

#if KILN_TSAN
#include <sanitizer/tsan_interface.h>
// The dynamic-annotation entry points of the TSan runtime (tsan_interface_ann.cpp).
extern "C" void AnnotateIgnoreWritesBegin(const char* file, int line);
extern "C" void AnnotateIgnoreWritesEnd(const char* file, int line);
#define KILN_TSAN_RELEASE(p) __tsan_release(const_cast<void*>(static_cast<const void*>(p)))
#define KILN_TSAN_ACQUIRE(p) __tsan_acquire(const_cast<void*>(static_cast<const void*>(p)))
#define KILN_TSAN_IGNORE_WRITES_BEGIN() AnnotateIgnoreWritesBegin(__FILE__, __LINE__)
#define KILN_TSAN_IGNORE_WRITES_END() AnnotateIgnoreWritesEnd(__FILE__, __LINE__)
#else
#define KILN_TSAN_RELEASE(p) ((void)(p))
#define KILN_TSAN_ACQUIRE(p) ((void)(p))
#define KILN_TSAN_IGNORE_WRITES_BEGIN() ((void)0)
#define KILN_TSAN_IGNORE_WRITES_END() ((void)0)
#endif
