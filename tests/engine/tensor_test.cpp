// Tensor basics: factories, metadata, conversions, views, copies, devices, allocator stats.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/allocator.h"
#include "engine/error.h"
#include "engine/sanitizer.h"
#include "engine/build_config.h"
#include "engine/tensor.h"
#include "support/process_stats.h"

using namespace kiln;

TEST(Device, ParsesSpecs) {
  EXPECT_EQ(Device("cpu"), Device(DeviceType::CPU, 0));
  EXPECT_EQ(Device("cpu:3"), Device(DeviceType::CPU, 3));
  EXPECT_EQ(Device("cuda"), Device(DeviceType::CUDA, 0));
  EXPECT_EQ(Device("cuda:1").str(), "cuda:1");
  for (const char* bad : {"gpu", "cuda:", "cuda:x", "cpu:-1", "", "cuda:1:2"}) {
    try {
      Device d(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.exit_code(), 2);
      EXPECT_NE(std::string(e.what()).find("cpu, cpu:N, cuda or cuda:N"), std::string::npos);
    }
  }
}

TEST(Tensor, FactoriesAndMetadata) {
  Tensor t = Tensor::full({2, 3}, 1.5);
  EXPECT_EQ(t.shape(), (Shape{2, 3}));
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.dtype(), DType::F32);
  EXPECT_EQ(t.size(-1), 3);
  EXPECT_THROW(t.size(2), Error);
  for (float v : t.to_vector<float>()) EXPECT_EQ(v, 1.5f);
  EXPECT_EQ(Tensor::zeros({4}, DType::I64).to_vector<int64_t>(), std::vector<int64_t>(4, 0));
  EXPECT_EQ(t.str(), "Tensor f32 [2, 3] on cpu:0");
  EXPECT_FALSE(Tensor().defined());
}

TEST(Tensor, DataChecksDtype) {
  Tensor t = Tensor::zeros({2});
  EXPECT_NO_THROW(t.data<float>());
  EXPECT_THROW(t.data<double>(), Error);
}

TEST(Tensor, ConvertsDtypes) {
  Tensor t = Tensor::from_vector<float>({1.5f, -2.f, 3.f}, {3});
  EXPECT_EQ(t.to(DType::I32).to_vector<int32_t>(), (std::vector<int32_t>{1, -2, 3}));
  EXPECT_EQ(t.to(DType::F64).to_vector<double>(), (std::vector<double>{1.5, -2, 3}));
  EXPECT_DOUBLE_EQ(Tensor::full({1}, 7.0).item(), 7.0);
  EXPECT_THROW(t.item(), Error);
}

TEST(Tensor, ReshapeSharesStorageAndChecksSize) {
  Tensor t = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor r = t.reshape({3, -1});
  EXPECT_EQ(r.shape(), (Shape{3, 2}));
  r.data<float>()[0] = 42;
  EXPECT_EQ(t.to_vector<float>()[0], 42);
  EXPECT_THROW(t.reshape({4, 2}), Error);
  EXPECT_THROW(t.reshape({-1, -1}), Error);
  EXPECT_EQ(Tensor::zeros({2, 3, 4, 5}).flatten(1).shape(), (Shape{2, 60}));
}

TEST(Tensor, CloneIsDeepDetachIsShallow) {
  Tensor t = Tensor::from_vector<float>({1, 2}, {2});
  Tensor c = t.clone(), d = t.detach();
  t.data<float>()[1] = 9;
  EXPECT_EQ(c.to_vector<float>()[1], 2);
  EXPECT_EQ(d.to_vector<float>()[1], 9);
}

TEST(Tensor, CpuIndicesAreDistinctPlaces) {
  Tensor t = Tensor::from_vector<float>({1, 2, 3}, {3});
  Tensor u = t.to("cpu:1");
  EXPECT_EQ(u.device(), Device("cpu:1"));
  EXPECT_NE(u.raw_data(), t.raw_data());
  EXPECT_EQ(u.to_vector<float>(), t.to_vector<float>());
  EXPECT_TRUE(t.to("cpu:0").same(t));
}

TEST(Tensor, MissingCudaDeviceIsAClearError) {
  // Without a CUDA backend cuda:0 is missing; with one (a GPU build, the simulator), cuda:63 is.
  const std::string missing = kWithCuda ? "cuda:63" : "cuda:0";
  try {
    Tensor::zeros({2}, DType::F32, Device(missing));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
  }
}

TEST(Allocator, ReusesBlocksAndTracksPeak) {
  cpu_allocator::reset_peak();
  MemoryStats before = cpu_allocator::stats();
  void* first = nullptr;
  {
    Tensor t = Tensor::empty({1 << 20});  // 4 MiB
    first = t.raw_data();
    EXPECT_GE(cpu_allocator::stats().current_bytes, before.current_bytes + (4 << 20));
  }
  MemoryStats mid = cpu_allocator::stats();
  EXPECT_EQ(mid.current_bytes, before.current_bytes);
  EXPECT_GE(mid.peak_bytes, before.current_bytes + (4 << 20));
  Tensor again = Tensor::empty({1 << 20});
  EXPECT_EQ(again.raw_data(), first) << "a freed block of the same size should be reused";
  EXPECT_EQ(cpu_allocator::stats().os_allocs, mid.os_allocs);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(again.raw_data()) % 64, 0u);
}

