// impl.h: which implementation the heavy ops (conv, matmul) use.
//
//   Impl::Hand   our own readable kernels (im2col + GEMM on CPU; tiled kernels on CUDA)
//   Impl::Vendor the vendor library (oneDNN on CPU; cuBLAS/cuDNN on CUDA)
// Chosen at run time: set_kernel_impl(), or env KILN_KERNELS=hand|vendor. Default: vendor.
#pragma once

namespace kiln {

enum class Impl { Hand, Vendor };

Impl kernel_impl();            // the current choice (reads KILN_KERNELS once)
void set_kernel_impl(Impl impl);
const char* impl_name(Impl impl);  // "hand" | "vendor"
Impl parse_impl(const char* name); // throws kiln::Error (Usage) on anything else

}  // namespace kiln
