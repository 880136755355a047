// sim_graph_test.cpp: stream capture and CUDA graphs in the simulator (engine/cuda/sim/graphs.cpp).
// What is asserted is what CUDA guarantees (CUDA C++ Programming Guide, "CUDA Graphs"): captured
// work does not run until the graph is launched, a launch reads the current contents of memory
// and gives what the same work gives run eagerly, work of a stream that did not join the capture
// is not recorded, and each broken capture rule returns CUDA's error and invalidates the capture.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "engine/cuda/launch.h"
#include "engine/cuda/runtime.h"
#include "engine/cuda/sim/cublas.h"
#include "engine/cuda/sim/internal.h"

namespace {

using kiln::cuda::launch;
using kiln::cuda::LaunchConfig;

constexpr int kN = 64;
constexpr size_t kBytes = kN * sizeof(float);

// y[i] = a * x[i] + b
__global__ void affine_kernel(const float* x, float* y, float a, float b, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) y[i] = a * x[i] + b;
}
// z[i] = x[i] + y[i]
__global__ void add_kernel(const float* x, const float* y, float* z, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) z[i] = x[i] + y[i];
}
// Spins until *open != 0 (pinned host memory), then writes `value` to out[0].
__global__ void gate_kernel(const int* open, float* out, float value) {
  while (__atomic_load_n(open, __ATOMIC_ACQUIRE) == 0) {
  }
  out[0] = value;
}

template <typename T>
T* device_array(size_t n) {
  T* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, n * sizeof(T)), cudaSuccess);
  return p;
}
template <typename T>
T* pinned_array(size_t n) {
  T* p = nullptr;
  EXPECT_EQ(cudaMallocHost(&p, n * sizeof(T)), cudaSuccess);
  return p;
}
std::vector<float> download(const float* p, int n = kN) {
  std::vector<float> host(static_cast<size_t>(n));
  EXPECT_EQ(cudaMemcpy(host.data(), p, host.size() * sizeof(float), cudaMemcpyDeviceToHost),
            cudaSuccess);
  return host;
}
cudaStreamCaptureStatus capture_status(cudaStream_t s) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  EXPECT_EQ(cudaStreamIsCapturing(s, &status), cudaSuccess);
  return status;
}

