// pool2d.cpp: the pooling ops (checks, output shapes, dispatch, autograd nodes) and modules.
// The kernels live in pool2d_cpu.cpp (CPU) and pool2d_cuda.cu (CUDA, same results: max-pool
// indices and gradients bit-identical); a channels-last input runs the channels-last kernels
// (pool2d_nhwc_cpu.cpp, pool2d_nhwc_cuda.cu, the same bits again) and gets a channels-last
// output, so a channels-last network pools without reordering anything, forward or backward.
//
// x may be f32, f64, bf16 or f16 (is_activation_dtype); a 16-bit x gets a 16-bit y and a 16-bit
// gradient, computed in f32 and rounded once (the kernels' headers say how). Nothing 16-bit is
// widened into a saved tensor: max pooling saves its int32 indices, average pooling nothing.
#include "layers/pool2d.h"

#include <cstdint>
#include <limits>
#include <memory>
#include <sstream>
#include <vector>

#include "engine/autograd.h"
#include "engine/dispatch.h"
#include "engine/error.h"
#include "layers/layout.h"
#include "layers/pool2d_kernels.h"

namespace kiln {

namespace {

// Pooling parameters are usage errors (they come from model code or flags).
void check_pool_params(const char* op, int64_t kernel_size, int64_t stride, int64_t padding) {
  if (kernel_size < 1 || stride < 1 || padding < 0 || padding > kernel_size / 2)
    throw Error(detail::str(op, ": invalid kernel_size=", kernel_size, ", stride=", stride,
                            ", padding=", padding,
                            ": need kernel_size >= 1, stride >= 1 and 0 <= padding <= "
                            "kernel_size / 2"),
                ErrorKind::Usage);
}

void check_input(const char* op, const Tensor& x) {
  KILN_CHECK(x.defined(), op, ": the input is undefined");
  KILN_CHECK(x.dim() == 4 || x.dim() == 3, op, ": expected an input of shape (N, C, H, W) or ",
             "(C, H, W), got ", shape_str(x.shape()));
  KILN_CHECK(is_activation_dtype(x.dtype()), op,
             ": expected an f32, f64, bf16 or f16 tensor, got ", x.str());
}

// (C, H, W) is pooled as (1, C, H, W); the result is reshaped back by the caller.
Tensor as_4d(const Tensor& x) {
  return x.dim() == 4 ? x : x.reshape({1, x.size(0), x.size(1), x.size(2)});
}
Tensor like_input(const Tensor& y, const Tensor& x) {
  return x.dim() == 4 ? y : y.reshape({y.size(1), y.size(2), y.size(3)});
}

// The geometry of a windowed pool on an input of logical shape (N, C, H, W), with a check that
// the output exists.
Pool2dGeometry window_geometry(const char* op, const Shape& x4, int64_t kernel_size,
                               int64_t stride, int64_t padding) {
  Pool2dGeometry g;
  g.n = x4[0];
  g.c = x4[1];
  g.in_h = x4[2];
  g.in_w = x4[3];
  g.kernel_h = g.kernel_w = kernel_size;
  g.stride_h = g.stride_w = stride;
  g.pad_h = g.pad_w = padding;
  KILN_CHECK(g.in_h + 2 * padding >= kernel_size && g.in_w + 2 * padding >= kernel_size, op,
             ": input ", shape_str(x4), " is smaller than the window (kernel_size=",
             kernel_size, ", padding=", padding, "): use a smaller kernel or a larger input");
  g.out_h = pool2d_output_size(g.in_h, kernel_size, stride, padding);
  g.out_w = pool2d_output_size(g.in_w, kernel_size, stride, padding);
  return g;
}

Shape out_shape(const Pool2dGeometry& g) { return {g.n, g.c, g.out_h, g.out_w}; }
Shape in_shape(const Pool2dGeometry& g) { return {g.n, g.c, g.in_h, g.in_w}; }

// Every tensor of one pooling call (input, output, indices, gradients) is in the input's
// memory format: NCHW kernels for Contiguous, NHWC kernels for ChannelsLast. The tensors are
// allocated in that format and read with data_any_format(); the format picks the kernel.
bool nhwc(MemoryFormat f) { return f == MemoryFormat::ChannelsLast; }

// ---- Max pooling ----------------------------------------------------------------------

// Forward on x4: returns y and the int32 argmax indices (the kernels' own index type), both in
// x4's format. An index is the offset ih * W + iw in its channel's plane in either format.
std::pair<Tensor, Tensor> max_pool2d_run(const Tensor& x4, const Pool2dGeometry& g) {
  KILN_CHECK(g.in_h * g.in_w <= std::numeric_limits<int32_t>::max(),
             "max_pool2d: an input plane of ", g.in_h, " x ", g.in_w,
             " elements is too large for int32 indices");
  const MemoryFormat f = x4.memory_format();
  Tensor y = Tensor::empty(out_shape(g), x4.dtype(), x4.device(), f);
  Tensor idx = Tensor::empty(out_shape(g), DType::I32, x4.device(), f);
  run_activation_kernel("max_pool2d", x4.device(), x4.dtype(), [&](auto backend, auto tag) {
    using T = typename decltype(tag)::type;
    const T* xp = x4.data_any_format<T>();
    T* yp = y.data_any_format<T>();
    int32_t* ip = idx.data_any_format<int32_t>();
    if (nhwc(f))
      max_pool2d_forward_nhwc(backend, xp, yp, ip, g);
    else
      max_pool2d_forward(backend, xp, yp, ip, g);
  });
  return {y, idx};
}

// Saves only the int32 indices (not the input): backward scatters grad_out through them. The
// gradient may arrive in either format; it is brought into the forward's, and into x's dtype
// (the gradient of a tensor has its dtype).
struct MaxPool2dBackward : Node {
  Pool2dGeometry g;
  MemoryFormat format = MemoryFormat::Contiguous;
  DType dtype = DType::F32;
  const char* name() const override { return "MaxPool2dBackward"; }
  std::vector<Tensor> apply(const Tensor& grad_out) override {
    const Tensor& idx = saved[0];  // (N, C, OH, OW) int32, in `format`
    const Tensor gy = grad_out.to(dtype).to(format);
    Tensor gx = Tensor::empty(in_shape(g), gy.dtype(), gy.device(), format);
    run_activation_kernel("max_pool2d_backward", gy.device(), gy.dtype(),
                          [&](auto backend, auto tag) {
                            using T = typename decltype(tag)::type;
                            const T* gyp = gy.data_any_format<T>();
                            const int32_t* ip = idx.data_any_format<int32_t>();
                            T* gxp = gx.data_any_format<T>();
                            if (nhwc(format))
                              max_pool2d_backward_nhwc(backend, gyp, ip, gxp, g);
                            else
                              max_pool2d_backward(backend, gyp, ip, gxp, g);
                          });
    return {gx};
  }
};

// The differentiable op on x4; returns y (N, C, OH, OW) and the int32 indices.
std::pair<Tensor, Tensor> max_pool2d_4d(const Tensor& x, int64_t kernel_size,
                                        std::optional<int64_t> stride, int64_t padding) {
  const char* op = "max_pool2d";
  check_input(op, x);
  const int64_t s = stride.value_or(kernel_size);
  check_pool_params(op, kernel_size, s, padding);
  Tensor x4 = as_4d(x);
  Pool2dGeometry g = window_geometry(op, x4.shape(), kernel_size, s, padding);
  auto [y, idx] = max_pool2d_run(x4, g);
  if (any_requires_grad({&x4})) {
    auto node = std::make_shared<MaxPool2dBackward>();
    node->g = g;
    node->format = x4.memory_format();
    node->dtype = x4.dtype();
    node->saved = {idx};
    set_history(y, node, {x4});
  }
  return {y, idx};
}

// ---- Average pooling (windowed and adaptive) ---------------------------------------------

enum class AvgKind { Window, Adaptive };
enum class Pass { Forward, Backward };

// Forward: `in` is x (N, C, H, W), returns y. Backward: `in` is grad_y, returns grad_x. The
// result is in `in`'s format.
Tensor avg_pool2d_run(AvgKind kind, Pass pass, const Tensor& in, const Pool2dGeometry& g,
                      bool include_pad) {
  const bool backward = pass == Pass::Backward;
  const char* op = kind == AvgKind::Window ? (backward ? "avg_pool2d_backward" : "avg_pool2d")
                   : (backward ? "adaptive_avg_pool2d_backward" : "adaptive_avg_pool2d");
  const MemoryFormat f = in.memory_format();
  Tensor out =
      Tensor::empty(backward ? in_shape(g) : out_shape(g), in.dtype(), in.device(), f);
  run_activation_kernel(op, in.device(), in.dtype(), [&](auto backend, auto tag) {
    using T = typename decltype(tag)::type;
    const T* src = in.data_any_format<T>();
    T* dst = out.data_any_format<T>();
    if (nhwc(f)) {
      if (kind == AvgKind::Window && !backward)
        avg_pool2d_forward_nhwc(backend, src, dst, g, include_pad);
      else if (kind == AvgKind::Window)
        avg_pool2d_backward_nhwc(backend, src, dst, g, include_pad);
      else if (!backward)
        adaptive_avg_pool2d_forward_nhwc(backend, src, dst, g);
      else
        adaptive_avg_pool2d_backward_nhwc(backend, src, dst, g);
    } else {
      if (kind == AvgKind::Window && !backward)
        avg_pool2d_forward(backend, src, dst, g, include_pad);
      else if (kind == AvgKind::Window)
        avg_pool2d_backward(backend, src, dst, g, include_pad);
      else if (!backward)
        adaptive_avg_pool2d_forward(backend, src, dst, g);
      else
        adaptive_avg_pool2d_backward(backend, src, dst, g);
    }
  });
  return out;
}

// Average pooling is linear: backward needs only the geometry (and the forward's format and
// dtype, which the gradient is brought into), nothing saved.
struct AvgPool2dBackward : Node {
  AvgKind kind = AvgKind::Window;
  Pool2dGeometry g;
  bool include_pad = true;
  MemoryFormat format = MemoryFormat::Contiguous;
  DType dtype = DType::F32;
  const char* name() const override {
    return kind == AvgKind::Window ? "AvgPool2dBackward" : "AdaptiveAvgPool2dBackward";
  }
  std::vector<Tensor> apply(const Tensor& grad_out) override {
    return {avg_pool2d_run(kind, Pass::Backward, grad_out.to(dtype).to(format), g, include_pad)};
  }
};

Tensor avg_pool2d_record(AvgKind kind, const Tensor& x, const Tensor& x4,
                         const Pool2dGeometry& g, bool include_pad) {
  Tensor y = avg_pool2d_run(kind, Pass::Forward, x4, g, include_pad);
  if (any_requires_grad({&x4})) {
    auto node = std::make_shared<AvgPool2dBackward>();
    node->kind = kind;
    node->g = g;
    node->include_pad = include_pad;
    node->format = x4.memory_format();
    node->dtype = x4.dtype();
    set_history(y, node, {x4});
  }
  return like_input(y, x);
}

}  // namespace

int64_t pool2d_output_size(int64_t in, int64_t kernel_size, int64_t stride, int64_t padding) {
  KILN_CHECK(stride >= 1, "pool2d_output_size: stride must be >= 1, got ", stride);
  return (in + 2 * padding - kernel_size) / stride + 1;
}

namespace {

// Max pooling of a channel-blocked x (N, C/16, H, W, 16) on the CPU, blocked in and out.
struct MaxPool2dBlockedBackward : Node {
  Pool2dGeometry g;
  const char* name() const override { return "MaxPool2dBlockedBackward"; }
  std::vector<Tensor> apply(const Tensor& grad_out) override {
    const Tensor& idx = saved[0];
    Tensor gx = Tensor::empty({g.n, g.c / kChannelBlock, g.in_h, g.in_w, kChannelBlock},
                              grad_out.dtype(), grad_out.device());
    dispatch_floating(grad_out.dtype(), "max_pool2d_backward", [&](auto tag) {
      using T = typename decltype(tag)::type;
      max_pool2d_backward_blocked(cpu::Backend{}, grad_out.data<T>(), idx.data<int32_t>(),
                                  gx.data<T>(), g);
    });
    return {gx};
  }
};

Tensor max_pool2d_blocked(const Tensor& x, int64_t kernel_size, int64_t stride,
                          int64_t padding) {
  const char* op = "max_pool2d";
  // The blocked layout is chosen only outside autocast (layers/layout.cpp), so 16-bit
  // activations never arrive here in it.
  KILN_CHECK(is_floating(x.dtype()), op,
             ": the channel-blocked layout (N, C/16, H, W, 16) holds f32 or f64 only, got ",
             x.str(), ": unblock it first (from_channel_blocks)");
  check_pool_params(op, kernel_size, stride, padding);
  if (x.device().type != DeviceType::CPU)  // blocked kernels exist on the CPU only
    return to_channel_blocks(max_pool2d(from_channel_blocks(x), kernel_size, stride, padding));
  Pool2dGeometry g = window_geometry(op, {x.size(0), logical_channels(x), x.size(2), x.size(3)},
                                     kernel_size, stride, padding);
  const Shape out{g.n, g.c / kChannelBlock, g.out_h, g.out_w, kChannelBlock};
  Tensor y = Tensor::empty(out, x.dtype(), x.device());
  Tensor idx = Tensor::empty(out, DType::I32, x.device());
  dispatch_floating(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    max_pool2d_forward_blocked(cpu::Backend{}, x.data<T>(), y.data<T>(), idx.data<int32_t>(), g);
  });
  if (any_requires_grad({&x})) {
    auto node = std::make_shared<MaxPool2dBlockedBackward>();
    node->g = g;
    node->saved = {idx};
    set_history(y, node, {x});
  }
  return y;
}

}  // namespace

