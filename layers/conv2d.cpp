// conv2d.cpp: the conv2d op (shape checks, the choice of kernels, the one autograd node of
// conv2d and its autocast path) and the Conv2d module. layers/conv2d.h maps the whole family.
//
// Dispatch is two plain choices: the implementation conv_impl (engine/impl.h) picks when the op
// runs forward (the backward node keeps it), then the device (run_kernel), whose backend's tag
// picks the twin: conv2d_forward (hand) or conv2d_forward_vendor, and so on.
#include "layers/conv2d.h"

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <type_traits>
#include <vector>

#include "engine/autocast.h"
#include "engine/autograd.h"
#include "engine/dispatch.h"
#include "engine/error.h"
#include "engine/impl.h"
#include "engine/init.h"
#include "engine/ops.h"
#include "layers/conv2d_dispatch.h"
#include "layers/conv2d_kernels.h"
#include "layers/flop_counter.h"
#include "layers/layout.h"

namespace kiln {

namespace {
// -1: KILN_CONV_WINOGRAD not read yet; else 0 / 1.
std::atomic<int> g_winograd{-1};
}  // namespace

void set_conv_winograd(bool on) { g_winograd.store(on ? 1 : 0); }

bool conv_winograd() {
  int v = g_winograd.load();
  if (v < 0) {
    const char* env = std::getenv("KILN_CONV_WINOGRAD");
    v = env != nullptr && *env != '\0' && *env != '0' ? 1 : 0;
    g_winograd.store(v);
  }
  return v == 1;
}

namespace conv_detail {

namespace {

// The tensor's elements, or nullptr for an undefined tensor (a gradient nobody needs). In any
// memory format: the geometry says which (g.x_nhwc, g.y_nhwc), and conv2d() gives channels-last
// tensors only to the kernels that read them.
template <typename T>
T* data_or_null(const Tensor& t) {
  return t.defined() ? t.template data_any_format<T>() : nullptr;
}

// The weight for the hand kernels, in the order g says (g.w_nhwc: KRSC); a channels-last weight
// that g does not announce is refused (data<T>()), not misread.
template <typename T>
const T* hand_weight(const Tensor& w, const ConvGeometry& g) {
  return g.w_nhwc || !w.defined() ? data_or_null<T>(w) : w.template data<T>();
}

// Whether backend B has a vendor convolution of T: cuDNN has float and double, oneDNN float
// only (conv_impl never asks for it with double: engine/impl.cpp).
template <typename B, typename T>
constexpr bool kHasVendorConv = std::is_same_v<B, cuda::Backend> || std::is_same_v<T, float>;

// db = the sum of dy over all but the channel dims, for the oneDNN backward passes, which
// compute db only in the weight pass: a lone db (a frozen weight, a trained bias) is summed
// here. dy is (N, K, P, Q) or blocked (N, K/16, P, Q, 16); bf16/f16 under autocast, widened
// exactly to db's f32.
void bias_grad_alone(const Tensor& dy, Tensor& db, const ConvGeometry& g) {
  const Tensor d = dy.dtype() == db.dtype() ? dy : dy.to(db.dtype());
  // Channels-last: the channels are the last dimension of the storage order (N, P, Q, K).
  if (d.is_channels_last())
    db.copy_(sum(d.storage_order_view(), {0, 1, 2}).reshape({g.k}));
  else
    db.copy_(sum(d, {0, 2, 3}).reshape({g.k}));
}

}  // namespace

void run_forward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y,
                 const ConvGeometry& g, Impl impl) {
  run_kernel("conv2d", x.device(), x.dtype(), [&](auto backend, auto tag) {
    using T = typename decltype(tag)::type;
    const T* bp = data_or_null<T>(b);
    if constexpr (kHasVendorConv<decltype(backend), T>) {
      if (impl == Impl::Vendor) {
        conv2d_forward_vendor(backend, data_or_null<T>(x), data_or_null<T>(w), bp,
                              data_or_null<T>(y), g);
        return;
      }
    }
    conv2d_forward(backend, data_or_null<T>(x), hand_weight<T>(w, g), bp, data_or_null<T>(y), g);
  });
}

void run_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor& dx, Tensor& dw,
                  Tensor& db, const ConvGeometry& g, Impl impl) {
  run_kernel("conv2d_backward", dy.device(), dy.dtype(), [&](auto backend, auto tag) {
    using T = typename decltype(tag)::type;
    T *dxp = data_or_null<T>(dx), *dwp = data_or_null<T>(dw), *dbp = data_or_null<T>(db);
    const T *xp = data_or_null<T>(x), *wp = data_or_null<T>(w);
    if constexpr (kHasVendorConv<decltype(backend), T>) {
      if (impl == Impl::Vendor) {  // one call for every gradient
        conv2d_backward_vendor(backend, xp, data_or_null<T>(dy), wp, dxp, dwp, dbp, g);
        return;
      }
    }
    const T* dyp = data_or_null<T>(dy);
    if (dxp) conv2d_backward_data(backend, dyp, hand_weight<T>(w, g), dxp, g);
    if (dwp || dbp) conv2d_backward_weight(backend, xp, dyp, dwp, dbp, g);
  });
}

