// mnist_cuda.cu: the CUDA kernel of data/device_mnist.h (see mnist_kernels.h).
//
// Parallelisation: one thread per output pixel, blocks of 256, consecutive threads on
// consecutive pixels of a row (the writes are coalesced; the reads are too, within each
// example's 784 bytes). The grid is capped and each thread strides by the grid's size, so one
// launch covers any batch. The thread of a row's first pixel also writes the row's label. The
// arithmetic is the shared pixel rule, so every value equals the CPU's bit for bit.
#include "engine/cuda/runtime.h"

#include <cstdint>

#include "data/mnist_kernels.h"
#include "engine/cuda/context.h"
#include "engine/cuda/kernels/common.h"
#include "engine/cuda/launch.h"

namespace kiln::cuda {

namespace {

constexpr int kThreads = 256;
constexpr unsigned kMaxBlocks = 4096;

__global__ void gather_mnist_batch_kernel(const uint8_t* __restrict__ images,
                                          const uint8_t* __restrict__ labels, int64_t pixels,
                                          const int64_t* __restrict__ indices, int64_t rows,
                                          float* __restrict__ out_images,
                                          int64_t* __restrict__ out_labels) {
  const int64_t n = rows * pixels;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const int64_t r = i / pixels, p = i - r * pixels;
    const int64_t example = indices[r];
    out_images[i] = mnist_pixel_of(images[example * pixels + p]);
    if (p == 0) out_labels[r] = labels[example];
  }
}

}  // namespace

void gather_mnist_batch(Backend, const uint8_t* images, const uint8_t* labels, int64_t pixels,
                        const int64_t* indices, int64_t rows, float* out_images,
                        int64_t* out_labels) {
  if (rows == 0 || pixels == 0) return;
  launch(gather_mnist_batch_kernel,
         grid_stride_config_1d(rows * pixels, kThreads, kMaxBlocks, current_stream()), images,
         labels, pixels, indices, rows, out_images, out_labels);
}

}  // namespace kiln::cuda
