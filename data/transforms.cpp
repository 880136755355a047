// transforms.cpp: the transforms of transforms.h, as plain loops over CHW float arrays.
#include "data/transforms.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <utility>

#include "engine/error.h"
#include "engine/philox.h"

namespace kiln {

namespace {

[[noreturn]] void usage(const std::string& what) { throw Error(what, ErrorKind::Usage); }

// A CHW shape with every dimension >= 1, or a Usage error naming the transform.
void check_chw(const Shape& in, const char* who) {
  bool ok = in.size() == 3;
  for (int64_t d : in) ok = ok && d >= 1;
  if (!ok) usage(detail::str(who, ": expects a CHW example shape, got ", shape_str(in)));
}

// A uniform integer in [0, n) from 32 random bits (multiply-shift; bias <= n / 2^32).
int64_t below(uint32_t bits, int64_t n) {
  return static_cast<int64_t>((static_cast<uint64_t>(bits) * static_cast<uint64_t>(n)) >> 32);
}

constexpr int64_t kEpochBits = 24, kIndexBits = 34, kMaxSteps = 16;

}  // namespace

uint64_t sample_counter(const SampleContext& ctx) {
  if (ctx.epoch < 0 || ctx.epoch >= (int64_t{1} << kEpochBits) || ctx.index < 0 ||
      ctx.index >= (int64_t{1} << kIndexBits) || ctx.step < 0 || ctx.step >= kMaxSteps) {
    usage(detail::str("transform random stream: epoch ", ctx.epoch, ", index ", ctx.index,
                      ", step ", ctx.step, " out of range (epoch < 2^24, index < 2^34, step < 16)"));
  }
  // Bits 63..40 epoch, 39..6 index, 5..2 step, 1..0 the 4 counters (16 draws) of the call.
  const uint64_t e = static_cast<uint64_t>(ctx.epoch), i = static_cast<uint64_t>(ctx.index),
                 s = static_cast<uint64_t>(ctx.step);
  return (((e << kIndexBits) + i) * kMaxSteps + s) * (kDrawsPerStep / 4);
}

uint32_t sample_draw(const SampleContext& ctx, int j) {
  if (j < 0 || j >= kDrawsPerStep) usage(detail::str("sample_draw: draw ", j, " out of 0..15"));
  return philox_u32(ctx.seed, sample_counter(ctx), static_cast<uint64_t>(j));
}

Transform::~Transform() = default;

// ---- Compose ------------------------------------------------------------------------------

Compose::Compose(Shape input_shape, std::vector<std::shared_ptr<const Transform>> steps)
    : input_shape_(std::move(input_shape)), steps_(std::move(steps)) {
  check_chw(input_shape_, "Compose");
  if (static_cast<int64_t>(steps_.size()) > kMaxSteps) {
    usage(detail::str("Compose: ", steps_.size(), " transforms; at most 16 are supported"));
  }
  shapes_.push_back(input_shape_);
  for (size_t k = 0; k < steps_.size(); ++k) {
    if (!steps_[k]) usage(detail::str("Compose: transform ", k, " is null"));
    shapes_.push_back(steps_[k]->output_shape(shapes_.back()));
  }
  // Step k reads buffer k and writes buffer k+1: buffer 0 is `in`, the last is `out`, and the
  // intermediates 1..n-1 alternate between two scratch halves (A, B, A, ...), each as large
  // as the largest intermediate. One intermediate needs only half A.
  const size_t n = steps_.size();
  for (size_t k = 1; k + 1 <= n; ++k) half_ = std::max(half_, shape_numel(shapes_[k]));
  scratch_floats_ = n >= 3 ? 2 * half_ : (n == 2 ? half_ : 0);
}

void Compose::apply(const float* in, float* out, const SampleContext& ctx, float* scratch) const {
  const size_t n = steps_.size();
  if (n == 0) {
    std::memcpy(out, in, sizeof(float) * static_cast<size_t>(shape_numel(input_shape_)));
    return;
  }
  const float* src = in;
  for (size_t k = 0; k < n; ++k) {
    float* dst = k + 1 == n ? out : scratch + (k % 2 == 0 ? 0 : half_);
    SampleContext step_ctx = ctx;
    step_ctx.step = static_cast<int64_t>(k);
    steps_[k]->apply(src, shapes_[k], dst, step_ctx);
    src = dst;
  }
}

std::string Compose::describe() const {
  std::ostringstream s;
  s << "Compose[";
  for (size_t k = 0; k < steps_.size(); ++k) s << (k ? ", " : "") << steps_[k]->describe();
  s << "] " << shape_str(input_shape_) << " -> " << shape_str(output_shape());
  return s.str();
}

// ---- Normalize ----------------------------------------------------------------------------

Normalize::Normalize(std::vector<float> mean, std::vector<float> std)
    : mean_(std::move(mean)), std_(std::move(std)) {
  if (mean_.empty() || mean_.size() != std_.size()) {
    usage(detail::str("Normalize: mean and std need the same number (>= 1) of values, got ",
                      mean_.size(), " and ", std_.size()));
  }
  for (float s : std_) {
    if (!(s > 0) || !std::isfinite(s)) usage(detail::str("Normalize: std ", s, " is not > 0"));
  }
}

Shape Normalize::output_shape(const Shape& in) const {
  check_chw(in, "Normalize");
  if (mean_.size() != 1 && static_cast<int64_t>(mean_.size()) != in[0]) {
    usage(detail::str("Normalize: ", mean_.size(), " channel means for an input of ", in[0],
                      " channels ", shape_str(in)));
  }
  return in;
}

void Normalize::apply(const float* in, const Shape& in_shape, float* out,
                      const SampleContext&) const {
  const int64_t channels = in_shape[0], plane = in_shape[1] * in_shape[2];
  for (int64_t c = 0; c < channels; ++c) {
    const size_t p = mean_.size() == 1 ? 0 : static_cast<size_t>(c);
    const float m = mean_[p], s = std_[p];
    for (int64_t k = 0; k < plane; ++k) out[c * plane + k] = (in[c * plane + k] - m) / s;
  }
}

std::string Normalize::describe() const {
  std::ostringstream s;
  s << "Normalize(mean=[";
  for (size_t k = 0; k < mean_.size(); ++k) s << (k ? ", " : "") << mean_[k];
  s << "], std=[";
  for (size_t k = 0; k < std_.size(); ++k) s << (k ? ", " : "") << std_[k];
  s << "])";
  return s.str();
}

// ---- RandomCrop ---------------------------------------------------------------------------

RandomCrop::RandomCrop(int64_t size, int64_t padding) : size_(size), padding_(padding) {
  if (size < 1 || padding < 0) {
    usage(detail::str("RandomCrop: size ", size, " must be >= 1 and padding ", padding, " >= 0"));
  }
}

Shape RandomCrop::output_shape(const Shape& in) const {
  check_chw(in, "RandomCrop");
  if (in[1] + 2 * padding_ < size_ || in[2] + 2 * padding_ < size_) {
    usage(detail::str("RandomCrop: a ", size_, "x", size_, " crop does not fit in ",
                      shape_str(in), " padded by ", padding_));
  }
  return {in[0], size_, size_};
}

void RandomCrop::apply(const float* in, const Shape& in_shape, float* out,
                       const SampleContext& ctx) const {
  const int64_t channels = in_shape[0], height = in_shape[1], width = in_shape[2];
  // The window's top-left corner in padded coordinates: 0..(H + 2p - size), 0..(W + 2p - size).
  const int64_t top = below(sample_draw(ctx, 0), height + 2 * padding_ - size_ + 1);
  const int64_t left = below(sample_draw(ctx, 1), width + 2 * padding_ - size_ + 1);
  for (int64_t c = 0; c < channels; ++c) {
    for (int64_t y = 0; y < size_; ++y) {
      const int64_t src_y = top + y - padding_;  // row in the unpadded input
      for (int64_t x = 0; x < size_; ++x) {
        const int64_t src_x = left + x - padding_;
        const bool inside = src_y >= 0 && src_y < height && src_x >= 0 && src_x < width;
        out[(c * size_ + y) * size_ + x] = inside ? in[(c * height + src_y) * width + src_x] : 0.0f;
      }
    }
  }
}

std::string RandomCrop::describe() const {
  return detail::str("RandomCrop(size=", size_, ", padding=", padding_, ")");
}

// ---- RandomHorizontalFlip -----------------------------------------------------------------

RandomHorizontalFlip::RandomHorizontalFlip(double p) : p_(p) {
  if (!(p >= 0 && p <= 1)) usage(detail::str("RandomHorizontalFlip: p ", p, " is not in [0, 1]"));
}

Shape RandomHorizontalFlip::output_shape(const Shape& in) const {
  check_chw(in, "RandomHorizontalFlip");
  return in;
}

void RandomHorizontalFlip::apply(const float* in, const Shape& in_shape, float* out,
                                 const SampleContext& ctx) const {
  const int64_t rows = in_shape[0] * in_shape[1], width = in_shape[2];  // every row of every channel
  const bool flip = static_cast<double>(uniform01(sample_draw(ctx, 0))) < p_;
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = in + r * width;
    float* dst = out + r * width;
    for (int64_t x = 0; x < width; ++x) dst[x] = flip ? src[width - 1 - x] : src[x];
  }
}

