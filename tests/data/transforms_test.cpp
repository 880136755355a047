// transforms_test.cpp: Normalize (exact), RandomCrop (identity cases, zero padding, offsets
// cover the range), RandomHorizontalFlip (twice = identity, p = 0 and 1, about half the
// examples), Resize (constant stays constant, identity size, a hand-computed 2x2 -> 4x4),
// the Philox counter (pure function of the context, documented layout), and Compose (shapes,
// scratch sizing, same result as the steps one by one, the same from many threads).
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <numeric>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "data/transforms.h"
#include "engine/error.h"
#include "engine/philox.h"

namespace kiln {
namespace {

// Values 0, 1, 2, ... (distinct, so any displacement shows).
std::vector<float> iota_example(const Shape& shape) {
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  std::iota(v.begin(), v.end(), 0.0f);
  return v;
}

std::vector<float> run(const Transform& t, const std::vector<float>& in, const Shape& in_shape,
                       const SampleContext& ctx = {}) {
  std::vector<float> out(static_cast<size_t>(shape_numel(t.output_shape(in_shape))), -1.0f);
  t.apply(in.data(), in_shape, out.data(), ctx);
  return out;
}

TEST(Normalize, ExactPerChannel) {
  const Shape shape{2, 2, 3};
  std::vector<float> in = iota_example(shape);
  const Normalize n({0.5f, 0.25f}, {0.3f, 2.0f});
  const std::vector<float> out = run(n, in, shape);
  for (int c = 0; c < 2; ++c) {
    const float m = c == 0 ? 0.5f : 0.25f, s = c == 0 ? 0.3f : 2.0f;
    for (int k = 0; k < 6; ++k) EXPECT_EQ(out[c * 6 + k], (in[c * 6 + k] - m) / s);
  }
}

TEST(Normalize, OneValueForAllChannelsAndErrors) {
  const Shape shape{3, 1, 2};
  const std::vector<float> out = run(Normalize({1.0f}, {2.0f}), iota_example(shape), shape);
  for (int k = 0; k < 6; ++k) EXPECT_EQ(out[k], (static_cast<float>(k) - 1.0f) / 2.0f);
  EXPECT_THROW(Normalize({0.5f, 0.5f}, {0.5f}), Error);
  EXPECT_THROW(Normalize({0.5f}, {0.0f}), Error);
  EXPECT_THROW(Normalize({0.1f, 0.2f}, {1.0f, 1.0f}).output_shape({3, 4, 4}), Error);
}

TEST(RandomCrop, FullSizeWithoutPaddingIsIdentity) {
  const Shape shape{3, 5, 7};
  // Size = input needs a square input for the square crop.
  const Shape square{3, 6, 6};
  const std::vector<float> sq = iota_example(square);
  for (int64_t index = 0; index < 20; ++index) {
    EXPECT_EQ(run(RandomCrop(6, 0), sq, square, {7, 0, index}), sq);
  }
  EXPECT_THROW(RandomCrop(8, 0).output_shape(shape), Error);  // 8 > 5
  EXPECT_EQ(RandomCrop(8, 2).output_shape(shape), (Shape{3, 8, 8}));
}

TEST(RandomCrop, PadsWithZerosAndOffsetsCoverTheRange) {
  const Shape shape{1, 4, 4};
  const std::vector<float> in = iota_example(shape);
  const RandomCrop crop(4, 2);  // window top-left in 0..4 (padded coordinates)
  std::set<std::pair<int, int>> offsets;
  for (int64_t index = 0; index < 400; ++index) {
    const std::vector<float> out = run(crop, in, shape, {3, 1, index});
    // The output must be the input shifted by one of the 5 x 5 windows, zeros outside it.
    int matches = 0;
    for (int t = 0; t <= 4; ++t) {
      for (int l = 0; l <= 4; ++l) {
        bool same = true;
        for (int y = 0; y < 4; ++y) {
          for (int x = 0; x < 4; ++x) {
            const int sy = t + y - 2, sx = l + x - 2;
            const float want = sy >= 0 && sy < 4 && sx >= 0 && sx < 4 ? in[sy * 4 + sx] : 0.0f;
            same = same && out[y * 4 + x] == want;
          }
        }
        if (same) {
          ++matches;
          offsets.insert({t, l});
        }
      }
    }
    ASSERT_EQ(matches, 1) << "index " << index;
  }
  EXPECT_EQ(offsets.size(), 25u);  // all 5 x 5 offsets occur in 400 draws
}

TEST(RandomCrop, SameContextSameCropOtherIndexOtherCrop) {
  const Shape shape{1, 8, 8};
  const std::vector<float> in = iota_example(shape);
  const RandomCrop crop(6, 3);
  EXPECT_EQ(run(crop, in, shape, {11, 2, 5}), run(crop, in, shape, {11, 2, 5}));
  int differ_index = 0, differ_epoch = 0, differ_seed = 0;
  for (int64_t index = 0; index < 32; ++index) {
    const std::vector<float> a = run(crop, in, shape, {11, 2, index});
    differ_index += a != run(crop, in, shape, {11, 2, index + 1});
    differ_epoch += a != run(crop, in, shape, {11, 3, index});
    differ_seed += a != run(crop, in, shape, {12, 2, index});
  }
  // 81 possible windows: a repeat is rare, 32 of them would be a bug.
  EXPECT_GE(differ_index, 28);
  EXPECT_GE(differ_epoch, 28);
  EXPECT_GE(differ_seed, 28);
}

TEST(RandomHorizontalFlip, TwiceIsIdentityAndPExtremes) {
  const Shape shape{2, 3, 5};
  const std::vector<float> in = iota_example(shape);
  const RandomHorizontalFlip always(1.0), never(0.0), half(0.5);
  const std::vector<float> flipped = run(always, in, shape);
  for (int r = 0; r < 6; ++r) {
    for (int x = 0; x < 5; ++x) EXPECT_EQ(flipped[r * 5 + x], in[r * 5 + 4 - x]);
  }
  EXPECT_EQ(run(always, flipped, shape), in);
  EXPECT_EQ(run(never, in, shape), in);
  int flips = 0;
  for (int64_t index = 0; index < 1000; ++index) {
    const SampleContext ctx{5, 0, index};
    const std::vector<float> once = run(half, in, shape, ctx);
    EXPECT_EQ(run(half, once, shape, ctx), in);  // same context: same decision, undone
    flips += once != in;
  }
  EXPECT_GT(flips, 430);  // 500 expected; sd 16
  EXPECT_LT(flips, 570);
  EXPECT_THROW(RandomHorizontalFlip(1.5), Error);
}

TEST(Resize, ConstantStaysConstantAndSameSizeIsIdentity) {
  const Shape shape{2, 5, 3};
  std::vector<float> constant(30, 0.3f);
  for (const Shape& to : {Shape{2, 7, 11}, Shape{2, 2, 2}, Shape{2, 1, 9}}) {
    const std::vector<float> out = run(Resize(to[1], to[2]), constant, shape);
    ASSERT_EQ(out.size(), static_cast<size_t>(shape_numel(to)));
    for (float v : out) EXPECT_EQ(v, 0.3f);
  }
  const std::vector<float> in = iota_example(shape);
  EXPECT_EQ(run(Resize(5, 3), in, shape), in);
}

TEST(Resize, BilinearLikePyTorch) {
  // torch.nn.functional.interpolate(torch.tensor([[[[0., 1.], [2., 3.]]]]), size=(4, 4),
  // mode="bilinear", align_corners=False) gives these rows.
  const Shape shape{1, 2, 2};
  const std::vector<float> out = run(Resize(4, 4), {0, 1, 2, 3}, shape);
  const std::vector<float> want = {0.00f, 0.25f, 0.75f, 1.00f,  //
                                   0.50f, 0.75f, 1.25f, 1.50f,  //
                                   1.50f, 1.75f, 2.25f, 2.50f,  //
                                   2.00f, 2.25f, 2.75f, 3.00f};
  for (size_t k = 0; k < want.size(); ++k) EXPECT_FLOAT_EQ(out[k], want[k]) << k;
}

TEST(SampleCounter, LayoutAndRanges) {
  EXPECT_EQ(sample_counter({0, 0, 0, 0}), 0u);
  EXPECT_EQ(sample_counter({9, 0, 0, 1}), 4u);  // the seed is the key, not in the counter
  EXPECT_EQ(sample_counter({0, 0, 1, 0}), 64u);
  EXPECT_EQ(sample_counter({0, 1, 0, 0}), uint64_t{1} << 40);
  EXPECT_EQ(sample_draw({9, 1, 2, 3}, 5), philox_u32(9, sample_counter({9, 1, 2, 3}), 5));
  EXPECT_THROW(sample_counter({0, -1, 0, 0}), Error);
  EXPECT_THROW(sample_counter({0, 0, int64_t{1} << 34, 0}), Error);
  EXPECT_THROW(sample_counter({0, 0, 0, 16}), Error);
}

TEST(Compose, ShapesScratchAndStepByStep) {
  auto crop = std::make_shared<RandomCrop>(6, 2);
  auto flip = std::make_shared<RandomHorizontalFlip>(0.5);
  auto resize = std::make_shared<Resize>(3, 4);
  auto norm = std::make_shared<Normalize>(std::vector<float>{0.5f}, std::vector<float>{0.25f});
  const Shape in_shape{2, 5, 5};
  EXPECT_EQ(Compose(in_shape, {}).output_shape(), in_shape);
  EXPECT_EQ(Compose(in_shape, {}).scratch_floats(), 0);
  EXPECT_EQ(Compose(in_shape, {crop}).scratch_floats(), 0);
  EXPECT_EQ(Compose(in_shape, {crop, resize}).scratch_floats(), 2 * 6 * 6);
  const Compose pipe(in_shape, {crop, flip, resize, norm});
  EXPECT_EQ(pipe.output_shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(pipe.scratch_floats(), 2 * (2 * 6 * 6));  // two buffers of the largest intermediate
  EXPECT_NE(pipe.describe().find("RandomCrop(size=6, padding=2)"), std::string::npos);
  EXPECT_THROW(Compose(in_shape, {std::make_shared<RandomCrop>(10, 0)}), Error);
  EXPECT_THROW(Compose({1, 28, 28}, {std::make_shared<Normalize>(std::vector<float>{0, 0, 0},
                                                                 std::vector<float>{1, 1, 1})}),
               Error);

  const std::vector<float> in = iota_example(in_shape);
  for (int64_t index = 0; index < 10; ++index) {
    const SampleContext ctx{42, 3, index};
    std::vector<float> scratch(static_cast<size_t>(pipe.scratch_floats()));
    std::vector<float> out(24);
    pipe.apply(in.data(), out.data(), ctx, scratch.data());
    // By hand: step k sees ctx with step = k.
    SampleContext c = ctx;
    std::vector<float> x = in;
    Shape s = in_shape;
    int step = 0;
    for (const Transform* t : std::vector<const Transform*>{crop.get(), flip.get(), resize.get(), norm.get()}) {
      c.step = step++;
      x = run(*t, x, s, c);
      s = t->output_shape(s);
    }
    EXPECT_EQ(out, x);
  }
  std::vector<float> copy(50);
  Compose(in_shape, {}).apply(in.data(), copy.data(), {}, nullptr);
  EXPECT_EQ(copy, in);
}

TEST(Compose, ThreadsGetTheSameResults) {
  const Shape in_shape{3, 9, 9};
  const Compose pipe(in_shape, {std::make_shared<RandomCrop>(8, 2),
                                std::make_shared<RandomHorizontalFlip>(0.5),
                                std::make_shared<Normalize>(std::vector<float>{0.1f, 0.2f, 0.3f},
                                                            std::vector<float>{0.5f, 0.6f, 0.7f})});
  const std::vector<float> in = iota_example(in_shape);
  const int64_t n = 64, out_numel = shape_numel(pipe.output_shape());
  auto compute = [&](int64_t first, int64_t stride, std::vector<float>& all) {
    std::vector<float> scratch(static_cast<size_t>(pipe.scratch_floats()));
    for (int64_t i = first; i < n; i += stride) {
      pipe.apply(in.data(), all.data() + i * out_numel, {1, 4, i}, scratch.data());
    }
  };
  std::vector<float> serial(static_cast<size_t>(n * out_numel)), threaded(serial.size());
  compute(0, 1, serial);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back(compute, t, 4, std::ref(threaded));
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(serial, threaded);
}

}  // namespace
}  // namespace kiln
