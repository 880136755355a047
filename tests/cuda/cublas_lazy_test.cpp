// cublas_lazy_test: cuBLAS is loaded on first use, not at start-up (engine/cuda/cublas_api.h).
// Real CUDA builds only (under the simulator nothing is ever loaded).
//   1. A process that works on the CPU alone, vendor kernels included, never maps libcublas:
//      loading it would cost ~150 MB of resident memory (libcublasLt's relocated data).
//   2. Asking for the table loads it (no GPU needed: dlopen and dlsym only) and every entry
//      point is resolved; a status name comes from the real library.
//   3. On a GPU (skipped without one), the first cuBLAS product loads it, and the product is
//      right.
// Run as one process (the binary), 1 comes before 2; ctest runs each test in its own.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

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
  KernelsGuard kernels(Impl::Vendor);
  Tensor a = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = Tensor::from_vector<float>({1, 0, 0, 1, 1, 1}, {3, 2});
  EXPECT_EQ(matmul(a, b).to_vector<float>(), (std::vector<float>{4, 5, 10, 11}));
  (void)cuda::is_available();  // what --device auto asks: the runtime, not cuBLAS
  EXPECT_FALSE(cuda::cublas_loaded());
  EXPECT_FALSE(mapped("libcublas")) << "libcublas is mapped although no GPU work ran";
}

TEST(CublasLazy, TheTableLoadsTheLibrary) {
  const cuda::CublasApi& api = cuda::cublas();
  EXPECT_TRUE(cuda::cublas_loaded());
  EXPECT_TRUE(mapped("libcublas"));
  for (const void* fn : {reinterpret_cast<const void*>(api.create),
                         reinterpret_cast<const void*>(api.destroy),
                         reinterpret_cast<const void*>(api.set_stream),
                         reinterpret_cast<const void*>(api.get_stream),
                         reinterpret_cast<const void*>(api.set_math_mode),
                         reinterpret_cast<const void*>(api.get_math_mode),
                         reinterpret_cast<const void*>(api.sgemm),
                         reinterpret_cast<const void*>(api.dgemm),
                         reinterpret_cast<const void*>(api.gemm_ex),
                         reinterpret_cast<const void*>(api.status_name),
                         reinterpret_cast<const void*>(api.status_string)}) {
    EXPECT_NE(fn, nullptr);
  }
  EXPECT_EQ(std::string(api.status_name(CUBLAS_STATUS_NOT_SUPPORTED)),
            "CUBLAS_STATUS_NOT_SUPPORTED");
}

TEST(CublasLazy, FirstGpuProductLoadsIt) {
  KILN_SKIP_WITHOUT_CUDA();
  KernelsGuard kernels(Impl::Vendor);
  Tensor a = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3}).to("cuda:0");
  Tensor b = Tensor::from_vector<float>({1, 0, 0, 1, 1, 1}, {3, 2}).to("cuda:0");
  const std::vector<float> c = matmul(a, b).to("cpu").to_vector<float>();
  EXPECT_EQ(c, (std::vector<float>{4, 5, 10, 11}));
  EXPECT_TRUE(cuda::cublas_loaded());
  EXPECT_TRUE(mapped("libcublas"));
}

}  // namespace
}  // namespace kiln