class SimGraph : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&a_, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&b_, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming), cudaSuccess);
    ASSERT_EQ(cudaEventCreateWithFlags(&join_, cudaEventDisableTiming), cudaSuccess);
    for (float** p : {&x_, &y_, &z_, &w_, &out_}) *p = device_array<float>(kN);
    in_ = pinned_array<float>(kN);
  }
  void TearDown() override {
    (void)cudaDeviceSynchronize();
    for (float* p : {x_, y_, z_, w_, out_}) (void)cudaFree(p);
    (void)cudaFreeHost(in_);
    (void)cudaEventDestroy(fork_);
    (void)cudaEventDestroy(join_);
    (void)cudaStreamDestroy(a_);
    (void)cudaStreamDestroy(b_);
    (void)cudaGetLastError();
  }

  // One "step" over two streams: an upload from pinned memory, a memset, kernels on both
  // streams, a device-to-device copy, a fork to b and a join back into a.
  //   x = in; y = 0; y = 2x + 1 (a) | z = 3x - 1 (b); w = y; out = w + z = 5x
  void step() {
    const LaunchConfig on_a{1, kN, 0, a_}, on_b{1, kN, 0, b_};
    ASSERT_EQ(cudaMemcpyAsync(x_, in_, kBytes, cudaMemcpyHostToDevice, a_), cudaSuccess);
    ASSERT_EQ(cudaMemsetAsync(y_, 0, kBytes, a_), cudaSuccess);
    ASSERT_EQ(cudaEventRecord(fork_, a_), cudaSuccess);
    ASSERT_EQ(cudaStreamWaitEvent(b_, fork_, 0), cudaSuccess);
    launch(affine_kernel, on_a, x_, y_, 2.0f, 1.0f, kN);
    launch(affine_kernel, on_b, x_, z_, 3.0f, -1.0f, kN);
    ASSERT_EQ(cudaMemcpyAsync(w_, y_, kBytes, cudaMemcpyDeviceToDevice, a_), cudaSuccess);
    ASSERT_EQ(cudaEventRecord(join_, b_), cudaSuccess);
    ASSERT_EQ(cudaStreamWaitEvent(a_, join_, 0), cudaSuccess);
    launch(add_kernel, on_a, w_, z_, out_, kN);
  }
  void fill_input(float base) {
    for (int i = 0; i < kN; ++i) in_[i] = base + static_cast<float>(i);
  }
  void poison_output() { ASSERT_EQ(cudaMemset(out_, 0xFF, kBytes), cudaSuccess); }  // NaN

  cudaGraph_t capture_step() {
    EXPECT_EQ(cudaStreamBeginCapture(a_, cudaStreamCaptureModeGlobal), cudaSuccess);
    step();
    cudaGraph_t graph = nullptr;
    EXPECT_EQ(cudaStreamEndCapture(a_, &graph), cudaSuccess);
    return graph;
  }

  // Begins a capture on `s`, breaks a rule with `violation`, which must return `expected`; the
  // capture is then invalidated and ends with cudaErrorStreamCaptureInvalidated and no graph.
  void expect_invalidates(cudaStream_t s, const std::function<cudaError_t()>& violation,
                          cudaError_t expected) {
    ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    launch(affine_kernel, LaunchConfig{1, kN, 0, s}, x_, y_, 1.0f, 0.0f, kN);
    EXPECT_EQ(violation(), expected) << cudaGetErrorName(expected);
    EXPECT_EQ(capture_status(s), cudaStreamCaptureStatusInvalidated);
    // Further work on the stream is refused until the capture ends.
    EXPECT_EQ(cudaMemsetAsync(y_, 0, kBytes, s), cudaErrorStreamCaptureInvalidated);
    cudaGraph_t graph = reinterpret_cast<cudaGraph_t>(&graph);  // not null: must be cleared
    EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);
    EXPECT_EQ(graph, nullptr);
    EXPECT_EQ(capture_status(s), cudaStreamCaptureStatusNone);
    (void)cudaGetLastError();
  }

  cudaStream_t a_ = nullptr, b_ = nullptr;
  cudaEvent_t fork_ = nullptr, join_ = nullptr;
  float *x_ = nullptr, *y_ = nullptr, *z_ = nullptr, *w_ = nullptr, *out_ = nullptr;
  float* in_ = nullptr;  // pinned
};

TEST_F(SimGraph, ReplaysMatchEagerWorkAndReadTheCurrentInputs) {
  const std::vector<float> bases = {0.0f, 100.0f, -7.5f};
  std::vector<std::vector<float>> eager;
  for (float base : bases) {
    fill_input(base);
    poison_output();
    step();
    ASSERT_EQ(cudaStreamSynchronize(a_), cudaSuccess);
    eager.push_back(download(out_));
    for (int i = 0; i < kN; ++i) ASSERT_EQ(eager.back()[i], 5.0f * in_[i]) << i;
  }

  fill_input(1000.0f);
  poison_output();
  cudaGraph_t graph = capture_step();
  ASSERT_NE(graph, nullptr);
  EXPECT_EQ(capture_status(a_), cudaStreamCaptureStatusNone);
  EXPECT_EQ(capture_status(b_), cudaStreamCaptureStatusNone);  // the fork left capture too
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (float v : download(out_)) EXPECT_TRUE(std::isnan(v)) << "captured work ran";

  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (size_t launch_index = 0; launch_index < bases.size(); ++launch_index) {
    fill_input(bases[launch_index]);  // the graph copies from this pinned buffer at replay
    poison_output();
    ASSERT_EQ(cudaGraphLaunch(exec, a_), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(a_), cudaSuccess);
    EXPECT_EQ(download(out_), eager[launch_index]) << "launch " << launch_index;
  }
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
}

