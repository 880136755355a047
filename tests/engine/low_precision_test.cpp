// low_precision_test.cpp: f16 and bf16 tensors. The scalar conversion rules (engine/host_device.h)
// against an independent reference (every finite value of the format decoded with ldexp, the
// nearest one found by search, ties to the even bit pattern), the named corner cases, the
// vectorised CPU loops bit-equal to the scalar rule (every half and bfloat16; millions of
// floats), tensors of the new dtypes (to, fill, from_vector, item, printing), checkpoints, and
// the clear error a compute op gives for them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "engine/convert_cpu.h"
#include "engine/host_device.h"
#include "engine/ops.h"
#include "engine/serialize.h"
#include "engine/tensor.h"
#include "layers/conv2d.h"
#include "support/file_bytes.h"

namespace kiln {
namespace {

using testing::read_bytes;
using testing::write_bytes;

constexpr double kInf = std::numeric_limits<double>::infinity();

// ---- An independent reference ---------------------------------------------------------------

// A 16-bit format: 1 sign bit, `exp_bits` exponent bits, the rest mantissa.
struct Format {
  int exp_bits, man_bits;
  int bias() const { return (1 << (exp_bits - 1)) - 1; }
  uint16_t inf_bits() const { return static_cast<uint16_t>(((1 << exp_bits) - 1) << man_bits); }
  // The value of non-negative bits up to and including inf_bits() (which decodes, for rounding,
  // to the power of two just past the largest finite value, as IEEE's overflow rule reads).
  double decode(uint16_t bits) const {
    const int e = bits >> man_bits, m = bits & ((1 << man_bits) - 1);
    if (e == 0) return std::ldexp(m, 1 - bias() - man_bits);
    return std::ldexp(m + (1 << man_bits), e - bias() - man_bits);
  }
};
constexpr Format kF16{5, 10};
constexpr Format kBF16{8, 7};

// x (not NaN) rounded to the format: nearest, ties to the even bit pattern, at or past the
// halfway point to 2^(emax+1) -> infinity. Finds the bracketing pair by binary search.
uint16_t reference_round(const Format& f, double x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(x);
  if (std::isinf(a)) return sign | f.inf_bits();
  uint16_t lo = 0, hi = f.inf_bits();  // decode(lo) <= a < decode(hi) unless a >= decode(hi)
  if (a >= f.decode(hi)) return sign | f.inf_bits();
  while (hi - lo > 1) {
    const uint16_t mid = static_cast<uint16_t>((lo + hi) / 2);
    (f.decode(mid) <= a ? lo : hi) = mid;
  }
  const double dl = a - f.decode(lo), dh = f.decode(hi) - a;
  const uint16_t r = dl < dh ? lo : dh < dl ? hi : (lo % 2 == 0 ? lo : hi);
  return sign | r;
}

uint32_t bits_of(float f) { return f32_bits(f); }
float float_of(uint32_t b) { return f32_from_bits(b); }

bool is_nan16(const Format& f, uint16_t b) {
  return (b & 0x7fff) > f.inf_bits();
}
// A quiet NaN: the top mantissa bit set.
bool is_quiet_nan16(const Format& f, uint16_t b) {
  return is_nan16(f, b) && (b & (1u << (f.man_bits - 1)));
}

// Floats that probe every region: random bit patterns, and sweeps across the boundaries of
// both formats (f16 subnormal/normal/overflow, float subnormals for bf16), plus ties.
std::vector<float> probe_floats(size_t random_count) {
  std::vector<float> v;
  std::mt19937 gen(2024);
  for (size_t i = 0; i < random_count; ++i) v.push_back(float_of(gen()));
  auto sweep = [&](uint32_t from, uint32_t to, uint32_t step) {
    for (uint32_t b = from; b < to; b += step) {
      v.push_back(float_of(b));
      v.push_back(float_of(b | 0x80000000u));
    }
  };
  sweep(0x00000000u, 0x00010000u, 1);                // float subnormals (bf16 subnormal rounding)
  sweep(0x007f0000u, 0x00810000u, 3);                // float subnormal -> normal
  sweep(0x33000000u - 4096, 0x38800000u + 4096, 613);  // f16 subnormal range
  sweep(0x477fe000u - 4096, 0x47800000u + 4096, 1);  // f16 overflow threshold
  sweep(0x7f7f0000u, 0x7f800000u, 1);                // bf16 overflow threshold
  // Exact ties of both formats and their neighbours, at many exponents.
  for (uint32_t e = 1; e < 255; ++e)
    for (uint32_t m : {0x1000u, 0x3000u, 0x8000u, 0x18000u, 0x7f8000u})
      for (int d : {-1, 0, 1}) v.push_back(float_of((e << 23) | (m + static_cast<uint32_t>(d))));
  for (float s : {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.996f, 65520.0f,
                  std::numeric_limits<float>::max(), std::numeric_limits<float>::min(),
                  std::numeric_limits<float>::denorm_min(),
                  std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()})
    v.push_back(s);
  // NaNs: quiet and signalling, payloads in the kept and the dropped bits, both signs.
  for (uint32_t b : {0x7fc00000u, 0x7f800001u, 0x7fa00000u, 0x7fbfffffu, 0x7fffffffu,
                     0xffc00000u, 0xff800001u, 0x7f802000u, 0x7f810000u})
    v.push_back(float_of(b));
  return v;
}

// ---- The scalar rules ------------------------------------------------------------------------

TEST(LowPrecisionRule, EveryHalfAndBFloat16WidensExactly) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const auto h = static_cast<uint16_t>(b);
    for (const Format* f : {&kF16, &kBF16}) {
      const float w = f == &kF16 ? f16_to_f32(h) : bf16_to_f32(h);
      if (is_nan16(*f, h)) {
        ASSERT_TRUE(std::isnan(w)) << std::hex << b;
        ASSERT_TRUE(bits_of(w) & 0x00400000u) << "quiet " << std::hex << b;
        ASSERT_EQ(std::signbit(w), (h & 0x8000) != 0) << std::hex << b;
        continue;
      }
      const uint16_t mag = h & 0x7fff;
      const double want =
          (h & 0x8000 ? -1.0 : 1.0) * (mag == f->inf_bits() ? kInf : f->decode(mag));
      ASSERT_EQ(static_cast<double>(w), want) << std::hex << b;
      ASSERT_EQ(std::signbit(w), (h & 0x8000) != 0) << std::hex << b;
      // And back: every value round-trips to its own bits.
      const uint16_t back = f == &kF16 ? f32_to_f16(w) : f32_to_bf16(w);
      ASSERT_EQ(back, h) << std::hex << b;
    }
  }
}

