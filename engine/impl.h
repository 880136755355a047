// impl.h: which implementation the heavy ops (conv, matmul) use.
//
//   Impl::Hand   our own readable kernels (im2col + GEMM on CPU; tiled kernels on CUDA)
//   Impl::Vendor the vendor library (oneDNN on CPU; cuBLAS/cuDNN on CUDA)
// Chosen at run time: set_kernel_impl(), or env KILN_KERNELS=hand|vendor. Default: vendor.
//
// CUDA ops ask cuda_kernel_impl() instead: the same choice, except under the CUDA simulator
// (KILN_CUDA_SIM), where the default is Hand: the simulator is there to run our kernels, and its
// cuBLAS/cuDNN are host-computed stand-ins (engine/cuda/sim/cublas.h, cudnn.h). Asking for
// Vendor explicitly (env or set_kernel_impl) runs those stand-ins.
#pragma once

namespace kiln {

enum class Impl { Hand, Vendor };

Impl kernel_impl();            // the current choice (reads KILN_KERNELS once)
void set_kernel_impl(Impl impl);
// Forgets set_kernel_impl(): back to KILN_KERNELS, or the default. Tests restore with this
// rather than set_kernel_impl(saved), which would turn a default into an explicit choice
// (under the simulator, a default Vendor on the CPU would become Vendor on CUDA too).
void reset_kernel_impl();
const char* impl_name(Impl impl);  // "hand" | "vendor"
Impl parse_impl(const char* name); // throws kiln::Error (Usage) on anything else

// The choice for ops on CUDA tensors: kernel_impl(), but Hand by default under the simulator.
Impl cuda_kernel_impl();

}  // namespace kiln
