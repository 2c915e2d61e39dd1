// Paged KV layout: byte offsets per docs/design.md §4.7 and bit-exact conversion to
// and from `.coli_kv` v2 layer rows. Runs without a GPU.
#include "kernels/cuda/kv_layout.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "common/testing/test_seed.h"
#include "kernels/cuda/test_util.h"

namespace strata::cuda {
namespace {

std::vector<uint8_t> RandomBytes(testing::Rng& rng, size_t n) {
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng.Next());
  return v;
}

TEST(KvLayoutTest, OffsetsFollowTheDesign) {
  EXPECT_EQ(kPageLatentOffset, 0u);
  EXPECT_EQ(kPageRopeOffset, 32768u);
  EXPECT_EQ(kPageScaleOffset, 36864u);
  EXPECT_EQ(kPageBytes, 37376u);
  EXPECT_EQ(kV2RowBytes, 584u);
}

TEST(KvLayoutTest, PackPlacesEveryFieldWhereTheLayoutSays) {
  testing::Rng rng(strata::testing::TestSeed());
  std::vector<uint8_t> page(kPageBytes, 0);
  for (int slot : {0, 1, 37, 63}) {
    const std::vector<uint8_t> row = RandomBytes(rng, kV2RowBytes);
    PackV2Row(row.data(), slot, page.data());
    EXPECT_EQ(0, std::memcmp(page.data() + slot * 512, row.data(), 512));
    EXPECT_EQ(0, std::memcmp(page.data() + 36864 + slot * 8, row.data() + 512, 4));
    EXPECT_EQ(0, std::memcmp(page.data() + 32768 + slot * 64, row.data() + 516, 64));
    EXPECT_EQ(0, std::memcmp(page.data() + 36864 + slot * 8 + 4, row.data() + 580, 4));
  }
}

TEST(KvLayoutTest, RowsRoundTripBitExactAcrossPages) {
  const uint64_t seed = strata::testing::TestSeed();
  SCOPED_TRACE(seed);
  testing::Rng rng(seed);
  // Rows as one layer's slice of consecutive records (stride = a record size),
  // scales deliberately including NaN / inf / negative / denormal bit patterns.
  const size_t record = 4 + 3 * kV2RowBytes;
  const int64_t first = 61, n = 200;
  std::vector<uint8_t> records = RandomBytes(rng, record * n);
  const uint32_t odd_scales[] = {0x7FC00001u, 0x7F800000u, 0xBF800000u, 0x00000001u, 0x80000000u};
  for (int i = 0; i < 5; ++i) std::memcpy(records.data() + record * i + 4 + 512, &odd_scales[i], 4);
  std::vector<std::vector<uint8_t>> pages(6, std::vector<uint8_t>(kPageBytes, 0xAB));
  std::vector<uint8_t*> table;
  for (auto& p : pages) table.push_back(p.data());
  const uint8_t* rows = records.data() + 4;  // layer 0 of each record
  PackV2Rows(rows, record, first, n, table.data());
  std::vector<uint8_t> back(record * n, 0);
  UnpackV2Rows(table.data(), first, n, back.data() + 4, record);
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(0, std::memcmp(rows + i * record, back.data() + 4 + i * record, kV2RowBytes)) << i;
  // Slots outside [first, first + n) are untouched.
  EXPECT_EQ(pages[0][0], 0xAB);
  EXPECT_EQ(pages[0][60 * 512 + 511], 0xAB);
  EXPECT_EQ(pages[4][(first + n) % 64 * 512], 0xAB);
}

}  // namespace
}  // namespace strata::cuda
