// resnet.cpp: the ResNet family of models/resnet.h, built like torchvision's resnet.py.
#include "models/resnet.h"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/init.h"
#include "engine/memory_format.h"
#include "engine/ops.h"
#include "engine/serialize.h"
#include "layers/activation.h"
#include "layers/layout.h"

namespace kiln {

namespace {

// torchvision initialises convolutions with kaiming_normal_(mode="fan_out",
// nonlinearity="relu"): N(0, 2 / fan_out), fan_out = out_channels * k * k.
std::shared_ptr<Conv2d> make_conv(int64_t in, int64_t out, int64_t k, int64_t stride,
                                  int64_t padding) {
  auto conv = std::make_shared<Conv2d>(in, out, k, stride, padding, /*bias=*/false);
  normal_(conv->weight, 0.0, std::sqrt(2.0 / static_cast<double>(out * k * k)));
  return conv;
}

ConvBn make_conv_bn(int64_t in, int64_t out, int64_t k, int64_t stride, int64_t padding) {
  return ConvBn{make_conv(in, out, k, stride, padding), std::make_shared<BatchNorm2d>(out)};
}

// The stem and the head are pieces (ResNet::pieces()) that share the model's modules under
// the model's own names, so a piece's state_dict keys are the model's.
class ResNetStem : public Module {
 public:
  ResNetStem(ConvBn* c1, std::shared_ptr<MaxPool2d> pool) : c1_(c1), pool_(std::move(pool)) {
    register_module("conv1", c1_->conv);
    register_module("bn1", c1_->bn);
    register_module("maxpool", pool_);
  }
  // The image comes in NCHW or channels-last (3 channels). conv1 writes its output in the
  // layout the blocks prefer on this device, or channels-last for a channels-last image
  // (layers/layout.h): from there on, activations stay in it.
  Tensor forward(const Tensor& x) override {
    const Layout layout = preferred_layout(x, c1_->conv->weight.size(0));
    const Tensor image = layout == Layout::NHWC ? x : as_layout(x, Layout::NCHW);
    return pool_->forward(c1_->forward(image, BatchNormActivation::Relu, layout));
  }
  std::string type_name() const override { return "ResNetStem"; }
  void drop_bn() { remove_module("bn1"); }

 private:
  ConvBn* c1_;  // owned by the ResNet
  std::shared_ptr<MaxPool2d> pool_;
};

class ResNetHead : public Module {
 public:
  ResNetHead(std::shared_ptr<AdaptiveAvgPool2d> pool, std::shared_ptr<Linear> fc)
      : pool_(std::move(pool)), fc_(std::move(fc)) {
    register_module("avgpool", pool_);
    register_module("fc", fc_);
  }
  Tensor forward(const Tensor& x) override {
    if (is_channel_blocked(x)) {
      // The global average of (N, C/16, H, W, 16) over H and W is (N, C/16, 16): channel
      // cb * 16 + l, i.e. (N, C) once flattened. No conversion needed.
      return fc_->forward(mean(x, {2, 3}).flatten(1));
    }
    if (x.is_channels_last()) {
      // Channels-last is, byte for byte, (N, H * W, C): the average over its middle dimension
      // is (N, C). No conversion needed.
      const Tensor pixels = reinterpret_view(x, {x.size(0), x.size(2) * x.size(3), x.size(1)},
                                             MemoryFormat::Contiguous);
      return fc_->forward(mean(pixels, {1}));
    }
    return fc_->forward(pool_->forward(x).flatten(1));
  }
  std::string type_name() const override { return "ResNetHead"; }

