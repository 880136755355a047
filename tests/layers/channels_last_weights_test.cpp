// channels_last_weights_test.cpp: convolution weights that follow the model's memory format.
// Module::to(MemoryFormat::ChannelsLast) reorders every 4-D parameter in place (the same tensor,
// as to(Device)); conv2d reads such a weight as it lies (oneDNN: `ohwi`; the CPU hand kernels)
// and writes its gradient in that order; and everything that touches parameters stays what it
// is for NCHW ones:
//   - the optimizers (SGD with momentum, Adam, Adadelta) step a channels-last parameter to the
//     same bits as its NCHW twin, also when the model is reordered after the optimizer was
//     built, and their state_dict is in logical order;
//   - GradScaler unscales a channels-last gradient;
//   - a checkpoint is in logical order: the same file from an NCHW and a channels-last model,
//     loadable into either;
//   - fold_batch_norms keeps the weight's format and the model's outputs.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/autocast.h"
#include "engine/autograd.h"
#include "engine/impl.h"
#include "engine/memory_format.h"
#include "engine/ops.h"
#include "engine/optim/adadelta.h"
#include "engine/optim/adam.h"
#include "engine/optim/grad_scaler.h"
#include "engine/optim/sgd.h"
#include "engine/philox.h"
#include "engine/serialize.h"
#include "layers/conv2d.h"
#include "models/resnet.h"
#include "support/gradcheck.h"

