// sync_debug_cuda_test: the sync debug mode (engine/cuda/sync_debug.h). Off reports nothing;
// warn prints one line per call site naming the caller's file:line; error throws kiln::Error
// with that text before waiting; AllowSync names a wait for its scope on its thread, nested or
// not; each waiting API and wrapper is seen, and the calls that never wait (asynchronous pinned
// copies, device-to-device copies, events waited for on a stream) are not; the Loader's next()
// raises nothing in its steady state under error. Runs under the simulator (label sim) and on a
// GPU (label gpu), where it checks the same things.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "data/loader.h"
#include "data/sampler.h"
#include "data/synthetic.h"
#include "engine/cuda/caching_allocator.h"
#include "engine/cuda/context.h"
#include "engine/cuda/pinned_allocator.h"
#include "engine/cuda/sync_calls.h"
#include "engine/cuda/sync_debug.h"
#include "engine/error.h"
#include "engine/ops.h"
#include "engine/parallel.h"
#include "support/cuda_skip.h"

namespace kiln {
namespace {

using cuda::AllowSync;
using cuda::SyncDebug;

const Device kCuda("cuda:0");

// Sets a mode for one test, zeroes the counts, and leaves the mode off afterwards.
class SyncDebugTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KILN_SKIP_WITHOUT_CUDA();
    set_num_threads(1);
    cuda::set_sync_debug_mode(SyncDebug::Off);
    // Made with the mode off: uploading them is a wait of its own.
    device_ = Tensor::from_vector<float>({1.5f, 2.5f}, {2}, kCuda);
    scalar_ = Tensor::from_vector<float>({4.0f}, {1}, kCuda);
    cuda::synchronize();
    cuda::reset_sync_debug_counts();
  }
  void TearDown() override {
    cuda::set_sync_debug_mode(SyncDebug::Off);
    cuda::reset_sync_debug_counts();
  }
  // The line the warn mode prints for a wait at this file's `line`.
  static std::string line_for(const std::string& what, int line) {
    return "kiln: sync debug: " + what + " waits for the device at tests/cuda/"
           "sync_debug_cuda_test.cpp:" + std::to_string(line) + "\n";
  }

  Tensor device_, scalar_;
};

TEST_F(SyncDebugTest, OffReportsNothing) {
  cuda::set_sync_debug_mode(SyncDebug::Off);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(scalar_.item(), 4.0);
  cuda::synchronize();
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  EXPECT_EQ(cuda::sync_debug_counts().checked, 0);
}

TEST_F(SyncDebugTest, WarnPrintsTheCallSiteOnce) {
  cuda::set_sync_debug_mode(SyncDebug::Warn);
  ::testing::internal::CaptureStderr();
  int line = 0;
  for (int i = 0; i < 3; ++i) {
    line = __LINE__; EXPECT_EQ(scalar_.item(), 4.0);  // NOLINT: the call on the line read
  }
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(err, line_for("Tensor::item() (a blocking device->host copy)", line));
  const cuda::SyncDebugCounts c = cuda::sync_debug_counts();
  EXPECT_EQ(c.checked, 3);
  EXPECT_EQ(c.reported, 3);
  EXPECT_EQ(c.allowed, 0);
  EXPECT_EQ(c.sites, 1);
}

