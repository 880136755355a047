// batchnorm2d.cpp: the batch_norm2d op (checks, statistics, running-stat update, autograd
// node) and the BatchNorm2d module. Kernels: batchnorm2d_cpu.cpp and batchnorm2d_cuda.cu.
#include "layers/batchnorm2d.h"

#include <cstdint>
#include <memory>
#include <sstream>
#include <vector>

#include "engine/autograd.h"
#include "engine/dispatch.h"
#include "engine/dtype.h"
#include "engine/error.h"
#include "engine/memory_format.h"
#include "engine/ops.h"
#include "layers/batchnorm2d_kernels.h"
#include "layers/layout.h"

namespace kiln {

namespace {

constexpr const char* kOp = "batch_norm2d";

// The dtype of the per-channel tensors for an input of dtype t: f32 for 16-bit activations
// (weight, bias, running and saved statistics, their gradients stay f32), t itself otherwise.
DType channel_dtype(DType t) { return is_low_precision(t) ? DType::F32 : t; }

// A per-channel tensor (weight, bias, running stats) must be (C) like x's channels, of
// channel_dtype(x's dtype), on x's device. Undefined is allowed (the caller decides what that
// means).
void check_channel_tensor(const char* what, const Tensor& t, const Tensor& x) {
  if (!t.defined()) return;
  const int64_t c = logical_channels(x);
  KILN_CHECK(t.dim() == 1 && t.size(0) == c, kOp, ": ", what, " has shape ",
             shape_str(t.shape()), " but the input ", shape_str(x.shape()), " has ", c,
             " channels: expected [", c, "]");
  const DType want = channel_dtype(x.dtype());
  KILN_CHECK(t.dtype() == want, kOp, ": ", what, " is ", dtype_name(t.dtype()),
             " but the input is ", dtype_name(x.dtype()), ": expected ", dtype_name(want),
             " (f32 for a 16-bit input); convert one with .to(dtype)");
  check_same_device(t, x, kOp);
}

// Saves x, the per-channel mean and invstd actually used, the weight and bias (or undefined),
// and with a fused ReLU on CUDA the output y (its mask; the CPU kernels recompute the mask
// from x, the weight and the bias). x and y are saved in their own dtype (16 bits for 16-bit
// activations: no f32 copy); the per-channel tensors are f32 then.
struct BatchNorm2dBackward : Node {
  BatchNormMode mode = BatchNormMode::Train;
  bool blocked = false;  // x in the channel-blocked layout (CPU only)
  bool relu = false;     // the forward had a fused ReLU
  const char* name() const override { return "BatchNorm2dBackward"; }
  // d gamma and d beta are the per-channel sums of dy * x_hat and dy that the input gradient
  // needs in training mode: one reduction serves all three, so a split backward computes them
  // with the input gradient and defers only their accumulation (autograd.h).
  SplitMode split_mode() const override { return SplitMode::WeightsWithInput; }
  std::vector<Tensor> apply(const Tensor& grad_out) override {
    const Tensor& x = saved[0];       // (N, C, H, W)
    const Tensor& mean = saved[1];    // (C)
    const Tensor& invstd = saved[2];  // (C)
    const Tensor& weight = saved[3];  // (C) or undefined
    const Tensor& bias = saved[4];    // (C) with a fused ReLU and a bias; else undefined
    [[maybe_unused]] const Tensor& relu_y = saved[5];  // the output (fused ReLU, CUDA only)
    const int64_t n = x.size(0), c = logical_channels(x), hw = x.size(2) * x.size(3);
    const DType cdt = channel_dtype(x.dtype());
    // The gradient of y has y's dtype (x's); one of another dtype is brought to it.
    const Tensor gy = grad_out.dtype() == x.dtype() ? grad_out : grad_out.to(x.dtype());
    // Only the gradients some input needs are computed (next[i] is null otherwise).
    Tensor gx, gw, gb;
    if (next[0]) gx = Tensor::empty(x.shape(), x.dtype(), x.device());
    if (next[1]) gw = Tensor::empty({c}, cdt, x.device());
    if (next[2]) gb = Tensor::empty({c}, cdt, x.device());
    // The CUDA kernels' workspace: k, a, d of grad_x per channel, from the reduction kernel to
    // the element-wise one.
    Tensor coef;
    if (x.device().is_cuda() && gx.defined()) coef = Tensor::empty({3 * c}, cdt, x.device());
    run_activation_kernel("batch_norm2d_backward", x.device(), x.dtype(), [&](auto backend,
                                                                              auto tag) {
      using T = typename decltype(tag)::type;
      using P = compute_t<T>;
      auto ptr = [](const Tensor& t) { return t.defined() ? t.data<P>() : nullptr; };
      if constexpr (is_cpu_v<decltype(backend)>) {
        if (blocked) {
          batch_norm2d_backward_blocked(backend, mode, gy.data<T>(), x.data<T>(),
                                        mean.data<P>(), invstd.data<P>(), ptr(weight), ptr(bias),
                                        relu, gx.defined() ? gx.data<T>() : nullptr, ptr(gw),
                                        ptr(gb), n, c, hw);
          return;
        }
      }
      batch_norm2d_backward(backend, mode, gy.data<T>(), x.data<T>(), mean.data<P>(),
                            invstd.data<P>(), ptr(weight), ptr(bias), relu,
                            relu_y.defined() ? relu_y.data<T>() : nullptr,
                            gx.defined() ? gx.data<T>() : nullptr, ptr(gw), ptr(gb), ptr(coef),
                            n, c, hw);
    });
    return {gx, gw, gb};
  }
};

}  // namespace

Tensor batch_norm2d(const Tensor& x, const Tensor& weight, const Tensor& bias,
                    const Tensor& running_mean, const Tensor& running_var, bool training,
                    double momentum, double eps, BatchNormActivation activation) {
  KILN_CHECK(x.defined(), kOp, ": the input is undefined");
  if (x.is_channels_last()) {
    // Byte for byte, a channels-last (N, C, H, W) is a contiguous (N * H * W, C, 1, 1): the
    // same values per channel, so the same statistics (over m = N * H * W values) and the same
    // normalisation, with no copy in either direction. On the CPU, when C is a multiple of 16,
    // it is also the channel-blocked (N * H * W, C/16, 1, 1, 16), whose kernels read 16
    // channels of a pixel at once; the NCHW kernels would walk each channel with a stride of C.
    const int64_t rows_count = x.size(0) * x.size(2) * x.size(3), c = x.size(1);
    const bool as_blocks = x.device().type == DeviceType::CPU && c % kChannelBlock == 0;
    const Shape rows_shape = as_blocks
                                 ? Shape{rows_count, c / kChannelBlock, 1, 1, kChannelBlock}
                                 : Shape{rows_count, c, 1, 1};
    const Tensor rows = reinterpret_view(x, rows_shape, MemoryFormat::Contiguous);
    return reinterpret_view(batch_norm2d(rows, weight, bias, running_mean, running_var, training,
                                         momentum, eps, activation),
                            x.shape(), MemoryFormat::ChannelsLast);
  }
  const bool blocked = is_channel_blocked(x);
  KILN_CHECK(x.dim() == 4 || blocked, kOp, ": expected an input of shape (N, C, H, W) ",
             "(or channel-blocked (N, C/16, H, W, 16)), got ", shape_str(x.shape()));
  if (blocked && x.device().type != DeviceType::CPU)  // blocked kernels exist on the CPU only
    return to_channel_blocks(batch_norm2d(from_channel_blocks(x), weight, bias, running_mean,
                                          running_var, training, momentum, eps, activation));
  KILN_CHECK(is_activation_dtype(x.dtype()), kOp,
             ": expected an f32, f64, f16 or bf16 tensor, got ", x.str());
  check_channel_tensor("weight", weight, x);
  check_channel_tensor("bias", bias, x);
  check_channel_tensor("running_mean", running_mean, x);
  check_channel_tensor("running_var", running_var, x);
  KILN_CHECK(running_mean.defined() == running_var.defined(), kOp,
             ": give both running_mean and running_var, or neither");
  if (!(eps >= 0) || !(momentum >= 0 && momentum <= 1))
    throw Error(detail::str(kOp, ": need eps >= 0 and 0 <= momentum <= 1, got eps=", eps,
                            ", momentum=", momentum),
                ErrorKind::Usage);

  const int64_t n = x.size(0), c = logical_channels(x), hw = x.size(2) * x.size(3), m = n * hw;
  // Batch statistics in training, and whenever there are no running statistics to use.
  const bool batch_stats = training || !running_mean.defined();
  const bool update_running = training && running_mean.defined();
  KILN_CHECK(!batch_stats || m > 1, kOp, ": expected more than 1 value per channel to compute ",
             "batch statistics, got input ", shape_str(x.shape()),
             ": use a larger batch, or eval mode");

  const DType cdt = channel_dtype(x.dtype());
  Tensor mean = Tensor::empty({c}, cdt, x.device());
  Tensor invstd = Tensor::empty({c}, cdt, x.device());
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  const bool relu = activation == BatchNormActivation::Relu;
  run_activation_kernel(kOp, x.device(), x.dtype(), [&](auto backend, auto tag) {
    using T = typename decltype(tag)::type;
    using P = compute_t<T>;  // the per-channel tensors' element type
    auto ptr = [](const Tensor& t) { return t.defined() ? t.data<P>() : nullptr; };
    // Only the CPU has kernels for the channel-blocked layout (a CUDA input was unblocked above).
    bool use_blocked = false;
    if constexpr (is_cpu_v<decltype(backend)>) use_blocked = blocked;
    if (batch_stats) {
      Tensor var = Tensor::empty({c}, cdt, x.device());
      if constexpr (is_cpu_v<decltype(backend)>) {
        if (use_blocked)
          batch_norm2d_stats_blocked(backend, x.data<T>(), mean.data<P>(), var.data<P>(), n, c,
                                     hw);
      }
      if (!use_blocked)
        batch_norm2d_stats(backend, x.data<T>(), mean.data<P>(), var.data<P>(), n, c, hw);
      batch_norm2d_invstd(backend, var.data<P>(), invstd.data<P>(), c, eps);
      // The running statistics are state, not part of the graph: written in place.
      if (update_running)
        batch_norm2d_update_running(backend, mean.data<P>(), var.data<P>(),
                                    running_mean.data<P>(), running_var.data<P>(), c, m,
                                    momentum);
    } else {
      mean.copy_(running_mean);
      batch_norm2d_invstd(backend, running_var.data<P>(), invstd.data<P>(), c, eps);
    }
    if constexpr (is_cpu_v<decltype(backend)>) {
      if (use_blocked)
        batch_norm2d_forward_blocked(backend, x.data<T>(), mean.data<P>(), invstd.data<P>(),
                                     ptr(weight), ptr(bias), y.data<T>(), n, c, hw, relu);
    }
    if (!use_blocked)
      batch_norm2d_forward(backend, x.data<T>(), mean.data<P>(), invstd.data<P>(), ptr(weight),
                           ptr(bias), y.data<T>(), n, c, hw, relu);
  });

  if (any_requires_grad({&x, &weight, &bias})) {
    auto node = std::make_shared<BatchNorm2dBackward>();
    node->mode = batch_stats ? BatchNormMode::Train : BatchNormMode::Eval;
    node->blocked = blocked;
    node->relu = relu;
    const bool save_y = relu && x.device().type != DeviceType::CPU;
    node->saved = {x.detach(), mean, invstd, weight.defined() ? weight.detach() : Tensor(),
                   relu && bias.defined() ? bias.detach() : Tensor(),  // the CPU mask's shift
                   save_y ? y.detach() : Tensor()};
    set_history(y, node, {x, weight, bias});
  }
  return y;
}

// ---- Module -----------------------------------------------------------------------------

BatchNorm2d::BatchNorm2d(int64_t num_features, double eps, std::optional<double> momentum,
                         bool affine, DType dtype)
    : num_features_(num_features), eps_(eps), momentum_(momentum) {
  if (num_features < 1 || !(eps >= 0) || (momentum && !(*momentum >= 0 && *momentum <= 1)) ||
      !is_floating(dtype))
    throw Error(detail::str("BatchNorm2d: invalid num_features=", num_features, ", eps=", eps,
                            ", momentum=", momentum ? std::to_string(*momentum) : "None",
                            ", dtype=", dtype_name(dtype),
                            ": need num_features >= 1, eps >= 0, 0 <= momentum <= 1, f32/f64"),
                ErrorKind::Usage);
  if (affine) {
    weight_ = register_parameter("weight", Tensor::ones({num_features}, dtype));
    bias_ = register_parameter("bias", Tensor::zeros({num_features}, dtype));
  }
  running_mean_ = register_buffer("running_mean", Tensor::zeros({num_features}, dtype));
  running_var_ = register_buffer("running_var", Tensor::ones({num_features}, dtype));
  num_batches_tracked_ = register_buffer("num_batches_tracked", Tensor::zeros({1}, DType::I64));
}

Tensor BatchNorm2d::forward(const Tensor& x, BatchNormActivation activation) {
  KILN_CHECK(x.defined() && (x.dim() == 4 || is_channel_blocked(x)), "BatchNorm2d: expected an ",
             "input of shape (N, C, H, W) or (N, C/16, H, W, 16), got ",
             x.defined() ? shape_str(x.shape()) : "an undefined tensor");
  KILN_CHECK(logical_channels(x) == num_features_, "BatchNorm2d(", num_features_, "): the input ",
             shape_str(x.shape()), " has ", logical_channels(x), " channels, expected ",
             num_features_);
  if (!is_training())
    return batch_norm2d(x, weight_, bias_, running_mean_, running_var_, false, 0.0, eps_,
                        activation);
  if (!momentum_) {
    // momentum = None: the cumulative average over the batches seen so far, as PyTorch. The
    // count is read on the host (on a GPU that waits for the device: only in this mode).
    const double batches = num_batches_tracked_.item() + 1;
    Tensor y = batch_norm2d(x, weight_, bias_, running_mean_, running_var_, true,
                            1.0 / batches, eps_, activation);
    num_batches_tracked_.fill_(batches);  // only once the step succeeded
    return y;
  }
  Tensor y = batch_norm2d(x, weight_, bias_, running_mean_, running_var_, true, *momentum_, eps_,
                          activation);
  // Count the step where the counter lives, without reading it back (exact below 2^53).
  NoGradGuard no_grad;
  num_batches_tracked_.copy_(num_batches_tracked_.to(DType::F64) + 1.0);
  return y;
}

std::string BatchNorm2d::extra_repr() const {
  std::ostringstream os;
  os << num_features_ << ", eps=" << eps_ << ", momentum=";
  if (momentum_) os << *momentum_; else os << "None";
  os << ", affine=" << (weight_.defined() ? "true" : "false");
  return os.str();
}

}  // namespace kiln
