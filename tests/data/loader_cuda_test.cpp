// loader_cuda_test.cpp: the Loader's CUDA path: pinned staging slots, the host->device copy on
// the loader's copy stream, the event the compute stream waits on, and slot reuse after the
// copy. Batches delivered on cuda:N must be byte-identical to the CPU loader's, for any number
// of workers, across epochs, also when the caller keeps them while later batches are copied.
// The simulator's streams are asynchronous like a GPU's, so a missing wait or record_stream
// shows up here as a corrupt batch (the file also runs with the `gpu` label on a real GPU).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "data/batch_iterator.h"
#include "data/loader.h"
#include "data/sampler.h"
#include "data/synthetic.h"
#include "data/transforms.h"
#include "engine/cuda/check.h"
#include "engine/cuda/context.h"
#include "engine/ops.h"
#include "engine/parallel.h"
#include "support/cuda_skip.h"

namespace kiln {
namespace {

struct HostBatch {
  std::vector<float> x;
  std::vector<int64_t> y;
  Shape shape;
  bool operator==(const HostBatch& o) const { return x == o.x && y == o.y && shape == o.shape; }
};

std::vector<HostBatch> epoch_of(BatchSource& source, int64_t epoch, Device expect) {
  source.start_epoch(epoch);
  std::vector<HostBatch> out;
  for (Batch b; source.next(b);) {
    EXPECT_EQ(b.inputs.device(), expect);
    EXPECT_EQ(b.labels.device(), expect);
    out.push_back({b.inputs.to_vector<float>(), b.labels.to_vector<int64_t>(), b.inputs.shape()});
  }
  return out;
}

LoaderOptions options(int workers, Device device) {
  LoaderOptions o;
  o.batch_size = 8;
  o.workers = workers;
  o.prefetch = 2;
  o.device = device;
  return o;
}

TEST(LoaderCuda, SameBatchesOnTheDeviceAsOnTheCpu) {
  KILN_SKIP_WITHOUT_CUDA();
  set_num_threads(1);
  const SyntheticDataset data(75, {1, 5, 5}, 10, 3);
  auto sampler = std::make_shared<RandomSampler>(data.size(), 8);
  Loader cpu(data, sampler, options(2, Device()));
  const std::vector<HostBatch> ref0 = epoch_of(cpu, 0, Device()), ref1 = epoch_of(cpu, 1, Device());
  ASSERT_EQ(ref0.size(), 10u);
  const int devices = cuda::device_count();
  for (int d = 0; d < std::min(devices, 2); ++d) {
    const Device gpu(DeviceType::CUDA, d);
    for (int workers : {0, 1, 2, 8}) {
      Loader loader(data, sampler, options(workers, gpu));
      EXPECT_TRUE(epoch_of(loader, 0, gpu) == ref0) << gpu.str() << ", " << workers << " workers";
      EXPECT_TRUE(epoch_of(loader, 1, gpu) == ref1) << gpu.str() << ", " << workers << " workers";
    }
  }
}

TEST(LoaderCuda, KeptBatchesAreNotOverwrittenAndComputeSeesThem) {
  KILN_SKIP_WITHOUT_CUDA();
  set_num_threads(1);
  const SyntheticDataset data(64, {1, 4, 4}, 10, 5);
  auto sampler = std::make_shared<SequentialSampler>(data.size());
  auto transform = std::make_shared<const Compose>(
      Shape{1, 4, 4}, std::vector<std::shared_ptr<const Transform>>{
                          std::make_shared<RandomCrop>(4, 1),
                          std::make_shared<Normalize>(std::vector<float>{0.5f},
                                                      std::vector<float>{0.5f})});
  LoaderOptions cpu_options = options(2, Device());
  cpu_options.transform = transform;
  cpu_options.seed = 4;
  Loader cpu(data, sampler, cpu_options);
  const std::vector<HostBatch> ref = epoch_of(cpu, 3, Device());
  const Device gpu(DeviceType::CUDA, 0);
  LoaderOptions gpu_options = cpu_options;
  gpu_options.device = gpu;
  Loader loader(data, sampler, gpu_options);
  // Keep all batches (the slots are recycled under them many times) and compute on them on the
  // consumer's stream: a kernel queued after next() must see the copied data.
  loader.start_epoch(3);
  std::vector<Batch> kept;
  std::vector<Tensor> doubled;
  for (Batch b; loader.next(b);) {
    doubled.push_back(mul(b.inputs, 2.0));
    kept.push_back(b);
  }
  ASSERT_EQ(kept.size(), ref.size());
  // Device target: slots never leave the loader; the pool grows only while copies are still
  // queued, up to twice its steady-state size (prefetch + workers).
  EXPECT_LE(loader.slots_allocated(), 2 * (2 + 2));
  for (size_t i = 0; i < kept.size(); ++i) {
    EXPECT_EQ(kept[i].inputs.to_vector<float>(), ref[i].x) << i;
    EXPECT_EQ(kept[i].labels.to_vector<int64_t>(), ref[i].y) << i;
    std::vector<float> twice = ref[i].x;
    for (float& v : twice) v *= 2;
    EXPECT_EQ(doubled[i].to_vector<float>(), twice) << i;
  }
}

// Holds the current compute stream with a host function until release() or `limit`, whichever
// comes first. The host function waits only for the host thread or a clock, never for CUDA
// work, so it keeps cudaLaunchHostFunc's contract; released() says whether the host thread got
// there before the limit.
class StreamHold {
 public:
  explicit StreamHold(std::chrono::seconds limit) {
    state_.store(kHeld);
    deadline_ = std::chrono::steady_clock::now() + limit;
    KILN_CUDA_CHECK(cudaLaunchHostFunc(cuda::current_stream(), &StreamHold::run, this));
  }
  ~StreamHold() {
    release();
    cuda::synchronize();  // the host function reads this object
  }
  // Opens the stream; returns false when the limit had opened it already.
  bool release() {
    int expected = kHeld;
    return state_.compare_exchange_strong(expected, kReleased) || expected == kReleased;
  }