TEST_F(SyncDebugTest, ErrorThrowsWithTheCallSite) {
  cuda::set_sync_debug_mode(SyncDebug::Error);
  int line = 0;
  try {
    line = __LINE__; cuda::synchronize();  // NOLINT: the call on the line read
    FAIL() << "cuda::synchronize() did not throw under KILN_SYNC_DEBUG=error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Runtime);
    const std::string want = line_for("cuda::synchronize() (cudaStreamSynchronize)", line);
    EXPECT_EQ(std::string(e.what()).rfind(want.substr(0, want.size() - 1), 0), 0u) << e.what();
    EXPECT_NE(std::string(e.what()).find("AllowSync"), std::string::npos) << e.what();
  }
  // Every waiting tensor read throws too, and names its own API.
  try {
    (void)device_.to_vector<float>();
    FAIL() << "to_vector() did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Tensor::to_vector() (a blocking device->host copy)"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(SyncDebugTest, AllowSyncNamesAWaitAndNests) {
  cuda::set_sync_debug_mode(SyncDebug::Error);
  EXPECT_FALSE(cuda::sync_allowed());
  {
    AllowSync outer("the loss, read once per log interval");
    EXPECT_EQ(std::string(cuda::sync_allowance()), "the loss, read once per log interval");
    {
      AllowSync inner("the accuracy, read once per epoch");
      EXPECT_EQ(std::string(cuda::sync_allowance()), "the accuracy, read once per epoch");
      EXPECT_EQ(scalar_.item(), 4.0);
    }
    EXPECT_TRUE(cuda::sync_allowed());
    EXPECT_EQ(std::string(cuda::sync_allowance()), "the loss, read once per log interval");
    EXPECT_EQ(device_.to_vector<float>(), (std::vector<float>{1.5f, 2.5f}));
  }
  EXPECT_FALSE(cuda::sync_allowed());
  EXPECT_EQ(cuda::sync_allowance(), nullptr);
  EXPECT_THROW((void)scalar_.item(), Error);
  const cuda::SyncDebugCounts c = cuda::sync_debug_counts();
  EXPECT_EQ(c.checked, 3);
  EXPECT_EQ(c.allowed, 2);
  EXPECT_EQ(c.reported, 1);
}

// An allowance is the calling thread's: another thread's wait is still reported.
TEST_F(SyncDebugTest, AllowSyncIsPerThread) {
  cuda::set_sync_debug_mode(SyncDebug::Error);
  AllowSync allow("this thread's waits");
  bool threw = false;
  std::thread other([&] {
    try {
      (void)scalar_.item();
    } catch (const Error&) {
      threw = true;
    }
  });
  other.join();
  EXPECT_TRUE(threw);
  EXPECT_EQ(scalar_.item(), 4.0);  // allowed here
}

// Every API that waits is seen (one report each); the calls that never block are not.
TEST_F(SyncDebugTest, EveryWaitingApiIsSeenAndNothingElse) {
  cuda::set_sync_debug_mode(SyncDebug::Warn);
  ::testing::internal::CaptureStderr();
  const Tensor host = Tensor::from_vector<float>({1.0f, 2.0f}, {2});
  const Tensor pinned = host.pin_memory();
  int64_t expected = 0;
  auto seen = [&](const char* what) {
    ++expected;
    EXPECT_EQ(cuda::sync_debug_counts().reported, expected) << what << " was not reported";
  };
  auto unseen = [&](const char* what) {
    EXPECT_EQ(cuda::sync_debug_counts().reported, expected) << what << " was reported";
  };
  // Never waits: asynchronous pinned copies both ways, a device-to-device copy, an event a
  // stream waits for, an event never recorded.
  Tensor up = pinned.to(kCuda, /*non_blocking=*/true);
  unseen("a non_blocking copy from pinned memory");
  Tensor down_pinned = Tensor::empty({2}).pin_memory();
  down_pinned.copy_(up, /*non_blocking=*/true);
  unseen("a non_blocking copy into pinned memory");
  Tensor same = up.clone();
  unseen("a device-to-device copy");
  cuda::Event event;
  event.synchronize();
  unseen("synchronize() of an event never recorded");
  event.record();
  event.wait();
  unseen("Event::wait()");
  // Waits.
  event.synchronize();
  seen("Event::synchronize()");
  cuda::synchronize();
  seen("cuda::synchronize()");
  EXPECT_THROW((void)same.item(), Error);  // two elements: item() refuses before any copy
  unseen("item() of a 2-element tensor");
  (void)scalar_.item();
  seen("Tensor::item()");
  (void)up.to_vector<float>();
  seen("Tensor::to_vector()");
  (void)up.to(Device());
  seen("Tensor::to(cpu)");
  (void)host.to(kCuda);
  seen("Tensor::to(cuda) from pageable memory");
  (void)pinned.to(kCuda);
  seen("Tensor::to(cuda) from pinned memory with non_blocking=false");
  Tensor down = Tensor::empty({2});
  down.copy_(up);
  seen("Tensor::copy_() to the host");
  (void)Tensor::from_vector<float>({3.0f}, {1}, kCuda);
  seen("Tensor::from_vector() onto a device");
  cuda::device_synchronize();
  seen("cuda::device_synchronize()");
  (void)cuda::stream_synchronize_nothrow(cuda::current_stream());
  seen("cuda::stream_synchronize_nothrow()");
  // The caches: release_cached() waits (cudaFree / cudaFreeHost) when it has blocks to free.
  { Tensor scratch = Tensor::empty({1024}, DType::F32, kCuda); }
  cuda_allocator::release_cached(0);
  EXPECT_GT(cuda::sync_debug_counts().reported, expected) << "release_cached() was not reported";
  expected = cuda::sync_debug_counts().reported;
  { Tensor scratch = Tensor::empty({1024}).pin_memory(); }
  pinned_allocator::release_cached();
  EXPECT_GT(cuda::sync_debug_counts().reported, expected)
      << "pinned_allocator::release_cached() was not reported";
  const std::string err = ::testing::internal::GetCapturedStderr();
  for (const char* what :
       {"cuda::Event::synchronize() (cudaEventSynchronize)",
        "cuda::synchronize() (cudaStreamSynchronize)",
        "Tensor::item() (a blocking device->host copy)",
        "Tensor::to_vector() (a blocking device->host copy)",
        "Tensor::to() (a blocking device->host copy)",
        "Tensor::to() (a blocking host->device copy from pageable memory)",
        "Tensor::to() (a blocking host->device copy from pinned memory)",
        "Tensor::copy_() (a blocking device->host copy)",
        "Tensor::from_vector() (a blocking host->device copy from pageable memory)",
        "cudaDeviceSynchronize", "cuda_allocator::release_cached() (cudaFree)",
        "pinned_allocator::release_cached() (cudaFreeHost)"}) {
    EXPECT_NE(err.find(std::string("kiln: sync debug: ") + what + " waits for the device at "),
              std::string::npos)
        << "no report of " << what << " in:\n"
        << err;
  }
}

// A destructor's wait (the *_nothrow wrapper) is printed under error, never thrown.
TEST_F(SyncDebugTest, NothrowWaitsPrintUnderError) {
  cuda::set_sync_debug_mode(SyncDebug::Error);
  ::testing::internal::CaptureStderr();
  int line = 0;
  cudaError_t result = cudaSuccess;
  line = __LINE__; result = cuda::stream_synchronize_nothrow(cuda::current_stream());  // NOLINT
  EXPECT_EQ(result, cudaSuccess);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(err, "kiln: sync debug: cudaStreamSynchronize waits for the device at "
                 "tests/cuda/sync_debug_cuda_test.cpp:" + std::to_string(line) +
                     " (not thrown: a path that must not throw)\n");
}

TEST(SyncDebugMode, ParsesTheEnvironmentsSpellings) {
  EXPECT_EQ(cuda::parse_sync_debug(""), SyncDebug::Off);
  EXPECT_EQ(cuda::parse_sync_debug("off"), SyncDebug::Off);
  EXPECT_EQ(cuda::parse_sync_debug("0"), SyncDebug::Off);
  EXPECT_EQ(cuda::parse_sync_debug("warn"), SyncDebug::Warn);
  EXPECT_EQ(cuda::parse_sync_debug("1"), SyncDebug::Warn);
  EXPECT_EQ(cuda::parse_sync_debug("error"), SyncDebug::Error);
  EXPECT_EQ(cuda::parse_sync_debug("2"), SyncDebug::Error);
  try {
    (void)cuda::parse_sync_debug("eror");
    FAIL() << "a misspelt mode was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Usage);
    EXPECT_NE(std::string(e.what()).find("use off, warn or error"), std::string::npos);
  }
}

// The Loader's steady state waits for nothing: next() hands out a batch on the device, whose
// copy the compute stream waits for on the GPU. Epochs of batches consumed by device work under
// error, with workers and without, raise nothing.
TEST_F(SyncDebugTest, LoaderNextInTheSteadyStateRaisesNothing) {
  const SyntheticDataset data(96, {1, 6, 6}, 10, 5);
  for (int workers : {0, 2}) {
    SCOPED_TRACE("workers " + std::to_string(workers));
    LoaderOptions o;
    o.batch_size = 8;
    o.workers = workers;
    o.prefetch = 2;
    o.device = kCuda;
    Loader loader(data, std::make_shared<RandomSampler>(data.size(), 1), o);
    cuda::set_sync_debug_mode(SyncDebug::Error);
    Tensor total = Tensor::zeros({1}, DType::F32, kCuda);
    int64_t batches = 0;
    for (int64_t epoch = 0; epoch < 3; ++epoch) {
      loader.start_epoch(epoch);
      for (Batch b; loader.next(b);) {
        EXPECT_EQ(b.inputs.device(), kCuda);
        total = total + sum(b.inputs);
        ++batches;
      }
    }
    EXPECT_EQ(batches, 3 * 12);
    EXPECT_EQ(cuda::sync_debug_counts().reported, 0);
    cuda::set_sync_debug_mode(SyncDebug::Off);
    EXPECT_TRUE(std::isfinite(total.item()));
  }
}

}  // namespace
}  // namespace kiln
