// layout.h: the three activation layouts of Kiln's 2-D layers, and the moves between them.
//
//   NCHW       (N, C, H, W): the plain layout every kernel accepts.
//   NHWC       (N, C, H, W) in the channels-last memory format (engine/tensor.h): the shape is
//              NCHW, the bytes lie in (N, H, W, C) order. What oneDNN's and cuDNN's 16-bit
//              convolutions read directly. The input picks it (x.to(MemoryFormat::ChannelsLast),
//              or Module::to(MemoryFormat) for a model), and the layers keep it.
//   NCHW16c    (N, C/16, H, W, 16): channels in blocks of 16, the 16 channels of one pixel
//              side by side. oneDNN calls it nChw16c: one AVX-512 register holds one pixel of
//              one block, and its fastest CPU convolutions read and write only this layout.
//
// Why it exists. Given NCHW, oneDNN reorders every convolution's input into blocks and its
// output back (PyTorch's mkldnn path does the same): for ResNet-50 training at 128x128 that is
// ~230 ms of a ~1.4 s step on two cores, pure copying. A network whose activations stay
// blocked between layers pays it once at the entry. The layers that see such activations
// (Conv2d, BatchNorm2d; element-wise ops do not care) recognise the layout by its shape: rank
// 5 with a last dimension of 16. The logical channel of x[n][cb][h][w][l] is cb * 16 + l.
//
// Where a layer has no kernel for the blocked layout (CUDA, f64 or the hand CPU convolution),
// it converts, runs its NCHW kernel and converts back: correct everywhere, fast where it pays.
// preferred_layout() says where it pays: f32 on the CPU with the vendor (oneDNN) kernels.
#pragma once

#include <cstdint>

#include "engine/tensor.h"

namespace kiln {

enum class Layout { NCHW, NCHW16c, NHWC };

constexpr int64_t kChannelBlock = 16;

// True for a (N, C/16, H, W, 16) tensor.
bool is_channel_blocked(const Tensor& x);
// NCHW16c when is_channel_blocked(x), NHWC when x is channels-last, else NCHW.
Layout layout_of(const Tensor& x);

// The number of logical channels: C of an NCHW tensor, C/16 * 16 of a blocked one.
int64_t logical_channels(const Tensor& x);

// (N, C, H, W) <-> (N, C/16, H, W, 16); C must be a multiple of 16. Differentiable copies
// (reshape + transpose), on any device.
Tensor to_channel_blocks(const Tensor& x);
Tensor from_channel_blocks(const Tensor& x);

// The layout that is fastest for activations of `channels` channels like x (its device,
// dtype and the CPU kernel implementation): NHWC when x is channels-last (the input's choice
// stands), else NCHW16c for f32 on the CPU under Impl::Vendor when channels is a multiple of
// 16, NCHW otherwise.
Layout preferred_layout(const Tensor& x, int64_t channels);

// x in `layout` (x itself when it already is).
Tensor as_layout(const Tensor& x, Layout layout);

}  // namespace kiln
