// grad_scaler_device_cuda_test.cpp: GradScaler's device-side path on cuda:0 (found_inf left in
// device memory and read by the optimizer's kernels, the scale rule run as a one-thread kernel,
// the learning rate and step counts read on the device) against the host's decisions on the
// same device: bit for bit the same parameters, optimizer state, scale history and counts, for
// SGD with momentum and dampening, Adam and AdamW, over steps with injected inf and NaN
// gradients (tests/engine/device_step_harness.h). The device-side steps run under the sync
// debug mode's error setting: none of them waits for the device.
#include <gtest/gtest.h>

#include "engine/device.h"
#include "engine/device_step_harness.h"  // tests/engine
#include "support/cuda_skip.h"

namespace kiln {
namespace {

TEST(GradScalerDeviceCuda, DevicePathMatchesHostPath) {
  KILN_SKIP_WITHOUT_CUDA();
  for (const auto& [name, make] : testing::device_step_optimizers()) {
    SCOPED_TRACE(name);
    testing::expect_device_path_matches_host(Device(DeviceType::CUDA, 0), make);
  }
}

}  // namespace
}  // namespace kiln
