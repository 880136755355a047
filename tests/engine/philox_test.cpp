// philox_test.cpp: Philox4x32-10 against the Random123 known-answer vectors, the uniform01
// range and resolution, Generator counter bookkeeping, and init reproducibility.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <set>
#include <thread>
#include <vector>

#include "engine/init.h"
#include "engine/philox.h"
#include "engine/tensor.h"

namespace kiln {
namespace {

// A local reference with the full 4-word counter and 2-word key of Random123, written
// straight from the paper (Salmon et al., SC'11, and Random123's philox.h): our library API
// fixes c2 = c3 = 0, which the all-ones KAT vector does not.
std::array<uint32_t, 4> philox_reference(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = uint64_t{0xD2511F53u} * c[0];
    uint64_t p1 = uint64_t{0xCD9E8D57u} * c[2];
    c = {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k[0], static_cast<uint32_t>(p1),
         static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k[1], static_cast<uint32_t>(p0)};
    k[0] += 0x9E3779B9u;
    k[1] += 0xBB67AE85u;
  }
  return c;
}

// Random123 kat_vectors, "philox4x32 10" lines: counter (4 words), key (2 words), output.
struct Kat {
  std::array<uint32_t, 4> counter;
  std::array<uint32_t, 2> key;
  std::array<uint32_t, 4> expected;
};
const Kat kKats[] = {
    {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
    {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
     {0xffffffffu, 0xffffffffu},
     {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
    {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
     {0xa4093822u, 0x299f31d0u},
     {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
};

TEST(Philox, ReferenceMatchesRandom123Kat) {
  for (const Kat& kat : kKats) EXPECT_EQ(philox_reference(kat.counter, kat.key), kat.expected);
}

TEST(Philox, LibraryMatchesKatForZeroCounterAndKey) {
  PhiloxOut r = philox4x32_10(0, 0);
  EXPECT_EQ(r.v[0], 0x6627e8d5u);
  EXPECT_EQ(r.v[1], 0xe169c58du);
  EXPECT_EQ(r.v[2], 0xbc57ac4cu);
  EXPECT_EQ(r.v[3], 0x9b00dbd8u);
}

// The library is the reference restricted to c2 = c3 = 0: check it on many keys/counters,
// including words with the top bit set (where a sign or shift mistake would show).
TEST(Philox, LibraryMatchesReferenceWhenHighCounterWordsAreZero) {
  const uint64_t values[] = {0,           1,           0xffffffffull,        0x100000000ull,
                             0xdeadbeefcafebabeull, 0xffffffffffffffffull, 0x6b696c6eull,
                             0x8000000080000000ull};
  for (uint64_t key : values) {
    for (uint64_t ctr : values) {
      PhiloxOut got = philox4x32_10(key, ctr);
      auto want = philox_reference(
          {static_cast<uint32_t>(ctr), static_cast<uint32_t>(ctr >> 32), 0, 0},
          {static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32)});
      for (int i = 0; i < 4; ++i) EXPECT_EQ(got.v[i], want[i]) << "key " << key << " ctr " << ctr;
    }
  }
}

TEST(Philox, U32StreamReadsFourNumbersPerCounter) {
  for (uint64_t i = 0; i < 12; ++i) {
    PhiloxOut r = philox4x32_10(7, 100 + i / 4);
    EXPECT_EQ(philox_u32(7, 100, i), r.v[i % 4]);
  }
}

TEST(Philox, Uniform01RangeAndResolution) {
  EXPECT_EQ(uniform01(0u), 0.0f);
  EXPECT_LT(uniform01(0xffffffffu), 1.0f);
  EXPECT_EQ(uniform01(0xffffffffu), 1.0f - 1.0f / 16777216.0f);
  EXPECT_EQ(uniform01(0x100u), 1.0f / 16777216.0f);  // the lowest 8 bits are dropped
  EXPECT_EQ(uniform01(0xffu), 0.0f);
  // Mean and variance of many draws: U[0,1) has mean 1/2 and variance 1/12.
  const int n = 200000;
  double sum = 0, sq = 0;
  for (int i = 0; i < n; ++i) {
    float u = uniform01(philox_u32(42, 0, static_cast<uint64_t>(i)));
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    sum += u;
    sq += static_cast<double>(u) * u;
  }
  double mean = sum / n, var = sq / n - mean * mean;
  EXPECT_NEAR(mean, 0.5, 0.005);
  EXPECT_NEAR(var, 1.0 / 12.0, 0.002);
}

TEST(Generator, ReserveHandsOutDisjointRanges) {
  Generator gen(5);
  EXPECT_EQ(gen.reserve(1), 0u);  // one number still takes a whole counter (4 numbers)
  EXPECT_EQ(gen.reserve(4), 1u);
  EXPECT_EQ(gen.reserve(5), 2u);  // 5 numbers need 2 counters
  EXPECT_EQ(gen.reserve(0), 4u);
  EXPECT_EQ(gen.offset(), 4u);
  gen.set_state(9, 100);
  EXPECT_EQ(gen.seed(), 9u);
  EXPECT_EQ(gen.reserve(3), 100u);
}

// A capture hands out bases relative to its start, tagged with the device offset to add at
// replay; afterwards the generator is where it was, and advance() moves it by one replay.
TEST(Generator, CaptureHandsOutRelativeRangesAndRestoresTheOffset) {
  Generator gen(5);
  gen.set_state(5, 40);
  const uint64_t device_scalar = 0;  // stands for a device pointer: only its identity matters
  gen.begin_capture(&device_scalar);
  EXPECT_TRUE(gen.capturing());
  const Generator::Range a = gen.reserve_range(10);  // 3 counters
  const Generator::Range b = gen.reserve_range(4);   // 1 counter
  EXPECT_EQ(a.base, 0u);
  EXPECT_EQ(b.base, 3u);
  EXPECT_EQ(a.device_offset, &device_scalar);
  EXPECT_EQ(gen.end_capture(), 4u);  // counters one replay consumes
  EXPECT_FALSE(gen.capturing());
  EXPECT_EQ(gen.offset(), 40u);
  const Generator::Range c = gen.reserve_range(1);
  EXPECT_EQ(c.base, 40u);
  EXPECT_EQ(c.device_offset, nullptr);
  gen.advance(4);
  EXPECT_EQ(gen.offset(), 45u);
}

TEST(Generator, ConcurrentReservesNeverOverlap) {
  Generator gen(1);
  const int threads = 4, per_thread = 1000;
  std::vector<std::vector<uint64_t>> bases(threads);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      for (int i = 0; i < per_thread; ++i) bases[t].push_back(gen.reserve(8));  // 2 counters
    });
  for (auto& th : pool) th.join();
  std::set<uint64_t> all;
  for (auto& b : bases) all.insert(b.begin(), b.end());
  ASSERT_EQ(all.size(), size_t{threads * per_thread});
  uint64_t expect = 0;
  for (uint64_t b : all) {  // sorted: consecutive ranges of 2 counters, no gaps, no overlap
    EXPECT_EQ(b, expect);
    expect += 2;
  }
  EXPECT_EQ(gen.offset(), expect);
}

TEST(Init, ManualSeedReproducesAndAdvances) {
  Tensor a = Tensor::empty({3, 7});
  Tensor b = Tensor::empty({3, 7});
  manual_seed(123);
  uniform_(a, -1, 1);
  uniform_(b, -1, 1);
  EXPECT_NE(a.to_vector<float>(), b.to_vector<float>());  // the offset moved on
  Tensor c = Tensor::empty({3, 7});
  manual_seed(123);
  uniform_(c, -1, 1);
  EXPECT_EQ(a.to_vector<float>(), c.to_vector<float>());
}

TEST(Init, UniformMatchesTheStreamAndRange) {
  Generator gen(77);
  Tensor t = Tensor::empty({5, 11}, DType::F64);
  uniform_(t, -2.0, 3.0, gen);
  auto v = t.to_vector<double>();
  for (size_t i = 0; i < v.size(); ++i) {
    double u = uniform01(philox_u32(77, 0, i));
    EXPECT_EQ(v[i], -2.0 + 5.0 * u);
    EXPECT_GE(v[i], -2.0);
    EXPECT_LT(v[i], 3.0);
  }
  EXPECT_EQ(gen.offset(), (55u + 3) / 4);
}

TEST(Init, NormalMoments) {
  Generator gen(3);
  Tensor t = Tensor::empty({100001});  // odd: the last pair is half used
  normal_(t, 2.0, 0.5, gen);
  auto v = t.to_vector<double>();
  double sum = 0, sq = 0;
  for (double x : v) {
    ASSERT_TRUE(std::isfinite(x));
    sum += x;
  }
  double mean = sum / v.size();
  for (double x : v) sq += (x - mean) * (x - mean);
  EXPECT_NEAR(mean, 2.0, 0.01);
  EXPECT_NEAR(std::sqrt(sq / v.size()), 0.5, 0.01);
}

TEST(Init, DefaultInitBound) {
  Generator gen(11);
  Tensor w = Tensor::empty({13, 25});
  default_init_(w, 25, gen);
  double max_abs = 0;
  for (float x : w.to_vector<float>()) max_abs = std::max(max_abs, std::abs(double(x)));
  EXPECT_LE(max_abs, 0.2);  // 1 / sqrt(25)
  EXPECT_GT(max_abs, 0.18);  // 325 draws come close to the bound
  EXPECT_THROW(default_init_(w, 0, gen), Error);
  Tensor i = Tensor::empty({3}, DType::I64);
  EXPECT_THROW(uniform_(i, 0, 1, gen), Error);
}

}  // namespace
}  // namespace kiln
