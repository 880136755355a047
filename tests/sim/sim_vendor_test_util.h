// sim_vendor_test_util.h: what the tests of the simulated cuBLAS and cuDNN share: device buffers
// filled with NaN (like fresh GPU memory in the simulator), host round trips, a stream whose
// next work is delayed (to see that library work queues behind it), relative comparison.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine/cuda/runtime.h"
#include "engine/cuda/sim/internal.h"

namespace kiln::sim_test {

// A cudaMalloc'd buffer of `count` T on the current device, every byte 0xFF (NaN).
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t count) : count_(count) {
    EXPECT_EQ(cudaMalloc(&ptr_, count * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemset(ptr_, 0xFF, count * sizeof(T)), cudaSuccess);
  }
  DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  ~DeviceBuffer() { (void)cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return ptr_; }
  void upload(const std::vector<T>& host) {
    EXPECT_EQ(cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  std::vector<T> download() const {
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<T> host(count_);
    EXPECT_EQ(cudaMemcpy(host.data(), ptr_, count_ * sizeof(T), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return host;
  }

 private:
  T* ptr_ = nullptr;
  size_t count_;
};

template <typename T>
std::vector<T> random_values(size_t count, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  std::vector<T> v(count);
  for (T& x : v) x = static_cast<T>(dist(gen));
  return v;
}

// |got - want| <= rtol * (|want| + max |want|) everywhere, NaN included as a failure.
template <typename T>
::testing::AssertionResult near_all(const std::string& what, const std::vector<T>& got,
                                    const std::vector<double>& want, double rtol) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << what << ": size " << got.size() << " vs " << want.size();
  double scale = 0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  for (size_t i = 0; i < want.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(err <= rtol * (std::fabs(want[i]) + scale)))
      return ::testing::AssertionFailure() << what << ": element " << i << " is " << got[i]
                                           << ", expected " << want[i];
  }
  return ::testing::AssertionSuccess();
}

// Queues on `stream` a host step that sleeps `ms`, then runs `write`: library work queued on
// the same stream afterwards must see what `write` did (with asynchronous streams, work on
// another stream would overtake it).
inline void delayed_write(cudaStream_t stream, int ms, std::function<void()> write) {
  ASSERT_EQ(kiln::sim::enqueue(stream, "test delayed write", [ms, write] {
              std::this_thread::sleep_for(std::chrono::milliseconds(ms));
              write();
            }),
            cudaSuccess);
}

}  // namespace kiln::sim_test