Shape activation_shape(int64_t n, int64_t c, int64_t h, int64_t w, bool blocked) {
  if (blocked) return {n, c / kChannelBlock, h, w, kChannelBlock};
  return {n, c, h, w};
}

namespace {

// The backward of conv2d and of its autocast path: the gradients of x, w and b that are needed,
// from the implementation the forward ran (the node keeps it).
struct Conv2dBackward : Node {
  ConvGeometry g{};
  Impl impl = Impl::Hand;
  bool has_bias = false;
  // Autocast (conv2d_lowp.cpp): the saved operands are bf16/f16, the gradient is rounded to
  // their dtype for the products, and every gradient returned is f32, except dx for a 16-bit
  // x (AutocastOutputs::LowPrecision: g.y_lowp), which is 16-bit, x's dtype.
  bool autocast = false;
  DType x_dtype = DType::F32;  // the dtype of the x conv2d was given (dx's)
  // saved = {x or undefined, w or undefined}: x only if w needs a gradient, w only if x does.

  std::vector<Tensor> apply(const Tensor& grad_out_any) override {
    const Shape y_shape = activation_shape(g.n, g.k, g.p, g.q, g.y_blocked);
    KILN_CHECK(grad_out_any.shape() == y_shape, "conv2d backward: the output gradient has shape ",
               shape_str(grad_out_any.shape()), ", expected ", shape_str(y_shape));
    const Tensor& x = saved[0];
    const Tensor& w = saved[1];
    const DType dt = autocast ? DType::F32 : grad_out_any.dtype();
    const Device dev = grad_out_any.device();
    // The gradient in the output's format (a no-op unless another consumer sent another one).
    const Tensor grad_out =
        g.y_nhwc ? grad_out_any.to(MemoryFormat::ChannelsLast) : grad_out_any.contiguous();
    Tensor dx, dw, db;
    // The dtype the kernels write dx in: 16-bit with g.y_lowp (converted to x_dtype after).
    const DType dx_kernel_dtype = autocast && g.y_lowp ? x_dtype_low() : dt;
    if (next[0])
      dx = Tensor::empty(activation_shape(g.n, g.c, g.h, g.w, g.x_blocked), dx_kernel_dtype, dev,
                         g.x_nhwc ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous);
    if (next[1])
      dw = Tensor::empty({g.k, g.c, g.r, g.s}, dt, dev,
                         g.w_nhwc ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous);
    if (has_bias && next[2]) db = Tensor::empty({g.k}, dt, dev);
    if (g.n == 0) {  // an empty batch: the sums over images are empty
      if (dw.defined()) dw.zero_();
      if (db.defined()) db.zero_();
    } else {
      const Tensor dy = autocast ? grad_out.to(x.defined() ? x.dtype() : w.dtype()) : grad_out;
      // oneDNN sums db only with dw (conv2d_kernels.h): a lone db is summed apart.
      const bool lone_db = impl == Impl::Vendor && dev.is_cpu() && db.defined() && !dw.defined();
      Tensor kernel_db = lone_db ? Tensor() : db;
      if (autocast)
        run_backward_lowp(x, w, dy, dx, dw, kernel_db, g, impl);
      else
        run_backward(x, w, dy, dx, dw, kernel_db, g, impl);
      if (lone_db) bias_grad_alone(dy, db, g);
    }
    // A 16-bit-output convolution of an f32 x (a network's first): dx back in f32.
    if (dx.defined() && dx.dtype() != x_dtype) dx = dx.to(x_dtype);
    std::vector<Tensor> grads{dx, dw};
    if (has_bias) grads.push_back(db);
    return grads;
  }
  // The 16-bit dtype of the saved operands.
  DType x_dtype_low() const { return saved[0].defined() ? saved[0].dtype() : saved[1].dtype(); }
  const char* name() const override {
    return autocast ? "Conv2dAutocastBackward" : "Conv2dBackward";
  }
  // dx, dw and db are computed only for the edges that are set (backward data and backward
  // weights are separate kernels, or separate vendor calls): a split backward runs dx first and
  // dw, db later (autograd.h).
  SplitMode split_mode() const override { return SplitMode::ByEdges; }
};

}  // namespace

