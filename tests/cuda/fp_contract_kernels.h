// fp_contract_kernels.h: kernels that show how a build compiles a * b + c in device code, for
// tests/cuda/fp_contract_cuda_test.cpp. Their definitions (fp_contract_kernels.cu) are compiled
// as every Kiln .cu file is (kiln_add_cuda_sources, cmake/KilnCuda.cmake): by nvcc, or under
// the simulator by the host compiler with the simulator's floating-point options.
#pragma once

#include <cstdint>

namespace kiln::testing {

// What the kernels compute, on device arrays of n elements (one launch of one block each;
// T is float or double; out has the number of elements each one names).
enum class MaddForm {
  Plain,      // out[i] = a[i] * b[i] + c[i], as written: nvcc contracts it (--fmad=true)
  MulRn,      // out[i] = cuda::mul_rn(a[i], b[i]) + c[i] (__fmul_rn / __dmul_rn): never
              // contracted (CUDA Math API)
  AddRn,      // out[i] = __fadd_rn(a[i] * b[i], c[i]) (__dadd_rn): never contracted
  FmaRn,      // out[i] = cuda::fma_t(a[i], b[i], c[i]) (__fmaf_rn / __fma_rn): always fused
  LoopSum,    // out[0] = c[0] + sum_i a[i] * (b[i] - c[1]), accumulated in a loop the way a
              // reduction kernel does (and out[1] = sum_i a[i] beside it): nvcc contracts the
              // loop-carried multiply-add too
};
template <typename T>
void fp_madd_cuda(MaddForm form, const T* a, const T* b, const T* c, T* out, int64_t n);

// Whether this build's kernels may contract at all: nvcc always may; the simulator's host
// compiler only where the target CPU has fused multiply-add instructions and optimisation is
// on (GCC and clang form FMAs in optimisation passes, so never at -O0).
bool fp_kernels_can_contract();

}  // namespace kiln::testing
