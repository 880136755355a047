// memory_format_test: the channels-last memory format of engine/tensor.h. The bytes lie in
// (N, H, W, C) order while the shape stays (N, C, H, W); conversions are differentiable and
// counted; element-wise ops keep the format; a kernel that reads NCHW refuses the tensor
// instead of reading it wrong.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/memory_format.h"
#include "engine/ops.h"
#include "engine/tensor.h"
#include "support/gradcheck.h"

namespace kiln {
namespace {

using testing::gradcheck;
using testing::random_tensor;

// Element (n, c, h, w) of an NCHW-ordered vector of shape s.
double at(const std::vector<double>& v, const Shape& s, int64_t n, int64_t c, int64_t h,
          int64_t w) {
  return v[static_cast<size_t>(((n * s[1] + c) * s[2] + h) * s[3] + w)];
}

TEST(MemoryFormat, ChannelsLastBytesAreNhwcAndTheShapeStaysNchw) {
  const Shape s{2, 3, 4, 5};
  Tensor x = random_tensor(s, 1);
  Tensor y = x.to(MemoryFormat::ChannelsLast);
  EXPECT_TRUE(y.is_channels_last());
  EXPECT_EQ(y.shape(), s);
  const std::vector<double> v = x.to_vector<double>();
  const double* bytes = y.data_any_format<double>();
  for (int64_t n = 0; n < 2; ++n)
    for (int64_t h = 0; h < 4; ++h)
      for (int64_t w = 0; w < 5; ++w)
        for (int64_t c = 0; c < 3; ++c)
          EXPECT_EQ(bytes[((n * 4 + h) * 5 + w) * 3 + c], at(v, s, n, c, h, w));
  // to_vector reads in the shape's order whatever the format; the way back is exact.
  EXPECT_EQ(y.to_vector<double>(), v);
  EXPECT_EQ(y.contiguous().to_vector<double>(), v);
  EXPECT_FALSE(y.contiguous().is_channels_last());
  EXPECT_EQ(y.storage_order_view().shape(), (Shape{2, 4, 5, 3}));
}

// A conversion moves bytes: 16-bit floats and integers convert as f32 and f64 do.
TEST(MemoryFormat, EveryDtypeConverts) {
  const Shape s{2, 3, 4, 5};
  Tensor x = random_tensor(s, 12, -100, 100);
  for (DType dt : {DType::BF16, DType::F16, DType::I64, DType::I32, DType::U8, DType::F32}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor t = (dt == DType::U8 ? mul(add(x, 100.0), 1.0) : x).to(dt);
    Tensor cl = t.to(MemoryFormat::ChannelsLast);
    EXPECT_EQ(cl.dtype(), dt);
    EXPECT_EQ(cl.to_vector<double>(), t.to_vector<double>());
    EXPECT_EQ(cl.contiguous().to_vector<double>(), t.to_vector<double>());
  }
}

TEST(MemoryFormat, ConversionsAreCountedAndRelabelsAreNot) {
  Tensor x = random_tensor({2, 3, 4, 5}, 2);
  const int64_t before = memory_format_conversions();
  Tensor y = x.to(MemoryFormat::ChannelsLast);
  EXPECT_EQ(memory_format_conversions() - before, 1);
  EXPECT_TRUE(y.to(MemoryFormat::ChannelsLast).same(y));  // already: no copy
  EXPECT_EQ(memory_format_conversions() - before, 1);
  // One pixel, or one channel: both orders are the same bytes, so nothing is copied.
  Tensor pooled = random_tensor({2, 8, 1, 1}, 3);
  Tensor gray = random_tensor({2, 1, 4, 4}, 4);
  Tensor p = pooled.to(MemoryFormat::ChannelsLast);
  Tensor g = gray.to(MemoryFormat::ChannelsLast);
  EXPECT_EQ(memory_format_conversions() - before, 1);
  EXPECT_EQ(p.raw_data_any_format(), pooled.raw_data());
  EXPECT_EQ(g.to_vector<double>(), gray.to_vector<double>());
  EXPECT_EQ(p.reshape({2, 8}).to_vector<double>(), pooled.to_vector<double>());
  EXPECT_EQ(memory_format_conversions() - before, 1);
}

TEST(MemoryFormat, NchwKernelsRefuseChannelsLastTensors) {
  Tensor y = random_tensor({2, 3, 4, 5}, 5).to(MemoryFormat::ChannelsLast);
  try {
    (void)y.data<double>();
    FAIL() << "data() handed out a channels-last tensor";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Usage);
    EXPECT_NE(std::string(e.what()).find("contiguous()"), std::string::npos) << e.what();
  }
  // An op without a channels-last kernel: the same error, not a wrong result.
  EXPECT_THROW((void)softmax(y, 1), Error);
  EXPECT_THROW(Tensor::empty({2, 3}, DType::F32, Device(), MemoryFormat::ChannelsLast), Error);
  EXPECT_THROW((void)random_tensor({6, 10}, 6).to(MemoryFormat::ChannelsLast), Error);
}

TEST(MemoryFormat, ElementwiseOpsKeepTheFormatOfTheirFirstOperand) {
  const Shape s{2, 3, 4, 5};
  Tensor a = random_tensor(s, 7), b = random_tensor(s, 8);
  Tensor a_cl = a.to(MemoryFormat::ChannelsLast), b_cl = b.to(MemoryFormat::ChannelsLast);
  const int64_t before = memory_format_conversions();
  Tensor sum_cl = add(a_cl, b_cl), relu_cl = relu(a_cl), both = add_relu(a_cl, b_cl);
  EXPECT_EQ(memory_format_conversions() - before, 0);
  EXPECT_TRUE(sum_cl.is_channels_last() && relu_cl.is_channels_last() && both.is_channels_last());
  EXPECT_EQ(sum_cl.to_vector<double>(), add(a, b).to_vector<double>());
  EXPECT_EQ(relu_cl.to_vector<double>(), relu(a).to_vector<double>());
  EXPECT_EQ(both.to_vector<double>(), add_relu(a, b).to_vector<double>());
  // Mixed formats: the second operand is brought into the first's (one counted conversion).
  const int64_t before_mixed = memory_format_conversions();
  Tensor mixed = add(a_cl, b);
  EXPECT_EQ(memory_format_conversions() - before_mixed, 1);
  EXPECT_TRUE(mixed.is_channels_last());
  EXPECT_EQ(mul(a_cl, 2.0).to_vector<double>(), mul(a, 2.0).to_vector<double>());
  EXPECT_EQ(mixed.to_vector<double>(), add(a, b).to_vector<double>());
}

TEST(MemoryFormat, CopiesKeepOrConvertTheFormat) {
  const Shape s{2, 3, 4, 5};
  Tensor x = random_tensor(s, 9);
  Tensor cl = x.to(MemoryFormat::ChannelsLast);
  EXPECT_TRUE(cl.clone().is_channels_last());
  EXPECT_TRUE(cl.detach().is_channels_last());
  EXPECT_TRUE(cl.to(DType::F32).is_channels_last());
  EXPECT_EQ(cl.to(DType::F32).to_vector<float>(), x.to(DType::F32).to_vector<float>());
  Tensor into_nchw = Tensor::zeros(s, DType::F64);
  into_nchw.copy_(cl);
  EXPECT_EQ(into_nchw.to_vector<double>(), x.to_vector<double>());
  Tensor into_cl = Tensor::empty(s, DType::F64, Device(), MemoryFormat::ChannelsLast);
  into_cl.fill_(0.0);
  into_cl.copy_(x);
  EXPECT_EQ(into_cl.to_vector<double>(), x.to_vector<double>());
  EXPECT_TRUE(into_cl.is_channels_last());
  // A reshape that is not a relabel makes the tensor contiguous first.
  EXPECT_EQ(cl.reshape({2, 60}).to_vector<double>(), x.reshape({2, 60}).to_vector<double>());
  EXPECT_EQ(cl.rows(1, 2).to_vector<double>(), x.rows(1, 2).to_vector<double>());
}

TEST(MemoryFormat, ConversionsAndViewsAreDifferentiable) {
  Tensor x = random_tensor({2, 3, 3, 2}, 10).set_requires_grad(true);
  EXPECT_TRUE(gradcheck(
      [](const std::vector<Tensor>& in) {
        Tensor cl = in[0].to(MemoryFormat::ChannelsLast);
        return mul(relu(add(cl, 0.5)), cl).contiguous();
      },
      {x}));
  // The gradient of a channels-last input arrives in whatever format its users produced; the
  // sum of a channels-last and a contiguous gradient is right either way.
  Tensor y = random_tensor({2, 3, 3, 2}, 11).set_requires_grad(true);
  EXPECT_TRUE(gradcheck(
      [](const std::vector<Tensor>& in) {
        Tensor cl = in[0].to(MemoryFormat::ChannelsLast);
        return add(cl.reshape({2, 18}), square(cl).reshape({2, 18}));
      },
      {y}));
}

}  // namespace
}  // namespace kiln