TEST(LowPrecisionRule, FloatsRoundToNearestEvenLikeTheReference) {
  for (float x : probe_floats(1000000)) {
    const uint16_t h = f32_to_f16(x), b = f32_to_bf16(x);
    if (std::isnan(x)) {
      ASSERT_TRUE(is_quiet_nan16(kF16, h)) << std::hex << bits_of(x) << " -> " << h;
      ASSERT_TRUE(is_quiet_nan16(kBF16, b)) << std::hex << bits_of(x) << " -> " << b;
      ASSERT_EQ(static_cast<uint32_t>(h >> 15), bits_of(x) >> 31);
      ASSERT_EQ(static_cast<uint32_t>(b >> 15), bits_of(x) >> 31);
      continue;
    }
    ASSERT_EQ(h, reference_round(kF16, x)) << "f16 of " << std::hex << bits_of(x);
    ASSERT_EQ(b, reference_round(kBF16, x)) << "bf16 of " << std::hex << bits_of(x);
  }
}

TEST(LowPrecisionRule, DoublesRoundOnceNotTwice) {
  // Values a hair off the ties of both formats, where rounding through f32 to nearest would
  // land on the tie and then round the wrong way.
  std::vector<double> v;
  std::mt19937_64 gen(7);
  for (int e = -140; e < 130; ++e)
    for (int k = 0; k < 40; ++k) {
      const double m = 1.0 + static_cast<double>(gen() >> 11) * 0x1p-53;  // [1, 2)
      const double base = std::ldexp(m, e);
      for (const Format* f : {&kF16, &kBF16}) {
        const double ulp = std::ldexp(1.0, e - f->man_bits);
        const double tie = (std::floor(base / ulp) + 0.5) * ulp;
        for (double d : {0.0, 0x1p-30, -0x1p-30, 0x1p-40, -0x1p-40})
          v.push_back(tie + d * ulp);
      }
      v.push_back(std::ldexp(static_cast<double>(gen()), e - 64));
    }
  v.insert(v.end(), {1.0 + 0x1p-11 + 0x1p-40, 1.0 + 0x1p-8 + 0x1p-40, 65520.0 - 0x1p-30, 65520.0,
                     1e300, -1e300, 1e-300, -1e-300, 0.0, -0.0, kInf, -kInf,
                     static_cast<double>(std::numeric_limits<float>::max()) * 1.0000001});
  for (double x : v) {
    ASSERT_EQ(f64_to_f16(x), reference_round(kF16, x)) << "f16 of " << x;
    ASSERT_EQ(f64_to_bf16(x), reference_round(kBF16, x)) << "bf16 of " << x;
    ASSERT_EQ(f64_to_f16(-x), reference_round(kF16, -x)) << "f16 of " << -x;
  }
  // The double-rounding trap, spelled out: the nearest half to 1 + 2^-11 + 2^-40 is 1 + 2^-10.
  EXPECT_EQ(f64_to_f16(1.0 + 0x1p-11 + 0x1p-40), 0x3c01);
  EXPECT_EQ(f32_to_f16(static_cast<float>(1.0 + 0x1p-11 + 0x1p-40)), 0x3c00);
  EXPECT_TRUE(is_quiet_nan16(kF16, f64_to_f16(std::nan(""))));
  EXPECT_TRUE(is_quiet_nan16(kBF16, f64_to_bf16(-std::nan(""))));
}