void record_backward(Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b,
                     const Tensor& x_op, const Tensor& w_op, const ConvGeometry& g, Impl impl,
                     bool autocast) {
  const bool with_b = b.defined();
  if (!(with_b ? any_requires_grad({&x, &w, &b}) : any_requires_grad({&x, &w}))) return;
  auto node = std::make_shared<Conv2dBackward>();
  node->g = g;
  node->impl = impl;
  node->has_bias = with_b;
  node->autocast = autocast;
  node->x_dtype = x.dtype();
  // Save only what backward reads: x for dw, w for dx.
  node->saved = {w.requires_grad() ? x_op : Tensor(), x.requires_grad() ? w_op : Tensor()};
  std::vector<Tensor> inputs{x, w};
  if (with_b) inputs.push_back(b);
  set_history(y, node, inputs);
}

}  // namespace conv_detail

using conv_detail::activation_shape;

namespace {

// Whether the kernels for x read and write channels-last activations themselves: on CUDA every
// one, cuDNN and the hand implicit GEMM (f32 and f64, and under autocast, whose hand path widens
// to f32 keeping the format); on the CPU the hand im2col + GEMM (f32 and f64, and autocast's
// hand path, the same way) and oneDNN (f32, and under autocast bf16/f16).
bool kernels_read_channels_last(const Tensor& x) {
  if (x.device().type == DeviceType::CUDA)
    return is_low_precision(x.dtype()) ? autocast_applies(x)
                                       : x.dtype() == DType::F32 || x.dtype() == DType::F64;
  if (conv_impl(x.device(), autocast_applies(x) ? autocast_dtype() : x.dtype()) == Impl::Hand)
    return true;
  // A 16-bit activation (autocast with AutocastOutputs::LowPrecision): the 16-bit kernels.
  if (is_low_precision(x.dtype()))
    return autocast_applies(x) && conv_impl(x.device(), autocast_dtype()) == Impl::Vendor;
  if (conv_impl(x.device(), x.dtype()) != Impl::Vendor) return false;
  if (autocast_applies(x) && conv_impl(x.device(), autocast_dtype()) != Impl::Vendor) return false;
  return x.dtype() == DType::F32;
}

// The order the kernels take the weight in. On CUDA the activations': cuDNN wants the filter
// in x's format (conv2d_cudnn.cu says why), and the hand implicit GEMM, which reads either,
// coalesces its weight loads when the filter's taps run in x's order (docs/memory_format.md).
// On the CPU the weight's own: oneDNN (an `ohwi` weight, conv2d_dnnl.cpp) and the hand kernels
// (conv2d_cpu.cpp) read either.
MemoryFormat weight_order(const Tensor& x, const Tensor& w) {
  return x.device().type == DeviceType::CUDA ? x.memory_format() : w.memory_format();
}

}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& b, int64_t stride,
              int64_t padding, std::optional<Layout> out_layout) {
  KILN_CHECK(x.defined() && w.defined(), "conv2d: the input or the weight is undefined");
  if (x.is_channels_last()) {
    // Where the kernels read and write channels-last themselves (kernels_read_channels_last), x
    // goes to them as it is; any other kernel gets NCHW and its result is converted back (two
    // counted conversions).
    if (out_layout && *out_layout != Layout::NHWC)
      return as_layout(conv2d(x, w, b, stride, padding), *out_layout);
    if (!kernels_read_channels_last(x))
      return conv2d(x.contiguous(), w, b, stride, padding).to(MemoryFormat::ChannelsLast);
  } else if (out_layout == Layout::NHWC) {
    return as_layout(conv2d(x, w, b, stride, padding), Layout::NHWC);
  }
  const Layout y_layout = out_layout.value_or(layout_of(x));
  if (is_channel_blocked(x))
    KILN_CHECK(w.dim() == 4 && w.size(1) == logical_channels(x), "conv2d: the channel-blocked ",
               "input ", shape_str(x.shape()), " has ", logical_channels(x), " channels but the ",
               "weight ", shape_str(w.shape()), " expects ", w.dim() == 4 ? w.size(1) : -1);
  if (y_layout == Layout::NCHW16c)
    KILN_CHECK(w.dim() == 4 && w.size(0) % kChannelBlock == 0, "conv2d: a channel-blocked ",
               "output needs a multiple of ", kChannelBlock, " output channels, the weight ",
               shape_str(w.shape()), " has ", w.dim() >= 1 ? w.size(0) : -1);
  if (is_channel_blocked(x) || y_layout == Layout::NCHW16c) {
    // Blocked activations (layers/layout.h): oneDNN reads and writes them itself; every other
    // kernel gets NCHW and its result is converted.
    // Under autocast every kernel gets NCHW too (the low-precision kernels take no other).
    if (!(x.device().type == DeviceType::CPU && x.dtype() == DType::F32 &&
          conv_impl(x.device(), x.dtype()) == Impl::Vendor) || autocast_applies(x))
      return as_layout(conv2d(as_layout(x, Layout::NCHW), w, b, stride, padding), y_layout);
  }
  const bool blocked = is_channel_blocked(x);
  KILN_CHECK(x.dim() == 4 || blocked, "conv2d: expected the input as (N, C, H, W), got ",
             shape_str(x.shape()), "; add a batch or channel dimension with reshape()");
  KILN_CHECK(w.dim() == 4, "conv2d: expected the weight as (K, C, R, S), got ",
             shape_str(w.shape()));
  check_same_device(x, w, "conv2d");
  // Under autocast x may be a 16-bit activation (AutocastOutputs::LowPrecision) with the f32
  // weight and bias it is multiplied with; otherwise x, w and b share one floating dtype.
  const bool lowp_x = is_low_precision(x.dtype());
  KILN_CHECK(!lowp_x || autocast_applies(x), "conv2d: a ", dtype_name(x.dtype()), " input ",
             "needs an AutocastGuard of that dtype (engine/autocast.h), or convert it with ",
             ".to(DType::F32)");
  if (!lowp_x) check_same_dtype(x, w, "conv2d");
  KILN_CHECK(lowp_x ? w.dtype() == DType::F32 : is_floating(x.dtype()),
             "conv2d: expected f32 or f64 tensors, got ", x.str(), " and ", w.str());
  KILN_CHECK(logical_channels(x) == w.size(1), "conv2d: the input ", shape_str(x.shape()), " has ",
             logical_channels(x), " channels but the weight ", shape_str(w.shape()), " expects ",
             w.size(1), " (weight is (out_channels, in_channels, kH, kW))");
  if (b.defined()) {
    check_same_device(x, b, "conv2d");
    check_same_dtype(w, b, "conv2d");  // w's dtype is checked above
    KILN_CHECK(b.dim() == 1 && b.size(0) == w.size(0), "conv2d: the bias has shape ",
               shape_str(b.shape()), " but the weight ", shape_str(w.shape()), " needs [",
               w.size(0), "]");
  }
  KILN_CHECK(stride >= 1, "conv2d: stride must be >= 1, got ", stride);
  KILN_CHECK(padding >= 0, "conv2d: padding must be >= 0, got ", padding);
  ConvGeometry g{};
  g.n = x.size(0), g.c = logical_channels(x), g.h = x.size(2), g.w = x.size(3);
  g.x_blocked = blocked;
  g.y_blocked = y_layout == Layout::NCHW16c;
  g.x_nhwc = g.y_nhwc = x.is_channels_last();
  g.k = w.size(0), g.r = w.size(2), g.s = w.size(3);
  g.stride = stride, g.pad = padding;
  KILN_CHECK(g.r >= 1 && g.s >= 1 && g.k >= 1 && g.c >= 1, "conv2d: the weight ",
             shape_str(w.shape()), " has an empty dimension");
  KILN_CHECK(g.h + 2 * padding >= g.r && g.w + 2 * padding >= g.s, "conv2d: the input ",
             shape_str(x.shape()), " with padding ", padding, " is smaller than the kernel ",
             shape_str(w.shape()), "; pad the input or use a smaller kernel");
  g.p = (g.h + 2 * padding - g.r) / stride + 1;
  g.q = (g.w + 2 * padding - g.s) / stride + 1;
  // Multiply-adds x 2 (layers/flop_counter.h); the bias add is not counted.
  FlopCounter::add(2 * g.n * g.k * g.p * g.q * g.c * g.r * g.s);

  // The weight in the order it has (KRSC, g.w_nhwc, after Module::to(ChannelsLast)) where the
  // kernel reads it, else a differentiable copy in the order the kernel needs (counted; none for
  // a 1x1 filter, whose two orders are the same bytes), its gradient brought back the same way.
  const bool autocast = autocast_applies(x);
  const Impl impl = conv_impl(x.device(), autocast ? autocast_dtype() : x.dtype());
  const Tensor w_op = w.to(weight_order(x, w));
  g.w_nhwc = w_op.is_channels_last();
  if (autocast) return conv2d_autocast(x, w_op, b, g);
  Tensor y = Tensor::empty(activation_shape(g.n, g.k, g.p, g.q, g.y_blocked), x.dtype(),
                           x.device(), x.memory_format());
  if (g.n > 0) conv_detail::run_forward(x, w_op, b, y, g, impl);
  conv_detail::record_backward(y, x, w_op, b, x.detach(), w_op.detach(), g, impl,
                               /*autocast=*/false);
  return y;
}

