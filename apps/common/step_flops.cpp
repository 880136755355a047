// step_flops.cpp: a step's model FLOPs, FLOP/s and MFU for the apps (apps/common/step_flops.h).
#include "apps/common/step_flops.h"

#include <cstdint>
#include <cstdio>

#include "engine/peak_flops.h"
#include "models/flops.h"

namespace kiln::apps {

double StepFlops::achieved(double seconds_per_step) const {
  return achieved_flops_per_second(per_step, seconds_per_step);
}

std::optional<double> StepFlops::mfu(double seconds_per_step) const {
  if (simulated) return std::nullopt;
  return kiln::mfu(achieved(seconds_per_step), peak);
}

std::string StepFlops::suffix(double seconds_per_step) const {
  char buf[96];
  std::snprintf(buf, sizeof buf, " tflops=%.4g", achieved(seconds_per_step) / 1e12);
  std::string s = buf;
  if (const auto m = mfu(seconds_per_step)) {
    std::snprintf(buf, sizeof buf, " mfu=%.1f%%", *m * 100);
    s += buf;
  }
  return s;
}

nlohmann::json StepFlops::json(double seconds_per_step) const {
  nlohmann::json j = {{"model_flops_per_step", per_step},
                      {"achieved_tflops", achieved(seconds_per_step) / 1e12},
                      {"mfu", nullptr},
                      {"peak_tflops", nullptr}};
  if (const auto m = mfu(seconds_per_step)) j["mfu"] = *m;
  if (peak && !simulated) j["peak_tflops"] = *peak / 1e12;
  return j;
}

StepFlops step_flops(Module& model, const Shape& input, bool training, Device device,
                     Precision precision) {
  Shape one = input;
  const int64_t batch = one.empty() ? 1 : one.front();
  if (!one.empty()) one.front() = 1;
  const int64_t forward = forward_flops(model, one) * batch;
  const PeakFlops peak = peak_flops(device);
  StepFlops f;
  f.per_step = training ? training_step_flops(forward) : forward;
  f.peak = peak.at(precision);
  f.simulated = peak.simulated;
  return f;
}

}  // namespace kiln::apps
