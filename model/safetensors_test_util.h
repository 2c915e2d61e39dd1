// Test-only helpers for the safetensors tests: a scratch directory per test,
// random data, and converters written independently of the code under test
// (they go through double arithmetic on sign, exponent and mantissa, not bit
// shifts into a float).
#ifndef STRATA_MODEL_SAFETENSORS_TEST_UTIL_H_
#define STRATA_MODEL_SAFETENSORS_TEST_UTIL_H_

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/testing/test_seed.h"
#include "gtest/gtest.h"

namespace strata::testing_util {

// (-1)^sign * 2^exp2 * (mant / 2^mant_bits), the value of a binary float's
// fields, in double (exact for every format used here).
inline double FromFields(bool negative, int exp2, double significand) {
  const double v = std::ldexp(significand, exp2);
  return negative ? -v : v;
}

// bfloat16: 1 sign, 8 exponent (bias 127), 7 mantissa bits.
inline double RefBf16(uint16_t b) {
  const bool neg = (b >> 15) != 0;
  const int e = (b >> 7) & 0xFF;
  const int m = b & 0x7F;
  if (e == 0xFF) {
    return m == 0 ? (neg ? -HUGE_VAL : HUGE_VAL) : std::numeric_limits<double>::quiet_NaN();
  }
  if (e == 0) return FromFields(neg, -126, m / 128.0);
  return FromFields(neg, e - 127, 1.0 + m / 128.0);
}

// IEEE half: 1 sign, 5 exponent (bias 15), 10 mantissa bits.
inline double RefF16(uint16_t h) {
  const bool neg = (h >> 15) != 0;
  const int e = (h >> 10) & 0x1F;
  const int m = h & 0x3FF;
  if (e == 0x1F) {
    return m == 0 ? (neg ? -HUGE_VAL : HUGE_VAL) : std::numeric_limits<double>::quiet_NaN();
  }
  if (e == 0) return FromFields(neg, -14, m / 1024.0);
  return FromFields(neg, e - 15, 1.0 + m / 1024.0);
}

// fp8 e4m3 "fn": 1 sign, 4 exponent (bias 7), 3 mantissa bits; the NaN codes
// (S.1111.111) read as a zero of their sign in Strata (kernels/fp8.h).
inline double RefFp8(uint8_t c) {
  const bool neg = (c >> 7) != 0;
  const int e = (c >> 3) & 0xF;
  const int m = c & 0x7;
  if (e == 0xF && m == 0x7) return neg ? -0.0 : 0.0;
  if (e == 0) return FromFields(neg, -6, m / 8.0);
  return FromFields(neg, e - 7, 1.0 + m / 8.0);
}

// Checks a float against a double reference value: both NaN, or equal
// including the sign of zero.
inline ::testing::AssertionResult SameValue(float got, double want) {
  if (std::isnan(want)) {
    if (std::isnan(got)) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "got " << got << ", want NaN";
  }
  if (static_cast<double>(got) == want && std::signbit(got) == std::signbit(want)) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "got " << got << ", want " << want;
}

inline std::vector<uint8_t> RandomBytes(std::mt19937_64& rng, size_t n) {
  std::vector<uint8_t> out(n);
  for (auto& b : out) b = static_cast<uint8_t>(rng());
  return out;
}

template <typename T>
std::vector<uint8_t> ToBytes(const std::vector<T>& v) {
  std::vector<uint8_t> out(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(out.data(), v.data(), out.size());
  return out;
}

inline void WriteFileBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

inline std::string ReadFileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A fresh directory per test, removed afterwards; a random seed per test,
// printed so a failure can be replayed.
class ScratchDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = (std::filesystem::path(::testing::TempDir()) /
            (std::string("strata_safetensors_") + info->test_suite_name() + "_" + info->name() +
             "_" + std::to_string(::getpid())))
               .string();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    seed_ = strata::testing::TestSeed();  // printed; STRATA_TEST_SEED replays it
    rng_.seed(seed_);
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string Path(const std::string& name) const {
    return (std::filesystem::path(dir_) / name).string();
  }

  std::string dir_;
  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
};

}  // namespace strata::testing_util

#endif  // STRATA_MODEL_SAFETENSORS_TEST_UTIL_H_