namespace kiln {
namespace {

using testing::random_tensor;
using testing::rel_diff;

constexpr MemoryFormat kCl = MemoryFormat::ChannelsLast;
constexpr MemoryFormat kNchw = MemoryFormat::Contiguous;

std::shared_ptr<ResNet> small_resnet(uint64_t seed) {
  Generator gen(seed);
  GeneratorScope scope(gen);
  return make_resnet(ResNetConfig{ResNetBlock::Basic, {1, 1, 1, 1}, 10, 16, 16});
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.to_vector<float>() == b.to_vector<float>();
}

TEST(ChannelsLastWeights, ModuleToReordersFourDParametersInPlace) {
  auto model = small_resnet(3);
  const NamedTensors before = model->named_parameters();
  std::map<std::string, std::vector<float>> values;
  for (const auto& [name, p] : before) values[name] = p.to_vector<float>();
  model->to(kCl);
  const NamedTensors after = model->named_parameters();
  ASSERT_EQ(after.size(), before.size());
  int reordered = 0;
  for (size_t i = 0; i < after.size(); ++i) {
    const auto& [name, p] = after[i];
    SCOPED_TRACE(name);
    EXPECT_TRUE(p.same(before[i].second)) << "the same tensor: optimizers keep seeing it";
    EXPECT_TRUE(p.is_leaf() && p.requires_grad());
    EXPECT_EQ(p.is_channels_last(), p.dim() == 4);
    reordered += p.dim() == 4;
    EXPECT_EQ(p.to_vector<float>(), values[name]) << "the same values in another order";
  }
  EXPECT_GT(reordered, 0);
  model->to(kNchw);
  for (const auto& [name, p] : model->named_parameters()) {
    EXPECT_FALSE(p.is_channels_last()) << name;
    EXPECT_EQ(p.to_vector<float>(), values[name]) << name;
  }
}

// conv2d with a channels-last weight against the NCHW op; `conversions` counted forward and
// backward.
void check_conv(Impl impl, MemoryFormat x_format, int64_t conversions, DType autocast) {
  KernelsGuard guard(impl);
  Tensor x = random_tensor({3, 16, 9, 7}, 30, -1, 1, DType::F32);
  Tensor w = random_tensor({24, 16, 3, 3}, 31, -0.2, 0.2, DType::F32);
  Tensor b = random_tensor({24}, 32, -1, 1, DType::F32);
  auto leaf = [](Tensor t) { return t.detach().set_requires_grad(true); };
  Tensor xr = leaf(x.clone()), wr = leaf(w.clone()), br = leaf(b.clone());
  Tensor xc = leaf(x.to(x_format)), wc = leaf(w.to(kCl)), bc = leaf(b.clone());
  Tensor yr, yc;
  int64_t counted = 0;
  {
    AutocastGuard mixed(autocast, autocast != DType::F32);
    yr = conv2d(xr, wr, br, 2, 1);
    const int64_t before = memory_format_conversions();
    yc = conv2d(xc, wc, bc, 2, 1);
    counted = memory_format_conversions() - before;
  }
  const Tensor g = random_tensor(yr.shape(), 33, -1, 1, DType::F32);
  const Tensor gc = g.to(x_format);
  const int64_t before = memory_format_conversions();
  backward(yc, gc);
  counted += memory_format_conversions() - before;
  backward(yr, g);
  EXPECT_EQ(counted, conversions);
  EXPECT_EQ(yc.memory_format(), x_format);
  ASSERT_TRUE(wc.grad().is_channels_last()) << "the gradient in the weight's format";
  // The same operands, summed in another order.
  EXPECT_LT(rel_diff(yc, yr), 1e-5);
  EXPECT_LT(rel_diff(xc.grad(), xr.grad()), 1e-5);
  EXPECT_LT(rel_diff(wc.grad(), wr.grad()), 1e-5);
  EXPECT_LT(rel_diff(bc.grad(), br.grad()), 1e-5);
}

TEST(ChannelsLastWeights, OneDnnReadsAndWritesAChannelsLastWeight) {
  check_conv(Impl::Vendor, kCl, 0, DType::F32);
  check_conv(Impl::Vendor, kNchw, 0, DType::F32);  // any weight order with any activations
  // Under autocast the bf16 cast keeps the weight's format: nothing reordered either.
  check_conv(Impl::Vendor, kCl, 0, DType::BF16);
}

TEST(ChannelsLastWeights, HandKernelsReadAChannelsLastWeight) {
  // The im2col kernels read either weight order with either activations (conv2d_cpu.cpp).
  check_conv(Impl::Hand, kCl, 0, DType::F32);
  check_conv(Impl::Hand, kNchw, 0, DType::F32);
  check_conv(Impl::Hand, kCl, 0, DType::BF16);  // autocast's hand path widens in the format
}

// Three steps of `make(params)` on an NCHW parameter and on its channels-last twin, the same
// gradients: the same bits (element-wise rules on the same values), with the model reordered
// between steps 1 and 2 for the twin whose optimizer was built while it was NCHW.
using MakeOptimizer = std::function<std::unique_ptr<Optimizer>(std::vector<Tensor>)>;

void check_optimizer(const char* what, const MakeOptimizer& make) {
  SCOPED_TRACE(what);
  Tensor ref = random_tensor({6, 4, 3, 3}, 40, -1, 1, DType::F32).set_requires_grad(true);
  Tensor cl = ref.detach().to(kCl).set_requires_grad(true);
  Tensor late = ref.detach().clone().set_requires_grad(true);  // reordered after step 1
  auto opt_ref = make(std::vector<Tensor>{ref});
  auto opt_cl = make(std::vector<Tensor>{cl});
  auto opt_late = make(std::vector<Tensor>{late});
  for (uint32_t step = 0; step < 3; ++step) {
    if (step == 1) {
      NoGradGuard no_grad;
      late.set_data(late.to(kCl));  // what Module::to(MemoryFormat) does
    }
    const Tensor g = random_tensor(ref.shape(), 41 + step, -1, 1, DType::F32);
    ref.set_grad(g);
    cl.set_grad(g.to(kCl));
    late.set_grad(late.is_channels_last() ? g.to(kCl) : g.clone());
    opt_ref->step();
    opt_cl->step();
    opt_late->step();
  }
  EXPECT_TRUE(cl.is_channels_last());
  EXPECT_TRUE(same_bits(cl, ref));
  EXPECT_TRUE(same_bits(late, ref));
  // The state in logical order, the same as the NCHW optimizer's, and loadable into either.
  const std::map<std::string, Tensor> state_ref = opt_ref->state_dict();
  const std::map<std::string, Tensor> state_cl = opt_cl->state_dict();
  ASSERT_EQ(state_cl.size(), state_ref.size());
  for (const auto& [key, t] : state_ref) {
    SCOPED_TRACE(key);
    EXPECT_FALSE(state_cl.at(key).is_channels_last());
    EXPECT_EQ(state_cl.at(key).to_vector<double>(), t.to_vector<double>());
  }
  opt_cl->load_state_dict(state_ref);
  opt_ref->load_state_dict(state_cl);
  const Tensor g = random_tensor(ref.shape(), 50, -1, 1, DType::F32);
  ref.set_grad(g);
  cl.set_grad(g.to(kCl));
  opt_ref->step();
  opt_cl->step();
  EXPECT_TRUE(same_bits(cl, ref)) << "after loading each other's state";
}

TEST(ChannelsLastWeights, OptimizersStepAChannelsLastParameterAsItsNchwTwin) {
  check_optimizer("SGD", [](std::vector<Tensor> p) {
    return std::unique_ptr<Optimizer>(
        new SGD(std::move(p), 0.1, 0.9, 0.0, 1e-2, /*nesterov=*/true));
  });
  check_optimizer("Adam", [](std::vector<Tensor> p) {
    return std::unique_ptr<Optimizer>(new Adam(std::move(p), 1e-2, 0.9, 0.999, 1e-8, 1e-2));
  });
  check_optimizer("Adadelta", [](std::vector<Tensor> p) {
    return std::unique_ptr<Optimizer>(new Adadelta(std::move(p), 1.0, 0.9, 1e-6, 1e-2));
  });
}

TEST(ChannelsLastWeights, GradScalerUnscalesAChannelsLastGradient) {
  Tensor p = random_tensor({6, 4, 3, 3}, 60, -1, 1, DType::F32).to(kCl).set_requires_grad(true);
  const Tensor g = random_tensor(p.shape(), 61, -1, 1, DType::F32);
  GradScaler scaler;
  // Scaled by 2^16, a power of two: unscaling is exact.
  p.set_grad((g * 65536.0).to(kCl));
  EXPECT_FALSE(scaler.unscale_({p}));
  EXPECT_TRUE(p.grad().is_channels_last());
  EXPECT_TRUE(same_bits(p.grad(), g));
}

std::vector<char> file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

TEST(ChannelsLastWeights, CheckpointsAreInLogicalOrder) {
  const std::string nchw_path = ::testing::TempDir() + "cl_weights_nchw.ckpt";
  const std::string cl_path = ::testing::TempDir() + "cl_weights_cl.ckpt";
  auto nchw = small_resnet(7);
  auto cl = small_resnet(7);
  cl->to(kCl);
  write_checkpoint(nchw_path, nchw->state_dict());
  write_checkpoint(cl_path, cl->state_dict());
  EXPECT_EQ(file_bytes(cl_path), file_bytes(nchw_path)) << "the file does not depend on the format";
  // Into an NCHW model and into a channels-last one (both from other weights).
  auto into_nchw = small_resnet(8);
  auto into_cl = small_resnet(8);
  into_cl->to(kCl);
  into_nchw->load_state_dict(read_checkpoint(cl_path).tensors);
  into_cl->load_state_dict(read_checkpoint(nchw_path).tensors);
  const auto want = nchw->state_dict();
  for (const auto& [name, t] : want) {
    SCOPED_TRACE(name);
    EXPECT_FALSE(into_nchw->state_dict().at(name).is_channels_last());
    EXPECT_EQ(into_cl->state_dict().at(name).is_channels_last(), t.dim() == 4);
    EXPECT_EQ(into_nchw->state_dict().at(name).to_vector<double>(), t.to_vector<double>());
    EXPECT_EQ(into_cl->state_dict().at(name).to_vector<double>(), t.to_vector<double>());
  }
  std::remove(nchw_path.c_str());
  std::remove(cl_path.c_str());
}

TEST(ChannelsLastWeights, FoldBatchNormsKeepsTheWeightsFormat) {
  KernelsGuard vendor(Impl::Vendor);
  auto model = small_resnet(9);
  model->to(kCl);
  const Tensor x = random_tensor({2, 3, 32, 32}, 70, -1, 1, DType::F32);
  {  // running statistics that are not the initial ones
    NoGradGuard no_grad;
    (*model)(x);
  }
  model->eval();
  NoGradGuard no_grad;
  const Tensor before = (*model)(x);
  model->fold_batch_norms();
  const Tensor after = (*model)(x);
  for (const auto& [name, p] : model->named_parameters())
    EXPECT_EQ(p.is_channels_last(), p.dim() == 4) << name;
  // Each folded weight rounded once to f32: the logits agree to a few roundings (as for NCHW,
  // tests/models/resnet_test.cpp).
  EXPECT_LT(rel_diff(after, before), 1e-5);
}

}  // namespace
}  // namespace kiln
