// impl.h: which implementation the heavy ops (convolution, matrix product) run, decided here and
// nowhere else.
//
//   Impl::Hand   our own readable kernels (im2col + GEMM on the CPU; implicit GEMM, tiled and
//                tensor-core GEMMs on CUDA)
//   Impl::Vendor the vendor libraries (oneDNN on the CPU; cuBLAS and cuDNN on CUDA, or the
//                simulator's host-computed stand-ins, engine/cuda/sim/cublas.h and cudnn.h)
//
// The setting is per thread, like autocast (engine/autocast.h):
//
//   {
//     KernelsGuard kernels(Impl::Hand);   // this thread, for the guard's lifetime
//     y = conv2d(x, w, b);                // the hand kernels
//   }
//
// Outside any guard a thread uses the process default: set_default_impl() (the apps' --kernels
// flag), else env KILN_KERNELS=hand|vendor, else Vendor. The default is the same in every build,
// the CUDA simulator's included, so a test runs the same code on the simulator and on a GPU; the
// simulator's test preset sets KILN_KERNELS=hand (CMakePresets.json) because the simulator is
// there to run our kernels. A new thread starts at the process default, not at its creator's
// guard; models/pipeline/pipeline.cpp hands its stage threads the setting of the thread that
// built the pipeline.
//
// The setting is a wish; conv_impl() and gemm_impl() below apply it together with what exists
// (oneDNN has no f64 convolution, ...), and the ops call the kernel twin they name: `name` for
// Hand, `name_vendor` for Vendor (engine/dispatch.h; layers/conv2d.h, engine/ops_matmul.cpp).
// Kernel files never decide.
#pragma once

#include "engine/device.h"
#include "engine/dtype.h"

namespace kiln {

enum class Impl { Hand, Vendor };

const char* impl_name(Impl impl);   // "hand" | "vendor"
Impl parse_impl(const char* name);  // throws kiln::Error (Usage) on anything else

// The process default: set_default_impl(), else KILN_KERNELS (read once), else Vendor.
Impl default_impl();
// Sets the process default (the apps' --kernels flag, before they start threads). A thread's
// KernelsGuard overrides it.
void set_default_impl(Impl impl);

// This thread's setting: its innermost KernelsGuard, else default_impl().
Impl current_impl();

// Sets this thread's setting until the guard is destroyed; guards nest and restore the previous
// setting.
class KernelsGuard {
 public:
  explicit KernelsGuard(Impl impl);
  ~KernelsGuard();
  KernelsGuard(const KernelsGuard&) = delete;
  KernelsGuard& operator=(const KernelsGuard&) = delete;

 private:
  int prev_;  // the previous guard's Impl, or -1: none (the process default)
};

// The implementation a convolution on `device` with `dtype` operands runs (f32 or f64; bf16 or
// f16 under autocast): current_impl(), except where the vendor has no such kernel (impl.cpp).
Impl conv_impl(Device device, DType dtype);

// The implementation a matrix product on `device` with `dtype` operands runs, the same way.
Impl gemm_impl(Device device, DType dtype);

}  // namespace kiln
