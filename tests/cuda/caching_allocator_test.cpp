// caching_allocator_test.cpp: the CUDA caching allocator (engine/cuda/caching_allocator.h).
//
// Statistics are global per device and shared by every test of this binary, so each test
// compares differences from a snapshot, and uses sizes no other test uses.
// Covered: size rounding; a freed block is reused for the next request of its rounded size with
// no new cudaMalloc; free lists are per stream (another stream or host thread never gets the
// block); record_stream delays reuse until the other stream's work is done; current / peak /
// reserved / cudaMalloc count; release_cached; per-device statistics; bad frees; many threads;
// under the simulator, blocks handed out full of NaN and (with AddressSanitizer) their slack
// poisoned.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <thread>
#include <vector>

#include "engine/allocator.h"
#include "engine/cuda/caching_allocator.h"
#include "engine/cuda/check.h"
#include "engine/cuda/context.h"
#include "engine/error.h"
#include "engine/tensor.h"
#include "support/cuda_skip.h"

namespace kiln {
namespace {

constexpr size_t kKiB = 1024, kMiB = 1024 * 1024;

// A stream of cuda:0 that is not any thread's current stream.
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

TEST(CachingAllocator, RoundsSmallTo512BytesAndLargeTo2MiB) {
  using cuda_allocator::round_size;
  EXPECT_EQ(round_size(0), 512u);
  EXPECT_EQ(round_size(1), 512u);
  EXPECT_EQ(round_size(512), 512u);
  EXPECT_EQ(round_size(513), 1024u);
  EXPECT_EQ(round_size(kMiB), kMiB);  // the largest "small" request
  EXPECT_EQ(round_size(kMiB + 1), 2 * kMiB);
  EXPECT_EQ(round_size(2 * kMiB), 2 * kMiB);
  EXPECT_EQ(round_size(3 * kMiB + 1), 4 * kMiB);
}

TEST(CachingAllocator, SameRoundedSizeReusesTheBlock) {
  KILN_SKIP_WITHOUT_CUDA();
  void* first = cuda_allocator::allocate(3000, 0);
  const int64_t mallocs = cuda_allocator::stats(0).os_allocs;
  cuda_allocator::deallocate(first);
  void* second = cuda_allocator::allocate(2900, 0);  // also rounds to 3072
  EXPECT_EQ(second, first);
  EXPECT_EQ(cuda_allocator::stats(0).os_allocs, mallocs);  // no new cudaMalloc
  void* other_size = cuda_allocator::allocate(3100, 0);   // 3584: another size class
  EXPECT_NE(other_size, first);
  EXPECT_EQ(cuda_allocator::stats(0).os_allocs, mallocs + 1);
  cuda_allocator::deallocate(second);
  cuda_allocator::deallocate(other_size);

  // Through tensors: a training loop's second step allocates nothing new.
  auto step = [] {
    Tensor a = Tensor::empty({37, 41}, DType::F32, Device(DeviceType::CUDA, 0));
    Tensor b = Tensor::zeros({37, 41}, DType::F64, Device(DeviceType::CUDA, 0));
    a.copy_(b);
  };
  step();
  const int64_t after_first_step = cuda_allocator::stats(0).os_allocs;
  for (int i = 0; i < 5; ++i) step();
  EXPECT_EQ(cuda_allocator::stats(0).os_allocs, after_first_step);
}

TEST(CachingAllocator, FreeListsArePerStream) {
  KILN_SKIP_WITHOUT_CUDA();
  ExtraStream other;
  cudaStream_t mine = cuda::current_stream(0);
  const size_t size = 5 * kKiB + 100;
  void* a = cuda_allocator::allocate(size, 0, mine);
  cuda_allocator::deallocate(a);
  const int64_t mallocs = cuda_allocator::stats(0).os_allocs;
  // Another stream never gets a block freed on this one: it may still be read by queued work.
  void* b = cuda_allocator::allocate(size, 0, other.stream);
  EXPECT_NE(b, a);
  EXPECT_EQ(cuda_allocator::stats(0).os_allocs, mallocs + 1);
  // The block's own stream does.
  void* c = cuda_allocator::allocate(size, 0, mine);
  EXPECT_EQ(c, a);
  cuda_allocator::deallocate(b);
  cuda_allocator::deallocate(c);
  // A block freed on the other stream goes back to that stream's list.
  void* d = cuda_allocator::allocate(size, 0, other.stream);
  EXPECT_EQ(d, b);
  cuda_allocator::deallocate(d);

  // Host threads have their own streams, so the same holds between threads.
  void* from_thread = nullptr;
  std::thread([&] {
    from_thread = cuda_allocator::allocate(7 * kKiB, 0);
    cuda_allocator::deallocate(from_thread);
  }).join();
  void* here = cuda_allocator::allocate(7 * kKiB, 0);
  EXPECT_NE(here, from_thread);
  cuda_allocator::deallocate(here);
}

TEST(CachingAllocator, RecordStreamDelaysReuseUntilTheOtherStreamIsDone) {
  KILN_SKIP_WITHOUT_CUDA();
  ExtraStream other;
  const size_t size = 9 * kKiB;
  void* a = cuda_allocator::allocate(size, 0);
  cuda_allocator::record_stream(a, other.stream);  // e.g. a copy stream reads the block
  cuda_allocator::deallocate(a);
  KILN_CUDA_CHECK(cudaStreamSynchronize(other.stream));
  // Once the other stream's work up to the free has completed, the block is reused as usual.
  void* b = cuda_allocator::allocate(size, 0);
  EXPECT_EQ(b, a);
  cuda_allocator::deallocate(b);
  EXPECT_THROW(cuda_allocator::record_stream(b, other.stream), Error);  // no longer allocated
}

TEST(CachingAllocator, StatisticsCurrentPeakReserved) {
  KILN_SKIP_WITHOUT_CUDA();
  cuda_allocator::reset_peak(0);
  const MemoryStats base = cuda_allocator::stats(0);
  EXPECT_EQ(base.peak_bytes, base.current_bytes);
  EXPECT_GE(base.reserved_bytes, base.current_bytes);

  void* big = cuda_allocator::allocate(3 * kMiB + 5, 0);  // rounds to 4 MiB
  void* small = cuda_allocator::allocate(kMiB - 7, 0);    // rounds to 1 MiB
  MemoryStats s = cuda_allocator::stats(0);
  EXPECT_EQ(s.current_bytes - base.current_bytes, static_cast<int64_t>(5 * kMiB));
  EXPECT_EQ(s.peak_bytes - base.current_bytes, static_cast<int64_t>(5 * kMiB));
  EXPECT_GE(s.reserved_bytes - base.reserved_bytes, 0);
  EXPECT_GE(s.reserved_bytes, s.current_bytes);

  cuda_allocator::deallocate(big);
  MemoryStats freed = cuda_allocator::stats(0);
  EXPECT_EQ(freed.current_bytes - base.current_bytes, static_cast<int64_t>(kMiB));
  EXPECT_EQ(freed.peak_bytes, s.peak_bytes);          // the high-water mark stays
  EXPECT_EQ(freed.reserved_bytes, s.reserved_bytes);  // cached, not returned to the driver
  cuda_allocator::reset_peak(0);
  EXPECT_EQ(cuda_allocator::stats(0).peak_bytes, freed.current_bytes);
  cuda_allocator::deallocate(small);
  EXPECT_EQ(cuda_allocator::stats(0).current_bytes, base.current_bytes);
}

TEST(CachingAllocator, ReleaseCachedReturnsFreeBlocksToTheDriver) {
  KILN_SKIP_WITHOUT_CUDA();
  void* keep = cuda_allocator::allocate(11 * kKiB, 0);
  void* drop = cuda_allocator::allocate(13 * kKiB, 0);
  cuda_allocator::deallocate(drop);
  MemoryStats before = cuda_allocator::stats(0);
  EXPECT_GT(before.reserved_bytes, before.current_bytes);
  cuda_allocator::release_cached(0);
  MemoryStats after = cuda_allocator::stats(0);
  EXPECT_EQ(after.reserved_bytes, after.current_bytes);  // only blocks in use remain
  EXPECT_EQ(after.current_bytes, before.current_bytes);
  // The next request of the released size needs a new cudaMalloc.
  void* again = cuda_allocator::allocate(13 * kKiB, 0);
  EXPECT_EQ(cuda_allocator::stats(0).os_allocs, after.os_allocs + 1);
  cuda_allocator::deallocate(again);
  cuda_allocator::deallocate(keep);
  cuda_allocator::release_cached();  // every device
  EXPECT_EQ(cuda_allocator::stats(0).reserved_bytes, cuda_allocator::stats(0).current_bytes);
}

TEST(CachingAllocator, StatisticsArePerDevice) {
  KILN_SKIP_WITHOUT_CUDA_DEVICES(2);
  const MemoryStats zero_before = cuda_allocator::stats(0);
  const MemoryStats one_before = cuda_allocator::stats(1);
  Tensor t = Tensor::empty({3 * 1024 * 1024}, DType::U8, Device(DeviceType::CUDA, 1));
  EXPECT_EQ(cuda_allocator::stats(1).current_bytes - one_before.current_bytes,
            static_cast<int64_t>(4 * kMiB));
  EXPECT_EQ(cuda_allocator::stats(0).current_bytes, zero_before.current_bytes);
}

TEST(CachingAllocator, ZeroBytesAndBadFrees) {
  KILN_SKIP_WITHOUT_CUDA();
  void* a = cuda_allocator::allocate(0, 0);
  void* b = cuda_allocator::allocate(0, 0);
  EXPECT_NE(a, nullptr);
  EXPECT_NE(a, b);
  cuda_allocator::deallocate(a);
  EXPECT_THROW(cuda_allocator::deallocate(a), Error);  // double free
  int not_a_block = 0;
  EXPECT_THROW(cuda_allocator::deallocate(&not_a_block), Error);
  cuda_allocator::deallocate(b);
  cuda_allocator::deallocate(nullptr);  // a no-op, like free(nullptr)
}

TEST(CachingAllocator, ManyThreadsAllocateAndFree) {
  KILN_SKIP_WITHOUT_CUDA();
  const int64_t base = cuda_allocator::stats(0).current_bytes;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t] {
      std::mt19937 gen(static_cast<uint32_t>(t));
      std::vector<void*> held;
      for (int i = 0; i < 300; ++i) {
        held.push_back(cuda_allocator::allocate(gen() % (64 * kKiB), 0));
        if (gen() % 3 == 0) {
          cuda_allocator::deallocate(held.back());
          held.pop_back();
        }
      }
      for (void* p : held) cuda_allocator::deallocate(p);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(cuda_allocator::stats(0).current_bytes, base);
}

#if KILN_CUDA_SIM
// Under the simulator every block handed out holds NaN, fresh or reused: a kernel that leaves
// part of its output unwritten produces NaN there, which every parity test notices, instead of
// a stale value that may happen to be right.
TEST(CachingAllocatorSim, BlocksAreHandedOutFullOfNaN) {
  const Device dev(DeviceType::CUDA, 0);
  auto all_nan = [](const Tensor& t) {
    for (double v : t.to(Device()).to_vector<double>())
      if (!std::isnan(v)) return false;
    return true;
  };
  Tensor a = Tensor::empty({1001}, DType::F32, dev);  // a fresh block
  EXPECT_TRUE(all_nan(a));
  a.zero_();
  void* first = a.raw_data();
  a = Tensor();                                       // back to the free list, holding zeros
  Tensor b = Tensor::empty({1001}, DType::F32, dev);  // the same block again
  EXPECT_EQ(b.raw_data(), first);
  EXPECT_TRUE(all_nan(b));
  EXPECT_TRUE(all_nan(Tensor::empty({77}, DType::F64, dev)));
}

#if defined(__SANITIZE_ADDRESS__)
// ...and the slack between the requested size and the rounded block is poisoned for
// AddressSanitizer: a write one element past the end is an error at once, although the block
// has room for it.
TEST(CachingAllocatorSimDeathTest, WritingPastTheEndIsCaught) {
  ::testing::FLAGS_gtest_death_test_style = "threadsafe";
  const size_t bytes = 100 * sizeof(float);  // rounded to 512
  float* p = static_cast<float*>(cuda_allocator::allocate(bytes, 0));
  // The poisoning is queued on the block's stream, like every use of the block.
  ASSERT_EQ(cudaStreamSynchronize(cuda::current_stream()), cudaSuccess);
  p[99] = 1.0f;  // the last element: fine
  EXPECT_DEATH({ p[100] = 1.0f; }, "AddressSanitizer");
  cuda_allocator::deallocate(p);
}
#endif  // __SANITIZE_ADDRESS__
#endif  // KILN_CUDA_SIM

}  // namespace
}  // namespace kiln
