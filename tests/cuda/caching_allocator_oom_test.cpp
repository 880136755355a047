// caching_allocator_oom_test.cpp: what happens when a device runs out of memory.
//
// Under the simulator, device memory is limited to 64 MiB (sim::set_device_memory_capacity, the
// switch behind env KILN_SIM_DEVICE_MEMORY; its own binary so the limit cannot surprise other
// tests), so the tests can fill it: a failed
// cudaMalloc first releases the cached blocks and retries (and succeeds when the cache was in
// the way); when it fails again, the error names the request, the device and the allocator's
// statistics, and says what to do. On a real GPU the request is simply larger than any GPU.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/cuda/caching_allocator.h"
#include "engine/cuda/context.h"
#include "engine/error.h"
#include "engine/tensor.h"
#include "support/cuda_skip.h"

namespace kiln {
namespace {

constexpr size_t kMiB = 1024 * 1024;

#if KILN_CUDA_SIM
constexpr size_t kTooBig = 100 * kMiB;
// Every device of the simulator holds 64 MiB, for every test of this binary.
class SmallDevices : public ::testing::Environment {
 public:
  void SetUp() override { sim::set_device_memory_capacity(64 * kMiB); }
};
const auto* const kSmallDevices = ::testing::AddGlobalTestEnvironment(new SmallDevices);
#else
constexpr size_t kTooBig = size_t{1} << 50;  // 1 PiB: more than any GPU has
#endif

std::string oom_message(size_t bytes) {
  try {
    void* p = cuda_allocator::allocate(bytes, 0);
    cuda_allocator::deallocate(p);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Runtime);  // exit code 1: not a usage error
    // The apps tell it apart from other runtime errors (apps/common/flag_checks.h).
    EXPECT_NE(dynamic_cast<const OutOfMemory*>(&e), nullptr) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "allocating " << bytes << " bytes did not fail";
  return "";
}

void expect_contains(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "missing \"" << part << "\" in: " << text;
}

TEST(CachingAllocatorOom, ErrorNamesRequestDeviceStatisticsAndWhatToDo) {
  KILN_SKIP_WITHOUT_CUDA();
  // Something cached, which the failed allocation releases before it gives up.
  cuda_allocator::deallocate(cuda_allocator::allocate(4 * kMiB, 0));
  const std::string msg = oom_message(kTooBig);
  expect_contains(msg, "CUDA out of memory on cuda:0: tried to allocate ");
  expect_contains(msg, "(" + std::to_string(kTooBig) + " bytes");
  expect_contains(msg, "even after releasing 4.00 MiB of cached blocks");
  expect_contains(msg, "in use by tensors (peak ");
  expect_contains(msg, "reserved from the driver in ");
  expect_contains(msg, "cudaMalloc calls");
  expect_contains(msg, "smaller batch size");
  const MemoryStats s = cuda_allocator::stats(0);
  EXPECT_EQ(s.reserved_bytes, s.current_bytes);  // the cache was released
  // The allocator still works afterwards.
  void* p = cuda_allocator::allocate(kMiB, 0);
  EXPECT_NE(p, nullptr);
  cuda_allocator::deallocate(p);
}

TEST(CachingAllocatorOom, TensorFactoriesReportTheSameError) {
  KILN_SKIP_WITHOUT_CUDA();
  try {
    Tensor::empty({static_cast<int64_t>(kTooBig)}, DType::U8, Device(DeviceType::CUDA, 0));
    ADD_FAILURE() << "a tensor larger than the device was allocated";
  } catch (const Error& e) {
    expect_contains(e.what(), "CUDA out of memory on cuda:0");
  }
}

#if KILN_CUDA_SIM
TEST(CachingAllocatorOom, FailedMallocReleasesTheCacheAndRetries) {
  cuda_allocator::release_cached(0);
  const int64_t in_use = cuda_allocator::stats(0).current_bytes;
  ASSERT_LT(in_use, static_cast<int64_t>(4 * kMiB));
  // 40 MiB cached + 48 MiB requested > 64 MiB: cudaMalloc fails, the cache goes, the retry works.
  cuda_allocator::deallocate(cuda_allocator::allocate(40 * kMiB, 0));
  EXPECT_EQ(cuda_allocator::stats(0).reserved_bytes - in_use, static_cast<int64_t>(40 * kMiB));
  void* held = cuda_allocator::allocate(48 * kMiB, 0);
  MemoryStats s = cuda_allocator::stats(0);
  EXPECT_EQ(s.reserved_bytes - in_use, static_cast<int64_t>(48 * kMiB));  // the 40 MiB went back
  // With 48 MiB in use, 40 MiB more cannot fit, cache or not.
  const std::string msg = oom_message(40 * kMiB);
  expect_contains(msg, "tried to allocate 40.00 MiB (41943040 bytes, rounded to 41943040)");
  expect_contains(msg, "48.");  // the bytes in use, in MiB
  EXPECT_EQ(msg.find("even after releasing"), std::string::npos) << msg;  // nothing was cached
  cuda_allocator::deallocate(held);
  // Now the cached 48 MiB block is in the way: it is released and the retry fits.
  void* fits = cuda_allocator::allocate(40 * kMiB, 0);
  cuda_allocator::deallocate(fits);
}
#endif

}  // namespace
}  // namespace kiln
