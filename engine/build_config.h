// build_config.h: which CUDA backend this build of Kiln has, as constants that C++ code can test.
//
// Code that differs between builds tests these with `if constexpr` instead of `#if`, so both
// branches stay visible and are compiled (engine/dispatch.h, on_device).
#pragma once

namespace kiln {

// True when a CUDA backend is built in: the real one (nvcc) or the simulator.
#if KILN_WITH_CUDA
inline constexpr bool kWithCuda = true;
#else
inline constexpr bool kWithCuda = false;
#endif

namespace cuda {

// True when the CUDA backend is the simulator (docs/cuda_simulator.md): CUDA code runs on the
// CPU, so its results are real but its timings are no GPU's.
#if KILN_CUDA_SIM
inline constexpr bool kSimulated = true;
#else
inline constexpr bool kSimulated = false;
#endif

}  // namespace cuda

}  // namespace kiln
