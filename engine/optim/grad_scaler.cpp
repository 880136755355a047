// grad_scaler.cpp: the loss-scaling rule, the fused unscale over every gradient (one flag per
// device, read once), the device-side path (state in device memory, the rule as a kernel), and
// the checkpoint state. See grad_scaler.h.
#include "engine/optim/grad_scaler.h"

#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "engine/autograd.h"
#include "engine/cuda/sync_debug.h"
#include "engine/dispatch.h"
#include "engine/error.h"
#include "engine/ops.h"
#include "engine/ops_cpu.h"
#include "engine/ops_cuda.h"
#include "engine/optim/grad_scaler_kernels.h"

namespace kiln {

namespace cpu {

void update_scale(Backend, const int32_t* found_inf, ScaleState state, ScaleRule rule) {
  update_scale_state(*found_inf != 0, state, rule);
}

}  // namespace cpu

namespace {

bool positive_finite_f32(double v) { return v > 0 && v <= FLT_MAX && static_cast<float>(v) > 0; }

}  // namespace

GradScaler::GradScaler(GradScalerOptions options) : options_(options) {
  KILN_CHECK_INPUT(positive_finite_f32(options.init_scale), "GradScaler: init_scale must be a "
                   "positive finite f32 value, got ", options.init_scale);
  KILN_CHECK_INPUT(std::isfinite(options.growth_factor) && options.growth_factor > 1.0,
                   "GradScaler: growth_factor must be > 1, got ", options.growth_factor);
  KILN_CHECK_INPUT(options.backoff_factor > 0.0 && options.backoff_factor < 1.0,
                   "GradScaler: backoff_factor must be in (0, 1), got ", options.backoff_factor);
  KILN_CHECK_INPUT(options.growth_interval >= 1, "GradScaler: growth_interval must be >= 1, got ",
                   options.growth_interval);
  scale_ = static_cast<float>(options.init_scale);
  history_.push_back({0, scale_});
}

Tensor GradScaler::scale(const Tensor& loss) const {
  KILN_CHECK(loss.defined(), "GradScaler::scale: the loss is undefined");
  if (!kept_on_device_ || loss.device() != device_) {
    pull();
    return mul(loss, scale_);
  }
  push();
  // The device's value, read by the kernel: a captured step scales by the scale of its replay.
  return mul(loss, loss.dtype() == DType::F32 ? dev_.scale : dev_.scale.to(loss.dtype()));
}

bool GradScaler::unscale_(const std::vector<Tensor>& params) {
  NoGradGuard no_grad;
  pull();
  // One int32 flag per device the gradients live on, zeroed once; every gradient's kernel
  // ORs into its device's flag; the host reads each flag once at the end, so the kernels of a
  // GPU run back to back without a synchronisation between parameters. The scale goes to each
  // device as one f32 (a fill kernel).
  struct OnDevice {
    Device device;
    Tensor flag, scale;
  };
  std::vector<OnDevice> per_device;
  auto on = [&](Device d) -> OnDevice& {
    for (OnDevice& o : per_device)
      if (o.device == d) return o;
    per_device.push_back({d, Tensor::zeros({1}, DType::I32, d),
                          Tensor::full({1}, scale_, DType::F32, d)});
    return per_device.back();
  };
  for (size_t i = 0; i < params.size(); ++i) {
    KILN_CHECK(params[i].defined(), "GradScaler::unscale_: parameter ", i, " is undefined");
    Tensor g = params[i].grad();
    if (!g.defined()) continue;
    OnDevice& o = on(g.device());
    run_kernel("GradScaler::unscale_", g.device(), g.dtype(), [&](auto backend, auto tag) {
      using T = typename decltype(tag)::type;
      unscale_and_check(backend, g.data_any_format<T>(), g.numel(), o.scale.data<float>(),
                        o.flag.data<int32_t>());
    });
  }
  bool found_inf = false;
  for (const OnDevice& o : per_device) found_inf |= o.flag.item() != 0;  // one read per device
  return found_inf;
}

bool GradScaler::update(bool found_inf) {
  pull();
  const ScaleRule rule{static_cast<float>(options_.growth_factor),
                       static_cast<float>(options_.backoff_factor), options_.growth_interval,
                       options_.dynamic};
  ++steps_;
  if (found_inf) ++skipped_;
  // In f32, as PyTorch's _amp_update_scale_ computes it (grad_scaler_kernels.h).
  const float next = next_scale(rule, found_inf, static_cast<float>(scale_), growth_tracker_);
  if (static_cast<double>(next) != scale_) {
    scale_ = next;
    history_.push_back({steps_, scale_});  // steps_ already counts this update: the next step's
  }
  host_changed();
  return !found_inf;
}

// ---- The device-side path ------------------------------------------------------------------

void GradScaler::keep_on_device(Device device) {
  if (kept_on_device_ && device == device_) return;
  pull();
  device_ = device;
  kept_on_device_ = true;
  dev_.scale = Tensor::empty({1}, DType::F32, device);
  dev_.growth_tracker = Tensor::empty({1}, DType::I64, device);
  dev_.steps = Tensor::empty({1}, DType::I64, device);
  dev_.skipped = Tensor::empty({1}, DType::I64, device);
  dev_.changes = Tensor::empty({1}, DType::I64, device);
  dev_.change_steps = Tensor::zeros({kChangeLog}, DType::I64, device);
  dev_.change_scales = Tensor::zeros({kChangeLog}, DType::F32, device);
  dev_.found_inf = Tensor::zeros({1}, DType::I32, device);
  host_newer_ = true;
  push();
}

void GradScaler::unscale_on_device(const std::vector<Tensor>& params) {
  NoGradGuard no_grad;
  if (!kept_on_device_) {
    for (const Tensor& p : params)
      if (p.defined() && p.grad().defined()) {
        keep_on_device(p.grad().device());
        break;
      }
    if (!kept_on_device_) keep_on_device(Device());  // no gradients: nothing is checked
  }
  push();
  dev_.found_inf.zero_();
  for (size_t i = 0; i < params.size(); ++i) {
    KILN_CHECK(params[i].defined(), "GradScaler::unscale_on_device: parameter ", i,
               " is undefined");
    Tensor g = params[i].grad();
    if (!g.defined()) continue;
    KILN_CHECK(g.device() == device_, "GradScaler::unscale_on_device: the gradient of parameter ",
               i, " is on ", g.device().str(), " but the scaler's state is on ", device_.str());
    run_kernel("GradScaler::unscale_on_device", g.device(), g.dtype(), [&](auto backend, auto tag) {
      using T = typename decltype(tag)::type;
      unscale_and_check(backend, g.data_any_format<T>(), g.numel(),
                        dev_.scale.data<float>(), dev_.found_inf.data<int32_t>());
    });
  }
}

const Tensor& GradScaler::found_inf() const {
  KILN_CHECK(kept_on_device_, "GradScaler::found_inf: call unscale_on_device() first");
  return dev_.found_inf;
}

void GradScaler::update_on_device() {
  KILN_CHECK(kept_on_device_, "GradScaler::update_on_device: call unscale_on_device() first");
  push();
  const ScaleState state{dev_.scale.data<float>(),        dev_.growth_tracker.data<int64_t>(),
                         dev_.steps.data<int64_t>(),      dev_.skipped.data<int64_t>(),
                         dev_.change_steps.data<int64_t>(), dev_.change_scales.data<float>(),
                         dev_.changes.data<int64_t>(),    kChangeLog};
  const ScaleRule rule{static_cast<float>(options_.growth_factor),
                       static_cast<float>(options_.backoff_factor), options_.growth_interval,
                       options_.dynamic};
  const int32_t* flag = dev_.found_inf.data<int32_t>();
  on_device("GradScaler::update_on_device", device_,
            [&](auto backend) { update_scale(backend, flag, state, rule); });
  device_newer_ = true;
}

void GradScaler::pull() const {
  if (!device_newer_) return;
  cuda::AllowSync allow("GradScaler: the device-side state read back (outside the step)");
  const int64_t changes = static_cast<int64_t>(dev_.changes.item());
  KILN_CHECK(changes <= kChangeLog, "GradScaler: ", changes, " scale changes on the device since "
             "the state was last read, more than the log of ", kChangeLog,
             " holds: read it (scale_value(), history()) more often");
  if (changes > 0) {
    const std::vector<int64_t> at = dev_.change_steps.to_vector<int64_t>();
    const std::vector<float> to = dev_.change_scales.to_vector<float>();
    for (int64_t i = 0; i < changes; ++i)
      history_.push_back({at[static_cast<size_t>(i)], to[static_cast<size_t>(i)]});
    dev_.changes.zero_();
  }
  scale_ = dev_.scale.item();
  growth_tracker_ = static_cast<int64_t>(dev_.growth_tracker.item());
  steps_ = static_cast<int64_t>(dev_.steps.item());
  skipped_ = static_cast<int64_t>(dev_.skipped.item());
  device_newer_ = false;
}

void GradScaler::push() const {
  if (!host_newer_ || !kept_on_device_) return;
  dev_.scale.fill_(scale_);
  dev_.growth_tracker.fill_(static_cast<double>(growth_tracker_));
  dev_.steps.fill_(static_cast<double>(steps_));
  dev_.skipped.fill_(static_cast<double>(skipped_));
  dev_.changes.zero_();
  host_newer_ = false;
}

void GradScaler::host_changed() {
  if (kept_on_device_) host_newer_ = true;
}

double GradScaler::scale_value() const {
  pull();
  return scale_;
}

int64_t GradScaler::growth_tracker() const {
  pull();
  return growth_tracker_;
}

int64_t GradScaler::steps() const {
  pull();
  return steps_;
}

int64_t GradScaler::skipped_steps() const {
  pull();
  return skipped_;
}

const std::vector<GradScaler::Change>& GradScaler::history() const {
  pull();
  return history_;
}

std::map<std::string, Tensor> GradScaler::state_dict() const {
  pull();
  std::vector<int64_t> change_steps;
  std::vector<double> change_scales;
  for (const Change& c : history_) {
    change_steps.push_back(c.step);
    change_scales.push_back(c.scale);
  }
  const int64_t n = static_cast<int64_t>(history_.size());
  return {
      {"scale", Tensor::from_vector(std::vector<double>{scale_}, {1})},
      {"growth_tracker", Tensor::from_vector(std::vector<int64_t>{growth_tracker_}, {1})},
      {"steps", Tensor::from_vector(std::vector<int64_t>{steps_}, {1})},
      {"skipped_steps", Tensor::from_vector(std::vector<int64_t>{skipped_}, {1})},
      {"history.step", Tensor::from_vector(change_steps, {n})},
      {"history.scale", Tensor::from_vector(change_scales, {n})},
  };
}

void GradScaler::load_state_dict(const std::map<std::string, Tensor>& state) {
  pull();
  const char* const keys[] = {"scale", "growth_tracker", "steps", "skipped_steps",
                              "history.step", "history.scale"};
  for (const auto& [key, t] : state) {
    bool known = false;
    for (const char* k : keys) known |= key == k;
    KILN_CHECK_INPUT(known, "GradScaler state has an unexpected entry '", key, "'");
  }
  auto entry = [&](const char* key) -> const Tensor& {
    auto it = state.find(key);
    KILN_CHECK_INPUT(it != state.end() && it->second.defined(), "GradScaler state is missing '",
                     key, "'");
    return it->second;
  };
  auto scalar = [&](const char* key) {
    const Tensor& t = entry(key);
    KILN_CHECK_INPUT(t.numel() == 1, "GradScaler state entry '", key,
                     "' must hold one value, has shape ", shape_str(t.shape()));
    return t.item();
  };
  const double scale = scalar("scale");
  const int64_t tracker = static_cast<int64_t>(scalar("growth_tracker"));
  const int64_t steps = static_cast<int64_t>(scalar("steps"));
  const int64_t skipped = static_cast<int64_t>(scalar("skipped_steps"));
  KILN_CHECK_INPUT(positive_finite_f32(scale) && static_cast<float>(scale) == scale,
                   "GradScaler state entry 'scale' must be a positive finite f32 value, got ",
                   scale);
  KILN_CHECK_INPUT(tracker >= 0 && tracker < options_.growth_interval,
                   "GradScaler state entry 'growth_tracker' is ", tracker, ", outside [0, ",
                   options_.growth_interval, "): was it saved with another growth_interval?");
  KILN_CHECK_INPUT(steps >= 0 && skipped >= 0 && skipped <= steps, "GradScaler state: ",
                   skipped, " skipped steps of ", steps, " is impossible");
  const std::vector<int64_t> change_steps = entry("history.step").to_vector<int64_t>();
  const std::vector<double> change_scales = entry("history.scale").to_vector<double>();
  KILN_CHECK_INPUT(!change_steps.empty() && change_steps.size() == change_scales.size(),
                   "GradScaler state entries 'history.step' and 'history.scale' must hold the "
                   "same number (>= 1) of values, hold ", change_steps.size(), " and ",
                   change_scales.size());
  std::vector<Change> history;
  for (size_t i = 0; i < change_steps.size(); ++i) {
    KILN_CHECK_INPUT(change_steps[i] >= (i == 0 ? 0 : change_steps[i - 1]) &&
                         change_steps[i] <= steps && positive_finite_f32(change_scales[i]),
                     "GradScaler state entry 'history' is inconsistent at change ", i, ": (",
                     change_steps[i], ", ", change_scales[i], ")");
    history.push_back({change_steps[i], change_scales[i]});
  }
  KILN_CHECK_INPUT(history.back().scale == scale, "GradScaler state: the last change of "
                   "'history' (scale ", history.back().scale, ") is not 'scale' (", scale, ")");
  scale_ = scale;
  growth_tracker_ = tracker;
  steps_ = steps;
  skipped_ = skipped;
  history_ = std::move(history);
  host_changed();
}

}  // namespace kiln
