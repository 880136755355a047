// resnet.h: the ResNet family (He, Zhang, Ren, Sun, "Deep Residual Learning for Image
// Recognition", CVPR 2016, https://arxiv.org/abs/1512.03385), laid out exactly like
// torchvision/models/resnet.py, so a torchvision state_dict loads key for key.
//
//   x (N, 3, H, W)                     (in_channels: 3; MNIST's 1 channel: ResNetConfig)
//   stem:   conv1 7x7/2 (3 -> 64), bn1, relu, maxpool 3x3/2 pad 1       -> (N, 64, H/4, W/4)
//   layer1: blocks at 64 planes, stride 1                              -> (N, 64 e, H/4, W/4)
//   layer2: 128 planes, first block stride 2                           -> (N, 128 e, H/8, W/8)
//   layer3: 256 planes, stride 2                                       -> (N, 256 e, H/16, W/16)
//   layer4: 512 planes, stride 2                                       -> (N, 512 e, H/32, W/32)
//   head:   avgpool (adaptive, 1x1), flatten, fc (512 e -> classes)    -> logits (N, classes)
// e is the block's expansion: 1 for BasicBlock (ResNet-18/34), 4 for Bottleneck (50/101/152).
// Every stride-2 layer pads, so each halving rounds up (ceil(H / 2)): any H, W >= 1 reaches
// layer4 at >= 1x1. 224x224 ends at 7x7; 28x28 (MNIST) goes 14, 7 (after the max-pool), 4, 2,
// 1, the torchvision layout unchanged.
//
// Blocks (each ends in ReLU(residual + identity)):
//   BasicBlock:  conv 3x3/s -> bn -> relu -> conv 3x3 -> bn                 (+ identity)
//   Bottleneck:  conv 1x1 -> bn -> relu -> conv 3x3/s -> bn -> relu -> conv 1x1 (x4) -> bn
// The Bottleneck is "v1.5": the stride sits on the 3x3 convolution, not the first 1x1 as in
// the paper; torchvision's form (https://catalog.ngc.nvidia.com/orgs/nvidia/resources/resnet_50_v1_5_for_pytorch).
// The identity is x itself, or downsample(x) = bn(conv 1x1/s(x)) where the shape changes.
//
// Kernels and fusion: every conv has no bias (a BN follows); each BN -> ReLU pair runs as one
// kernel (BatchNorm2d::forward(x, Relu)), and the residual join as add_relu(), so no
// activation is written twice. fold_batch_norms() turns an eval-mode model into convolutions
// with bias (BN folded into the weights) for inference. On the CPU in f32 with the oneDNN
// kernels, activations stay channel-blocked (layers/layout.h) from the stem's convolution to
// the head: no reorders around each convolution. docs/resnet.md explains both, with figures.
//
// Names follow torchvision: conv1.weight, bn1.running_mean, layer2.0.downsample.0.weight,
// layer4.1.bn2.num_batches_tracked, fc.bias ... (num_batches_tracked is [1] here, a 0-d tensor
// in PyTorch: tools/export_torchvision.py reshapes it).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "layers/batchnorm2d.h"
#include "layers/conv2d.h"
#include "layers/linear.h"
#include "layers/module.h"
#include "layers/pool2d.h"

