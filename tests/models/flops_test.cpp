// The model-FLOPs counter (models/flops.h, layers/flop_counter.h) against counts worked out by
// hand from each layer's shapes, and the peak table of engine/peak_flops.h.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "engine/autograd.h"
#include "engine/build_config.h"
#include "engine/ops.h"
#include "engine/peak_flops.h"
#include "engine/tensor.h"
#include "layers/conv2d.h"
#include "layers/flop_counter.h"
#include "layers/linear.h"
#include "models/flops.h"
#include "models/mnist_cnn.h"
#include "models/resnet.h"

namespace kiln {
namespace {

// 2 x multiply-adds of a k x k convolution with "same"-style output size `out` (square).
int64_t conv_flops(int64_t n, int64_t cin, int64_t cout, int64_t k, int64_t out) {
  return 2 * n * cout * out * out * cin * k * k;
}

TEST(FlopCounter, CountsConvAndLinearOnlyAndNests) {
  NoGradGuard no_grad;
  Conv2d conv(3, 8, 3, /*stride=*/2, /*padding=*/1);
  Linear fc(8 * 5 * 5, 4);
  FlopCounter outer;
  Tensor y = conv(Tensor::zeros({2, 3, 10, 10}));  // -> (2, 8, 5, 5)
  EXPECT_EQ(outer.flops(), conv_flops(2, 3, 8, 3, 5));
  {
    FlopCounter inner;
    fc(relu(y).flatten(1));  // relu is elementwise: not counted
    EXPECT_EQ(inner.flops(), 2 * 2 * 200 * 4);
  }
  EXPECT_EQ(outer.flops(), conv_flops(2, 3, 8, 3, 5) + 2 * 2 * 200 * 4);
  FlopCounter::add(5);  // no counter lost its place in the chain
  EXPECT_EQ(outer.flops(), conv_flops(2, 3, 8, 3, 5) + 2 * 2 * 200 * 4 + 5);
}

TEST(ModelFlops, MnistCnnMatchesItsLayers) {
  auto model = make_mnist_cnn();
  const int64_t per_image = conv_flops(1, 1, 32, 3, 26)     // conv1 -> 26x26
                            + conv_flops(1, 32, 64, 3, 24)  // conv2 -> 24x24
                            + 2 * 9216 * 128 + 2 * 128 * 10;  // fc1, fc2
  EXPECT_EQ(per_image, 23984896);  // the ~72 MFLOP per step of models/mnist_cnn.h, over 3
  EXPECT_EQ(forward_flops(*model, {3, 1, 28, 28}), 3 * per_image);
  EXPECT_TRUE(model->is_training());  // the mode is restored
  EXPECT_EQ(training_step_flops(per_image), 3 * per_image);
}

TEST(ModelFlops, EvalModeIsRestoredAndStateUntouched) {
  auto model = make_resnet(ResNetConfig{ResNetBlock::Basic, {1, 1, 1, 1}, 10, 16, 16});
  model->eval();
  const std::vector<float> mean = model->state_dict().at("bn1.running_mean").to_vector<float>();
  model->train();
  EXPECT_GT(forward_flops(*model, {2, 3, 32, 32}), 0);
  EXPECT_TRUE(model->is_training());
  EXPECT_EQ(model->state_dict().at("bn1.running_mean").to_vector<float>(), mean);
}

// ResNet-50 at 224x224: every convolution of the stem and the 16 bottlenecks, then the fc.
TEST(ModelFlops, ResNet50At224IsTorchvisionsFigure) {
  int64_t hand = conv_flops(1, 3, 64, 7, 112);  // stem conv 7x7/2; maxpool -> 56x56
  int64_t in = 64, size = 56;
  const int64_t planes[4] = {64, 128, 256, 512}, blocks[4] = {3, 4, 6, 3};
  for (int s = 0; s < 4; ++s) {
    for (int64_t b = 0; b < blocks[s]; ++b) {
      const int64_t p = planes[s], out = (b == 0 && s > 0) ? size / 2 : size;
      hand += conv_flops(1, in, p, 1, size)      // 1x1 reduce
              + conv_flops(1, p, p, 3, out)      // 3x3, stride 2 in a stage's first block
              + conv_flops(1, p, 4 * p, 1, out);  // 1x1 expand
      if (b == 0) hand += conv_flops(1, in, 4 * p, 1, out);  // downsample 1x1
      in = 4 * p, size = out;
    }
  }
  hand += 2 * 2048 * 1000;  // fc
  EXPECT_EQ(hand, 8178368512);
  // torchvision's model card: 4.09 GFLOPS, counting multiply-adds
  // (https://pytorch.org/vision/stable/models/generated/torchvision.models.resnet50.html).
  EXPECT_NEAR(hand / 2 / 1e9, 4.09, 0.005);
  auto model = make_resnet("resnet50");
  EXPECT_EQ(forward_flops(*model, {1, 3, 224, 224}), hand);
}

TEST(ModelFlops, MfuNeedsAKnownPeak) {
  EXPECT_DOUBLE_EQ(achieved_flops_per_second(3000, 1.5), 2000);
  EXPECT_FALSE(mfu(1e12, std::nullopt));
  EXPECT_DOUBLE_EQ(*mfu(1e12, 4e12), 0.25);
}

TEST(PeakFlops, KnownGpusByName) {
  const PeakFlops h100 = gpu_peak_flops("NVIDIA H100 80GB HBM3");
  EXPECT_DOUBLE_EQ(*h100.at(Precision::BF16), 989.5e12);
  EXPECT_DOUBLE_EQ(*h100.at(Precision::FP32), 67e12);
  EXPECT_DOUBLE_EQ(*gpu_peak_flops("NVIDIA H100 PCIe").at(Precision::BF16), 756.5e12);
  EXPECT_DOUBLE_EQ(*gpu_peak_flops("NVIDIA H200").at(Precision::TF32), 494.5e12);
  EXPECT_DOUBLE_EQ(*gpu_peak_flops("NVIDIA A100-SXM4-80GB").at(Precision::FP16), 312e12);
  EXPECT_DOUBLE_EQ(*gpu_peak_flops("NVIDIA A100 80GB PCIe").at(Precision::TF32), 156e12);
  EXPECT_FALSE(gpu_peak_flops("NVIDIA GeForce GTX 1080").at(Precision::FP32));
}

TEST(PeakFlops, CpuAndSimulatorHaveNone) {
  const PeakFlops cpu = peak_flops(Device("cpu"));
  EXPECT_FALSE(cpu.at(Precision::FP32));
  EXPECT_FALSE(cpu.simulated);
  if constexpr (cuda::kSimulated) {
    const PeakFlops sim = peak_flops(Device("cuda:0"));
    EXPECT_TRUE(sim.simulated);
    EXPECT_FALSE(sim.at(Precision::BF16));
  }
}

}  // namespace
}  // namespace kiln
