// device_mnist_cuda_test.cpp: MNIST held on the device and gathered there (data/device_mnist.h).
// The gather kernel's CUDA twin equals its CPU twin bit for bit (every one of the 256 pixel
// values, repeated and out-of-order indices, a partial last block), and DeviceMnistBatches
// delivers, on cuda:0 and on the CPU, exactly the batches of the host pipeline (BatchIterator
// over MnistDataset with the same RandomSampler): the same order for every epoch, the smaller
// last batch, a start in the middle of an epoch, and next_into() into reused tensors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "data/batch_iterator.h"
#include "data/device_mnist.h"
#include "data/mnist.h"
#include "data/mnist_kernels.h"
#include "data/sampler.h"
#include "engine/dispatch.h"
#include "engine/error.h"
#include "support/cuda_skip.h"
#include "support/tiny_mnist.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

const Device kCpu;
const Device kCuda(DeviceType::CUDA, 0);
constexpr int64_t kPixels = 28 * 28;

// A small MNIST written as IDX files (its pixels take all 256 byte values), loaded as mnist_train
// loads the real one.
class DeviceMnistTest : public ::testing::Test {
 protected:
  static constexpr uint32_t kExamples = 300;  // batches of 64: four full ones and one of 44
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("kiln_device_mnist_" + std::to_string(getpid()));
    fs::create_directories(dir_);
    testing::write_tiny_mnist_split(dir_, "train", kExamples);
    set_ = std::make_unique<MnistDataset>(MnistDataset::load(dir_.string(), MnistSplit::Train));
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path dir_;
  std::unique_ptr<MnistDataset> set_;
};

struct HostBatch {
  std::vector<float> x;
  std::vector<int64_t> y;
  Shape shape;
};

// Every batch of `epoch` from `position` on, read back to the host.
std::vector<HostBatch> epoch_of(BatchSource& source, int64_t epoch, int64_t position = 0) {
  source.start_epoch_at(epoch, position);
  std::vector<HostBatch> out;
  for (Batch b; source.next(b);) {
    out.push_back({b.inputs.to_vector<float>(), b.labels.to_vector<int64_t>(), b.inputs.shape()});
  }
  return out;
}

void expect_same_batches(const std::vector<HostBatch>& got, const std::vector<HostBatch>& want,
                         const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t b = 0; b < want.size(); ++b) {
    EXPECT_EQ(got[b].shape, want[b].shape) << what << ", batch " << b;
    EXPECT_EQ(got[b].y, want[b].y) << what << ", batch " << b;
    // Bit for bit: == on floats would let -0.0 pass for 0.0, and no NaN is expected.
    ASSERT_EQ(got[b].x.size(), want[b].x.size()) << what << ", batch " << b;
    EXPECT_EQ(0, std::memcmp(got[b].x.data(), want[b].x.data(), got[b].x.size() * sizeof(float)))
        << what << ", batch " << b;
  }
}

// The two twins on the same bytes and indices: the same floats and labels, bit for bit.
TEST(GatherMnistBatchCuda, CudaTwinEqualsCpuTwin) {
  KILN_SKIP_WITHOUT_CUDA();
  const int64_t examples = 5;
  std::vector<uint8_t> images(static_cast<size_t>(examples * kPixels));
  for (size_t i = 0; i < images.size(); ++i) images[i] = static_cast<uint8_t>(i * 37 % 256);
  const std::vector<uint8_t> labels = {3, 1, 4, 1, 5};
  // Out of order and repeated; 7 rows x 784 pixels is not a multiple of a block of 256.
  const std::vector<int64_t> indices = {4, 0, 2, 2, 1, 3, 0};
  const int64_t rows = static_cast<int64_t>(indices.size());
  auto gather_on = [&](Device device) {
    const Tensor img = Tensor::from_vector(images, {examples, kPixels}, device);
    const Tensor lab = Tensor::from_vector(labels, {examples}, device);
    const Tensor idx = Tensor::from_vector(indices, {rows}, device);
    Tensor out = Tensor::empty({rows, kPixels}, DType::F32, device);
    Tensor out_labels = Tensor::empty({rows}, DType::I64, device);
    on_device("gather_mnist_batch", device, [&](auto backend) {
      gather_mnist_batch(backend, img.data<uint8_t>(), lab.data<uint8_t>(), kPixels,
                         idx.data<int64_t>(), rows, out.data<float>(), out_labels.data<int64_t>());
    });
    return HostBatch{out.to_vector<float>(), out_labels.to_vector<int64_t>(), out.shape()};
  };
  const HostBatch cpu = gather_on(kCpu), gpu = gather_on(kCuda);
  expect_same_batches({gpu}, {cpu}, "cuda vs cpu");
  EXPECT_EQ(cpu.y, (std::vector<int64_t>{5, 3, 4, 4, 1, 1, 3}));
  // And the CPU twin is MnistDataset's rule: row 1 is example 0, pixel p its normalised byte.
  for (int64_t p = 0; p < kPixels; ++p) {
    ASSERT_EQ(cpu.x[static_cast<size_t>(kPixels + p)],
              MnistDataset::normalize_pixel(images[static_cast<size_t>(p)]));
  }
}

