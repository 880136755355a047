// autocast.h: mixed-precision training's precision policy (like PyTorch's torch.autocast).
//
//   {
//     AutocastGuard autocast(DType::BF16);   // this thread, for the guard's lifetime
//     loss = cross_entropy(model(x), y);     // conv2d / linear / matmul take bf16 inputs
//   }
//   loss.backward();                         // the nodes kept their bf16 operands
//
// Under a guard, the ops that do nearly all the arithmetic (conv2d, matmul and so linear) round
// their f32 inputs to the guard's dtype (bf16 or f16), multiply the low-precision values and
// sum the products in f32, and return f32. Everything else (softmax, cross-entropy, BatchNorm's
// statistics, reductions, the optimizer) sees only f32 and is unchanged: those are the ops whose
// sums or exponentials lose too much in 8 or 11 mantissa bits. The parameters stay f32 (the
// "master weights"); their low-precision copies are made once per guard, on first use, and reused
// by every later use inside it (a training step's forward is one guard), so a weight shared by
// several layers or read again in backward is converted once per step.
//
// Gradients flow in f32 between ops; a conv/matmul node rounds its incoming gradient to the
// guard's dtype for its own products (as the low-precision backward of PyTorch's autocast does)
// and returns f32 gradients, so the master weights accumulate f32 gradients.
//
// Differences from PyTorch's autocast, on purpose: the outputs of conv/matmul are f32 rather than
// the low-precision type (more accurate; the next op's inputs are rounded anyway when they feed a
// conv or matmul), and the conv/matmul nodes save their low-precision operands for backward,
// which halves the memory of those saved activations. docs/mixed_precision.md has the numbers.
//
// References: Micikevicius et al., "Mixed Precision Training", ICLR 2018,
// https://arxiv.org/abs/1710.03740; Kalamkar et al., "A Study of BFLOAT16 for Deep Learning
// Training", 2019, https://arxiv.org/abs/1905.12322; PyTorch's autocast,
// https://pytorch.org/docs/stable/amp.html.
#pragma once

#include <cstdint>
#include <string>

#include "engine/tensor.h"

namespace kiln {

// The precision of a training run, as the apps' --precision flag names it.
//   fp32  everything in f32
//   tf32  f32 tensors; CUDA matrix products on tensor cores with inputs rounded to 10 mantissa
//         bits (engine/cuda/blas.h); GPU only
//   bf16  autocast to bfloat16; no loss scaling needed (f32's exponent range)
//   fp16  autocast to IEEE half; needs loss scaling (engine/optim/grad_scaler.h)
enum class Precision { FP32, TF32, BF16, FP16 };

const char* precision_name(Precision p);              // "fp32" | "tf32" | "bf16" | "fp16"
Precision parse_precision(const std::string& name);    // throws kiln::Error (usage) otherwise
// The dtype autocast converts to: BF16 or F16, F32 for fp32 and tf32 (no autocast).
DType autocast_dtype_of(Precision p);

// What conv2d returns under autocast.
//   F32           f32 activations between ops (the products' f32 sums, not rounded): every
//                 layer works unchanged; only conv/matmul operands are 16-bit.
//   LowPrecision  the guard's dtype, as PyTorch's autocast does: conv2d rounds its f32 sums
//                 once on store and the activations between layers (BatchNorm, ReLU, add,
//                 pooling, the ResNet head) stay 16-bit, read and written as 16-bit with f32
//                 arithmetic and f32 statistics; their gradients are 16-bit too. Half the bytes
//                 of every activation and of what backward saves. Models whose every layer
//                 takes 16-bit activations (ResNet) train this way; docs/mixed_precision.md.
enum class AutocastOutputs { F32, LowPrecision };

// Turns autocast on (dtype BF16 or F16) or off (dtype F32, or enabled = false) for this thread
// until the guard is destroyed; guards nest and restore the previous policy. The low-precision copies of
// parameters live until the outermost enabled guard exits.
class AutocastGuard {
 public:
  explicit AutocastGuard(DType dtype, bool enabled = true,
                         AutocastOutputs outputs = AutocastOutputs::F32);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool prev_enabled_;
  DType prev_dtype_;
  AutocastOutputs prev_outputs_;
};

bool autocast_enabled();  // this thread
DType autocast_dtype();   // BF16 or F16 when enabled, F32 otherwise
// The dtype conv2d returns in this thread: autocast_dtype() under an enabled guard with
// AutocastOutputs::LowPrecision, F32 otherwise.
DType autocast_output_dtype();

// True when an op given this input should take its autocast path: an f32 tensor, or a 16-bit
// activation of the guard's dtype (an earlier layer's output under AutocastOutputs::LowPrecision).
inline bool autocast_applies(const Tensor& t) {
  return autocast_enabled() && (t.dtype() == DType::F32 || t.dtype() == autocast_dtype());
}

// t rounded to autocast_dtype(), detached (the op's node carries the gradient to t itself).
// A leaf that requires grad (a parameter) is converted once per outermost guard and cached.
Tensor autocast_cast(const Tensor& t);

// Counters of this thread, for tests: conversions of parameters (cached: once per guard, not
// once per use), and autocast_cast() calls (zero: the ops run did not change under autocast).
int64_t autocast_cached_conversions();
int64_t autocast_cast_calls();

}  // namespace kiln
