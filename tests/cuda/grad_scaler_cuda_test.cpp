// grad_scaler_cuda_test.cpp: loss scaling's fused unscale-and-check on CUDA
// (engine/cuda/kernels/optim.cu) against the CPU loop (engine/ops_cpu.cpp), and GradScaler over
// gradients on several devices at once.
//
//   - the kernel gives the CPU's bits (a division on both) and the same flag, for f32 and f64,
//     on sizes 1, 31, 257, 70001 and one past the grid's 8192 x 256 threads (the grid-stride
//     loop), with inf / -inf / NaN at the first, the last, and a lane other than 0 of a warp in
//     the middle (the warp vote must carry it to lane 0), and with none;
//   - the flag is only ever set: a set flag stays set over finite data (one flag collects many
//     gradients), a clear one stays clear;
//   - GradScaler::unscale_ with gradients on cpu, cuda:0 and cuda:1 at once: one flag per device,
//     the same gradients and the same answer as with every gradient on the CPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "engine/cuda/context.h"
#include "engine/ops_cpu.h"
#include "engine/ops_cuda.h"
#include "engine/optim/grad_scaler.h"
#include "engine/sanitizer.h"
#include "parity/parity_harness.h"
#include "support/cuda_skip.h"

namespace kiln {
namespace {

using testing::kCpu;
using testing::kCuda;

template <typename T>
std::vector<T> values(int64_t n, uint32_t seed) {
  std::vector<T> v(static_cast<size_t>(n));
  uint32_t x = seed;
  for (auto& e : v) {
    x = x * 1664525u + 1013904223u;
    e = static_cast<T>(std::ldexp(static_cast<double>(x >> 8) - 8388608.0, static_cast<int>(x % 40) - 20));
  }
  return v;
}

template <typename T>
bool same_bits(T a, T b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

// Runs the CPU loop and the CUDA kernel on the same data; expects the same values and flag.
template <typename T>
void check_parity(const std::vector<T>& data, T scale, int32_t flag_before, const std::string& what) {
  SCOPED_TRACE(what);
  const int64_t n = static_cast<int64_t>(data.size());
  std::vector<T> on_cpu = data;
  int32_t cpu_flag = flag_before;
  const float scale_f32 = static_cast<float>(scale);  // the kernels read the scale as an f32
  unscale_and_check(cpu::Backend{}, on_cpu.data(), n, &scale_f32, &cpu_flag);

  Tensor g = Tensor::from_vector(data, {n}, kCuda);
  Tensor flag = Tensor::full({1}, flag_before, DType::I32, kCuda);
  const Tensor device_scale = Tensor::full({1}, scale, DType::F32, kCuda);
  {
    cuda::DeviceGuard guard(0);
    unscale_and_check(cuda::Backend{}, g.data<T>(), n, device_scale.data<float>(),
                      flag.data<int32_t>());
  }
  EXPECT_EQ(flag.item(), cpu_flag);
  const std::vector<T> on_cuda = g.to_vector<T>();
  for (int64_t i = 0; i < n; ++i)
    ASSERT_TRUE(same_bits(on_cuda[i], on_cpu[i]))
        << "element " << i << ": " << on_cuda[i] << " on CUDA, " << on_cpu[i] << " on the CPU";
}

template <typename T>
void kernel_matches_cpu() {
  constexpr T kInf = std::numeric_limits<T>::infinity();
  constexpr T kNaN = std::numeric_limits<T>::quiet_NaN();
  const int64_t past_grid = int64_t{8192} * 256 + 37;
  std::vector<int64_t> sizes = {1, 31, 257, 70001, past_grid};
  // Under ThreadSanitizer each simulated GPU thread is a fiber TSan follows, and the size past
  // the grid (two million threads' work) takes 40 s; a second trip of the grid-stride loop is
  // the same thread touching other elements, so it adds no race that 70001 lacks. The other
  // trees run it.
  if (KILN_TSAN_ENABLED) sizes.pop_back();
  for (int64_t n : sizes) {
    for (T scale : {T(65536), T(3)}) {
      const std::vector<T> clean = values<T>(n, static_cast<uint32_t>(n));
      const std::string at = "n " + std::to_string(n) + " scale " + std::to_string(scale);
      check_parity<T>(clean, scale, 0, at + ", all finite");
      std::vector<T> bad = clean;
      bad[0] = kInf;
      check_parity<T>(bad, scale, 0, at + ", +inf first");
      bad = clean;
      bad.back() = -kInf;
      check_parity<T>(bad, scale, 0, at + ", -inf last");
      if (n >= 257) {
        bad = clean;
        bad[static_cast<size_t>(n / 2 / 32 * 32 + 5)] = kNaN;  // lane 5 of a middle warp
        check_parity<T>(bad, scale, 0, at + ", NaN in lane 5");
      }
      if (n == past_grid) {
        bad = clean;
        bad[static_cast<size_t>(n - 10)] = kNaN;  // only a second trip of the grid-stride loop sees it
        check_parity<T>(bad, scale, 0, at + ", NaN past the grid");
      }
    }
  }
}

TEST(GradScalerCuda, KernelMatchesCpuF32) {
  KILN_SKIP_WITHOUT_CUDA();
  kernel_matches_cpu<float>();
}

TEST(GradScalerCuda, KernelMatchesCpuF64) {
  KILN_SKIP_WITHOUT_CUDA();
  kernel_matches_cpu<double>();
}

TEST(GradScalerCuda, TheFlagIsOnlyEverSet) {
  KILN_SKIP_WITHOUT_CUDA();
  const std::vector<float> clean = values<float>(1000, 7);
  check_parity<float>(clean, 2.0f, 1, "set flag, finite data");  // stays 1
  check_parity<float>({}, 2.0f, 1, "set flag, no data");
  check_parity<float>(clean, 2.0f, 0, "clear flag, finite data");  // stays 0
}

TEST(GradScalerCuda, UnscaleOverSeveralDevicesMatchesTheCpu) {
  KILN_SKIP_WITHOUT_CUDA_DEVICES(2);
  const Device devices[] = {kCpu, kCuda, Device(DeviceType::CUDA, 1), kCuda};
  const int64_t sizes[] = {5, 70001, 33, 300};
  for (int bad_param : {-1, 0, 1, 2, 3}) {
    SCOPED_TRACE("non-finite gradient in parameter " + std::to_string(bad_param));
    std::vector<Tensor> mixed, host;
    for (int k = 0; k < 4; ++k) {
      std::vector<float> g = values<float>(sizes[k], 100 + k);
      if (k == bad_param) g[static_cast<size_t>(sizes[k] / 2)] = k % 2 ? -INFINITY : NAN;
      const Tensor grad = Tensor::from_vector(g, {sizes[k]});
      mixed.push_back(Tensor::zeros({sizes[k]}, DType::F32, devices[k]).set_requires_grad(true));
      mixed.back().set_grad(grad.to(devices[k]));
      host.push_back(Tensor::zeros({sizes[k]}).set_requires_grad(true));
      host.back().set_grad(grad);
    }
    GradScaler a, b;
    const bool found = a.unscale_(mixed);
    EXPECT_EQ(found, bad_param >= 0);
    EXPECT_EQ(b.unscale_(host), found);
    for (int k = 0; k < 4; ++k)
      EXPECT_TRUE(testing::same_values("parameter " + std::to_string(k), mixed[k].grad().to(kCpu),
                                       host[k].grad()));
  }
}

}  // namespace
}  // namespace kiln