 private:
  static constexpr int kHeld = 0, kReleased = 1, kTimedOut = 2;
  static void run(void* self) {
    auto* hold = static_cast<StreamHold*>(self);
    while (hold->state_.load() == kHeld) {
      if (std::chrono::steady_clock::now() > hold->deadline_) {
        int expected = kHeld;
        hold->state_.compare_exchange_strong(expected, kTimedOut);
        break;
      }
      std::this_thread::yield();
    }
  }
  std::atomic<int> state_{kHeld};
  std::chrono::steady_clock::time_point deadline_;
};

// The consumer drops a batch while its compute stream is still busy with work that reads it,
// then takes more batches while the compute stream stays held. Two properties:
//  - next() never waits for the compute stream: the later batches arrive while it is held
//    (each next() allocates device memory here, an implicit synchronisation that holds the
//    new copies behind the held stream: a loader that waits for a slot's last copy waits for
//    the compute stream);
//  - the dropped batch's blocks belong to the loader's copy stream; only the record_stream on
//    the compute stream keeps the allocator from handing them to a later copy, which would
//    overwrite the batch before the queued work has read it.
TEST(LoaderCuda, DroppedBatchStaysIntactForQueuedCompute) {
  KILN_SKIP_WITHOUT_CUDA();
  set_num_threads(1);
  const SyntheticDataset data(48, {1, 4, 4}, 10, 6);
  auto sampler = std::make_shared<SequentialSampler>(data.size());
  Loader cpu(data, sampler, options(0, Device()));
  const std::vector<HostBatch> ref = epoch_of(cpu, 0, Device());
  const Device gpu(DeviceType::CUDA, 0);
  for (int workers : {0, 2}) {
    SCOPED_TRACE(std::to_string(workers) + " workers");
    Loader loader(data, sampler, options(workers, gpu));
    loader.start_epoch(0);
    Batch first;
    ASSERT_TRUE(loader.next(first));
    cuda::DeviceGuard guard(0);
    std::vector<Batch> later;
    Tensor doubled;
    {
      StreamHold hold(std::chrono::seconds(10));
      doubled = mul(first.inputs, 2.0);  // queued behind the held stream
      first = Batch();                   // dropped: its blocks are freed now
      for (Batch b; later.size() < 4 && loader.next(b);) later.push_back(b);
      EXPECT_TRUE(hold.release())
          << "Loader::next() waited for the held compute stream (10 s) before returning 4 "
             "batches";
    }
    std::vector<float> twice = ref[0].x;
    for (float& v : twice) v *= 2;
    EXPECT_EQ(doubled.to_vector<float>(), twice);
    ASSERT_EQ(later.size(), 4u);
    for (size_t i = 0; i < later.size(); ++i)
      EXPECT_EQ(later[i].inputs.to_vector<float>(), ref[i + 1].x) << i + 1;
  }
}

// While the device is behind, the pool grows rather than next() waiting, up to twice its
// steady-state size (prefetch + max(workers, 1) = 3 here, so 6); past that, the next batch
// takes the oldest slot and waits for its copy before overwriting the pinned memory the DMA
// still reads. The compute stream is held for 2 s; every copy in that window is behind it
// (each next() allocates device memory: an implicit synchronisation), so the 7th batch waits
// out the hold, and every batch must still arrive intact.
TEST(LoaderCuda, AtTheSlotLimitNextWaitsForTheOldestCopy) {
  KILN_SKIP_WITHOUT_CUDA();
  set_num_threads(1);
  const SyntheticDataset data(80, {1, 4, 4}, 10, 7);
  auto sampler = std::make_shared<SequentialSampler>(data.size());
  Loader cpu(data, sampler, options(0, Device()));
  const std::vector<HostBatch> ref = epoch_of(cpu, 0, Device());
  const Device gpu(DeviceType::CUDA, 0);
  Loader loader(data, sampler, options(0, gpu));
  loader.start_epoch(0);
  cuda::DeviceGuard guard(0);
  std::vector<Batch> kept;
  {
    StreamHold hold(std::chrono::seconds(2));
    for (Batch b; kept.size() < 7 && loader.next(b);) kept.push_back(b);
    EXPECT_EQ(loader.slots_allocated(), 6);
    EXPECT_FALSE(hold.release()) << "the 7th batch did not wait for the oldest slot's copy";
  }
  ASSERT_EQ(kept.size(), 7u);
  for (size_t i = 0; i < kept.size(); ++i) {
    EXPECT_EQ(kept[i].inputs.to_vector<float>(), ref[i].x) << i;
    EXPECT_EQ(kept[i].labels.to_vector<int64_t>(), ref[i].y) << i;
  }
}

TEST(LoaderCuda, PinMemoryOnACpuTarget) {
  KILN_SKIP_WITHOUT_CUDA();
  const SyntheticDataset data(20, {1, 3, 3}, 10, 1);
  auto sampler = std::make_shared<SequentialSampler>(data.size());
  LoaderOptions o = options(1, Device());
  o.pin_memory = true;
  Loader loader(data, sampler, o);
  BatchIterator reference(data, sampler, 8);
  loader.start_epoch(0);
  reference.start_epoch(0);
  for (Batch b, r; loader.next(b);) {
    ASSERT_TRUE(reference.next(r));
    EXPECT_TRUE(b.inputs.is_pinned());
    EXPECT_EQ(b.inputs.device(), Device());
    // The point of pinning: the caller may copy asynchronously.
    const Tensor on_gpu = b.inputs.to(Device(DeviceType::CUDA, 0), /*non_blocking=*/true);
    EXPECT_EQ(on_gpu.to_vector<float>(), r.inputs.to_vector<float>());
  }
}

TEST(LoaderCuda, DestructionMidEpoch) {
  KILN_SKIP_WITHOUT_CUDA();
  const SyntheticDataset data(200, {1, 4, 4}, 10, 1);
  auto sampler = std::make_shared<SequentialSampler>(data.size());
  for (int workers : {0, 3}) {
    Loader loader(data, sampler, options(workers, Device(DeviceType::CUDA, 0)));
    loader.start_epoch(0);
    Batch b;
    ASSERT_TRUE(loader.next(b));
    loader.start_epoch(1);
    ASSERT_TRUE(loader.next(b));
  }
}

}  // namespace
}  // namespace kiln
