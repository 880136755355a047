// mnist_cpu.cpp: the CPU kernel of data/device_mnist.h (see mnist_kernels.h). One pass over the
// batch's rows, split across OpenMP threads; each row is one example's 784 pixels.
#include <cstdint>

#include "data/mnist_kernels.h"

namespace kiln::cpu {

void gather_mnist_batch(Backend, const uint8_t* images, const uint8_t* labels, int64_t pixels,
                        const int64_t* indices, int64_t rows, float* out_images,
                        int64_t* out_labels) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* src = images + indices[r] * pixels;
    float* dst = out_images + r * pixels;
    for (int64_t p = 0; p < pixels; ++p) dst[p] = mnist_pixel_of(src[p]);
    out_labels[r] = labels[indices[r]];
  }
}

}  // namespace kiln::cpu