Tensor max_pool2d(const Tensor& x, int64_t kernel_size, std::optional<int64_t> stride,
                  int64_t padding) {
  if (is_channel_blocked(x))
    return max_pool2d_blocked(x, kernel_size, stride.value_or(kernel_size), padding);
  return like_input(max_pool2d_4d(x, kernel_size, stride, padding).first, x);
}

std::pair<Tensor, Tensor> max_pool2d_with_indices(const Tensor& x, int64_t kernel_size,
                                                  std::optional<int64_t> stride,
                                                  int64_t padding) {
  auto [y, idx] = max_pool2d_4d(x, kernel_size, stride, padding);
  return {like_input(y, x), like_input(idx.to(DType::I64), x)};
}

Tensor avg_pool2d(const Tensor& x, int64_t kernel_size, std::optional<int64_t> stride,
                  int64_t padding, AvgPoolDivisor divisor) {
  const char* op = "avg_pool2d";
  check_input(op, x);
  const int64_t s = stride.value_or(kernel_size);
  check_pool_params(op, kernel_size, s, padding);
  Tensor x4 = as_4d(x);
  Pool2dGeometry g = window_geometry(op, x4.shape(), kernel_size, s, padding);
  return avg_pool2d_record(AvgKind::Window, x, x4, g, divisor == AvgPoolDivisor::IncludePad);
}