// DeviceMnistBatches on cuda:0 and on the CPU hands out the host pipeline's batches.
TEST_F(DeviceMnistTest, BatchesEqualTheHostPipelines) {
  KILN_SKIP_WITHOUT_CUDA();
  auto sampler = std::make_shared<RandomSampler>(set_->size(), /*seed=*/7);
  BatchIterator host(*set_, sampler, 64);
  DeviceMnistBatches gpu(*set_, sampler, 64, kCuda);
  DeviceMnistBatches cpu(*set_, sampler, 64, kCpu);
  EXPECT_EQ(gpu.num_batches(), host.num_batches());
  for (int64_t epoch : {0, 1}) {
    const std::vector<HostBatch> want = epoch_of(host, epoch);
    ASSERT_EQ(want.size(), 5u);
    EXPECT_EQ(want.back().shape, (Shape{44, 1, 28, 28}));
    expect_same_batches(epoch_of(gpu, epoch), want, "cuda, epoch " + std::to_string(epoch));
    expect_same_batches(epoch_of(cpu, epoch), want, "cpu, epoch " + std::to_string(epoch));
    EXPECT_EQ(gpu.epoch_position(), host.epoch_position());
  }
  // An epoch started in the middle (a resumed checkpoint), at a position inside a batch.
  const std::vector<HostBatch> rest = epoch_of(host, 2, 100);
  expect_same_batches(epoch_of(gpu, 2, 100), rest, "cuda, epoch 2 from position 100");
  EXPECT_EQ(gpu.epoch_batches(), host.epoch_batches());
}

// next_into() gathers into the caller's tensors, the last, smaller batch into their first rows;
// the default of BatchSource (a copy of next()'s batch) writes the same.
TEST_F(DeviceMnistTest, NextIntoWritesTheBatchIntoReusedTensors) {
  KILN_SKIP_WITHOUT_CUDA();
  auto sampler = std::make_shared<RandomSampler>(set_->size(), /*seed=*/3);
  BatchIterator host(*set_, sampler, 64);
  DeviceMnistBatches gpu(*set_, sampler, 64, kCuda);
  const std::vector<HostBatch> want = epoch_of(host, 0);
  const Tensor x = Tensor::empty({64, 1, 28, 28}, DType::F32, kCuda);
  const Tensor y = Tensor::empty({64}, DType::I64, kCuda);
  const Tensor x_cpu = Tensor::empty({64, 1, 28, 28}, DType::F32, kCpu);
  const Tensor y_cpu = Tensor::empty({64}, DType::I64, kCpu);
  gpu.start_epoch(0);
  host.start_epoch(0);
  std::vector<HostBatch> got, got_default;
  for (int64_t rows; (rows = gpu.next_into(x, y)) > 0;) {
    got.push_back({x.rows(0, rows).to_vector<float>(), y.rows(0, rows).to_vector<int64_t>(),
                   x.rows(0, rows).shape()});
    ASSERT_EQ(host.next_into(x_cpu, y_cpu), rows);
    got_default.push_back({x_cpu.rows(0, rows).to_vector<float>(),
                           y_cpu.rows(0, rows).to_vector<int64_t>(), x_cpu.rows(0, rows).shape()});
  }
  EXPECT_EQ(host.next_into(x_cpu, y_cpu), 0);
  expect_same_batches(got, want, "DeviceMnistBatches::next_into");
  expect_same_batches(got_default, want, "BatchSource::next_into");
}

// Tensors that cannot hold the batch are refused, naming what was expected.
TEST_F(DeviceMnistTest, NextIntoRefusesTensorsThatDoNotFit) {
  KILN_SKIP_WITHOUT_CUDA();
  DeviceMnistBatches gpu(*set_, std::make_shared<SequentialSampler>(set_->size()), 64, kCuda);
  gpu.start_epoch(0);
  const Tensor y = Tensor::empty({64}, DType::I64, kCuda);
  for (const Tensor& x : {Tensor::empty({32, 1, 28, 28}, DType::F32, kCuda),   // too few rows
                          Tensor::empty({64, 1, 28, 28}, DType::F32, kCpu),    // other device
                          Tensor::empty({64, 784}, DType::F32, kCuda)}) {      // other shape
    try {
      gpu.next_into(x, y);
      ADD_FAILURE() << "accepted " << x.str();
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Usage);
      EXPECT_NE(std::string(e.what()).find("needs f32 inputs of at least 64 rows"),
                std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace kiln