TEST(LowPrecisionRule, NamedCorners) {
  // f16.
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(1.0f + 0x1p-11f), 0x3c00);      // tie: the even neighbour below
  EXPECT_EQ(f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);  // tie: the even neighbour above
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);             // largest finite
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);             // overflow: halfway to 2^16 -> inf
  EXPECT_EQ(f32_to_f16(1e10f), 0x7c00);
  EXPECT_EQ(f32_to_f16(-1e10f), 0xfc00);
  EXPECT_EQ(f32_to_f16(0x1p-14f), 0x0400);             // smallest normal
  EXPECT_EQ(f32_to_f16(0x1p-24f), 0x0001);             // smallest subnormal
  EXPECT_EQ(f32_to_f16(0x1p-25f), 0x0000);             // tie with 0: even is 0
  EXPECT_EQ(f32_to_f16(-0x1p-25f * 1.5f), 0x8001);
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(f32_to_f16(float_of(0x7fc00000u)), 0x7e00);
  EXPECT_EQ(f32_to_f16(float_of(0x7f800001u)), 0x7e00);  // signalling, payload dropped: quiet
  EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);
  EXPECT_EQ(f16_to_f32(0x0001), 0x1p-24f);
  EXPECT_EQ(bits_of(f16_to_f32(0x8000)), 0x80000000u);
  EXPECT_EQ(bits_of(f16_to_f32(0x7c01)), 0x7fc02000u);   // signalling half: quiet float
  // bf16.
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);        // tie: even below
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);    // tie: even above
  EXPECT_EQ(f32_to_bf16(float_of(0x7f7f7fffu)), 0x7f7f); // largest finite, just below the tie
  EXPECT_EQ(f32_to_bf16(float_of(0x7f7f8000u)), 0x7f80); // tie past the largest: inf
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::min()), 0x0080);  // smallest normal
  EXPECT_EQ(f32_to_bf16(float_of(0x00010000u)), 0x0001); // smallest subnormal
  EXPECT_EQ(f32_to_bf16(float_of(0x00008000u)), 0x0000); // tie with 0: even is 0
  EXPECT_EQ(f32_to_bf16(float_of(0x00018000u)), 0x0002); // tie: even above
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_bf16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(f32_to_bf16(float_of(0x7f800001u)), 0x7fc0);  // NaN in the dropped bits: still NaN
  EXPECT_EQ(f32_to_bf16(float_of(0xffc00000u)), 0xffc0);
  EXPECT_EQ(bits_of(bf16_to_f32(0x7f81)), 0x7fc10000u);   // signalling bf16: quiet float
  EXPECT_EQ(bf16_to_f32(0x0001), std::ldexp(1.0f, -133));
}

// ---- The vector loops are the scalar rule ------------------------------------------------------