Tensor adaptive_avg_pool2d(const Tensor& x, int64_t out_h, int64_t out_w) {
  const char* op = "adaptive_avg_pool2d";
  check_input(op, x);
  if (out_h < 1 || out_w < 1)
    throw Error(detail::str(op, ": output size (", out_h, ", ", out_w, ") must be >= 1"),
                ErrorKind::Usage);
  Tensor x4 = as_4d(x);
  KILN_CHECK(x4.size(2) >= 1 && x4.size(3) >= 1, op, ": the input ", shape_str(x.shape()),
             " has an empty plane");
  Pool2dGeometry g;
  g.n = x4.size(0);
  g.c = x4.size(1);
  g.in_h = x4.size(2);
  g.in_w = x4.size(3);
  g.out_h = out_h;
  g.out_w = out_w;
  return avg_pool2d_record(AvgKind::Adaptive, x, x4, g, /*include_pad=*/true);
}

// ---- Modules ----------------------------------------------------------------------------

MaxPool2d::MaxPool2d(int64_t kernel_size, std::optional<int64_t> stride, int64_t padding)
    : kernel_size_(kernel_size), stride_(stride.value_or(kernel_size)), padding_(padding) {
  check_pool_params("MaxPool2d", kernel_size_, stride_, padding_);
}

