// graph_test.cpp: cuda::Graph (engine/cuda/graph.h): Kiln ops captured into a CUDA graph with a
// private memory pool, and replayed.
//
// What is asserted is what CUDA guarantees (CUDA C++ Programming Guide, "CUDA Graphs"): a
// replay runs the captured work on the current contents of its buffers, so with new data
// copied into the static input it gives what the same ops give eagerly; the blocks of the
// capture keep their addresses and are never another tensor's meanwhile; a call the capture
// forbids fails, and the error names the rule. Covered: replays equal eager steps; the current
// stream during and after a capture; outputs keep their addresses, eager tensors are never
// overwritten by a replay; the pool goes back to the driver when the Graph dies (allocator
// statistics), a wait named for KILN_SYNC_DEBUG; a host wait and a raw cudaMalloc inside the
// capture; misuse.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "engine/allocator.h"
#include "engine/cuda/caching_allocator.h"
#include "engine/cuda/check.h"
#include "engine/cuda/context.h"
#include "engine/cuda/graph.h"
#include "engine/cuda/sync_debug.h"
#include "engine/error.h"
#include "engine/ops.h"
#include "engine/tensor.h"
#include "support/cuda_skip.h"

namespace kiln {
namespace {

const Device kCuda0(DeviceType::CUDA, 0);
constexpr int64_t kBatch = 8, kIn = 16, kOut = 12;

std::vector<float> random_values(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

// A layer's forward: relu(x w + b), with x the static input.
struct Step {
  Tensor x = Tensor::from_vector(random_values(kBatch * kIn, 1), {kBatch, kIn}, kCuda0);
  Tensor w = Tensor::from_vector(random_values(kIn * kOut, 2), {kIn, kOut}, kCuda0);
  Tensor b = Tensor::from_vector(random_values(kOut, 3), {kOut}, kCuda0);
  Tensor operator()() const { return relu(add(matmul(x, w), b)); }
  void new_input(uint32_t seed) {
    x.copy_(Tensor::from_vector(random_values(kBatch * kIn, seed), {kBatch, kIn}));
  }
};

void expect_close(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5f) << i;
}

TEST(CudaGraph, ReplaysEqualEagerStepsWithNewInputs) {
  KILN_SKIP_WITHOUT_CUDA();
  Step step;
  (void)step();  // once eagerly first: lazy setup (library handles) happens outside the capture
  cuda::Graph g;
  Tensor y;
  const cudaStream_t mine = cuda::current_stream(0);
  cudaStream_t during = nullptr;
  g.capture([&] {
    during = cuda::current_stream(0);
    y = step();
  });
  EXPECT_NE(during, mine);  // the capture ran on the Graph's own stream...
  EXPECT_EQ(cuda::current_stream(0), mine);  // ...and gave this thread's back
  EXPECT_TRUE(g.captured());
  void* const out = y.raw_data();
  for (uint32_t i = 0; i < 3; ++i) {
    step.new_input(100 + i);
    g.replay();
    const std::vector<float> replayed = y.to_vector<float>();
    EXPECT_EQ(y.raw_data(), out);
    expect_close(replayed, step().to_vector<float>());
  }
}

// Blocks freed during the capture (the matmul's and the add's outputs) are written by every
// replay. Eager tensors made after the capture hold their values across replays: a replay
// writes only the blocks of its pool.
TEST(CudaGraph, AReplayNeverOverwritesEagerTensors) {
  KILN_SKIP_WITHOUT_CUDA();
  Step step;
  (void)step();
  cuda::Graph g;
  Tensor y;
  g.capture([&] { y = step(); });
  std::vector<Tensor> eager;
  for (int i = 0; i < 6; ++i) eager.push_back(Tensor::full({kBatch, kOut}, 7.0, DType::F32, kCuda0));
  for (const Tensor& t : eager) EXPECT_NE(t.raw_data(), y.raw_data());
  for (int i = 0; i < 2; ++i) {
    step.new_input(200 + static_cast<uint32_t>(i));
    g.replay();
  }
  for (const Tensor& t : eager) {
    EXPECT_EQ(t.to_vector<float>(), std::vector<float>(kBatch * kOut, 7.0f));
  }
  expect_close(y.to_vector<float>(), step().to_vector<float>());
}

TEST(CudaGraph, ThePoolGoesBackToTheDriverWhenTheGraphDies) {
  KILN_SKIP_WITHOUT_CUDA();
  Step step;
  (void)step();
  cuda_allocator::release_cached(0);
  const MemoryStats base = cuda_allocator::stats(0);
  Tensor kept;
  {
    cuda::Graph g;
    Tensor y;
    g.capture([&] { y = step(); });
    g.replay();
    const MemoryStats during = cuda_allocator::stats(0);
    EXPECT_GT(during.os_allocs, base.os_allocs);  // the pool's own blocks
    EXPECT_GT(during.reserved_bytes, base.reserved_bytes);
    kept = y;  // an output that outlives its Graph
    (void)kept.to_vector<float>();
  }
  // The pool's cached blocks are returned; the kept output is not, until it is freed too.
  const MemoryStats after = cuda_allocator::stats(0);
  EXPECT_EQ(after.reserved_bytes - base.reserved_bytes,
            static_cast<int64_t>(cuda_allocator::round_size(kBatch * kOut * sizeof(float))));
  kept = Tensor();
  cuda_allocator::release_cached(0);
  EXPECT_EQ(cuda_allocator::stats(0).reserved_bytes, base.reserved_bytes);
  EXPECT_EQ(cuda_allocator::stats(0).current_bytes, base.current_bytes);
}

// Releasing the pool waits for the device (cudaFree): a wait the Graph names, so that
// KILN_SYNC_DEBUG=error does not throw from its destructor.
TEST(CudaGraph, DestroyingAGraphIsANamedWait) {
  KILN_SKIP_WITHOUT_CUDA();
  Step step;
  (void)step();
  cuda::set_sync_debug_mode(cuda::SyncDebug::Error);
  cuda::reset_sync_debug_counts();
  {
    cuda::Graph g;
    Tensor y;
    g.capture([&] { y = step(); });
    g.replay();
  }
  const cuda::SyncDebugCounts counts = cuda::sync_debug_counts();
  cuda::set_sync_debug_mode(cuda::SyncDebug::Off);
  EXPECT_GT(counts.allowed, 0);
  EXPECT_EQ(counts.reported, 0);
}

TEST(CudaGraph, AHostWaitInsideTheCaptureFailsNamingTheRule) {
  KILN_SKIP_WITHOUT_CUDA();
  Step step;
  (void)step();
  cuda::Graph g;
  try {
    g.capture([&] {
      Tensor y = step();
      (void)y.to_vector<float>();  // waits for the device: a graph cannot record that
    });
    FAIL() << "a host wait inside a capture must throw";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("cudaErrorStreamCaptureUnsupported"), std::string::npos) << what;
    EXPECT_NE(what.find("CUDA graph capture: a call a CUDA graph capture forbids"),
              std::string::npos) << what;
    EXPECT_NE(what.find("host wait"), std::string::npos) << what;
  }
  EXPECT_FALSE(g.captured());
  EXPECT_FALSE(cuda_allocator::capture_underway());
  // The Graph can capture again, correctly this time.
  Tensor y;
  g.capture([&] { y = step(); });
  step.new_input(300);
  g.replay();
  expect_close(y.to_vector<float>(), step().to_vector<float>());
}

TEST(CudaGraph, ARawCudaMallocInsideTheCaptureFailsNamingTheRule) {
  KILN_SKIP_WITHOUT_CUDA();
  Step step;
  (void)step();
  const cudaStream_t mine = cuda::current_stream(0);
  cuda::Graph g;
  // Checked where it is made: that call throws.
  try {
    g.capture([&] {
      Tensor y = step();
      void* p = nullptr;
      KILN_CUDA_CHECK(cudaMalloc(&p, 4096));  // not Kiln's allocator: not allowed here
    });
    FAIL() << "cudaMalloc inside a capture must throw";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("cudaMalloc"), std::string::npos) << what;
    EXPECT_NE(what.find("outside Kiln's caching allocator"), std::string::npos) << what;
  }
  // Ignored where it is made: the invalidated capture fails at its end, saying so.
  g.capture_begin();
  Tensor y = step();
  void* p = nullptr;
  (void)cudaMalloc(&p, 4096);
  (void)cudaGetLastError();
  try {
    g.capture_end();
    FAIL() << "an invalidated capture must not end";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("cudaErrorStreamCaptureInvalidated"), std::string::npos) << what;
    EXPECT_NE(what.find("broke a capture rule"), std::string::npos) << what;
  }
  EXPECT_FALSE(g.captured());
  EXPECT_EQ(cuda::current_stream(0), mine);
  EXPECT_FALSE(cuda_allocator::capture_underway());
}

TEST(CudaGraph, Misuse) {
  KILN_SKIP_WITHOUT_CUDA();
  Step step;
  (void)step();
  cuda::Graph g;
  EXPECT_THROW(g.replay(), Error);       // nothing captured
  EXPECT_THROW(g.capture_end(), Error);  // no capture open
  g.capture_begin();
  EXPECT_THROW(g.capture_begin(), Error);  // open already
  Tensor y = step();
  g.capture_end();
  EXPECT_THROW(g.capture([] {}), Error);  // one capture per Graph
  g.replay();
  // A Graph destroyed while capturing abandons the capture and gives the stream back.
  const cudaStream_t mine = cuda::current_stream(0);
  {
    cuda::Graph open;
    open.capture_begin();
    EXPECT_NE(cuda::current_stream(0), mine);
  }
  EXPECT_EQ(cuda::current_stream(0), mine);
  EXPECT_FALSE(cuda_allocator::capture_underway());
}

}  // namespace
}  // namespace kiln
