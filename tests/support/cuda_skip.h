// cuda_skip.h: CUDA tests skip, saying why, where no CUDA device exists (a real CUDA build on a
// machine without a GPU). Under the simulator the devices always exist (KILN_SIM_DEVICES,
// default 2), so nothing skips there.
//
//   TEST(AddCuda, Parity) { KILN_SKIP_WITHOUT_CUDA(); ... }
//   TEST(CopyCuda, PeerCopy) { KILN_SKIP_WITHOUT_CUDA_DEVICES(2); ... }   // cuda:0 and cuda:1
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "engine/cuda/context.h"

#define KILN_SKIP_WITHOUT_CUDA()                                        \
  do {                                                                  \
    if (!::kiln::cuda::is_available())                                  \
      GTEST_SKIP() << "skipped: " << ::kiln::cuda::unavailable_reason(); \
  } while (0)

#define KILN_SKIP_WITHOUT_CUDA_DEVICES(n)                                                   \
  do {                                                                                      \
    KILN_SKIP_WITHOUT_CUDA();                                                               \
    if (::kiln::cuda::device_count() < (n))                                                 \
      GTEST_SKIP() << "skipped: needs " << (n) << " CUDA devices, this machine has "        \
                   << ::kiln::cuda::device_count();                                         \
  } while (0)