// ---- Conv2d module -----------------------------------------------------------------------------

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, int64_t stride,
               int64_t padding, bool bias, Generator& gen)
    : in_channels_(in_channels), out_channels_(out_channels), kernel_size_(kernel_size),
      stride_(stride), padding_(padding) {
  KILN_CHECK_INPUT(in_channels >= 1 && out_channels >= 1 && kernel_size >= 1,
                   "Conv2d: in_channels, out_channels and kernel_size must be >= 1, got ",
                   in_channels, ", ", out_channels, ", ", kernel_size);
  KILN_CHECK_INPUT(stride >= 1 && padding >= 0, "Conv2d: stride must be >= 1 and padding >= 0, got ",
                   stride, " and ", padding);
  const int64_t fan_in = in_channels * kernel_size * kernel_size;
  Tensor w = Tensor::empty({out_channels, in_channels, kernel_size, kernel_size});
  default_init_(w, fan_in, gen);
  weight = register_parameter("weight", w);
  if (bias) {
    Tensor b = Tensor::empty({out_channels});
    default_init_(b, fan_in, gen);
    this->bias = register_parameter("bias", b);
  }
}

void Conv2d::set_bias(const Tensor& b) {
  KILN_CHECK(!bias.defined(), "Conv2d::set_bias: this convolution already has a bias");
  KILN_CHECK(b.defined() && b.dim() == 1 && b.size(0) == out_channels_, "Conv2d::set_bias: ",
             "expected a bias of shape [", out_channels_, "], got ",
             b.defined() ? shape_str(b.shape()) : "an undefined tensor");
  bias = register_parameter("bias", b);
}

Tensor Conv2d::forward(const Tensor& x) { return conv2d(x, weight, bias, stride_, padding_); }

Tensor Conv2d::forward(const Tensor& x, Layout out_layout) {
  return conv2d(x, weight, bias, stride_, padding_, out_layout);
}

std::string Conv2d::extra_repr() const {
  std::ostringstream os;
  os << in_channels_ << ", " << out_channels_ << ", kernel_size=(" << kernel_size_ << ", "
     << kernel_size_ << "), stride=(" << stride_ << ", " << stride_ << ")";
  if (padding_ != 0) os << ", padding=(" << padding_ << ", " << padding_ << ")";
  if (!bias.defined()) os << ", bias=False";
  return os.str();
}

}  // namespace kiln
