// The FP8 / FP4 decoders against references written from the formats'
// fields (sign, exponent, mantissa), not from the code under test.
#include "model/v4/quant.h"

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "common/testing/test_seed.h"
#include "gtest/gtest.h"
#include "model/safetensors_test_util.h"

namespace strata::v4 {
namespace {

using testing_util::RefFp8;
using testing_util::SameValue;

// E2M1: 1 sign, 2 exponent bits (bias 1), 1 mantissa bit; exponent 0 is
// subnormal (m · 0.5).
double RefE2m1(uint8_t code) {
  const bool neg = (code & 8) != 0;
  const int e = (code >> 1) & 3, m = code & 1;
  const double v = e == 0 ? m * 0.5 : std::ldexp(1.0 + m / 2.0, e - 1);
  return neg ? -v : v;
}

double RefE8m0(uint8_t b) { return std::pow(2.0, static_cast<double>(b) - 127.0); }

TEST(V4QuantTest, ScalarDecoders) {
  for (int b = 0; b < 255; ++b) {
    EXPECT_TRUE(SameValue(E8m0Value(static_cast<uint8_t>(b)), RefE8m0(static_cast<uint8_t>(b)))) << b;
  }
  for (int code = 0; code < 16; ++code) {
    EXPECT_TRUE(SameValue(E2m1Value(static_cast<uint8_t>(code)), RefE2m1(static_cast<uint8_t>(code)))) << code;
  }
  EXPECT_EQ(E2m1Value(7), 6.0f);
  EXPECT_EQ(E2m1Value(0xF), -6.0f);
}

TEST(V4QuantTest, Fp8BlocksWithPartialEdges) {
  std::mt19937_64 rng(strata::testing::TestSeed());
  const int64_t rows = 200, cols = 300;  // partial blocks at the right and bottom
  const int64_t sr = 2, sc = 3;
  std::vector<uint8_t> codes(rows * cols), scales(sr * sc);
  for (auto& c : codes) {
    do c = static_cast<uint8_t>(rng());
    while ((c & 0x7F) == 0x7F);
  }
  for (auto& s : scales) s = static_cast<uint8_t>(110 + rng() % 30);
  std::vector<float> out(rows * cols);
  ASSERT_TRUE(DequantFp8Blocks(codes, rows, cols, scales, out.data()).ok());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const double want = RefFp8(codes[r * cols + c]) * RefE8m0(scales[(r / 128) * sc + c / 128]);
      ASSERT_TRUE(SameValue(out[r * cols + c], want)) << r << "," << c;
    }
  }
}

TEST(V4QuantTest, Fp8RefusesNanCodesAndNanScales) {
  std::vector<uint8_t> codes(4 * 4, 0x38), scales(1, 127);
  std::vector<float> out(16);
  ASSERT_TRUE(DequantFp8Blocks(codes, 4, 4, scales, out.data()).ok());
  EXPECT_EQ(out[0], 1.0f);
  codes[6] = 0xFF;
  auto st = DequantFp8Blocks(codes, 4, 4, scales, out.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(st.message()).find("[1][2]"), std::string::npos) << st;
  codes[6] = 0x38;
  scales[0] = 255;
  st = DequantFp8Blocks(codes, 4, 4, scales, out.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(st.message()).find("255"), std::string::npos) << st;
}

TEST(V4QuantTest, Fp4RowsLowNibbleFirst) {
  std::mt19937_64 rng(strata::testing::TestSeed());
  const int64_t rows = 7, cols = 96;
  std::vector<uint8_t> packed(rows * cols / 2), scales(rows * cols / 32);
  for (auto& p : packed) p = static_cast<uint8_t>(rng());
  for (auto& s : scales) s = static_cast<uint8_t>(100 + rng() % 50);
  std::vector<float> out(rows * cols);
  ASSERT_TRUE(DequantFp4Rows(packed, rows, cols, scales, out.data()).ok());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const uint8_t byte = packed[r * cols / 2 + c / 2];
      const uint8_t code = c % 2 == 0 ? byte % 16 : byte / 16;
      const double want = RefE2m1(code) * RefE8m0(scales[r * (cols / 32) + c / 32]);
      ASSERT_TRUE(SameValue(out[r * cols + c], want)) << r << "," << c;
    }
  }
  scales[5] = 255;
  EXPECT_EQ(DequantFp4Rows(packed, rows, cols, scales, out.data()).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strata::v4