TEST(LowPrecisionVector, WideningEveryPatternMatchesTheScalarRule) {
  // 65536 + 13 elements: the tail runs the scalar loop too.
  std::vector<Half> h(65536 + 13);
  std::vector<BFloat16> b(h.size());
  for (size_t i = 0; i < h.size(); ++i) {
    h[i].bits = static_cast<uint16_t>(i * 40503u);  // odd multiplier: every pattern, shuffled
    b[i].bits = h[i].bits;
  }
  std::vector<float> fh(h.size()), fb(h.size());
  cpu::convert_f16_to_f32(h.data(), fh.data(), static_cast<int64_t>(h.size()));
  cpu::convert_bf16_to_f32(b.data(), fb.data(), static_cast<int64_t>(b.size()));
  for (size_t i = 0; i < h.size(); ++i) {
    ASSERT_EQ(bits_of(fh[i]), bits_of(f16_to_f32(h[i].bits)))
        << cpu::f16_conversion_isa() << " f16 " << std::hex << h[i].bits;
    ASSERT_EQ(bits_of(fb[i]), bits_of(bf16_to_f32(b[i].bits)))
        << cpu::bf16_conversion_isa() << " bf16 " << std::hex << b[i].bits;
  }
}

TEST(LowPrecisionVector, NarrowingMillionsOfFloatsMatchesTheScalarRule) {
  std::vector<float> x = probe_floats(4000000);
  x.push_back(1.0f);  // an odd count: a scalar tail
  const auto n = static_cast<int64_t>(x.size());
  std::vector<Half> h(x.size());
  std::vector<BFloat16> b(x.size());
  cpu::convert_f32_to_f16(x.data(), h.data(), n);
  cpu::convert_f32_to_bf16(x.data(), b.data(), n);
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(h[i].bits, f32_to_f16(x[i]))
        << cpu::f16_conversion_isa() << " f16 of " << std::hex << bits_of(x[i]);
    ASSERT_EQ(b[i].bits, f32_to_bf16(x[i]))
        << cpu::bf16_conversion_isa() << " bf16 of " << std::hex << bits_of(x[i]);
  }
  // An unaligned start: the vector loads must not assume alignment.
  std::vector<Half> h1(x.size() - 3);
  cpu::convert_f32_to_f16(x.data() + 3, h1.data(), n - 3);
  for (size_t i = 0; i < h1.size(); ++i) ASSERT_EQ(h1[i].bits, h[i + 3].bits);
}

// ---- Tensors --------------------------------------------------------------------------------

TEST(LowPrecisionTensor, ConversionsBetweenDtypes) {
  const std::vector<float> v = {1.0f, -2.5f, 65504.0f, 1e6f, 0x1p-24f, 1.0f + 0x1p-11f, -0.0f};
  const Tensor x = Tensor::from_vector(v, {7});
  const Tensor h = x.to(DType::F16), b = x.to(DType::BF16);
  EXPECT_EQ(h.dtype(), DType::F16);
  EXPECT_EQ(b.dtype(), DType::BF16);
  EXPECT_EQ(h.nbytes(), 14u);
  for (size_t i = 0; i < v.size(); ++i) {
    EXPECT_EQ(h.data<Half>()[i].bits, f32_to_f16(v[i])) << i;
    EXPECT_EQ(b.data<BFloat16>()[i].bits, f32_to_bf16(v[i])) << i;
  }
  const std::vector<double> back = h.to_vector<double>();
  EXPECT_EQ(back[2], 65504.0);
  EXPECT_TRUE(std::isinf(back[3]));
  EXPECT_EQ(back[4], 0x1p-24);
  EXPECT_EQ(back[5], 1.0);
  EXPECT_TRUE(std::signbit(back[6]));
  EXPECT_EQ(b.to(DType::F32).to_vector<float>()[3], 999424.0f);  // 1e6 to 8 bits of precision
  // f64, integers, and f16 <-> bf16.
  const Tensor d = Tensor::from_vector(std::vector<double>{1.0 + 0x1p-11 + 0x1p-40, 3.0}, {2});
  EXPECT_EQ(d.to(DType::F16).data<Half>()[0].bits, 0x3c01);
  EXPECT_EQ(Tensor::from_vector(std::vector<int32_t>{-7, 300}, {2}).to(DType::BF16)
                .to_vector<double>(),
            (std::vector<double>{-7.0, 300.0}));
  EXPECT_EQ(h.to(DType::I64).to_vector<int64_t>()[1], -2);  // -2.5 truncates toward zero
  EXPECT_EQ(h.to(DType::BF16).to_vector<double>()[0], 1.0);
  EXPECT_EQ(b.to(DType::F16).to(DType::F64).to_vector<double>()[1], -2.5);
  // A long tensor takes the parallel, vectorised path and gives the same bits.
  std::vector<float> big(200003);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i) * 0.37f - 5000.0f;
  const Tensor bh = Tensor::from_vector(big, {200003}).to(DType::F16);
  for (size_t i = 0; i < big.size(); i += 997) ASSERT_EQ(bh.data<Half>()[i].bits, f32_to_f16(big[i]));
}

