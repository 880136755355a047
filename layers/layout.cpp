// layout.cpp: the blocked channel layout's conversions (see layout.h).
#include "layers/layout.h"

#include <cstdint>

#include "engine/autocast.h"

#include "engine/error.h"
#include "engine/impl.h"
#include "engine/ops.h"

namespace kiln {

bool is_channel_blocked(const Tensor& x) {
  return x.defined() && x.dim() == 5 && x.size(4) == kChannelBlock;
}

Layout layout_of(const Tensor& x) {
  if (is_channel_blocked(x)) return Layout::NCHW16c;
  return x.defined() && x.is_channels_last() ? Layout::NHWC : Layout::NCHW;
}

int64_t logical_channels(const Tensor& x) {
  return is_channel_blocked(x) ? x.size(1) * kChannelBlock : x.size(1);
}

Tensor to_channel_blocks(const Tensor& x) {
  KILN_CHECK(x.defined() && x.dim() == 4 && x.size(1) % kChannelBlock == 0,
             "to_channel_blocks: expected (N, C, H, W) with C a multiple of ", kChannelBlock,
             ", got ", x.defined() ? shape_str(x.shape()) : "an undefined tensor");
  const int64_t n = x.size(0), cb = x.size(1) / kChannelBlock, h = x.size(2), w = x.size(3);
  // (N, CB, 16, HW) -> (N, CB, HW, 16): each pixel's 16 channels become contiguous.
  return transpose(x.reshape({n, cb, kChannelBlock, h * w}), 2, 3).reshape({n, cb, h, w, kChannelBlock});
}

Tensor from_channel_blocks(const Tensor& x) {
  KILN_CHECK(is_channel_blocked(x), "from_channel_blocks: expected (N, C/16, H, W, 16), got ",
             x.defined() ? shape_str(x.shape()) : "an undefined tensor");
  const int64_t n = x.size(0), cb = x.size(1), h = x.size(2), w = x.size(3);
  return transpose(x.reshape({n, cb, h * w, kChannelBlock}), 2, 3).reshape({n, cb * kChannelBlock, h, w});
}

Layout preferred_layout(const Tensor& x, int64_t channels) {
  if (x.is_channels_last()) return Layout::NHWC;
  // Under autocast the low-precision convolutions take NCHW only (layers/conv2d_lowp.cpp).
  const bool fast = x.device().type == DeviceType::CPU && x.dtype() == DType::F32 &&
                    conv_impl(x.device(), x.dtype()) == Impl::Vendor &&
                    channels % kChannelBlock == 0 && !autocast_applies(x);
  return fast ? Layout::NCHW16c : Layout::NCHW;
}

Tensor as_layout(const Tensor& x, Layout layout) {
  const Layout from = layout_of(x);
  if (from == layout) return x;
  const Tensor nchw = from == Layout::NCHW16c ? from_channel_blocks(x) : x.contiguous();
  switch (layout) {
    case Layout::NCHW: return nchw;
    case Layout::NCHW16c: return to_channel_blocks(nchw);
    case Layout::NHWC: return nchw.to(MemoryFormat::ChannelsLast);
  }
  return nchw;
}

}  // namespace kiln
