// backend.h: the tags that name a kernel's backend. Every kernel has twins of one name and one
// signature in kiln::cpu and kiln::cuda whose first parameter is their namespace's Backend, so
// an op reaches either with one unqualified call (engine/dispatch.h, run_kernel).
#pragma once

#include <type_traits>

namespace kiln {

namespace cpu {
struct Backend {};  // selects the CPU twin of a kernel
}  // namespace cpu

namespace cuda {
struct Backend {};  // selects the CUDA twin of a kernel
}  // namespace cuda

// Whether Backend is the CPU's tag: for the few kernels with no twin (the CPU's channel-blocked
// layouts), called under `if constexpr (is_cpu_v<decltype(backend)>)`.
template <typename Backend>
inline constexpr bool is_cpu_v = std::is_same_v<Backend, cpu::Backend>;

}  // namespace kiln