// An allocation that cannot succeed is kiln::OutOfMemory (a runtime error the apps map to the
// flags that chose the size), with the allocator's numbers and what to do.
TEST(Allocator, FailureIsOutOfMemoryWithTheRequest) {
#if KILN_ASAN
  GTEST_SKIP() << "AddressSanitizer aborts on a request above its maximum instead of failing it";
#endif
  const size_t huge = size_t{1} << 60;  // 1 EiB: beyond any address space in use
  try {
    cpu_allocator::allocate(huge);
    FAIL() << "allocating 1 EiB succeeded";
  } catch (const OutOfMemory& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Runtime);
    EXPECT_NE(std::string(e.what()).find("out of CPU memory allocating " + std::to_string(huge)),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("smaller batch size"), std::string::npos) << e.what();
  }
}

// A smaller request takes a cached block up to 1.5x its size (the smaller last batch of an
// epoch reuses the full batches' blocks), and nothing larger.
TEST(Allocator, SmallerRequestsReuseCachedBlocksWithinHalfAgain) {
  cpu_allocator::release_cached();
  void* block = nullptr;
  {
    Tensor full = Tensor::empty({1 << 20});  // 4 MiB
    block = full.raw_data();
  }
  const MemoryStats cached = cpu_allocator::stats();
  {
    Tensor smaller = Tensor::empty({3 << 18});  // 3 MiB: 4/3 of it is within 1.5x
    EXPECT_EQ(smaller.raw_data(), block);
    EXPECT_EQ(cpu_allocator::stats().os_allocs, cached.os_allocs);
    EXPECT_EQ(cpu_allocator::stats().current_bytes, cached.current_bytes + (4 << 20))
        << "the block's whole size is in use";
  }
  EXPECT_EQ(cpu_allocator::stats().current_bytes, cached.current_bytes);
  Tensor half = Tensor::empty({1 << 19});  // 2 MiB: the 4 MiB block is twice that
  EXPECT_NE(half.raw_data(), block);
  EXPECT_EQ(cpu_allocator::stats().os_allocs, cached.os_allocs + 1);
}

// release_cached() gives the memory back to the OS every time. It did not after the first
// time when blocks came from malloc: glibc raised its mmap threshold to the size of the freed
// chunks, the next blocks came from the heap, and freeing them left the heap resident.
TEST(Allocator, ReleaseCachedReturnsMemoryToTheOs) {
  if (KILN_ASAN_ENABLED) GTEST_SKIP() << "under AddressSanitizer freed blocks wait in its quarantine";
  // Small objects allocated between the blocks and kept (as a training step's autograd nodes
  // are) stop a heap from shrinking back over the freed blocks.
  std::vector<std::unique_ptr<char[]>> small;
  auto touch_and_free = [&small] {
    std::vector<Tensor> blocks;
    for (int i = 0; i < 8; ++i) {
      blocks.push_back(Tensor::empty({1 << 20}));  // 8 x 4 MiB
      std::memset(blocks.back().raw_data(), 1, size_t{4} << 20);
      small.push_back(std::make_unique<char[]>(256));
    }
    blocks.clear();
    cpu_allocator::release_cached();
  };
  touch_and_free();
  const int64_t baseline = kiln::testing::resident_bytes();
  ASSERT_GT(baseline, 0) << "/proc/self/statm is not readable";
  for (int round = 0; round < 3; ++round) {
    touch_and_free();
    EXPECT_LT(kiln::testing::resident_bytes(), baseline + (8 << 20))
        << "round " << round << ": 32 MiB freed and released are still resident";
  }
  EXPECT_EQ(cpu_allocator::stats().reserved_bytes, cpu_allocator::stats().current_bytes);
}

TEST(Allocator, FreeingAForeignPointerIsAnError) {
  int not_ours = 0;
  EXPECT_THROW(cpu_allocator::deallocate(&not_ours, sizeof not_ours), Error);
}

// cpu:N share one pool but count their bytes apart: a pipeline stage reports its own peak.
TEST(Allocator, CountsBytesPerCpuDevice) {
  cpu_allocator::reset_peak(3);
  MemoryStats before3 = cpu_allocator::stats(3), before0 = cpu_allocator::stats(0);
  {
    Tensor t = Tensor::empty({1 << 18}, DType::F32, Device("cpu:3"));  // 1 MiB
    EXPECT_EQ(cpu_allocator::stats(3).current_bytes, before3.current_bytes + (1 << 20));
    EXPECT_EQ(cpu_allocator::stats(0).current_bytes, before0.current_bytes);
  }
  EXPECT_EQ(cpu_allocator::stats(3).current_bytes, before3.current_bytes);
  EXPECT_EQ(cpu_allocator::stats(3).peak_bytes, before3.current_bytes + (1 << 20));
  cpu_allocator::reset_peak(3);
  EXPECT_EQ(cpu_allocator::stats(3).peak_bytes, before3.current_bytes);
}

TEST(Tensor, RowsAreAViewOfTheBatch) {
  Tensor t = Tensor::from_vector<float>({0, 1, 2, 3, 4, 5, 6, 7}, {4, 2});
  Tensor mid = t.rows(1, 3);
  EXPECT_EQ(mid.shape(), (Shape{2, 2}));
  EXPECT_EQ(mid.to_vector<float>(), (std::vector<float>{2, 3, 4, 5}));
  mid.fill_(9);  // shares storage
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{0, 1, 9, 9, 9, 9, 6, 7}));
  EXPECT_EQ(t.rows(4, 4).numel(), 0);
  EXPECT_THROW(t.rows(3, 5), Error);
  Tensor w = Tensor::ones({2, 2});
  w.set_requires_grad(true);
  EXPECT_THROW(w.rows(0, 1), Error);
}
