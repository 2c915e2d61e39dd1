#include "kvstore/crc32c.h"

#include <random>
#include <string>

#include "common/testing/test_seed.h"
#include "gtest/gtest.h"

namespace strata::kv::crc32c {
namespace {

// Check values from RFC 3720 (iSCSI), appendix B.4, and the common
// "123456789" check value of CRC-32C.
TEST(Crc32c, StandardVectors) {
  EXPECT_EQ(Value("123456789"), 0xE3069283u);
  EXPECT_EQ(Value(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(Value(std::string(32, '\xff')), 0x62A8AB43u);
  std::string inc(32, '\0'), dec(32, '\0');
  for (int i = 0; i < 32; ++i) {
    inc[i] = static_cast<char>(i);
    dec[i] = static_cast<char>(31 - i);
  }
  EXPECT_EQ(Value(inc), 0x46DD794Eu);
  EXPECT_EQ(Value(dec), 0x113FDB5Cu);
  EXPECT_EQ(ExtendPortable(0, "123456789", 9), 0xE3069283u);
  EXPECT_EQ(Value(""), 0u);
}

// A bit-at-a-time CRC straight from the polynomial, as an independent oracle.
uint32_t Bitwise(const std::string& s) {
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : s) {
    c ^= b;
    for (int i = 0; i < 8; ++i) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
  }
  return ~c;
}

TEST(Crc32c, MatchesBitwiseOnRandomDataAndSplits) {
  std::mt19937_64 rng(strata::testing::TestSeed());
  for (int iter = 0; iter < 200; ++iter) {
    std::string s(rng() % 3000, '\0');
    for (char& c : s) c = static_cast<char>(rng());
    const uint32_t want = Bitwise(s);
    EXPECT_EQ(Value(s), want);
    EXPECT_EQ(ExtendPortable(0, s.data(), s.size()), want);
    const size_t cut = s.empty() ? 0 : rng() % s.size();
    EXPECT_EQ(Extend(Value(s.data(), cut), s.data() + cut, s.size() - cut), want);
    // Unaligned start.
    if (s.size() > 3) {
      EXPECT_EQ(Value(s.data() + 3, s.size() - 3), Bitwise(s.substr(3)));
    }
  }
}

}  // namespace
}  // namespace strata::kv::crc32c
