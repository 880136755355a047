// autocast_activations_cuda_test.cpp: a narrow ResNet-18 trains on cuda:0 with 16-bit
// activations between its layers (AutocastOutputs::LowPrecision), NCHW and channels-last,
// bf16 and f16, close to its f32 step as on the CPU (tests/support/autocast_resnet_step.h says
// how close and why), with one memory-format conversion per channels-last step (the image).
#include <gtest/gtest.h>

#include "engine/dtype.h"
#include "engine/impl.h"
#include "parity/parity_harness.h"
#include "support/autocast_resnet_step.h"
#include "support/cuda_skip.h"

namespace kiln {
namespace {

TEST(AutocastActivationsCuda, AResNetTrainsInBf16Activations) {
  KILN_SKIP_WITHOUT_CUDA();
  KernelsGuard vendor(Impl::Vendor);
  testing::check_resnet_with_16bit_activations(DType::BF16, testing::kCuda);
}

TEST(AutocastActivationsCuda, AResNetTrainsInF16Activations) {
  KILN_SKIP_WITHOUT_CUDA();
  KernelsGuard vendor(Impl::Vendor);
  testing::check_resnet_with_16bit_activations(DType::F16, testing::kCuda);
}

}  // namespace
}  // namespace kiln
