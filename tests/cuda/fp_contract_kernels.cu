// fp_contract_kernels.cu: the kernels of fp_contract_kernels.h.
#include "engine/cuda/runtime.h"

#include <cstdint>

#include "cuda/fp_contract_kernels.h"
#include "engine/cuda/context.h"
#include "engine/cuda/kernels/common.h"
#include "engine/cuda/launch.h"

namespace kiln::testing {

namespace {

using cuda::fma_t;   // __fmaf_rn / __fma_rn, as Kiln's kernels spell a fused multiply-add
using cuda::mul_rn;  // __fmul_rn / __dmul_rn, as they spell a product rounded before the add
__device__ __forceinline__ float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double add_rn(double a, double b) { return __dadd_rn(a, b); }

// One thread per element (the forms but LoopSum), grid-stride.
template <typename T>
__global__ void madd_kernel(MaddForm form, const T* __restrict__ a, const T* __restrict__ b,
                            const T* __restrict__ c, T* __restrict__ out, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    if (form == MaddForm::Plain) out[i] = a[i] * b[i] + c[i];
    else if (form == MaddForm::MulRn) out[i] = mul_rn(a[i], b[i]) + c[i];
    else if (form == MaddForm::AddRn) out[i] = add_rn(a[i] * b[i], c[i]);
    else out[i] = fma_t(a[i], b[i], c[i]);
  }
}

// The shape of a per-channel reduction (layers/batchnorm2d_cuda.cu's backward sums): a tight
// loop with two accumulators, one of them fed by a product. GCC's tuning for AMD Zen declines
// to contract such loop-carried chains unless told otherwise (--param=avoid-fma-max-bits=0).
template <typename T>
__global__ void loop_sum_kernel(const T* __restrict__ a, const T* __restrict__ b,
                                const T* __restrict__ c, T* __restrict__ out, int64_t n) {
  T sum = 0, sum_prod = c[0];
  const T shift = c[1];
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    sum += a[i];
    sum_prod += a[i] * (b[i] - shift);
  }
  out[0] = sum_prod;
  out[1] = sum;
}

}  // namespace

template <typename T>
void fp_madd_cuda(MaddForm form, const T* a, const T* b, const T* c, T* out, int64_t n) {
  if (form == MaddForm::LoopSum) {
    cuda::launch(loop_sum_kernel<T>, cuda::LaunchConfig{dim3(1), dim3(1), 0, cuda::current_stream()},
                 a, b, c, out, n);
  } else {
    cuda::launch(madd_kernel<T>,
                 cuda::LaunchConfig{dim3(cuda::blocks_for(n, 64)), dim3(64), 0, cuda::current_stream()},
                 form, a, b, c, out, n);
  }
}
template void fp_madd_cuda<float>(MaddForm, const float*, const float*, const float*, float*,
                                  int64_t);
template void fp_madd_cuda<double>(MaddForm, const double*, const double*, const double*,
                                   double*, int64_t);

bool fp_kernels_can_contract() {
#if !KILN_CUDA_SIM
  return true;
#elif (defined(__FP_FAST_FMA) || defined(__FMA__)) && defined(__OPTIMIZE__)
  return true;
#else
  return false;
#endif
}

}  // namespace kiln::testing
