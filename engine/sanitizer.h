// sanitizer.h: AddressSanitizer's manual poisoning, as no-ops in builds without ASan.
//
// KILN_ASAN_POISON(p, n) marks n bytes at p as unaddressable: any access is reported at once.
// Used where memory that a real GPU would not let a kernel touch is ordinary host memory under
// the CUDA simulator (the slack of rounded allocator blocks, guard zones around shared memory).
#pragma once

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define KILN_ASAN_POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define KILN_ASAN_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define KILN_ASAN_POISON(p, n) ((void)(p), (void)(n))
#define KILN_ASAN_UNPOISON(p, n) ((void)(p), (void)(n))
#endif
