// loader_cuda_test.cpp: the Loader's CUDA path: pinned staging slots, the host->device copy on
// the loader's copy stream, the event the compute stream waits on, and slot reuse after the
// copy. Batches delivered on cuda:N must be byte-identical to the CPU loader's, for any number
// of workers, across epochs, also when the caller keeps them while later batches are copied.
// The simulator's streams are asynchronous like a GPU's, so a missing wait or record_stream
// shows up here as a corrupt batch (the file also runs with the `gpu` label on a real GPU).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
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
  EXPECT_LE(loader.slots_allocated(), 2 + 2);  // device target: slots never leave the loader
  for (size_t i = 0; i < kept.size(); ++i) {
    EXPECT_EQ(kept[i].inputs.to_vector<float>(), ref[i].x) << i;
    EXPECT_EQ(kept[i].labels.to_vector<int64_t>(), ref[i].y) << i;
    std::vector<float> twice = ref[i].x;
    for (float& v : twice) v *= 2;
    EXPECT_EQ(doubled[i].to_vector<float>(), twice) << i;
  }
}

// The consumer drops a batch while its compute stream is still busy with work that reads it.
// The batch's blocks belong to the loader's copy stream; only the record_stream on the compute
// stream keeps the allocator from handing them to the next copy, which would overwrite the
// batch before the queued work has read it. A host function holds the compute stream until the
// later batches have been copied, the widest possible window.
TEST(LoaderCuda, DroppedBatchStaysIntactForQueuedCompute) {
  KILN_SKIP_WITHOUT_CUDA();
  set_num_threads(1);
  const SyntheticDataset data(48, {1, 4, 4}, 10, 6);
  auto sampler = std::make_shared<SequentialSampler>(data.size());
  Loader cpu(data, sampler, options(0, Device()));
  const std::vector<HostBatch> ref = epoch_of(cpu, 0, Device());
  const Device gpu(DeviceType::CUDA, 0);
  Loader loader(data, sampler, options(0, gpu));
  loader.start_epoch(0);
  Batch first;
  ASSERT_TRUE(loader.next(first));
  cuda::DeviceGuard guard(0);
  static std::atomic<int> open{0};
  open = 0;
  KILN_CUDA_CHECK(cudaLaunchHostFunc(
      cuda::current_stream(),
      [](void*) {
        while (open.load() == 0) std::this_thread::yield();
      },
      nullptr));
  const Tensor doubled = mul(first.inputs, 2.0);  // queued behind the held stream
  first = Batch();                                // dropped: its blocks are freed now
  std::vector<Batch> later;
  for (Batch b; later.size() < 4 && loader.next(b);) later.push_back(b);
  open = 1;
  std::vector<float> twice = ref[0].x;
  for (float& v : twice) v *= 2;
  EXPECT_EQ(doubled.to_vector<float>(), twice);
  for (size_t i = 0; i < later.size(); ++i)
    EXPECT_EQ(later[i].inputs.to_vector<float>(), ref[i + 1].x) << i + 1;
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
