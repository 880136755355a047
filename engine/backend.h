// backend.h: the tags that name a kernel's backend. Every kernel has twins of one name and one
// signature in kiln::cpu and kiln::cuda whose first parameter is their namespace's Backend, so
// an op reaches either with one unqualified call (engine/dispatch.h, run_kernel).
#pragma once

namespace kiln {

namespace cpu {
struct Backend {};  // selects the CPU twin of a kernel
}  // namespace cpu

namespace cuda {
struct Backend {};  // selects the CUDA twin of a kernel
}  // namespace cuda

}  // namespace kiln