std::string RandomHorizontalFlip::describe() const {
  return detail::str("RandomHorizontalFlip(p=", p_, ")");
}

// ---- Resize -------------------------------------------------------------------------------

Resize::Resize(int64_t height, int64_t width) : height_(height), width_(width) {
  if (height < 1 || width < 1) usage(detail::str("Resize: size ", height, "x", width, " must be >= 1"));
}

Shape Resize::output_shape(const Shape& in) const {
  check_chw(in, "Resize");
  return {in[0], height_, width_};
}

namespace {

// Where output coordinate `o` samples the input axis of n_in pixels when it is resized to
// n_out (align_corners=False): the two neighbours i0 <= i1 and the weight of i1.
struct Tap {
  int64_t i0, i1;
  float w1;
};
Tap bilinear_tap(int64_t o, int64_t n_in, int64_t n_out) {
  const float scale = static_cast<float>(n_in) / static_cast<float>(n_out);
  float src = (static_cast<float>(o) + 0.5f) * scale - 0.5f;  // output centre in input pixels
  if (src < 0) src = 0;  // PyTorch clamps below; above, i1 is clamped to the last pixel
  const int64_t i0 = std::min(static_cast<int64_t>(src), n_in - 1);
  const int64_t i1 = std::min(i0 + 1, n_in - 1);
  return Tap{i0, i1, src - static_cast<float>(i0)};
}

}  // namespace

void Resize::apply(const float* in, const Shape& in_shape, float* out, const SampleContext&) const {
  const int64_t channels = in_shape[0], h_in = in_shape[1], w_in = in_shape[2];
  for (int64_t y = 0; y < height_; ++y) {
    const Tap ty = bilinear_tap(y, h_in, height_);
    for (int64_t x = 0; x < width_; ++x) {
      const Tap tx = bilinear_tap(x, w_in, width_);
      for (int64_t c = 0; c < channels; ++c) {
        const float* plane = in + c * h_in * w_in;
        // Interpolate along x in the two rows, then along y; a + (b - a) * w keeps a constant
        // image exactly constant.
        const float a = plane[ty.i0 * w_in + tx.i0], b = plane[ty.i0 * w_in + tx.i1];
        const float c0 = plane[ty.i1 * w_in + tx.i0], d = plane[ty.i1 * w_in + tx.i1];
        const float top = a + (b - a) * tx.w1, bottom = c0 + (d - c0) * tx.w1;
        out[(c * height_ + y) * width_ + x] = top + (bottom - top) * ty.w1;
      }
    }
  }
}

std::string Resize::describe() const { return detail::str("Resize(", height_, "x", width_, ")"); }

}  // namespace kiln
