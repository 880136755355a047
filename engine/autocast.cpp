// autocast.cpp: the thread-local policy and the per-guard cache of low-precision parameters.
#include "engine/autocast.h"

#include <cstdint>
#include <memory>
#include <unordered_map>

#include "engine/error.h"

namespace kiln {

namespace {

struct CachedCast {
  std::shared_ptr<TensorImpl> source;  // keeps the parameter alive: its address stays its own
  Tensor copy;
};

struct AutocastState {
  bool enabled = false;
  DType dtype = DType::F32;
  AutocastOutputs outputs = AutocastOutputs::F32;
  int depth = 0;  // enabled guards alive; the cache is dropped when the last one exits
  std::unordered_map<const TensorImpl*, CachedCast> cache;
  int64_t conversions = 0;
  int64_t calls = 0;
};

AutocastState& state() {
  thread_local AutocastState s;
  return s;
}

}  // namespace

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::FP32: return "fp32";
    case Precision::TF32: return "tf32";
    case Precision::BF16: return "bf16";
    case Precision::FP16: return "fp16";
  }
  return "?";
}

Precision parse_precision(const std::string& name) {
  if (name == "fp32") return Precision::FP32;
  if (name == "tf32") return Precision::TF32;
  if (name == "bf16") return Precision::BF16;
  if (name == "fp16") return Precision::FP16;
  KILN_CHECK_INPUT(false, "unknown precision '", name, "': use fp32, tf32, bf16 or fp16");
  return Precision::FP32;
}

DType autocast_dtype_of(Precision p) {
  switch (p) {
    case Precision::BF16: return DType::BF16;
    case Precision::FP16: return DType::F16;
    default: return DType::F32;
  }
}

AutocastGuard::AutocastGuard(DType dtype, bool enabled, AutocastOutputs outputs) {
  enabled = enabled && dtype != DType::F32;  // F32: autocast off (a run's --precision fp32)
  AutocastState& s = state();
  prev_enabled_ = s.enabled;
  prev_dtype_ = s.dtype;
  prev_outputs_ = s.outputs;
  if (enabled) {
    KILN_CHECK(is_low_precision(dtype), "AutocastGuard: autocast converts to bf16 or f16, got ",
               dtype_name(dtype));
    // A nested guard with another dtype must not see copies made for the outer one.
    if (s.enabled && s.dtype != dtype) s.cache.clear();
    ++s.depth;
  }
  s.enabled = enabled;
  s.dtype = enabled ? dtype : DType::F32;
  s.outputs = enabled ? outputs : AutocastOutputs::F32;
}

AutocastGuard::~AutocastGuard() {
  AutocastState& s = state();
  if (s.enabled) {
    if (--s.depth == 0) s.cache.clear();
    else if (prev_dtype_ != s.dtype) s.cache.clear();
  }
  s.enabled = prev_enabled_;
  s.dtype = prev_dtype_;
  s.outputs = prev_outputs_;
}

bool autocast_enabled() { return state().enabled; }
DType autocast_dtype() { return state().dtype; }
DType autocast_output_dtype() {
  const AutocastState& s = state();
  return s.enabled && s.outputs == AutocastOutputs::LowPrecision ? s.dtype : DType::F32;
}

Tensor autocast_cast(const Tensor& t) {
  AutocastState& s = state();
  KILN_CHECK(s.enabled, "autocast_cast: no AutocastGuard is active in this thread");
  ++s.calls;
  if (t.dtype() == s.dtype) return t.detach();
  if (!(t.is_leaf() && t.requires_grad())) return t.to(s.dtype);
  auto it = s.cache.find(t.impl());
  if (it != s.cache.end()) return it->second.copy;
  ++s.conversions;
  Tensor copy = t.to(s.dtype);
  s.cache.emplace(t.impl(), CachedCast{t.impl_ptr(), copy});
  return copy;
}

int64_t autocast_cached_conversions() { return state().conversions; }
int64_t autocast_cast_calls() { return state().calls; }

}  // namespace kiln