// A device-to-host copy into pinned memory and a host-to-device copy out of it, captured: each
// replay reads the pinned input as it is then and writes the pinned output.
TEST_F(SimGraph, PinnedHostCopiesUseTheBuffersAtReplayTime) {
  float* host_out = pinned_array<float>(kN);
  ASSERT_EQ(cudaStreamBeginCapture(a_, cudaStreamCaptureModeGlobal), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(x_, in_, kBytes, cudaMemcpyHostToDevice, a_), cudaSuccess);
  launch(affine_kernel, LaunchConfig{1, kN, 0, a_}, x_, y_, 1.0f, 0.5f, kN);
  ASSERT_EQ(cudaMemcpyAsync(host_out, y_, kBytes, cudaMemcpyDeviceToHost, a_), cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(a_, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (float base : {1.0f, 2.0f}) {
    fill_input(base);
    ASSERT_EQ(cudaGraphLaunch(exec, a_), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(a_), cudaSuccess);
    for (int i = 0; i < kN; ++i) ASSERT_EQ(host_out[i], in_[i] + 0.5f) << i;
  }
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  EXPECT_EQ(cudaFreeHost(host_out), cudaSuccess);
}

// b never waits for an event of the capture: its work runs now and is not part of the graph.
TEST_F(SimGraph, StreamThatDidNotJoinIsNotRecorded) {
  ASSERT_EQ(cudaMemset(y_, 0, kBytes), cudaSuccess);
  ASSERT_EQ(cudaMemset(z_, 0, kBytes), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(a_, cudaStreamCaptureModeGlobal), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(y_, 0x3F, kBytes, a_), cudaSuccess);  // captured
  ASSERT_EQ(cudaMemsetAsync(z_, 0x40, kBytes, b_), cudaSuccess);  // runs
  ASSERT_EQ(cudaStreamSynchronize(b_), cudaSuccess);  // allowed: b does not capture
  EXPECT_EQ(capture_status(b_), cudaStreamCaptureStatusNone);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(a_, &graph), cudaSuccess);
  std::vector<uint8_t> bytes(kBytes);
  ASSERT_EQ(cudaMemcpy(bytes.data(), z_, kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(bytes, std::vector<uint8_t>(kBytes, 0x40));
  ASSERT_EQ(cudaMemcpy(bytes.data(), y_, kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(bytes, std::vector<uint8_t>(kBytes, 0));

  ASSERT_EQ(cudaMemset(z_, 0, kBytes), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, a_), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(a_), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(bytes.data(), y_, kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(bytes, std::vector<uint8_t>(kBytes, 0x3F));
  ASSERT_EQ(cudaMemcpy(bytes.data(), z_, kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(bytes, std::vector<uint8_t>(kBytes, 0)) << "b's memset was recorded";
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
}

// A launch is ordered after the work before it on its stream, and CUDA lets the exec (and the
// graph) be destroyed while the launch is queued: the launch still completes.
TEST_F(SimGraph, DestroyingTheExecWhileItsLaunchIsQueuedIsSafe) {
  // The host would wait for the gate it has not opened yet.
  if (kiln::sim::synchronous_streams()) GTEST_SKIP() << "needs asynchronous streams";
  int* open = pinned_array<int>(1);
  float* result = pinned_array<float>(2);
  *open = 0;
  result[0] = result[1] = 0.0f;
  ASSERT_EQ(cudaStreamBeginCapture(a_, cudaStreamCaptureModeGlobal), cudaSuccess);
  launch(affine_kernel, LaunchConfig{1, 1, 0, a_}, result, result + 1, 1.0f, 2.0f, 1);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(a_, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);

  launch(gate_kernel, LaunchConfig{1, 1, 0, a_}, open, result, 40.0f);  // result[0] = 40 later
  ASSERT_EQ(cudaGraphLaunch(exec, a_), cudaSuccess);                    // result[1] = 42 after
  ASSERT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  ASSERT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  EXPECT_EQ(cudaStreamQuery(a_), cudaErrorNotReady);
  float seen = -1.0f;
  __atomic_load(&result[1], &seen, __ATOMIC_ACQUIRE);
  EXPECT_EQ(seen, 0.0f) << "the launch overtook the gate";
  __atomic_store_n(open, 1, __ATOMIC_RELEASE);
  ASSERT_EQ(cudaStreamSynchronize(a_), cudaSuccess);
  EXPECT_EQ(result[1], 42.0f);
  EXPECT_EQ(cudaFreeHost(open), cudaSuccess);
  EXPECT_EQ(cudaFreeHost(result), cudaSuccess);
}

// ---- The capture rules ----------------------------------------------------------------------
TEST_F(SimGraph, PotentiallyUnsafeCallsInvalidateAGlobalCapture) {
  void* p = nullptr;
  std::vector<float> host(kN);
  expect_invalidates(a_, [&] { return cudaMalloc(&p, 256); }, cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(p, nullptr);
  expect_invalidates(a_, [&] { return cudaFree(x_); }, cudaErrorStreamCaptureUnsupported);
  expect_invalidates(a_, [&] { return cudaMallocHost(&p, 256); },
                     cudaErrorStreamCaptureUnsupported);
  expect_invalidates(
      a_, [&] { return cudaMemcpy(host.data(), x_, kBytes, cudaMemcpyDeviceToHost); },
      cudaErrorStreamCaptureUnsupported);
}

TEST_F(SimGraph, SynchronisingWithCapturedWorkInvalidatesTheCapture) {
  expect_invalidates(a_, [] { return cudaDeviceSynchronize(); }, cudaErrorStreamCaptureUnsupported);
  expect_invalidates(a_, [&] { return cudaStreamSynchronize(a_); },
                     cudaErrorStreamCaptureUnsupported);
  expect_invalidates(a_, [&] { return cudaStreamQuery(a_); }, cudaErrorStreamCaptureUnsupported);
  const auto record = [&](cudaError_t (*use)(cudaEvent_t)) {
    return [&, use] {
      EXPECT_EQ(cudaEventRecord(fork_, a_), cudaSuccess);
      return use(fork_);
    };
  };
  expect_invalidates(a_, record(cudaEventQuery), cudaErrorCapturedEvent);
  expect_invalidates(a_, record(cudaEventSynchronize), cudaErrorCapturedEvent);
}

TEST_F(SimGraph, PageableHostCopiesCannotBeCaptured) {
  std::vector<float> pageable(kN, 1.0f);
  expect_invalidates(
      a_,
      [&] { return cudaMemcpyAsync(x_, pageable.data(), kBytes, cudaMemcpyHostToDevice, a_); },
      cudaErrorStreamCaptureUnsupported);
  expect_invalidates(
      a_,
      [&] { return cudaMemcpyAsync(pageable.data(), x_, kBytes, cudaMemcpyDeviceToHost, a_); },
      cudaErrorStreamCaptureUnsupported);
}

// The legacy default stream implicitly depends on every blocking stream of its device, so it
// cannot be used while one of them captures.
TEST_F(SimGraph, LegacyStreamUseWhileABlockingStreamCapturesIsImplicit) {
  cudaStream_t blocking = nullptr;
  ASSERT_EQ(cudaStreamCreate(&blocking), cudaSuccess);
  expect_invalidates(blocking, [&] { return cudaMemsetAsync(z_, 0, kBytes, nullptr); },
                     cudaErrorStreamCaptureImplicit);
  expect_invalidates(blocking, [&] { return cudaEventRecord(join_, nullptr); },
                     cudaErrorStreamCaptureImplicit);
  // Querying the legacy stream's capture status says so without invalidating the capture.
  ASSERT_EQ(cudaStreamBeginCapture(blocking, cudaStreamCaptureModeGlobal), cudaSuccess);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  EXPECT_EQ(cudaStreamIsCapturing(nullptr, &status), cudaErrorStreamCaptureImplicit);
  EXPECT_EQ(capture_status(blocking), cudaStreamCaptureStatusActive);
  // A non-blocking stream does not take part: the legacy stream stays usable.
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(blocking, &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(a_, cudaStreamCaptureModeRelaxed), cudaSuccess);
  EXPECT_EQ(cudaMemsetAsync(z_, 0, kBytes, nullptr), cudaSuccess);
  EXPECT_EQ(cudaStreamIsCapturing(nullptr, &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusNone);
  ASSERT_EQ(cudaStreamEndCapture(a_, &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  (void)cudaGetLastError();
  EXPECT_EQ(cudaStreamDestroy(blocking), cudaSuccess);
}

TEST_F(SimGraph, WaitingOnUncapturedWorkIsIsolation) {
  ASSERT_EQ(cudaEventRecord(join_, b_), cudaSuccess);  // recorded for execution, not captured
  expect_invalidates(a_, [&] { return cudaStreamWaitEvent(a_, join_, 0); },
                     cudaErrorStreamCaptureIsolation);
}

TEST_F(SimGraph, AnUnjoinedForkFailsTheCapture) {
  ASSERT_EQ(cudaStreamBeginCapture(a_, cudaStreamCaptureModeGlobal), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(fork_, a_), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(b_, fork_, 0), cudaSuccess);
  EXPECT_EQ(capture_status(b_), cudaStreamCaptureStatusActive);
  ASSERT_EQ(cudaMemsetAsync(z_, 0, kBytes, b_), cudaSuccess);
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(b_, &graph), cudaErrorStreamCaptureUnmatched);  // not the origin
  EXPECT_EQ(cudaStreamEndCapture(a_, &graph), cudaErrorStreamCaptureUnjoined);
  EXPECT_EQ(graph, nullptr);
  EXPECT_EQ(capture_status(a_), cudaStreamCaptureStatusNone);
  EXPECT_EQ(capture_status(b_), cudaStreamCaptureStatusNone);
  EXPECT_EQ(cudaStreamEndCapture(a_, &graph), cudaErrorIllegalState);  // no capture any more
  (void)cudaGetLastError();
}

// Relaxed captures forbid nothing; a ThreadLocal capture forbids only its own thread's unsafe
// calls; a Global one those of every thread in Global mode.
TEST_F(SimGraph, CaptureModesDecideWhoMayCallUnsafeApis) {
  const auto malloc_on_other_thread = [] {
    cudaError_t result = cudaSuccess;
    std::thread other([&] {
      (void)cudaSetDevice(0);
      void* p = nullptr;
      result = cudaMalloc(&p, 256);
      if (result == cudaSuccess) (void)cudaFree(p);
    });
    other.join();
    return result;
  };
  cudaGraph_t graph = nullptr;
  void* p = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(a_, cudaStreamCaptureModeRelaxed), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&p, 256), cudaSuccess);
  EXPECT_EQ(cudaFree(p), cudaSuccess);
  ASSERT_EQ(cudaStreamEndCapture(a_, &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphDestroy(graph), cudaSuccess);

  ASSERT_EQ(cudaStreamBeginCapture(a_, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  EXPECT_EQ(malloc_on_other_thread(), cudaSuccess);
  EXPECT_EQ(capture_status(a_), cudaStreamCaptureStatusActive);
  ASSERT_EQ(cudaStreamEndCapture(a_, &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphDestroy(graph), cudaSuccess);

  expect_invalidates(a_, malloc_on_other_thread, cudaErrorStreamCaptureUnsupported);

  // This thread in Relaxed mode may call them during its own Global capture.
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  ASSERT_EQ(cudaThreadExchangeStreamCaptureMode(&mode), cudaSuccess);
  EXPECT_EQ(mode, cudaStreamCaptureModeGlobal);  // the previous mode
  ASSERT_EQ(cudaStreamBeginCapture(a_, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&p, 256), cudaSuccess);
  EXPECT_EQ(cudaFree(p), cudaSuccess);
  ASSERT_EQ(cudaStreamEndCapture(a_, &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  ASSERT_EQ(cudaThreadExchangeStreamCaptureMode(&mode), cudaSuccess);
  EXPECT_EQ(mode, cudaStreamCaptureModeRelaxed);
}

TEST_F(SimGraph, CaptureInfoGivesAnIdPerCapture) {
  unsigned long long first = 0, second = 0;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cudaGraph_t graph = nullptr;
  for (unsigned long long* id : {&first, &second}) {
    ASSERT_EQ(cudaStreamBeginCapture(a_, cudaStreamCaptureModeGlobal), cudaSuccess);
    ASSERT_EQ(cudaStreamGetCaptureInfo(a_, &status, id), cudaSuccess);
    EXPECT_EQ(status, cudaStreamCaptureStatusActive);
    ASSERT_EQ(cudaStreamEndCapture(a_, &graph), cudaSuccess);
    ASSERT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  }
  EXPECT_NE(first, second);
}

// A cuBLAS call on a capturing stream is recorded with its arguments (pointers, sizes, alpha and
// beta read at the call) and computes on the matrices' current contents at each replay.
TEST_F(SimGraph, CublasGemmIsCapturedAndReplayed) {
  cublasHandle_t handle = nullptr;
  ASSERT_EQ(cublasCreate(&handle), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasSetStream(handle, a_), CUBLAS_STATUS_SUCCESS);
  // C (2x2) = A (2x3) B (3x2), column-major.
  float *a = x_, *b = y_, *c = z_;
  const float alpha = 1.0f, beta = 0.0f;
  ASSERT_EQ(cudaStreamBeginCapture(a_, cudaStreamCaptureModeGlobal), cudaSuccess);
  ASSERT_EQ(cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, &alpha, a, 2, b, 3, &beta, c, 2),
            CUBLAS_STATUS_SUCCESS);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(a_, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (float scale : {1.0f, -2.0f}) {
    std::vector<float> ha(6), hb(6);
    for (int i = 0; i < 6; ++i) {
      ha[static_cast<size_t>(i)] = scale * static_cast<float>(i + 1);
      hb[static_cast<size_t>(i)] = static_cast<float>(6 - i);
    }
    ASSERT_EQ(cudaMemcpy(a, ha.data(), 6 * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(b, hb.data(), 6 * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, a_), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(a_), cudaSuccess);
    const std::vector<float> hc = download(c, 4);
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 2; ++j) {
        float expected = 0.0f;
        for (int k = 0; k < 3; ++k)
          expected += ha[static_cast<size_t>(i + 2 * k)] * hb[static_cast<size_t>(k + 3 * j)];
        EXPECT_EQ(hc[static_cast<size_t>(i + 2 * j)], expected) << i << "," << j;
      }
  }
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  EXPECT_EQ(cublasDestroy(handle), CUBLAS_STATUS_SUCCESS);
}

TEST_F(SimGraph, ArgumentErrors) {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  EXPECT_EQ(cudaStreamBeginCapture(nullptr, cudaStreamCaptureModeGlobal),
            cudaErrorStreamCaptureUnsupported);  // the legacy stream cannot capture
  EXPECT_EQ(cudaStreamBeginCapture(a_, static_cast<cudaStreamCaptureMode>(7)),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaStreamEndCapture(a_, &graph), cudaErrorIllegalState);
  ASSERT_EQ(cudaStreamBeginCapture(a_, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_EQ(cudaStreamBeginCapture(a_, cudaStreamCaptureModeGlobal), cudaErrorIllegalState);
  ASSERT_EQ(cudaStreamEndCapture(a_, &graph), cudaSuccess);  // an empty graph
  EXPECT_EQ(cudaGraphInstantiate(&exec, graph, cudaGraphInstantiateFlagDeviceLaunch),
            cudaErrorInvalidValue);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  EXPECT_EQ(cudaGraphLaunch(exec, a_), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(a_), cudaSuccess);
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  EXPECT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaErrorInvalidValue);  // destroyed
  (void)cudaGetLastError();
}

}  // namespace