Tensor MaxPool2d::forward(const Tensor& x) {
  return max_pool2d(x, kernel_size_, stride_, padding_);
}

std::string MaxPool2d::extra_repr() const {
  std::ostringstream os;
  os << "kernel_size=" << kernel_size_ << ", stride=" << stride_ << ", padding=" << padding_;
  return os.str();
}

AvgPool2d::AvgPool2d(int64_t kernel_size, std::optional<int64_t> stride, int64_t padding,
                     AvgPoolDivisor divisor)
    : kernel_size_(kernel_size),
      stride_(stride.value_or(kernel_size)),
      padding_(padding),
      divisor_(divisor) {
  check_pool_params("AvgPool2d", kernel_size_, stride_, padding_);
}

Tensor AvgPool2d::forward(const Tensor& x) {
  return avg_pool2d(x, kernel_size_, stride_, padding_, divisor_);
}

std::string AvgPool2d::extra_repr() const {
  std::ostringstream os;
  os << "kernel_size=" << kernel_size_ << ", stride=" << stride_ << ", padding=" << padding_
     << ", count_include_pad=" << (divisor_ == AvgPoolDivisor::IncludePad ? "true" : "false");
  return os.str();
}

AdaptiveAvgPool2d::AdaptiveAvgPool2d(int64_t out_h, int64_t out_w) : out_h_(out_h), out_w_(out_w) {
  if (out_h < 1 || out_w < 1)
    throw Error(detail::str("AdaptiveAvgPool2d: output size (", out_h, ", ", out_w,
                            ") must be >= 1"),
                ErrorKind::Usage);
}

Tensor AdaptiveAvgPool2d::forward(const Tensor& x) {
  return adaptive_avg_pool2d(x, out_h_, out_w_);
}

std::string AdaptiveAvgPool2d::extra_repr() const {
  std::ostringstream os;
  os << "output_size=(" << out_h_ << ", " << out_w_ << ")";
  return os.str();
}

}  // namespace kiln
