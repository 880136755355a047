// sim_streams_test.cpp: the simulator's streams are asynchronous, as a GPU's are
// (engine/cuda/sim/streams.cpp). A "gate" kernel that spins until the host opens it keeps a
// stream busy for exactly as long as a test needs, so every ordering below is checked without
// timing assumptions: what CUDA orders after the gate waits for it, everything else does not.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "engine/cuda/launch.h"
#include "engine/cuda/runtime.h"

namespace {

using kiln::cuda::launch;
using kiln::cuda::LaunchConfig;

// Spins until *open != 0 (pinned host memory, which kernels may read), then writes `value`.
__global__ void gate_kernel(const int* open, float* out, float value) {
  while (__atomic_load_n(open, __ATOMIC_ACQUIRE) == 0) {
  }
  out[threadIdx.x] = value;
}
// out[i] = in[i] + 1
__global__ void add_one_kernel(const float* in, float* out, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) out[i] = in[i] + 1.0f;
}

class Gate {
 public:
  Gate() { EXPECT_EQ(cudaMallocHost(&flag_, sizeof(int)), cudaSuccess); *flag_ = 0; }
  ~Gate() {
    open();
    (void)cudaDeviceSynchronize();
    (void)cudaFreeHost(flag_);
  }
  void open() { __atomic_store_n(flag_, 1, __ATOMIC_RELEASE); }
  const int* flag() const { return flag_; }

 private:
  int* flag_ = nullptr;
};

template <typename T>
T* device_array(size_t n) {
  T* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, n * sizeof(T)), cudaSuccess);
  return p;
}

class SimStreams : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&a_, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&b_, cudaStreamNonBlocking), cudaSuccess);
    out_ = device_array<float>(32);
  }
  void TearDown() override {
    (void)cudaStreamDestroy(a_);
    (void)cudaStreamDestroy(b_);
    (void)cudaFree(out_);
    (void)cudaGetLastError();
  }
  cudaStream_t a_ = nullptr, b_ = nullptr;
  float* out_ = nullptr;
};

