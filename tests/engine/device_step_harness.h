// device_step_harness.h: a run of loss-scaled training steps twice on one device, once with
// GradScaler's host decisions (unscale_ / update / opt.step() when finite) and once with its
// device-side path (unscale_on_device / opt.step(found_inf()) / update_on_device), which must
// agree bit for bit: parameters, optimizer state (step counts included), the scale's history,
// the step and skip counts. Used on the CPU (tests/engine/grad_scaler_device_test.cpp) and on
// CUDA (tests/cuda/grad_scaler_device_cuda_test.cpp).
//
// The gradients are prepared up front (the scaled gradient of step s is scaler.scale(c), with c
// chosen per step and parameter): +inf, -inf and NaN are injected into chosen steps, the very
// first one among them (SGD's first momentum step and Adam's bias corrections must not count a
// skipped step), two in a row, and in the f64 parameter. The learning rate changes every few
// steps (set_lr, which the device path reads from memory), and the device path's state is read
// once in the middle of the run (its change log drained) and once at the end.
//
// The device-side steps run under cuda::set_sync_debug_mode(Error): queueing them must never
// wait for the device.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/autograd.h"
#include "engine/cuda/sync_debug.h"
#include "engine/optim/adam.h"
#include "engine/optim/grad_scaler.h"
#include "engine/optim/optimizer.h"
#include "engine/optim/sgd.h"
#include "engine/tensor.h"
#include "parity/parity_harness.h"

namespace kiln::testing {

using MakeOptimizer = std::function<std::unique_ptr<Optimizer>(std::vector<Tensor>)>;

inline std::map<std::string, MakeOptimizer> device_step_optimizers() {
  using P = std::vector<Tensor>;
  return {
      {"sgd_momentum_dampening",
       [](P p) { return std::make_unique<SGD>(std::move(p), 0.1, 0.9, 0.25, 0.01); }},
      {"adam", [](P p) { return std::make_unique<Adam>(std::move(p), 1e-2); }},
      {"adamw", [](P p) { return std::make_unique<AdamW>(std::move(p), 1e-2); }},
  };
}

// Runs the two paths on `device` and compares them (gtest expectations).
inline void expect_device_path_matches_host(Device device, const MakeOptimizer& make) {
  constexpr int kSteps = 14;
  const double kInf = std::numeric_limits<double>::infinity();
  const std::vector<Shape> shapes = {{5}, {40000}, {7}};
  const std::vector<DType> dtypes = {DType::F32, DType::F32, DType::F64};
  // step -> (parameter, value) injected into element 3 of c.
  const std::map<int, std::pair<size_t, double>> injected = {
      {0, {0, kInf}}, {4, {1, -kInf}}, {5, {2, std::nan("")}}, {9, {1, kInf}}};

  NoGradGuard no_grad;
  std::vector<Tensor> host_params, device_params;
  for (size_t k = 0; k < shapes.size(); ++k) {
    std::vector<double> init(static_cast<size_t>(shape_numel(shapes[k])));
    for (size_t i = 0; i < init.size(); ++i) init[i] = std::sin(0.37 * static_cast<double>(i + k));
    const Tensor t = Tensor::from_vector(init, shapes[k]).to(dtypes[k]);
    host_params.push_back(leaf_on(t.clone(), device));  // clones: to() of a tensor already on
    device_params.push_back(leaf_on(t.clone(), device));  // the device would share its memory
  }
  // c[s][k]: the unscaled gradient of parameter k at step s.
  std::vector<std::vector<Tensor>> c(kSteps);
  for (int s = 0; s < kSteps; ++s) {
    for (size_t k = 0; k < shapes.size(); ++k) {
      std::vector<double> v(static_cast<size_t>(shape_numel(shapes[k])));
      for (size_t i = 0; i < v.size(); ++i)
        v[i] = std::cos(0.11 * static_cast<double>(i) + s) * std::ldexp(1.0, -(s % 5));
      auto it = injected.find(s);
      if (it != injected.end() && it->second.first == k) v[3] = it->second.second;
      c[s].push_back(Tensor::from_vector(v, shapes[k]).to(dtypes[k]).to(device));
    }
  }

  GradScalerOptions options;
  options.init_scale = 1024.0;
  options.growth_interval = 3;
  GradScaler host_scaler(options), device_scaler(options);
  device_scaler.keep_on_device(device);
  std::unique_ptr<Optimizer> host_opt = make(host_params), device_opt = make(device_params);

  auto lr_at = [&](int s) { return s % 4 == 3 ? host_opt->lr() * 0.5 : host_opt->lr(); };
  for (int s = 0; s < kSteps; ++s) {
    SCOPED_TRACE("step " + std::to_string(s));
    const double lr = lr_at(s);
    host_opt->set_lr(lr);
    for (size_t k = 0; k < shapes.size(); ++k)
      host_params[k].set_grad(host_scaler.scale(c[s][k]));
    const bool inf = host_scaler.unscale_(host_params);
    EXPECT_EQ(inf, injected.count(s) == 1);
    if (host_scaler.update(inf)) host_opt->step();

    cuda::set_sync_debug_mode(cuda::SyncDebug::Error);
    device_opt->set_lr(lr);
    for (size_t k = 0; k < shapes.size(); ++k)
      device_params[k].set_grad(device_scaler.scale(c[s][k]));
    device_scaler.unscale_on_device(device_params);
    device_opt->step(device_scaler.found_inf());
    device_scaler.update_on_device();
    cuda::set_sync_debug_mode(cuda::SyncDebug::Off);

    if (s == kSteps / 2) {  // a read in the middle drains the device's change log
      EXPECT_EQ(device_scaler.scale_value(), host_scaler.scale_value());
      EXPECT_EQ(device_scaler.history().size(), host_scaler.history().size());
    }
  }
  for (size_t k = 0; k < shapes.size(); ++k)
    EXPECT_TRUE(bit_identical("parameter " + std::to_string(k), device_params[k], host_params[k]));
  const auto host_state = host_opt->state_dict(), device_state = device_opt->state_dict();
  ASSERT_EQ(device_state.size(), host_state.size());
  for (const auto& [key, want] : host_state) {
    ASSERT_EQ(device_state.count(key), 1u) << key;
    EXPECT_TRUE(bit_identical("optimizer state " + key, device_state.at(key), want));
  }
  EXPECT_EQ(device_opt->step_count(), kSteps - static_cast<int64_t>(injected.size()));
  EXPECT_EQ(device_scaler.steps(), kSteps);
  EXPECT_EQ(device_scaler.skipped_steps(), static_cast<int64_t>(injected.size()));
  EXPECT_EQ(device_scaler.skipped_steps(), host_scaler.skipped_steps());
  EXPECT_EQ(device_scaler.growth_tracker(), host_scaler.growth_tracker());
  EXPECT_EQ(device_scaler.scale_value(), host_scaler.scale_value());
  const auto& want = host_scaler.history();
  const auto& got = device_scaler.history();
  ASSERT_EQ(got.size(), want.size());
  EXPECT_GT(want.size(), 3u);  // the run grows and backs off the scale several times
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].step, want[i].step) << "change " << i;
    EXPECT_EQ(got[i].scale, want[i].scale) << "change " << i;
  }
}

}  // namespace kiln::testing
