// SequenceKv: a row appended from its stored form (fp8 codes + scales) is
// bit-identical to the row AppendRow produced from the floats.
#include "model/kv_cache.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/testing/test_seed.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

std::vector<float> RandomRow(std::mt19937& rng, int n, float scale) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

TEST(SequenceKvTest, QuantizedRowEqualsTheRowAppendRowProduced) {
  constexpr int kLora = 40, kRope = 8, kIndex = 12, kTokens = 23;
  std::mt19937 rng(strata::testing::TestSeed());
  SequenceKv from_floats(3, kLora, kRope, kIndex, KvDtype::kFp8, false);
  for (int t = 0; t < kTokens; ++t) {
    for (int l = 0; l < 3; ++l) {
      // Mix magnitudes, an all-zero row, a row with inf and one with NaN.
      std::vector<float> c = RandomRow(rng, kLora, std::pow(10.0f, static_cast<float>(t % 7) - 3));
      std::vector<float> r = RandomRow(rng, kRope, 1.0f);
      if (t == 3) std::fill(c.begin(), c.end(), 0.0f);
      if (t == 5) c[7] = std::numeric_limits<float>::infinity();
      if (t == 6) r[2] = std::numeric_limits<float>::quiet_NaN();
      from_floats.AppendRow(l, c.data(), r.data());
    }
    std::vector<float> k = RandomRow(rng, kIndex, 2.0f);
    from_floats.AppendIndexKey(1, k.data());
    from_floats.Commit(1);
  }
  SequenceKv from_codes(3, kLora, kRope, kIndex, KvDtype::kFp8, false);
  for (int t = 0; t < kTokens; ++t) {
    for (int l = 0; l < 3; ++l) {
      const LayerKv& L = from_floats.layer(l);
      from_codes.AppendQuantizedRow(l, &L.c_codes[t * kLora], L.c_scale[t], &L.r_codes[t * kRope], L.r_scale[t]);
    }
    from_codes.AppendStoredIndexKey(1, &from_floats.layer(1).index_k[t * kIndex]);
    from_codes.Commit(1);
  }
  ASSERT_EQ(from_codes.num_tokens(), kTokens);
  for (int l = 0; l < 3; ++l) {
    const LayerKv& a = from_floats.layer(l);
    const LayerKv& b = from_codes.layer(l);
    EXPECT_EQ(a.c_codes, b.c_codes) << l;
    EXPECT_EQ(a.r_codes, b.r_codes) << l;
    EXPECT_TRUE(SameBits(a.c_scale, b.c_scale)) << l;
    EXPECT_TRUE(SameBits(a.r_scale, b.r_scale)) << l;
    EXPECT_TRUE(SameBits(a.c, b.c)) << l;
    EXPECT_TRUE(SameBits(a.r, b.r)) << l;
    EXPECT_TRUE(SameBits(a.index_k, b.index_k)) << l;
  }
  EXPECT_TRUE(from_codes.layer(0).index_k.empty());
}

TEST(SequenceKvTest, FP8IndexKeysAreStoredVerbatim) {
  // With fp8 indexer keys AppendIndexKey keeps dequantised values; loading
  // them must not quantise a second time.
  constexpr int kIndex = 16;
  std::mt19937 rng(7);
  SequenceKv a(1, 8, 4, kIndex, KvDtype::kFp8, true);
  std::vector<float> k = RandomRow(rng, kIndex, 3.0f);
  a.AppendIndexKey(0, k.data());
  SequenceKv b(1, 8, 4, kIndex, KvDtype::kFp8, true);
  b.AppendStoredIndexKey(0, a.layer(0).index_k.data());
  EXPECT_TRUE(SameBits(a.layer(0).index_k, b.layer(0).index_k));
}

TEST(SequenceKvTest, F32CacheKeepsOnlyTheDequantisedRow) {
  const uint8_t c[4] = {0x38, 0xB8, 0x00, 0x7E};  // 1, -1, 0, 448
  const uint8_t r[2] = {0x40, 0x30};              // 2, 0.5
  SequenceKv kv(1, 4, 2, 0, KvDtype::kF32, false);
  kv.AppendQuantizedRow(0, c, 0.5f, r, 2.0f);
  kv.Commit(1);
  EXPECT_EQ(kv.layer(0).c, (std::vector<float>{0.5f, -0.5f, 0.0f, 224.0f}));
  EXPECT_EQ(kv.layer(0).r, (std::vector<float>{4.0f, 1.0f}));
  EXPECT_TRUE(kv.layer(0).c_codes.empty());
  EXPECT_TRUE(kv.layer(0).c_scale.empty());
}

}  // namespace
}  // namespace strata