TEST_F(SimStreams, LaunchReturnsBeforeTheKernelRuns) {
  Gate gate;
  launch(gate_kernel, LaunchConfig{1, 1, 0, a_}, gate.flag(), out_, 7.0f);
  cudaEvent_t after = nullptr;
  ASSERT_EQ(cudaEventCreate(&after), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(after, a_), cudaSuccess);
  EXPECT_EQ(cudaStreamQuery(a_), cudaErrorNotReady);
  EXPECT_EQ(cudaEventQuery(after), cudaErrorNotReady);
  EXPECT_EQ(cudaStreamQuery(b_), cudaSuccess);  // another stream is not held up
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);   // NotReady is a status, not an error
  gate.open();
  ASSERT_EQ(cudaEventSynchronize(after), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(after), cudaSuccess);
  EXPECT_EQ(cudaStreamQuery(a_), cudaSuccess);
  float v = 0;
  ASSERT_EQ(cudaMemcpy(&v, out_, sizeof v, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(v, 7.0f);
  ASSERT_EQ(cudaEventDestroy(after), cudaSuccess);
}

TEST_F(SimStreams, StreamWaitEventOrdersTwoStreams) {
  Gate gate;
  float* in = device_array<float>(32);
  launch(gate_kernel, LaunchConfig{1, 32, 0, a_}, gate.flag(), in, 41.0f);
  cudaEvent_t written = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&written, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(written, a_), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(b_, written, 0), cudaSuccess);
  launch(add_one_kernel, LaunchConfig{1, 32, 0, b_}, in, out_, 32);
  EXPECT_EQ(cudaStreamQuery(b_), cudaErrorNotReady);  // b waits for a's gate
  // Recording the event again does not move the wait already queued on b.
  ASSERT_EQ(cudaEventRecord(written, b_), cudaSuccess);
  gate.open();
  ASSERT_EQ(cudaStreamSynchronize(b_), cudaSuccess);
  std::vector<float> host(32);
  ASSERT_EQ(cudaMemcpy(host.data(), out_, 32 * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  for (float v : host) EXPECT_EQ(v, 42.0f);
  (void)cudaEventDestroy(written);
  (void)cudaFree(in);
}

// Without the wait, the second stream does not wait: it reads the buffer before the gate.
TEST_F(SimStreams, WithoutAWaitTheSecondStreamOvertakes) {
  Gate gate;
  float* in = device_array<float>(32);
  ASSERT_EQ(cudaMemset(in, 0, 32 * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  launch(gate_kernel, LaunchConfig{1, 32, 0, a_}, gate.flag(), in, 41.0f);
  launch(add_one_kernel, LaunchConfig{1, 32, 0, b_}, in, out_, 32);
  ASSERT_EQ(cudaStreamSynchronize(b_), cudaSuccess);  // returns with a still gated
  std::vector<float> host(32);
  ASSERT_EQ(cudaMemcpyAsync(host.data(), out_, 32 * sizeof(float), cudaMemcpyDeviceToHost, b_),
            cudaSuccess);  // pageable destination: returns when done
  EXPECT_EQ(host[0], 1.0f);
  gate.open();
  (void)cudaFree(in);
}

// The legacy default stream waits for the device's blocking streams and they wait for it;
// non-blocking streams take part in neither rule.
TEST_F(SimStreams, LegacyDefaultStreamRules) {
  cudaStream_t blocking = nullptr;
  ASSERT_EQ(cudaStreamCreate(&blocking), cudaSuccess);
  {
    Gate gate;
    launch(gate_kernel, LaunchConfig{1, 1, 0, nullptr}, gate.flag(), out_, 1.0f);
    launch(add_one_kernel, LaunchConfig{1, 1, 0, blocking}, out_, out_ + 1, 1);
    launch(add_one_kernel, LaunchConfig{1, 1, 0, a_}, out_ + 2, out_ + 3, 1);
    ASSERT_EQ(cudaStreamSynchronize(a_), cudaSuccess);           // not behind the legacy gate
    EXPECT_EQ(cudaStreamQuery(blocking), cudaErrorNotReady);     // behind it
    gate.open();
    ASSERT_EQ(cudaStreamSynchronize(blocking), cudaSuccess);
  }
  {
    Gate gate;
    launch(gate_kernel, LaunchConfig{1, 1, 0, blocking}, gate.flag(), out_, 1.0f);
    launch(add_one_kernel, LaunchConfig{1, 1, 0, nullptr}, out_, out_ + 1, 1);
    EXPECT_EQ(cudaStreamQuery(nullptr), cudaErrorNotReady);  // the legacy stream waits too
    gate.open();
    ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
  }
  float v = 0;
  ASSERT_EQ(cudaMemcpy(&v, out_ + 1, sizeof v, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(v, 2.0f);
  ASSERT_EQ(cudaStreamDestroy(blocking), cudaSuccess);
}

// A copy to pinned memory is asynchronous; from pageable memory the source is staged at the
// call, so the caller may overwrite it at once (CUDA's documented behaviour).
TEST_F(SimStreams, CopiesFollowTheHostMemoryRules) {
  Gate gate;
  float* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(&pinned, 32 * sizeof(float)), cudaSuccess);
  std::fill(pinned, pinned + 32, -1.0f);
  launch(gate_kernel, LaunchConfig{1, 32, 0, a_}, gate.flag(), out_, 5.0f);
  ASSERT_EQ(cudaMemcpyAsync(pinned, out_, 32 * sizeof(float), cudaMemcpyDeviceToHost, a_),
            cudaSuccess);
  EXPECT_EQ(pinned[0], -1.0f);  // not copied yet: the stream is gated
  std::vector<float> source(32, 3.0f);
  float* in = device_array<float>(32);
  ASSERT_EQ(cudaMemcpyAsync(in, source.data(), 32 * sizeof(float), cudaMemcpyHostToDevice, a_),
            cudaSuccess);
  std::fill(source.begin(), source.end(), 99.0f);  // allowed: the copy took its own snapshot
  gate.open();
  ASSERT_EQ(cudaStreamSynchronize(a_), cudaSuccess);
  EXPECT_EQ(pinned[31], 5.0f);
  float v = 0;
  ASSERT_EQ(cudaMemcpy(&v, in, sizeof v, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(v, 3.0f);
  (void)cudaFree(in);
  (void)cudaFreeHost(pinned);
}

// Host functions run in stream order; destroying a stream lets its queued work finish.
TEST_F(SimStreams, HostFunctionsAndDestroyWithPendingWork) {
  static std::atomic<int> calls{0};
  calls = 0;
  Gate gate;
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  launch(gate_kernel, LaunchConfig{1, 1, 0, s}, gate.flag(), out_, 1.0f);
  ASSERT_EQ(cudaLaunchHostFunc(s, [](void*) { calls.fetch_add(1); }, nullptr), cudaSuccess);
  EXPECT_EQ(calls.load(), 0);
  gate.open();
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);  // returns once the queue has drained
  EXPECT_EQ(calls.load(), 1);
}

TEST_F(SimStreams, ElapsedTimeNeedsCompletedEvents) {
  Gate gate;
  cudaEvent_t start = nullptr, end = nullptr;
  ASSERT_EQ(cudaEventCreate(&start), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&end), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(start, a_), cudaSuccess);
  launch(gate_kernel, LaunchConfig{1, 1, 0, a_}, gate.flag(), out_, 1.0f);
  ASSERT_EQ(cudaEventRecord(end, a_), cudaSuccess);
  float ms = -1;
  EXPECT_EQ(cudaEventElapsedTime(&ms, start, end), cudaErrorNotReady);
  gate.open();
  ASSERT_EQ(cudaEventSynchronize(end), cudaSuccess);
  ASSERT_EQ(cudaEventElapsedTime(&ms, start, end), cudaSuccess);
  EXPECT_GE(ms, 0.0f);
  (void)cudaEventDestroy(start);
  (void)cudaEventDestroy(end);
}


// The implicit synchronisations of the CUDA C++ Programming Guide ("Implicit
// Synchronization"): after a device or page-locked allocation, a device memset or a copy
// between two addresses of one device, work on ANY stream of the device (non-blocking ones
// too) waits for the work issued before. Stream a is gated; an event recorded on stream b
// afterwards must stay incomplete while the gate is closed, and complete once it opens. The
// control case (no such call in between) completes at once: b has no other reason to wait.
// The 50 ms pause only gives an unordered record the time to run; an ordered one never runs.
TEST_F(SimStreams, ImplicitSynchronisationsOrderEveryStream) {
  float* scratch = device_array<float>(64);
  cudaStream_t c = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&c, cudaStreamNonBlocking), cudaSuccess);
  struct Case {
    const char* name;
    std::function<void()> call;
    bool orders;
  };
  std::vector<void*> to_free, to_free_host;
  const std::vector<Case> cases = {
      {"a kernel on another stream (control)",
       [&] { launch(add_one_kernel, LaunchConfig{1, 1, 0, c}, scratch, scratch + 1, 1); }, false},
      {"cudaMalloc", [&] { to_free.push_back(device_array<float>(16)); }, true},
      {"cudaMallocHost",
       [&] {
         void* p = nullptr;
         EXPECT_EQ(cudaMallocHost(&p, 64), cudaSuccess);
         to_free_host.push_back(p);
       },
       true},
      {"cudaMemsetAsync on a third stream",
       [&] { EXPECT_EQ(cudaMemsetAsync(scratch, 0, 16, c), cudaSuccess); }, true},
      {"a same-device cudaMemcpyAsync on a third stream",
       [&] {
         EXPECT_EQ(cudaMemcpyAsync(scratch + 32, scratch, 16, cudaMemcpyDeviceToDevice, c),
                   cudaSuccess);
       },
       true},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    cudaEvent_t on_b = nullptr;
    ASSERT_EQ(cudaEventCreateWithFlags(&on_b, cudaEventDisableTiming), cudaSuccess);
    {
      Gate gate;
      launch(gate_kernel, LaunchConfig{1, 1, 0, a_}, gate.flag(), out_, 1.0f);
      k.call();
      ASSERT_EQ(cudaEventRecord(on_b, b_), cudaSuccess);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (k.orders) {
        EXPECT_EQ(cudaEventQuery(on_b), cudaErrorNotReady) << "b did not wait for the gate";
      } else {
        EXPECT_EQ(cudaEventSynchronize(on_b), cudaSuccess);  // returns while a is gated
      }
      gate.open();
      ASSERT_EQ(cudaEventSynchronize(on_b), cudaSuccess);
    }
    ASSERT_EQ(cudaEventDestroy(on_b), cudaSuccess);
  }
  for (void* p : to_free) (void)cudaFree(p);
  for (void* p : to_free_host) (void)cudaFreeHost(p);
  (void)cudaStreamDestroy(c);
  (void)cudaFree(scratch);
}

// Host functions of different streams may be serialized by the runtime (cudaLaunchHostFunc):
// the simulator runs them one at a time, so one that waits for another stream's host function
// waits forever, as it may on a GPU.
TEST_F(SimStreams, HostFunctionsOfAllStreamsRunOneAtATime) {
  static std::atomic<int> open{0}, calls{0};
  open = 0;
  calls = 0;
  ASSERT_EQ(cudaLaunchHostFunc(
                a_, [](void*) { while (open.load() == 0) std::this_thread::yield(); }, nullptr),
            cudaSuccess);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // a's host function is running
  ASSERT_EQ(cudaLaunchHostFunc(b_, [](void*) { calls.fetch_add(1); }, nullptr), cudaSuccess);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(calls.load(), 0) << "b's host function ran beside a's";
  open = 1;
  ASSERT_EQ(cudaStreamSynchronize(b_), cudaSuccess);
  EXPECT_EQ(calls.load(), 1);
}

// A host function that waits for the host thread while the host thread waits for the device
// is a deadlock on a GPU; the simulator reports it and aborts instead of hanging.
TEST_F(SimStreams, HostFunctionDeadlockIsReported) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        kiln::sim::set_host_function_limit(1);
        static std::atomic<int> open{0};
        (void)cudaLaunchHostFunc(
            a_, [](void*) { while (open.load() == 0) std::this_thread::yield(); }, nullptr);
        (void)cudaStreamSynchronize(a_);  // open is set only after this returns: never
        open = 1;
      },
      "deadlock: the host has waited [0-9]+ s in cudaStreamSynchronize while a host function");
}

}  // namespace