TEST(LowPrecisionTensor, FactoriesFillItemAndPrinting) {
  for (DType dt : {DType::F16, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    EXPECT_EQ(Tensor::zeros({3}, dt).to_vector<double>(), (std::vector<double>{0, 0, 0}));
    EXPECT_EQ(Tensor::ones({2}, dt).to_vector<double>(), (std::vector<double>{1, 1}));
    EXPECT_EQ(Tensor::full({1}, 0.1, dt).item(),
              dt == DType::F16 ? f16_to_f32(f64_to_f16(0.1)) : bf16_to_f32(f64_to_bf16(0.1)));
    EXPECT_TRUE(std::isinf(Tensor::full({1}, dt == DType::F16 ? 7e4 : 4e38, dt).item()));
    Tensor t = Tensor::full({1}, -0.0, dt);
    EXPECT_TRUE(std::signbit(t.item()));
    EXPECT_EQ(Tensor::zeros({2, 3}, dt).str(), std::string("Tensor ") + dtype_name(dt) +
                                                  " [2, 3] on cpu:0");
    EXPECT_EQ(dtype_size(dt), 2u);
    EXPECT_FALSE(is_floating(dt));
    EXPECT_TRUE(is_low_precision(dt));
    // Views and copies work on bytes.
    Tensor r = Tensor::ones({2, 3}, dt).reshape({3, 2}).clone();
    EXPECT_EQ(r.shape(), (Shape{3, 2}));
    EXPECT_EQ(r.rows(1, 2).to_vector<float>(), (std::vector<float>{1, 1}));
  }
  EXPECT_EQ(std::string(dtype_name(DType::F16)), "f16");
  EXPECT_EQ(std::string(dtype_name(DType::BF16)), "bf16");
  // The dtype codes are a file-format contract.
  EXPECT_EQ(static_cast<int>(DType::U8), 4);
  EXPECT_EQ(static_cast<int>(DType::F16), 5);
  EXPECT_EQ(static_cast<int>(DType::BF16), 6);
  const Tensor h = Tensor::from_vector(std::vector<Half>{{0x3c00}, {0xc000}}, {2});
  EXPECT_EQ(h.dtype(), DType::F16);
  EXPECT_EQ(h.to_vector<double>(), (std::vector<double>{1.0, -2.0}));
  EXPECT_EQ(h.to_vector<BFloat16>()[1].bits, 0xc000);
  EXPECT_THROW(h.data<float>(), Error);
}

// Expects fn() to throw a kiln::Error whose message contains every needle.
template <typename Fn>
void expect_error(Fn&& fn, const std::vector<std::string>& needles) {
  try {
    fn();
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    for (const auto& n : needles)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos)
          << "message lacks '" << n << "': " << e.what();
  }
}

TEST(LowPrecisionTensor, ComputeOpsRefuseClearly) {
  const Tensor a = Tensor::ones({2, 2}, DType::BF16), h = Tensor::ones({2, 2}, DType::F16);
  expect_error([&] { matmul(a, a); },
               {"matmul", "bf16 tensors are not supported yet", ".to(DType::F32)"});
  // The elementwise ops and sum/mean take 16-bit activations (low_precision_ops_test.cpp);
  // the others refuse.
  expect_error([&] { kiln::exp(h); }, {"f16 tensors are not supported yet", ".to(DType::F32)"});
  expect_error([&] { div(h, h); }, {"f16"});
  expect_error([&] { add(a, h); }, {"bf16", "f16"});
  expect_error([&] { log_softmax(a, 1); }, {"bf16"});
  const Tensor x = Tensor::ones({1, 1, 4, 4}, DType::BF16), w = Tensor::ones({1, 1, 3, 3}, DType::BF16);
  expect_error([&] { conv2d(x, w, Tensor()); }, {"conv2d", "bf16"});
  expect_error([&] { Tensor::ones({2}, DType::I32).set_requires_grad(true); }, {"i32"});
}

