// sim_runtime_test.cpp: the host API of the CUDA simulator (engine/cuda/sim/api.h): errors and
// the last-error state, devices and their properties, memory (round trips, the registry's
// error checks, the capacity limit), pinned memory, streams and events.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "engine/cuda/runtime.h"

namespace {

// The number of simulated devices this process sees (env KILN_SIM_DEVICES, default 2).
int expected_devices() {
  const char* env = std::getenv("KILN_SIM_DEVICES");
  return env ? std::atoi(env) : 2;
}

// Restores device 0 and a clean last-error state around every test.
class SimRuntime : public ::testing::Test {
 protected:
  void SetUp() override {
    if (expected_devices() < 2) GTEST_SKIP() << "these tests need KILN_SIM_DEVICES >= 2";
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    (void)cudaGetLastError();
  }
  void TearDown() override {
    (void)cudaSetDevice(0);
    (void)cudaGetLastError();
  }
};

TEST_F(SimRuntime, ErrorNamesAndStrings) {
  EXPECT_STREQ(cudaGetErrorName(cudaSuccess), "cudaSuccess");
  EXPECT_STREQ(cudaGetErrorName(cudaErrorMemoryAllocation), "cudaErrorMemoryAllocation");
  EXPECT_STREQ(cudaGetErrorString(cudaErrorMemoryAllocation), "out of memory");
  EXPECT_STREQ(cudaGetErrorName(cudaErrorInvalidDevice), "cudaErrorInvalidDevice");
  EXPECT_STREQ(cudaGetErrorString(cudaErrorInvalidConfiguration), "invalid configuration argument");
}

TEST_F(SimRuntime, LastErrorIsRecordedPeekedAndCleared) {
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  int x = 0;
  EXPECT_EQ(cudaFree(&x), cudaErrorInvalidValue);  // not device memory
  EXPECT_EQ(cudaPeekAtLastError(), cudaErrorInvalidValue);
  EXPECT_EQ(cudaPeekAtLastError(), cudaErrorInvalidValue);  // peek leaves it
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);     // get returns and clears
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  // A later success does not clear it (only cudaGetLastError does).
  EXPECT_EQ(cudaSetDevice(999), cudaErrorInvalidDevice);
  EXPECT_EQ(cudaSetDevice(0), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidDevice);
}

