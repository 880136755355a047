// mnist_kernels.h: the CPU and CUDA kernels behind data/device_mnist.h (called only inside
// kiln_data), and the pixel rule they share with MnistDataset::get() (data/mnist.h). Twins of
// one name and signature in cpu:: and cuda:: (engine/dispatch.h).
//
// The rule, written once: a raw MNIST byte becomes the float32 the PyTorch MNIST example feeds
// its model, (pixel / 255 - 0.1307) / 0.3081, computed in float32 in torchvision's order
// (ToTensor divides by 255, then Normalize). It is two IEEE-rounded operations and one
// subtraction, with no multiply that a compiler could fuse into an add, so the host, the
// simulator and nvcc (whose float division is IEEE round-to-nearest by default, -prec-div=true)
// give the same bits: a batch gathered on the GPU equals the loader's batch bit for bit.
#pragma once

#include <cstdint>

#include "engine/backend.h"
#include "engine/host_device.h"  // KILN_HOST_DEVICE

namespace kiln {

// The mean and standard deviation of MNIST's training pixels / 255 (MnistDataset::kMean, kStd).
constexpr float kMnistMean = 0.1307f, kMnistStd = 0.3081f;

// The float32 value of raw pixel byte `pixel`, normalised.
KILN_HOST_DEVICE inline float mnist_pixel_of(uint8_t pixel) {
  return (static_cast<float>(pixel) / 255.0f - kMnistMean) / kMnistStd;
}

namespace cpu {
// Gathers `rows` examples of a set of raw MNIST images into one batch: row r of the batch is
// example indices[r] of the set. images is (examples, pixels) u8, labels (examples) u8;
// out_images is (rows, pixels) f32, out_images[r][p] = mnist_pixel_of(images[indices[r]][p]);
// out_labels is (rows), out_labels[r] = labels[indices[r]]. The indices must be in range (the
// caller checks them on the host).
void gather_mnist_batch(Backend, const uint8_t* images, const uint8_t* labels, int64_t pixels,
                        const int64_t* indices, int64_t rows, float* out_images,
                        int64_t* out_labels);
}  // namespace cpu

namespace cuda {
// The same on device arrays, launched on current_stream().
void gather_mnist_batch(Backend, const uint8_t* images, const uint8_t* labels, int64_t pixels,
                        const int64_t* indices, int64_t rows, float* out_images,
                        int64_t* out_labels);
}  // namespace cuda

}  // namespace kiln
