// caching_allocator_pool_test.cpp: the CUDA caching allocator's private pools (point 5 of
// engine/cuda/caching_allocator.h), the memory of a CUDA graph capture.
//
// No capture is made here: a pool is what the allocator does between begin_allocate_to_pool
// and end_allocate_to_pool, with or without one (tests/cuda/graph_test.cpp captures for real).
// Statistics are global per device, so each test compares differences from a snapshot and
// uses sizes no other test here uses.
// Covered: a pool's blocks keep their addresses and are never handed to eager allocations
// while the pool lives (neither freed during the capture nor after it), nor to another pool,
// nor returned by release_cached(); frees during the capture are reused inside the pool;
// release_pool returns the cached blocks to the driver and the blocks still in use once they
// are freed; eager allocations on other streams are unaffected; record_stream frees during a
// capture wait for its end; misuse errors; many threads.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "engine/allocator.h"
#include "engine/cuda/caching_allocator.h"
#include "engine/cuda/check.h"
#include "engine/cuda/context.h"
#include "engine/error.h"
#include "support/cuda_skip.h"

namespace kiln {
namespace {

namespace ca = cuda_allocator;
constexpr size_t kKiB = 1024, kMiB = 1024 * 1024;

// A stream of cuda:0 that is not any thread's current stream: the "capturing" stream.
struct ExtraStream {
  cudaStream_t stream = nullptr;
  ExtraStream() {
    cuda::DeviceGuard guard(0);
    KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  }
  ~ExtraStream() {
    (void)cudaStreamSynchronize(stream);
    (void)cudaStreamDestroy(stream);
  }
};

TEST(CachingAllocatorPool, FreesDuringTheCaptureAreReusedInsideThePool) {
  KILN_SKIP_WITHOUT_CUDA();
  ExtraStream capture;
  const ca::PoolId pool = ca::create_pool();
  const int64_t mallocs = ca::stats(0).os_allocs;
  ca::begin_allocate_to_pool(0, pool, capture.stream);
  EXPECT_TRUE(ca::capture_underway());
  // A step's temporaries: allocated, freed, and the same sizes again, as an eager step would.
  void* a = ca::allocate(21 * kKiB, 0, capture.stream);
  void* b = ca::allocate(23 * kKiB, 0, capture.stream);
  ca::deallocate(a);
  void* c = ca::allocate(21 * kKiB - 100, 0, capture.stream);  // the same rounded size
  EXPECT_EQ(c, a);
  ca::deallocate(b);
  ca::deallocate(c);
  EXPECT_EQ(ca::allocate(23 * kKiB, 0, capture.stream), b);
  EXPECT_EQ(ca::stats(0).os_allocs, mallocs + 2);  // the step's footprint: two blocks
  ca::deallocate(b);
  ca::end_allocate_to_pool(0, pool);
  EXPECT_FALSE(ca::capture_underway());
  ca::release_pool(0, pool);
}

TEST(CachingAllocatorPool, BlocksNeverGoToEagerAllocationsWhileThePoolLives) {
  KILN_SKIP_WITHOUT_CUDA();
  ExtraStream capture;
  const size_t freed_in_capture = 31 * kKiB, output = 33 * kKiB;
  const ca::PoolId pool = ca::create_pool();
  ca::begin_allocate_to_pool(0, pool, capture.stream);
  void* temp = ca::allocate(freed_in_capture, 0, capture.stream);
  void* out = ca::allocate(output, 0, capture.stream);  // outlives the capture
  ca::deallocate(temp);
  ca::end_allocate_to_pool(0, pool);

  // Eager allocations of the same sizes on the same stream get other blocks: the graph's
  // kernels still use these addresses at every replay.
  void* eager_temp = ca::allocate(freed_in_capture, 0, capture.stream);
  EXPECT_NE(eager_temp, temp);
  ca::deallocate(out);  // the output is freed after the capture: back to the pool
  void* eager_out = ca::allocate(output, 0, capture.stream);
  EXPECT_NE(eager_out, out);
  ca::deallocate(eager_temp);
  ca::deallocate(eager_out);

  // A second capture into the same pool reuses both, and eager's blocks are not taken.
  ca::begin_allocate_to_pool(0, pool, capture.stream);
  void* again_temp = ca::allocate(freed_in_capture, 0, capture.stream);
  void* again_out = ca::allocate(output, 0, capture.stream);
  EXPECT_EQ(again_temp, temp);
  EXPECT_EQ(again_out, out);
  ca::deallocate(again_temp);
  ca::deallocate(again_out);
  ca::end_allocate_to_pool(0, pool);
  ca::release_pool(0, pool);
}

TEST(CachingAllocatorPool, APoolDoesNotTakeEagerBlocksAndOtherStreamsAreUnaffected) {
  KILN_SKIP_WITHOUT_CUDA();
  ExtraStream capture;
  const cudaStream_t mine = cuda::current_stream(0);
  const size_t size = 41 * kKiB;
  void* eager_on_capture_stream = ca::allocate(size, 0, capture.stream);
  void* eager_on_mine = ca::allocate(size, 0, mine);
  ca::deallocate(eager_on_capture_stream);
  ca::deallocate(eager_on_mine);

  const ca::PoolId pool = ca::create_pool();
  ca::begin_allocate_to_pool(0, pool, capture.stream);
  const int64_t mallocs = ca::stats(0).os_allocs;
  void* in_pool = ca::allocate(size, 0, capture.stream);  // not the stream's cached block
  EXPECT_NE(in_pool, eager_on_capture_stream);
  EXPECT_EQ(ca::stats(0).os_allocs, mallocs + 1);
  // Meanwhile this thread's own stream allocates eagerly, from its own free list.
  void* eager_again = ca::allocate(size, 0, mine);
  EXPECT_EQ(eager_again, eager_on_mine);
  EXPECT_EQ(ca::stats(0).os_allocs, mallocs + 1);
  ca::deallocate(eager_again);
  ca::deallocate(in_pool);
  ca::end_allocate_to_pool(0, pool);

  // After the capture the stream's eager block is its own again.
  void* after = ca::allocate(size, 0, capture.stream);
  EXPECT_EQ(after, eager_on_capture_stream);
  ca::deallocate(after);
  ca::release_pool(0, pool);
}

TEST(CachingAllocatorPool, TwoPoolsDoNotShareBlocks) {
  KILN_SKIP_WITHOUT_CUDA();
  ExtraStream capture;
  const size_t size = 51 * kKiB;
  const ca::PoolId first = ca::create_pool(), second = ca::create_pool();
  EXPECT_NE(first, second);
  ca::begin_allocate_to_pool(0, first, capture.stream);
  void* a = ca::allocate(size, 0, capture.stream);
  ca::deallocate(a);  // cached in the first pool
  ca::end_allocate_to_pool(0, first);
  ca::begin_allocate_to_pool(0, second, capture.stream);
  void* b = ca::allocate(size, 0, capture.stream);
  EXPECT_NE(b, a);
  ca::deallocate(b);
  ca::end_allocate_to_pool(0, second);
  ca::release_pool(0, first);
  ca::release_pool(0, second);
}

TEST(CachingAllocatorPool, ReleaseCachedKeepsALivePoolsBlocks) {
  KILN_SKIP_WITHOUT_CUDA();
  ExtraStream capture;
  const size_t size = 3 * kMiB;  // rounds to 4 MiB
  const ca::PoolId pool = ca::create_pool();
  ca::begin_allocate_to_pool(0, pool, capture.stream);
  void* a = ca::allocate(size, 0, capture.stream);
  ca::deallocate(a);
  ca::end_allocate_to_pool(0, pool);
  ca::release_cached(0);
  // Only the pool's block is cached: a graph's freed temporary keeps its address.
  const MemoryStats s = ca::stats(0);
  EXPECT_EQ(s.reserved_bytes - s.current_bytes, static_cast<int64_t>(4 * kMiB));
  ca::begin_allocate_to_pool(0, pool, capture.stream);
  void* again = ca::allocate(size, 0, capture.stream);
  EXPECT_EQ(again, a);
  EXPECT_EQ(ca::stats(0).os_allocs, s.os_allocs);
  ca::deallocate(again);
  ca::end_allocate_to_pool(0, pool);
  ca::release_pool(0, pool);
}

TEST(CachingAllocatorPool, ReleaseReturnsThePoolsMemoryToTheDriver) {
  KILN_SKIP_WITHOUT_CUDA();
  ExtraStream capture;
  ca::release_cached(0);
  const MemoryStats base = ca::stats(0);
  const ca::PoolId pool = ca::create_pool();
  ca::begin_allocate_to_pool(0, pool, capture.stream);
  void* temp = ca::allocate(5 * kMiB, 0, capture.stream);  // 6 MiB
  void* out = ca::allocate(7 * kMiB, 0, capture.stream);   // 8 MiB, outlives the pool
  ca::deallocate(temp);
  ca::end_allocate_to_pool(0, pool);
  MemoryStats s = ca::stats(0);
  EXPECT_EQ(s.os_allocs, base.os_allocs + 2);
  EXPECT_EQ(s.reserved_bytes - base.reserved_bytes, static_cast<int64_t>(14 * kMiB));
  EXPECT_EQ(s.current_bytes - base.current_bytes, static_cast<int64_t>(8 * kMiB));

  ca::release_pool(0, pool);  // the cached block goes to the driver now
  s = ca::stats(0);
  EXPECT_EQ(s.reserved_bytes - base.reserved_bytes, static_cast<int64_t>(8 * kMiB));
  // The output, freed after its pool is gone, is not eager memory either: a replay may still
  // read it. The next release_cached() returns it.
  ca::deallocate(out);
  void* eager = ca::allocate(7 * kMiB, 0, capture.stream);
  EXPECT_NE(eager, out);
  ca::deallocate(eager);
  ca::release_cached(0);
  s = ca::stats(0);
  EXPECT_EQ(s.reserved_bytes, base.reserved_bytes);
  EXPECT_EQ(s.current_bytes, base.current_bytes);
  EXPECT_THROW(ca::begin_allocate_to_pool(0, pool, capture.stream), Error);  // released
}

TEST(CachingAllocatorPool, RecordStreamFreesDuringACaptureWaitForItsEnd) {
  KILN_SKIP_WITHOUT_CUDA();
  ExtraStream capture, other;
  const cudaStream_t mine = cuda::current_stream(0);
  const size_t size = 61 * kKiB;
  void* a = ca::allocate(size, 0, mine);
  ca::record_stream(a, other.stream);
  const ca::PoolId pool = ca::create_pool();
  ca::begin_allocate_to_pool(0, pool, capture.stream);
  // Freed during the capture: no event may be recorded or polled now, so the block is not
  // reused, however long ago the other stream finished.
  ca::deallocate(a);
  KILN_CUDA_CHECK(cudaStreamSynchronize(other.stream));
  void* during = ca::allocate(size, 0, mine);
  EXPECT_NE(during, a);
  ca::deallocate(during);
  ca::end_allocate_to_pool(0, pool);
  // After the capture the free goes the usual way (point 3): the next allocation records the
  // event on the other stream, and once that stream has reached it the block is reused.
  void* x = ca::allocate(size, 0, mine);
  KILN_CUDA_CHECK(cudaStreamSynchronize(other.stream));
  void* y = ca::allocate(size, 0, mine);
  EXPECT_TRUE(x == a || y == a);
  ca::deallocate(x);
  ca::deallocate(y);
  ca::release_pool(0, pool);
}

TEST(CachingAllocatorPool, Misuse) {
  KILN_SKIP_WITHOUT_CUDA();
  ExtraStream capture;
  const ca::PoolId pool = ca::create_pool(), other = ca::create_pool();
  ca::begin_allocate_to_pool(0, pool, capture.stream);
  EXPECT_THROW(ca::begin_allocate_to_pool(0, other, capture.stream), Error);  // one at a time
  EXPECT_THROW(ca::release_pool(0, pool), Error);  // still allocating to it
  EXPECT_THROW(ca::release_cached(0), Error);      // cudaFree during a capture
  EXPECT_THROW(ca::release_cached(), Error);
  ca::end_allocate_to_pool(0, pool);
  ca::release_pool(0, pool);
  EXPECT_THROW(ca::release_pool(0, pool), Error);  // twice
  EXPECT_THROW(ca::begin_allocate_to_pool(0, 12345678, capture.stream), Error);  // never made
  ca::release_pool(0, other);  // never used: fine
}

// Threads allocate eagerly, each on its own stream, while this one allocates to pools: no
// address of a live pool is ever handed to them.
TEST(CachingAllocatorPool, ManyThreadsNeverGetAPoolsBlocks) {
  KILN_SKIP_WITHOUT_CUDA();
  ExtraStream capture;
  const int64_t base = ca::stats(0).current_bytes;
  const ca::PoolId pool = ca::create_pool();
  std::mutex mu;
  std::set<void*> eager_seen;
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([t, &mu, &eager_seen] {
      std::mt19937 gen(static_cast<uint32_t>(t));
      std::vector<void*> held;
      for (int i = 0; i < 200; ++i) {
        held.push_back(ca::allocate(gen() % (16 * kKiB), 0));
        {
          std::lock_guard<std::mutex> lock(mu);
          eager_seen.insert(held.back());
        }
        if (gen() % 2 == 0) {
          ca::deallocate(held.back());
          held.pop_back();
        }
      }
      for (void* p : held) ca::deallocate(p);
    });
  }
  std::set<void*> pool_blocks;
  std::mt19937 gen(99);
  for (int round = 0; round < 20; ++round) {
    ca::begin_allocate_to_pool(0, pool, capture.stream);
    std::vector<void*> held;
    for (int i = 0; i < 10; ++i) {
      held.push_back(ca::allocate(gen() % (16 * kKiB), 0, capture.stream));
      pool_blocks.insert(held.back());
    }
    for (void* p : held) ca::deallocate(p);
    ca::end_allocate_to_pool(0, pool);
  }
  for (auto& th : threads) th.join();
  for (void* p : pool_blocks) EXPECT_EQ(eager_seen.count(p), 0u) << p;
  ca::release_pool(0, pool);
  EXPECT_EQ(ca::stats(0).current_bytes, base);
}

#if KILN_CUDA_SIM
// Under the simulator a pool's fresh block holds NaN at once, with no work queued on the
// stream (during a capture, queued work would be recorded into the graph): see
// hand_out_hostile_now in caching_allocator.cpp.
TEST(CachingAllocatorPoolSim, FreshBlocksAreFullOfNaNWithoutQueuedWork) {
  ExtraStream capture;
  const ca::PoolId pool = ca::create_pool();
  ca::begin_allocate_to_pool(0, pool, capture.stream);
  const size_t n = 1000;
  auto* p = static_cast<const unsigned char*>(ca::allocate(n, 0, capture.stream));
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(p[i], 0xFF) << i;
  ca::deallocate(const_cast<unsigned char*>(p));
  ca::end_allocate_to_pool(0, pool);
  ca::release_pool(0, pool);
}
#endif

}  // namespace
}  // namespace kiln
