#include "kernels/fp8.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/testing/test_seed.h"
#include "gtest/gtest.h"

namespace strata::fp8 {
namespace {

// Independent oracle: the nearest finite code by exhaustive search, ties to
// the code with an even mantissa, saturating beyond ±448.
uint8_t NearestCode(float x) {
  if (std::isnan(x)) return 0;
  const bool neg = std::signbit(x);
  const double a = std::fabs(static_cast<double>(x));
  int best = 0;
  double best_d = std::numeric_limits<double>::infinity();
  for (int c = 0; c <= 0x7E; ++c) {
    const double v = Decode(static_cast<uint8_t>(c));
    const double d = std::fabs(v - a);
    if (d < best_d || (d == best_d && (c & 1) == 0)) {
      best = c;
      best_d = d;
    }
  }
  return static_cast<uint8_t>(best | (neg ? 0x80 : 0));
}

float Bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

TEST(Fp8Test, AllCodesRoundTrip) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) {
      EXPECT_EQ(Decode(c), 0.0f) << "NaN code " << c;
      continue;
    }
    const float v = Decode(c);
    EXPECT_EQ(Encode(v), c) << "code " << c << " value " << v;
  }
}

TEST(Fp8Test, KnownValues) {
  EXPECT_EQ(Decode(0x7E), 448.0f);
  EXPECT_EQ(Decode(0x38), 1.0f);
  EXPECT_EQ(Decode(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(Decode(0x08), std::ldexp(1.0f, -6));
  EXPECT_EQ(Decode(0xB8), -1.0f);
}

TEST(Fp8Test, TiesRoundToEven) {
  EXPECT_EQ(Encode(1.0625f), 0x38);  // between 1.0 (even) and 1.125
  EXPECT_EQ(Encode(1.1875f), 0x3A);  // between 1.125 and 1.25 (even)
  EXPECT_EQ(Encode(-1.0625f), 0xB8);
  // Subnormal grid: 0.5 and 1.5 quanta.
  EXPECT_EQ(Encode(std::ldexp(0.5f, -9)), 0x00);
  EXPECT_EQ(Encode(std::ldexp(1.5f, -9)), 0x02);
  EXPECT_EQ(Encode(std::ldexp(2.5f, -9)), 0x02);
}

TEST(Fp8Test, TieCarriesIntoNextBinade) {
  // 1.9375 is halfway between 1.875 (0x3F, odd mantissa) and 2.0 (0x40).
  EXPECT_EQ(Encode(1.9375f), 0x40);
  // Halfway between the largest subnormal 7·2^-9 and the smallest normal 2^-6.
  EXPECT_EQ(Encode(std::ldexp(7.5f, -9)), 0x08);
  // Just below a tie rounds down.
  EXPECT_EQ(Encode(std::nextafter(1.9375f, 0.0f)), 0x3F);
}

TEST(Fp8Test, Saturation) {
  EXPECT_EQ(Encode(448.0f), 0x7E);
  EXPECT_EQ(Encode(464.0f), 0x7E);
  EXPECT_EQ(Encode(1e30f), 0x7E);
  EXPECT_EQ(Encode(std::numeric_limits<float>::infinity()), 0x7E);
  EXPECT_EQ(Encode(-std::numeric_limits<float>::infinity()), 0xFE);
  EXPECT_EQ(Encode(-500.0f), 0xFE);
}

TEST(Fp8Test, SignedZeroAndNaN) {
  EXPECT_EQ(Encode(0.0f), 0x00);
  EXPECT_EQ(Encode(-0.0f), 0x80);
  EXPECT_EQ(Encode(std::numeric_limits<float>::quiet_NaN()), 0x00);
  EXPECT_EQ(Encode(-std::numeric_limits<float>::quiet_NaN()), 0x00);
  EXPECT_EQ(Encode(Bits(0x7F800001)), 0x00);  // signalling NaN
  EXPECT_EQ(Encode(std::ldexp(1.0f, -12)), 0x00);  // underflow to zero
  EXPECT_EQ(Encode(-std::ldexp(1.0f, -12)), 0x80);
}

TEST(Fp8Test, MatchesExhaustiveNearestOnRandomFloats) {
  std::mt19937 rng(strata::testing::TestSeed());
  std::uniform_real_distribution<float> expo(-14.0f, 10.0f);
  std::uniform_int_distribution<uint32_t> any_bits;
  for (int i = 0; i < 200000; ++i) {
    float x;
    if (i % 2 == 0) {
      x = std::exp2(expo(rng)) * ((rng() & 1) ? -1.0f : 1.0f);
    } else {
      x = Bits(any_bits(rng));
    }
    ASSERT_EQ(Encode(x), NearestCode(x)) << "x=" << x;
  }
}

TEST(Fp8Test, QuantizeRowArithmetic) {
  std::mt19937 rng(strata::testing::TestSeed());
  std::normal_distribution<float> n01(0.0f, 3.0f);
  std::vector<float> x(512);
  for (auto& v : x) v = n01(rng);
  std::vector<uint8_t> codes(512);
  const float scale = QuantizeRow(x.data(), 512, codes.data());
  float amax = 0;
  for (float v : x) amax = std::max(amax, std::fabs(v));
  EXPECT_EQ(scale, amax / 448.0f);
  const float inv = 448.0f / amax;
  for (int i = 0; i < 512; ++i) ASSERT_EQ(codes[i], NearestCode(x[i] * inv));
  // The largest element maps to ±448 exactly.
  std::vector<float> back(512);
  DequantizeRow(codes.data(), scale, 512, back.data());
  for (int i = 0; i < 512; ++i) {
    // e4m3 has 3 mantissa bits: relative error at most 2^-4 above 2^-6·scale.
    EXPECT_LE(std::fabs(back[i] - x[i]), std::max(std::fabs(x[i]) / 16.0f, scale * std::ldexp(1.0f, -10)))
        << i;
  }
}

TEST(Fp8Test, TinyAmaxGuard) {
  std::vector<uint8_t> codes(4, 0xAA);
  float tiny[4] = {1e-36f, -1e-36f, 0.0f, 1e-35f};
  EXPECT_EQ(QuantizeRow(tiny, 4, codes.data()), 1.0f);
  for (auto c : codes) EXPECT_EQ(c, 0);
  float zeros[4] = {0, 0, -0.0f, 0};
  codes.assign(4, 0xAA);
  EXPECT_EQ(QuantizeRow(zeros, 4, codes.data()), 1.0f);
  for (auto c : codes) EXPECT_EQ(c, 0);
  float inf[4] = {1.0f, std::numeric_limits<float>::infinity(), 2.0f, 3.0f};
  codes.assign(4, 0xAA);
  EXPECT_EQ(QuantizeRow(inf, 4, codes.data()), 1.0f);
  for (auto c : codes) EXPECT_EQ(c, 0);
  float nan[4] = {std::numeric_limits<float>::quiet_NaN(), 2.0f, -4.0f, 1.0f};
  codes.assign(4, 0xAA);
  EXPECT_EQ(QuantizeRow(nan, 4, codes.data()), 4.0f / 448.0f);
  EXPECT_EQ(codes[0], 0x00);
  EXPECT_EQ(codes[2], 0xFE);
  float just_above[2] = {2e-35f, 0.0f};
  EXPECT_EQ(QuantizeRow(just_above, 2, codes.data()), 2e-35f / 448.0f);
  EXPECT_EQ(codes[0], 0x7E);
}

TEST(Fp8Test, ScaleUsability) {
  EXPECT_TRUE(ScaleIsUsable(1.0f));
  EXPECT_FALSE(ScaleIsUsable(0.0f));
  EXPECT_FALSE(ScaleIsUsable(-1.0f));
  EXPECT_FALSE(ScaleIsUsable(std::numeric_limits<float>::quiet_NaN()));
  EXPECT_FALSE(ScaleIsUsable(std::numeric_limits<float>::infinity()));
}

}  // namespace
}  // namespace strata::fp8