TEST_F(SimRuntime, DeviceCountSelectionAndProperties) {
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  EXPECT_EQ(count, expected_devices());
  int device = -1;
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  EXPECT_EQ(device, 1);
  EXPECT_EQ(cudaSetDevice(count), cudaErrorInvalidDevice);
  EXPECT_EQ(cudaSetDevice(-1), cudaErrorInvalidDevice);
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  EXPECT_EQ(device, 1);  // a failed cudaSetDevice changes nothing

  cudaDeviceProp prop;
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
  EXPECT_STREQ(prop.name, "Kiln CUDA simulator");
  EXPECT_EQ(prop.warpSize, 32);
  EXPECT_EQ(prop.maxThreadsPerBlock, 1024);
  EXPECT_EQ(prop.sharedMemPerBlock, 48u * 1024);
  EXPECT_EQ(prop.sharedMemPerBlockOptin, 227u * 1024);
  EXPECT_EQ(prop.major, 9);
  EXPECT_EQ(prop.minor, 0);
  EXPECT_GT(prop.multiProcessorCount, 0);
  EXPECT_GT(prop.totalGlobalMem, 0u);
  EXPECT_EQ(cudaGetDeviceProperties(&prop, count), cudaErrorInvalidDevice);

  int value = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&value, cudaDevAttrWarpSize, 1), cudaSuccess);
  EXPECT_EQ(value, 32);
  ASSERT_EQ(cudaDeviceGetAttribute(&value, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0), cudaSuccess);
  EXPECT_EQ(value, 227 * 1024);
  ASSERT_EQ(cudaDeviceGetAttribute(&value, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
  EXPECT_EQ(value, 9);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

TEST_F(SimRuntime, MemcpyRoundTripsInEveryDirection) {
  const size_t n = 1001;
  std::vector<float> host(n), back(n, -1.0f);
  for (size_t i = 0; i < n; ++i) host[i] = static_cast<float>(i) * 0.5f;
  float *a = nullptr, *b = nullptr;
  ASSERT_EQ(cudaMalloc(&a, n * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&b, n * sizeof(float)), cudaSuccess);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 64, 0u);  // 64-byte aligned
  ASSERT_EQ(cudaMemcpy(a, host.data(), n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(b, a, n * sizeof(float), cudaMemcpyDeviceToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(back.data(), b, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, host);
  // cudaMemcpyDefault infers the direction; async copies have finished when they return.
  std::vector<float> back2(n, 0.0f);
  ASSERT_EQ(cudaMemcpyAsync(back2.data(), b, n * sizeof(float), cudaMemcpyDefault, nullptr),
            cudaSuccess);
  EXPECT_EQ(back2, host);
  // memset of a sub-range.
  ASSERT_EQ(cudaMemset(a + 10, 0, 5 * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(back.data(), a, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(back[i], i >= 10 && i < 15 ? 0.0f : host[i]) << i;
  EXPECT_EQ(cudaFree(a), cudaSuccess);
  EXPECT_EQ(cudaFree(b), cudaSuccess);
}

TEST_F(SimRuntime, RegistryTurnsMemoryBugsIntoErrors) {
  char* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 256), cudaSuccess);
  char host[512] = {};
  EXPECT_EQ(cudaFree(p + 1), cudaErrorInvalidValue);  // not the start of an allocation
  EXPECT_EQ(cudaFree(host), cudaErrorInvalidValue);   // host memory
  EXPECT_EQ(cudaFreeHost(p), cudaErrorInvalidValue);  // device memory freed as pinned host
  // Copies whose device range leaves the allocation.
  EXPECT_EQ(cudaMemcpy(p, host, 257, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(host, p + 128, 129, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(host, host + 256, 256, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemset(p, 0, 300), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(host, p, 0, cudaMemcpyDeviceToHost), cudaSuccess);  // empty copy
  // memset needs memory of the current device.
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  EXPECT_EQ(cudaMemset(p, 0, 16), cudaErrorInvalidValue);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  EXPECT_EQ(cudaMemset(p, 0, 16), cudaSuccess);
  EXPECT_EQ(cudaFree(p), cudaSuccess);
  EXPECT_EQ(cudaFree(p), cudaErrorInvalidValue);  // double free
  EXPECT_EQ(cudaMemcpy(host, p, 16, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);  // freed
  EXPECT_EQ(cudaFree(nullptr), cudaSuccess);
  (void)cudaGetLastError();
}

// Device memory comes from the host heap here, so a host block could follow a device block
// directly (allocators without chunk headers, such as ThreadSanitizer's, do that). On a GPU a
// host pointer is never device memory; the simulator must agree for every interleaving.
TEST_F(SimRuntime, HostMemoryNextToDeviceMemoryIsNeverDeviceMemory) {
  std::vector<void*> device_blocks;
  std::vector<void*> host_blocks;
  for (size_t i = 1; i <= 256; ++i) {
    const size_t bytes = 64 * (i % 8 + 1);
    void* d = nullptr;
    ASSERT_EQ(cudaMalloc(&d, bytes), cudaSuccess);
    device_blocks.push_back(d);
    void* h = std::malloc(bytes);
    ASSERT_NE(h, nullptr);
    host_blocks.push_back(h);
    cudaPointerAttributes attributes{};
    ASSERT_EQ(cudaPointerGetAttributes(&attributes, h), cudaSuccess);
    EXPECT_EQ(attributes.type, cudaMemoryTypeUnregistered) << "host block " << i;
  }
  for (void* h : host_blocks) std::free(h);
  for (void* d : device_blocks) EXPECT_EQ(cudaFree(d), cudaSuccess);
}

TEST_F(SimRuntime, CapacityLimitGivesOutOfMemory) {
  size_t free0 = 0, total0 = 0;
  ASSERT_EQ(cudaMemGetInfo(&free0, &total0), cudaSuccess);
  kiln::sim::set_device_memory_capacity(1 << 20);  // 1 MiB per device
  void *a = nullptr, *b = nullptr, *c = nullptr;
  EXPECT_EQ(cudaMalloc(&a, 600 << 10), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&b, 600 << 10), cudaErrorMemoryAllocation);  // 1.2 MiB > 1 MiB
  EXPECT_EQ(b, nullptr);
  EXPECT_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
  size_t free_bytes = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
  EXPECT_EQ(total, size_t{1} << 20);
  EXPECT_EQ(free_bytes, (size_t{1} << 20) - (600 << 10));
  // Capacity is per device: device 1 still has its whole MiB.
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&c, 900 << 10), cudaSuccess);
  EXPECT_EQ(kiln::sim::device_memory_used(1), size_t{900} << 10);
  EXPECT_EQ(cudaFree(c), cudaSuccess);  // freeing works whatever the current device
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  EXPECT_EQ(cudaFree(a), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&b, 600 << 10), cudaSuccess);  // fits again after the free
  EXPECT_EQ(cudaFree(b), cudaSuccess);
  kiln::sim::set_device_memory_capacity(total0);
}

TEST_F(SimRuntime, PinnedHostMemory) {
  void* p = nullptr;
  ASSERT_EQ(cudaMallocHost(&p, 1000), cudaSuccess);
  std::memset(p, 7, 1000);  // ordinary host memory
  cudaPointerAttributes attr;
  ASSERT_EQ(cudaPointerGetAttributes(&attr, p), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeHost);
  EXPECT_EQ(cudaFree(p), cudaErrorInvalidValue);  // pinned memory is not device memory
  EXPECT_EQ(cudaFreeHost(p), cudaSuccess);
  EXPECT_EQ(cudaFreeHost(p), cudaErrorInvalidValue);
  ASSERT_EQ(cudaHostAlloc(&p, 64, cudaHostAllocPortable), cudaSuccess);
  EXPECT_EQ(cudaFreeHost(p), cudaSuccess);
  EXPECT_EQ(cudaHostAlloc(&p, 64, 0x8), cudaErrorInvalidValue);  // unsupported flag
  void* d = nullptr;
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d, 8), cudaSuccess);
  ASSERT_EQ(cudaPointerGetAttributes(&attr, d), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeDevice);
  EXPECT_EQ(attr.device, 1);
  EXPECT_EQ(cudaFree(d), cudaSuccess);
  (void)cudaGetLastError();
}

TEST_F(SimRuntime, PeerCopies) {
  int* a = nullptr;
  int* b = nullptr;
  ASSERT_EQ(cudaMalloc(&a, 4 * sizeof(int)), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&b, 4 * sizeof(int)), cudaSuccess);
  const int v[4] = {1, 2, 3, 4};
  int back[4] = {};
  ASSERT_EQ(cudaMemcpy(b, v, sizeof v, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpyPeer(a, 0, b, 1, sizeof v), cudaSuccess);
  EXPECT_EQ(cudaMemcpyPeer(a, 1, b, 1, sizeof v), cudaErrorInvalidValue);  // a is on device 0
  ASSERT_EQ(cudaMemcpy(back, a, sizeof v, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(std::vector<int>(back, back + 4), std::vector<int>(v, v + 4));
  int can = 0;
  ASSERT_EQ(cudaDeviceCanAccessPeer(&can, 0, 1), cudaSuccess);
  EXPECT_EQ(can, 1);
  EXPECT_EQ(cudaFree(a), cudaSuccess);
  EXPECT_EQ(cudaFree(b), cudaSuccess);
  (void)cudaGetLastError();
}

TEST_F(SimRuntime, StreamsAndEvents) {
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t start = nullptr, end = nullptr, untimed = nullptr;
  ASSERT_EQ(cudaEventCreate(&start), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&end), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&untimed, cudaEventDisableTiming), cudaSuccess);
  float ms = -1.0f;
  EXPECT_EQ(cudaEventElapsedTime(&ms, start, end), cudaErrorInvalidResourceHandle);  // unrecorded
  ASSERT_EQ(cudaEventRecord(start, s), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(end, s), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(untimed, nullptr), cudaSuccess);
  EXPECT_EQ(cudaEventSynchronize(end), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(end), cudaSuccess);  // work is done at submission
  EXPECT_EQ(cudaStreamQuery(s), cudaSuccess);
  ASSERT_EQ(cudaEventElapsedTime(&ms, start, end), cudaSuccess);
  EXPECT_GE(ms, 0.0f);
  EXPECT_EQ(cudaEventElapsedTime(&ms, start, untimed), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaStreamWaitEvent(s, untimed, 0), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);

  // An event of device 0 cannot be recorded on a stream of device 1.
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  cudaStream_t s1 = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s1), cudaSuccess);
  EXPECT_EQ(cudaEventRecord(start, s1), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaStreamWaitEvent(s1, start, 0), cudaSuccess);  // waiting across devices is fine
  EXPECT_EQ(cudaStreamDestroy(s1), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);

  EXPECT_EQ(cudaEventDestroy(start), cudaSuccess);
  EXPECT_EQ(cudaEventDestroy(start), cudaErrorInvalidResourceHandle);  // twice
  EXPECT_EQ(cudaEventDestroy(end), cudaSuccess);
  EXPECT_EQ(cudaEventDestroy(untimed), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(s), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaErrorInvalidResourceHandle);
  (void)cudaGetLastError();
}

// With KILN_SIM_DEVICES=0 the simulator behaves like a machine without a GPU (run by ctest as
// sim_runtime_test_no_device; skipped otherwise).
TEST(SimNoDevice, EveryDeviceCallFailsWithNoDevice) {
  if (expected_devices() != 0) GTEST_SKIP() << "needs KILN_SIM_DEVICES=0";
  int count = -1;
  EXPECT_EQ(cudaGetDeviceCount(&count), cudaErrorNoDevice);
  EXPECT_EQ(count, 0);
  EXPECT_EQ(cudaGetLastError(), cudaErrorNoDevice);
  EXPECT_EQ(cudaSetDevice(0), cudaErrorNoDevice);
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, 16), cudaErrorNoDevice);
  cudaStream_t s = nullptr;
  EXPECT_EQ(cudaStreamCreate(&s), cudaErrorNoDevice);
  (void)cudaGetLastError();
}

}  // namespace
