// transforms.h: per-example transforms (augmentation and normalisation) applied by the Loader
// and the BatchIterator after Dataset::get(), like torchvision.transforms.
//
// A Transform maps one example, float32 CHW of shape `in_shape`, to float32 CHW of the fixed
// shape output_shape(in_shape). apply() is const, thread-safe and allocates nothing: the
// Loader's worker threads share one pipeline.
//
// Randomness without shared state. A random transform (RandomCrop, RandomHorizontalFlip)
// draws its numbers from the counter-based Philox generator (engine/philox.h):
//
//     key     = ctx.seed
//     counter = ((ctx.epoch * 2^34 + ctx.index) * 16 + ctx.step) * 4        (sample_counter)
//     draw j  = philox_u32(key, counter, j),   j = 0..15  (kDrawsPerStep)
//
// so a transform of example `index` in epoch `epoch` at position `step` of its Compose
// pipeline gets its own 16 numbers, disjoint from every other (epoch, index, step) (for
// epoch < 2^24, index < 2^34, step < 16; checked). The result is a pure function of
// (seed, epoch, index, step): it never depends on which worker thread ran the example or in
// what order, so a batch is bit-identical for 0, 1 or 8 workers, and a resumed run
// augments exactly like an uninterrupted one. A new epoch draws new crops and flips.
//
// Shapes are CHW without the batch dimension, e.g. {1, 28, 28} for MNIST, {3, 32, 32} for
// CIFAR-10. Bad parameters or an input shape a transform cannot take throw kiln::Error
// (ErrorKind::Usage) from the constructor or from output_shape() (so from Compose's
// constructor, before any data flows).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/tensor.h"

namespace kiln {

// Identifies one example's transform call. The Loader fills {seed, epoch, index} (index: the
// dataset index, not the position in the batch); Compose sets `step` for each transform.
struct SampleContext {
  uint64_t seed = 0;
  int64_t epoch = 0;
  int64_t index = 0;
  int64_t step = 0;  // position of the transform in its Compose pipeline (0 outside one)
};

// Random numbers a transform may draw per call: philox_u32(ctx.seed, sample_counter(ctx), j)
// for j in 0..kDrawsPerStep-1.
constexpr int kDrawsPerStep = 16;
// The Philox counter of a call (formula above). Throws kiln::Error (Usage) when epoch, index
// or step is out of its range.
uint64_t sample_counter(const SampleContext& ctx);
// Draw j (0..kDrawsPerStep-1) of the call `ctx`.
uint32_t sample_draw(const SampleContext& ctx, int j);

class Transform {
 public:
  virtual ~Transform();
  // The output shape for input shape `in` (CHW). Throws kiln::Error (Usage) if this
  // transform cannot take `in`.
  virtual Shape output_shape(const Shape& in) const = 0;
  // in: float[shape_numel(in_shape)], CHW; out: float[shape_numel(output_shape(in_shape))].
  // in and out do not overlap. Thread-safe, allocates nothing.
  virtual void apply(const float* in, const Shape& in_shape, float* out,
                     const SampleContext& ctx) const = 0;
  // One line, e.g. "RandomCrop(size=28, padding=4)".
  virtual std::string describe() const = 0;
};

// A pipeline of transforms for one input shape, applied in order (torchvision's Compose).
// The intermediate results go into caller-owned scratch memory (scratch_floats() floats per
// concurrent call), so apply() allocates nothing and one Compose serves every worker.
class Compose {
 public:
  // Checks that each step accepts the previous one's output (throws kiln::Error, Usage) and
  // sizes the scratch. An empty pipeline copies its input. At most 16 steps.
  Compose(Shape input_shape, std::vector<std::shared_ptr<const Transform>> steps);

  const Shape& input_shape() const { return input_shape_; }
  const Shape& output_shape() const { return shapes_.back(); }
  // Floats of scratch apply() needs (0 for fewer than 2 steps).
  int64_t scratch_floats() const { return scratch_floats_; }
  // in: float[shape_numel(input_shape())]; out: float[shape_numel(output_shape())];
  // scratch: float[scratch_floats()] (may be null when that is 0). ctx.step is ignored (each
  // step gets its own position). Thread-safe, allocates nothing.
  void apply(const float* in, float* out, const SampleContext& ctx, float* scratch) const;
  size_t size() const { return steps_.size(); }
  // "Compose[RandomCrop(size=28, padding=4), Normalize(...)] [1, 28, 28] -> [1, 28, 28]".
  std::string describe() const;

 private:
  Shape input_shape_;
  std::vector<std::shared_ptr<const Transform>> steps_;
  std::vector<Shape> shapes_;  // shapes_[0] = input, shapes_[k+1] = output of step k
  int64_t half_ = 0;           // floats of each of the two ping-pong scratch buffers
  int64_t scratch_floats_ = 0;
};

// out[c, y, x] = (in[c, y, x] - mean[c]) / std[c], in float32 like torchvision's Normalize.
// mean and std have one value per channel, or one value for all channels; std > 0.
class Normalize : public Transform {
 public:
  Normalize(std::vector<float> mean, std::vector<float> std);
  Shape output_shape(const Shape& in) const override;
  void apply(const float* in, const Shape& in_shape, float* out,
             const SampleContext& ctx) const override;
  std::string describe() const override;

 private:
  std::vector<float> mean_, std_;
};

// torchvision's RandomCrop(size, padding): pads H and W with `padding` zeros on every side,
// then takes a size x size window at a uniformly random offset (draws 0 and 1: top, left).
// Zero is zero in whatever space the input is in: put it before Normalize to pad with black.
class RandomCrop : public Transform {
 public:
  explicit RandomCrop(int64_t size, int64_t padding = 0);
  Shape output_shape(const Shape& in) const override;  // {C, size, size}
  void apply(const float* in, const Shape& in_shape, float* out,
             const SampleContext& ctx) const override;
  std::string describe() const override;

 private:
  int64_t size_, padding_;
};

// Mirrors W (x -> W-1-x) with probability p (draw 0: flip when uniform01(draw) < p).
class RandomHorizontalFlip : public Transform {
 public:
  explicit RandomHorizontalFlip(double p = 0.5);
  Shape output_shape(const Shape& in) const override;  // = in
  void apply(const float* in, const Shape& in_shape, float* out,
             const SampleContext& ctx) const override;
  std::string describe() const override;

 private:
  double p_;
};

// Bilinear resize of every channel to height x width, sampling like PyTorch's
// F.interpolate(mode="bilinear", align_corners=False, antialias=False): output pixel centre
// (y + 0.5) * H_in / H_out - 0.5, clamped to the image. (Our own loop, not stb_image_resize:
// stb's float API mallocs per call, wants interleaved HWC, and filters with Mitchell /
// Catmull-Rom, which PyTorch users would not expect.)
class Resize : public Transform {
 public:
  Resize(int64_t height, int64_t width);
  Shape output_shape(const Shape& in) const override;  // {C, height, width}
  void apply(const float* in, const Shape& in_shape, float* out,
             const SampleContext& ctx) const override;
  std::string describe() const override;

 private:
  int64_t height_, width_;
};

}  // namespace kiln
