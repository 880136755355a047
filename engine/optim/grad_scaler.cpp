// grad_scaler.cpp: the loss-scaling rule, the fused unscale over every gradient (one flag per
// device, read once), and the checkpoint state. See grad_scaler.h.
#include "engine/optim/grad_scaler.h"

#include <cfloat>
#include <cmath>
#include <cstddef>
#include <utility>

#include "engine/autograd.h"
#include "engine/dispatch.h"
#include "engine/error.h"
#include "engine/ops.h"
#include "engine/ops_cpu.h"
#include "engine/ops_cuda.h"

namespace kiln {

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
  return mul(loss, scale_);
}

bool GradScaler::unscale_(const std::vector<Tensor>& params) {
  NoGradGuard no_grad;
  // One int32 flag per device the gradients live on, zeroed once; every gradient's kernel
  // ORs into its device's flag; the host reads each flag once at the end, so the kernels of a
  // GPU run back to back without a synchronisation between parameters.
  std::vector<std::pair<Device, Tensor>> flags;
  auto flag_on = [&](Device d) -> int32_t* {
    for (auto& [dev, flag] : flags)
      if (dev == d) return flag.data<int32_t>();
    flags.emplace_back(d, Tensor::zeros({1}, DType::I32, d));
    return flags.back().second.data<int32_t>();
  };
  for (size_t i = 0; i < params.size(); ++i) {
    KILN_CHECK(params[i].defined(), "GradScaler::unscale_: parameter ", i, " is undefined");
    Tensor g = params[i].grad();
    if (!g.defined()) continue;
    int32_t* flag = flag_on(g.device());
    run_kernel("GradScaler::unscale_", g.device(), g.dtype(), [&](auto backend, auto tag) {
      using T = typename decltype(tag)::type;
      unscale_and_check(backend, g.data<T>(), g.numel(), T(scale_), flag);
    });
  }
  bool found_inf = false;
  for (const auto& [dev, flag] : flags) found_inf |= flag.item() != 0;  // one read per device
  return found_inf;
}

void GradScaler::set_scale(float next) {
  if (!(next > 0.0f) || std::isinf(next) || static_cast<double>(next) == scale_) return;
  scale_ = next;
  history_.push_back({steps_, scale_});  // steps_ already counts this update: the next step's
}

bool GradScaler::update(bool found_inf) {
  ++steps_;
  if (found_inf) ++skipped_;
  if (!options_.dynamic) return !found_inf;
  // In f32, as PyTorch's _amp_update_scale_ computes it.
  const float s = static_cast<float>(scale_);
  if (found_inf) {
    growth_tracker_ = 0;
    set_scale(s * static_cast<float>(options_.backoff_factor));
  } else if (++growth_tracker_ == options_.growth_interval) {
    growth_tracker_ = 0;
    set_scale(s * static_cast<float>(options_.growth_factor));
  }
  return !found_inf;
}

std::map<std::string, Tensor> GradScaler::state_dict() const {
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
}

}  // namespace kiln