 private:
  std::shared_ptr<AdaptiveAvgPool2d> pool_;
  std::shared_ptr<Linear> fc_;
};

}  // namespace

ResNetConfig resnet_config(const std::string& name, int64_t num_classes) {
  static const std::map<std::string, ResNetConfig> known{
      {"resnet18", {ResNetBlock::Basic, {2, 2, 2, 2}}},
      {"resnet34", {ResNetBlock::Basic, {3, 4, 6, 3}}},
      {"resnet50", {ResNetBlock::Bottleneck, {3, 4, 6, 3}}},
      {"resnet101", {ResNetBlock::Bottleneck, {3, 4, 23, 3}}},
      {"resnet152", {ResNetBlock::Bottleneck, {3, 8, 36, 3}}},
  };
  auto it = known.find(name);
  KILN_CHECK_INPUT(it != known.end(), "unknown model '", name,
                   "': use resnet18, resnet34, resnet50, resnet101 or resnet152");
  KILN_CHECK_INPUT(num_classes >= 1, "a ResNet needs at least 1 class, got ", num_classes);
  ResNetConfig config = it->second;
  config.num_classes = num_classes;
  return config;
}

// ---- ConvBn --------------------------------------------------------------------------------

Tensor ConvBn::forward(const Tensor& x, BatchNormActivation activation,
                       std::optional<Layout> out_layout) const {
  Tensor y = out_layout ? conv->forward(x, *out_layout) : conv->forward(x);
  if (bn) return bn->forward(y, activation);
  return activation == BatchNormActivation::Relu ? relu(y) : y;
}

void ConvBn::fold() {
  KILN_CHECK(bn && !bn->is_training(), "fold_batch_norms: the model must be in eval mode ",
             "(call eval() first): folding uses the running statistics");
  NoGradGuard no_grad;
  // Eval-mode BN is y = x * scale + shift per channel, with scale = weight / sqrt(var + eps)
  // and shift = bias - mean * scale. Applied to conv(x) = w * x: w' = w * scale[k] on every
  // output channel k, and bias' = shift. Computed once, on the host, in double.
  const Device device = conv->weight.device();
  const DType dtype = conv->weight.dtype();
  auto host = [](const Tensor& t) { return t.to(Device()).to(DType::F64); };
  const MemoryFormat format = conv->weight.memory_format();
  // In the shape's order for the loop below; back in the weight's own format after.
  Tensor w = host(conv->weight).contiguous();
  Tensor mean = host(bn->running_mean()), var = host(bn->running_var());
  Tensor gamma = bn->weight().defined() ? host(bn->weight()) : Tensor::ones(mean.shape(), DType::F64);
  Tensor beta = bn->bias().defined() ? host(bn->bias()) : Tensor::zeros(mean.shape(), DType::F64);
  const int64_t k = w.size(0), per_k = w.numel() / k;
  Tensor b = Tensor::empty({k}, DType::F64);
  double* wp = w.data<double>();
  for (int64_t o = 0; o < k; ++o) {
    const double scale = gamma.data<double>()[o] / std::sqrt(var.data<double>()[o] + bn->eps());
    for (int64_t i = 0; i < per_k; ++i) wp[o * per_k + i] *= scale;
    b.data<double>()[o] = beta.data<double>()[o] - mean.data<double>()[o] * scale;
  }
  conv->weight.set_data(w.to(dtype).to(device).to(format));
  conv->set_bias(b.to(dtype).to(device));
  bn.reset();
}


// ---- Blocks --------------------------------------------------------------------------------

void ResidualBlock::add_conv_bn(int64_t in, int64_t out, int64_t k, int64_t stride) {
  main_.push_back(make_conv_bn(in, out, k, stride, k / 2));
  const std::string n = std::to_string(main_.size());
  register_module("conv" + n, main_.back().conv);
  register_module("bn" + n, main_.back().bn);
  blockable_ = blockable_ && in % kChannelBlock == 0 && out % kChannelBlock == 0;
}

void ResidualBlock::add_downsample(int64_t in, int64_t out, int64_t stride) {
  down_ = make_conv_bn(in, out, 1, stride, 0);
  register_module("downsample", std::make_shared<Sequential>(
                                    std::vector<std::shared_ptr<Module>>{down_.conv, down_.bn}));
}

Tensor ResidualBlock::forward(const Tensor& input) {
  // The channel-blocked layout where that is fast for this input and every channel count of the
  // block is a multiple of 16 (layers/layout.h); NCHW otherwise.
  // A channels-last input stays channels-last.
  const Tensor x = as_layout(input, blockable_ || input.is_channels_last()
                                        ? preferred_layout(input, kChannelBlock)
                                        : Layout::NCHW);
  Tensor out = x;
  for (size_t i = 0; i < main_.size(); ++i)
    out = main_[i].forward(out, i + 1 < main_.size() ? BatchNormActivation::Relu
                                                     : BatchNormActivation::None);
  return add_relu(out, down_.conv ? down_.forward(x, BatchNormActivation::None) : x);
}

void ResidualBlock::fold_batch_norms() {
  for (size_t i = 0; i < main_.size(); ++i) {
    main_[i].fold();
    remove_module("bn" + std::to_string(i + 1));
  }
  if (down_.conv) {
    down_.fold();
    child("downsample")->remove_module("1");
  }
}

BasicBlock::BasicBlock(int64_t inplanes, int64_t planes, int64_t stride, bool downsample) {
  add_conv_bn(inplanes, planes, 3, stride);
  add_conv_bn(planes, planes, 3, 1);
  if (downsample) add_downsample(inplanes, planes * kExpansion, stride);
}

Bottleneck::Bottleneck(int64_t inplanes, int64_t planes, int64_t stride, bool downsample,
                       int64_t width_per_group) {
  const int64_t width = planes * width_per_group / 64;
  add_conv_bn(inplanes, width, 1, 1);
  add_conv_bn(width, width, 3, stride);  // v1.5: the stride is on the 3x3
  add_conv_bn(width, planes * kExpansion, 1, 1);
  if (downsample) add_downsample(inplanes, planes * kExpansion, stride);
}

// ---- ResNet --------------------------------------------------------------------------------

ResNet::ResNet(const ResNetConfig& config) : config_(config) {
  const ResNetConfig& c = config;
  KILN_CHECK_INPUT(c.num_classes >= 1 && c.base_planes >= 1 && c.width_per_group >= 1 &&
                       c.in_channels >= 1,
                   "ResNet: num_classes, base_planes, width_per_group and in_channels must be "
                   ">= 1");
  for (int64_t n : c.layers)
    KILN_CHECK_INPUT(n >= 1, "ResNet: every stage needs at least one block");
  KILN_CHECK_INPUT(c.block != ResNetBlock::Bottleneck || c.base_planes * c.width_per_group >= 64,
                   "ResNet: a Bottleneck's 3x3 convolutions have base_planes * width_per_group "
                   "/ 64 channels in layer1, which is 0 for base_planes=", c.base_planes,
                   " and width_per_group=", c.width_per_group, ": raise one of them");
  const bool bottleneck = c.block == ResNetBlock::Bottleneck;
  const int64_t expansion = bottleneck ? Bottleneck::kExpansion : BasicBlock::kExpansion;

  stem_ = make_conv_bn(c.in_channels, c.base_planes, 7, 2, 3);
  register_module("conv1", stem_.conv);
  register_module("bn1", stem_.bn);
  auto maxpool = std::make_shared<MaxPool2d>(3, 2, 1);
  register_module("maxpool", maxpool);
  pieces_.push_back({"stem", std::make_shared<ResNetStem>(&stem_, maxpool)});

  int64_t inplanes = c.base_planes;
  for (int stage = 0; stage < 4; ++stage) {
    const int64_t planes = c.base_planes << stage;  // 64, 128, 256, 512
    const int64_t stride = stage == 0 ? 1 : 2;
    auto layer = std::make_shared<Sequential>();
    const std::string layer_name = "layer" + std::to_string(stage + 1);
    for (int64_t b = 0; b < c.layers[static_cast<size_t>(stage)]; ++b) {
      const int64_t s = b == 0 ? stride : 1;
      const bool down = b == 0 && (s != 1 || inplanes != planes * expansion);
      std::shared_ptr<Module> block;
      if (bottleneck)
        block = std::make_shared<Bottleneck>(inplanes, planes, s, down, c.width_per_group);
      else
        block = std::make_shared<BasicBlock>(inplanes, planes, s, down);
      layer->push_back(block);
      pieces_.push_back({layer_name + "." + std::to_string(b), block});
      inplanes = planes * expansion;
    }
    register_module(layer_name, layer);
  }
  auto avgpool = std::make_shared<AdaptiveAvgPool2d>(1);
  register_module("avgpool", avgpool);
  auto fc = std::make_shared<Linear>(inplanes, c.num_classes);
  register_module("fc", fc);
  pieces_.push_back({"head", std::make_shared<ResNetHead>(avgpool, fc)});
}

Tensor ResNet::forward(const Tensor& x) {
  const int64_t c = config_.in_channels;
  KILN_CHECK(x.defined() && x.dim() == 4 && x.size(1) == c, "ResNet: expected images as (N, ", c,
             ", H, W), got ", x.defined() ? shape_str(x.shape()) : "an undefined tensor");
  KILN_CHECK(!folded_ || !is_training(), "ResNet: this model's BatchNorms were folded for ",
             "inference; it cannot train (call eval(), or build a fresh model)");
  // The one conversion of a channels-last model: its input, at the entry (Module::to).
  Tensor y = memory_format() == MemoryFormat::ChannelsLast ? x.to(MemoryFormat::ChannelsLast) : x;
  for (const ResNetPiece& piece : pieces_) y = piece.module->forward(y);
  return y;
}

void ResNet::fold_batch_norms() {
  KILN_CHECK(!folded_, "ResNet::fold_batch_norms: already folded");
  KILN_CHECK(!is_training(), "ResNet::fold_batch_norms: call eval() first: folding uses the ",
             "running statistics");
  stem_.fold();
  remove_module("bn1");
  std::static_pointer_cast<ResNetStem>(pieces_.front().module)->drop_bn();
  for (const ResNetPiece& piece : pieces_)
    if (auto* block = dynamic_cast<ResidualBlock*>(piece.module.get())) block->fold_batch_norms();
  folded_ = true;
}

std::shared_ptr<ResNet> make_resnet(const ResNetConfig& config) {
  return std::make_shared<ResNet>(config);
}

std::shared_ptr<ResNet> make_resnet(const std::string& name, int64_t num_classes) {
  return make_resnet(resnet_config(name, num_classes));
}

void load_torchvision_weights(ResNet& model, const std::string& path) {
  Checkpoint ckpt = read_checkpoint(path);  // validates the file itself, naming it
  const std::string advice =
      ": export the weights with tools/export_torchvision.py for the same architecture and "
      "number of classes";
  std::map<std::string, Tensor> state = model.state_dict();
  // The model's order (parameters, then buffers), so the first mismatch named is the first a
  // reader meets in the architecture.
  NamedTensors ordered = model.named_parameters();
  for (auto& entry : model.named_buffers()) ordered.push_back(entry);
  for (const auto& [name, dst] : ordered) {
    auto it = ckpt.tensors.find(name);
    KILN_CHECK_INPUT(it != ckpt.tensors.end(), path, " has no entry '", name, "'", advice);
    KILN_CHECK_INPUT(it->second.shape() == dst.shape(), path, ": entry '", name, "' has shape ",
                     shape_str(it->second.shape()), " but this ", model.type_name(),
                     " expects ", shape_str(dst.shape()), advice);
  }
  for (const auto& [name, t] : ckpt.tensors)
    KILN_CHECK_INPUT(state.count(name), path, " has an entry '", name,
                     "' that this model does not have", advice);
  model.load_state_dict(ckpt.tensors);
}

}  // namespace kiln
