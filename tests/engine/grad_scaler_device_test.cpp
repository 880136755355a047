// grad_scaler_device_test.cpp: GradScaler's device-side path (state in memory, found_inf read
// by the optimizer's kernels, the scale rule run as a kernel twin) with the state kept on the
// CPU: the same parameters, optimizer state, history and counts as the host's decisions, bit
// for bit (tests/engine/device_step_harness.h), for SGD with momentum and dampening, Adam and
// AdamW; and the host and device APIs mixed on one scaler.
#include <gtest/gtest.h>

#include <vector>

#include "engine/device.h"
#include "engine/optim/grad_scaler.h"
#include "engine/tensor.h"
#include "engine/device_step_harness.h"  // tests/engine

namespace kiln {
namespace {

TEST(GradScalerDevice, DevicePathMatchesHostPathOnTheCpu) {
  for (const auto& [name, make] : testing::device_step_optimizers()) {
    SCOPED_TRACE(name);
    testing::expect_device_path_matches_host(Device(), make);
  }
}

TEST(GradScalerDevice, HostAndDeviceCallsMixOnOneScaler) {
  GradScalerOptions o;
  o.init_scale = 8.0;
  o.growth_interval = 1;  // doubles after every finite step
  GradScaler s(o);
  Tensor p = Tensor::zeros({2}).set_requires_grad(true);
  p.set_grad(Tensor::ones({2}));
  EXPECT_TRUE(s.update(s.unscale_({p})));  // host: 8 -> 16
  s.keep_on_device(Device());
  s.unscale_on_device({p});                // device: divides by 16; 16 -> 32
  s.update_on_device();
  EXPECT_EQ(s.scale_value(), 32.0);
  // Divided by 8 on the host, then by 16 on the "device".
  EXPECT_EQ(p.grad().to_vector<float>(), (std::vector<float>{1.0f / 128, 1.0f / 128}));
  EXPECT_TRUE(s.update(false));            // host again: 32 -> 64
  s.unscale_on_device({p});
  s.update_on_device();                    // 64 -> 128
  EXPECT_EQ(s.steps(), 4);
  EXPECT_EQ(s.scale_value(), 128.0);
  ASSERT_EQ(s.history().size(), 5u);
  EXPECT_EQ(s.history()[4].step, 4);
  EXPECT_EQ(s.history()[4].scale, 128.0);
}

}  // namespace
}  // namespace kiln