namespace kiln {

enum class ResNetBlock { Basic, Bottleneck };

struct ResNetConfig {
  ResNetBlock block = ResNetBlock::Basic;
  std::array<int64_t, 4> layers{2, 2, 2, 2};  // blocks per stage
  int64_t num_classes = 1000;
  // Channels of the 3x3 convolutions of a Bottleneck at 64 planes (torchvision's
  // width_per_group; 64 is the standard net). Smaller values make narrow nets for tests.
  int64_t width_per_group = 64;
  // Channels of the stem and of layer1's planes (64 in every standard net). Smaller values,
  // with a smaller width_per_group, give small nets of the same depth for tests and the
  // simulator; only 64 loads torchvision weights.
  int64_t base_planes = 64;
  // Channels of the input images, the stem convolution's input: 3 (RGB, every torchvision
  // net), 1 for greyscale (MNIST). Last, so that brace-initialised configurations written
  // before it keep their meaning.
  int64_t in_channels = 3;
};

// "resnet18" | "resnet34" | "resnet50" | "resnet101" | "resnet152" -> its configuration.
// An unknown name is a usage error listing the known ones.
ResNetConfig resnet_config(const std::string& name, int64_t num_classes = 1000);

// conv -> bn, with the BN's fused ReLU when asked: the building brick of every block.
struct ConvBn {
  std::shared_ptr<Conv2d> conv;
  std::shared_ptr<BatchNorm2d> bn;  // null once folded into conv (fold_batch_norms)
  // out_layout: the activation layout of the result (layers/layout.h), by default x's.
  Tensor forward(const Tensor& x, BatchNormActivation activation,
                 std::optional<Layout> out_layout = std::nullopt) const;
  void fold();  // conv' = conv * scale, bias' = shift (eval-mode BN as an affine map)
};

// What both blocks share: a main path of conv -> BN pieces, a ReLU after each BN but the last,
// the identity (x, or downsample(x) = BN(conv 1x1/s(x))), and relu(main + identity) at the end.
// Registered as conv1, bn1, conv2, bn2, ..., downsample.0, downsample.1 (torchvision's names).
class ResidualBlock : public Module {
 public:
  Tensor forward(const Tensor& x) override;
  void fold_batch_norms();  // each BN into its convolution (eval mode; see ResNet)

 protected:
  // Adds conv{n} / bn{n} to the main path: k x k, stride, padding k / 2.
  void add_conv_bn(int64_t in, int64_t out, int64_t k, int64_t stride);
  void add_downsample(int64_t in, int64_t out, int64_t stride);

 private:
  std::vector<ConvBn> main_;
  ConvBn down_;  // conv null: the identity is x itself
  bool blockable_ = true;  // every channel count a multiple of 16 (layers/layout.h)
};

class BasicBlock : public ResidualBlock {
 public:
  static constexpr int64_t kExpansion = 1;
  BasicBlock(int64_t inplanes, int64_t planes, int64_t stride, bool downsample);
  std::string type_name() const override { return "BasicBlock"; }
};

class Bottleneck : public ResidualBlock {
 public:
  static constexpr int64_t kExpansion = 4;
  Bottleneck(int64_t inplanes, int64_t planes, int64_t stride, bool downsample,
             int64_t width_per_group = 64);
  std::string type_name() const override { return "Bottleneck"; }
};

// A named piece of the model in execution order: the unit that pipeline stages are cut from.
struct ResNetPiece {
  std::string name;  // "stem", "layer1.0", ..., "layer4.2", "head"
  std::shared_ptr<Module> module;
};

class ResNet : public Module {
 public:
  explicit ResNet(const ResNetConfig& config);
  // Not copyable: the stem piece points at this model's conv1/bn1.
  ResNet(const ResNet&) = delete;
  ResNet& operator=(const ResNet&) = delete;
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "ResNet"; }
  const ResNetConfig& config() const { return config_; }

  // The model as an ordered sequence: stem, every residual block, head. Running the pieces
  // one after another is forward(). Their modules share the model's parameters, and each
  // piece's named_parameters() are the model's with the piece's prefix dropped ("stem": conv1.*,
  // bn1.*; "head": fc.*). Between pieces the activations are in the layout the device prefers
  // (channel-blocked on the CPU, layers/layout.h); every piece accepts either layout.
  std::vector<ResNetPiece> pieces() const { return pieces_; }

  // For inference: folds every BatchNorm into the convolution before it, using the running
  // statistics (the model must be in eval mode). Afterwards the model has no BN parameters or
  // buffers, its convolutions have biases, and forward() computes the same function with one
  // pass fewer per convolution. Irreversible; training a folded model is an error.
  void fold_batch_norms();
  bool folded() const { return folded_; }

 private:
  ResNetConfig config_;
  ConvBn stem_;  // conv1, bn1
  std::vector<ResNetPiece> pieces_;
  bool folded_ = false;
};

std::shared_ptr<ResNet> make_resnet(const ResNetConfig& config);
std::shared_ptr<ResNet> make_resnet(const std::string& name, int64_t num_classes = 1000);

// Loads a state_dict written by tools/export_torchvision.py (a Kiln checkpoint of
// torchvision's tensors) into `model`. Checks every key in the model's order and throws an
// input error naming the file and the first key that is missing, unexpected or mis-shaped.
void load_torchvision_weights(ResNet& model, const std::string& path);

}  // namespace kiln