// ---- Checkpoints ------------------------------------------------------------------------------

uint32_t version_of(const std::vector<char>& bytes) {
  uint32_t v;
  std::memcpy(&v, bytes.data() + 8, 4);
  return v;
}
// Recomputes the table and header CRCs after an edit.
void reseal(std::vector<char>& bytes) {
  uint64_t table_len;
  std::memcpy(&table_len, bytes.data() + 24, 8);
  const uint32_t table_crc = crc32(bytes.data() + 40, table_len);
  std::memcpy(bytes.data() + 20, &table_crc, 4);
  const uint32_t header_crc = crc32(bytes.data(), 36);
  std::memcpy(bytes.data() + 36, &header_crc, 4);
}

TEST(LowPrecisionCheckpoint, RoundTripsBitsAndRecordsTheDtype) {
  const std::string path = ::testing::TempDir() + "low_precision.kckpt";
  std::vector<float> v = {1.0f, -0.0f, 65504.0f, 0x1p-24f, 3.14159f, 1e-39f};
  v.push_back(std::numeric_limits<float>::infinity());
  const Tensor x = Tensor::from_vector(v, {7});
  const std::map<std::string, Tensor> tensors = {
      {"h", x.to(DType::F16)}, {"b", x.to(DType::BF16).reshape({7, 1})}, {"f", x}};
  write_checkpoint(path, tensors, {{"step", "5"}});
  EXPECT_EQ(version_of(read_bytes(path)), 2u);  // holds f16/bf16: format version 2
  const Checkpoint ck = read_checkpoint(path);
  for (const auto& [name, t] : tensors) {
    const Tensor& got = ck.tensors.at(name);
    EXPECT_EQ(got.dtype(), t.dtype()) << name;
    EXPECT_EQ(got.shape(), t.shape()) << name;
    EXPECT_EQ(std::memcmp(got.raw_data(), t.raw_data(), t.nbytes()), 0) << name;
  }
  // Without f16/bf16 the file stays version 1, readable by every Kiln.
  write_checkpoint(path, {{"f", x}});
  EXPECT_EQ(version_of(read_bytes(path)), 1u);
  std::remove(path.c_str());
}

TEST(LowPrecisionCheckpoint, LoaderValidatesTheDtypeCode) {
  const std::string path = ::testing::TempDir() + "bad_dtype.kckpt";
  write_checkpoint(path, {{"t", Tensor::ones({4}, DType::F16)}});
  const std::vector<char> good = read_bytes(path);
  // The record's dtype byte: table at 40, u32 name length, "t", then the dtype.
  ASSERT_EQ(good[45], static_cast<char>(DType::F16));
  auto expect_refused = [&](std::vector<char> bytes, const std::vector<std::string>& needles) {
    reseal(bytes);
    write_bytes(path, bytes);
    try {
      read_checkpoint(path);
      ADD_FAILURE() << "reading should have failed";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Input);
      for (const auto& n : needles)
        EXPECT_NE(std::string(e.what()).find(n), std::string::npos)
            << "message lacks '" << n << "': " << e.what();
    }
  };
  std::vector<char> bytes = good;
  bytes[45] = 7;  // no such dtype
  expect_refused(bytes, {"bad_dtype.kckpt", "'t'", "dtype code 7", "newer Kiln"});
  bytes = good;
  const uint32_t v1 = 1;  // a version-1 file cannot hold f16
  std::memcpy(bytes.data() + 8, &v1, 4);
  expect_refused(bytes, {"bad_dtype.kckpt", "dtype code 5", "version 1"});
  bytes = good;
  const uint32_t v3 = 3;  // a future version
  std::memcpy(bytes.data() + 8, &v3, 4);
  expect_refused(bytes, {"bad_dtype.kckpt", "format version 3", "re-save"});
  std::remove(path.c_str());
}

}  // namespace
}  // namespace kiln
