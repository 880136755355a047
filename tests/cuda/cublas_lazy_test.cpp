// cublas_lazy_test: cuBLAS is loaded on first use, not at start-up (engine/cuda/cublas_api.h).
// Real CUDA builds only (under the simulator nothing is ever loaded).
//   1. A process that works on the CPU alone, vendor kernels included, never maps libcublas:
//      loading it would cost ~150 MB of resident memory (libcublasLt's relocated data).
//   2. On a GPU (skipped without one), the first cuBLAS product loads it, and the product is
//      right.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "engine/cuda/cublas_api.h"
#include "engine/impl.h"
#include "engine/ops.h"
#include "engine/tensor.h"
#include "support/cuda_skip.h"

namespace kiln {
namespace {

// Whether a shared object whose path contains `name` is mapped into this process.
bool mapped(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    if (line.find(name) != std::string::npos) return true;
  }
  return false;
}

TEST(CublasLazy, CpuWorkNeverLoadsCublas) {
  set_kernel_impl(Impl::Vendor);
  Tensor a = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = Tensor::from_vector<float>({1, 0, 0, 1, 1, 1}, {3, 2});
  EXPECT_EQ(matmul(a, b).to_vector<float>(), (std::vector<float>{4, 5, 10, 11}));
  (void)cuda::is_available();  // what --device auto asks: the runtime, not cuBLAS
  reset_kernel_impl();
  EXPECT_FALSE(cuda::cublas_loaded());
  EXPECT_FALSE(mapped("libcublas")) << "libcublas is mapped although no GPU work ran";
}

TEST(CublasLazy, FirstGpuProductLoadsIt) {
  KILN_SKIP_WITHOUT_CUDA();
  set_kernel_impl(Impl::Vendor);
  Tensor a = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3}).to("cuda:0");
  Tensor b = Tensor::from_vector<float>({1, 0, 0, 1, 1, 1}, {3, 2}).to("cuda:0");
  const std::vector<float> c = matmul(a, b).to("cpu").to_vector<float>();
  reset_kernel_impl();
  EXPECT_EQ(c, (std::vector<float>{4, 5, 10, 11}));
  EXPECT_TRUE(cuda::cublas_loaded());
  EXPECT_TRUE(mapped("libcublas"));
}

}  // namespace
}  // namespace kiln
