// GPU fp8 row quantisation against fp8::QuantizeRow: identical codes and
// scales, bit for bit, on random rows and on every special case.
#include "kernels/cuda/fp8_quantize.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/testing/test_seed.h"
#include "kernels/cuda/kv_layout.h"
#include "kernels/cuda/test_util.h"
#include "kernels/fp8.h"

namespace strata::cuda {
namespace {

using testing::DeviceBuffer;

class Fp8QuantizeTest : public ::testing::Test {};

// Rows of several kinds: normal data, data hitting rounding ties of the fp8
// grid exactly (amax 448 makes inv exactly 1), specials, tiny and huge rows.
std::vector<float> MakeRows(testing::Rng& rng, int rows, int n) {
  std::vector<float> x(static_cast<size_t>(rows) * n);
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int r = 0; r < rows; ++r) {
    float* row = x.data() + static_cast<size_t>(r) * n;
    const int kind = r % 8;
    for (int i = 0; i < n; ++i) {
      switch (kind) {
        case 0: row[i] = rng.Normal(); break;
        case 1: row[i] = rng.Normal() * 1e-20f; break;
        case 2: {  // exact midpoints between neighbouring codes, amax 448
          const uint8_t c = static_cast<uint8_t>(rng.Below(0x7E));
          const float lo = fp8::Decode(c), hi = fp8::Decode(c + 1);
          row[i] = (rng.Below(2) ? 1.f : -1.f) * 0.5f * (lo + hi);
          break;
        }
        case 3: row[i] = rng.Normal() * 1e30f; break;
        case 4: row[i] = (i % 5 == 0) ? nan : rng.Normal(); break;
        case 5: row[i] = rng.Normal() * 1e-37f; break;  // amax under the tiny guard
        case 6: row[i] = (i % 7 == 3) ? ((i & 8) ? -inf : inf) : rng.Normal(); break;
        default: row[i] = (i % 3 == 0) ? -0.0f : rng.Normal() * 3e38f; break;
      }
    }
    if (kind == 2) row[0] = 448.0f;
  }
  return x;
}

TEST_F(Fp8QuantizeTest, MatchesCpuBitForBit) {
  const uint64_t seed = strata::testing::TestSeed();
  SCOPED_TRACE(seed);
  testing::Rng rng(seed);
  for (int n : {1, 31, 64, 128, 512, 577, 4096}) {
    const int rows = 96;
    const std::vector<float> x = MakeRows(rng, rows, n);
    DeviceBuffer dx(x.size() * 4), dc(x.size()), ds(rows * 4);
    dx.Upload(x.data(), x.size() * 4);
    dc.Poison(0x7F);
    ds.Poison();
    QuantizeRowsParams p{dx.as<float>(), dc.as<uint8_t>(), ds.as<float>(), rows, n, n, n, 1};
    STRATA_CUDA_OK(LaunchQuantizeRows(p, nullptr));
    STRATA_CUDA_OK(cudaDeviceSynchronize());
    std::vector<uint8_t> codes(x.size());
    std::vector<float> scales(rows);
    dc.Download(codes.data(), codes.size());
    ds.Download(scales.data(), rows * 4);
    std::vector<uint8_t> want(n);
    for (int r = 0; r < rows; ++r) {
      const float s = fp8::QuantizeRow(x.data() + static_cast<size_t>(r) * n, n, want.data());
      uint32_t a, b;
      std::memcpy(&a, &s, 4);
      std::memcpy(&b, &scales[r], 4);
      ASSERT_EQ(a, b) << "n=" << n << " row=" << r;
      for (int i = 0; i < n; ++i)
        ASSERT_EQ(want[i], codes[static_cast<size_t>(r) * n + i]) << "n=" << n << " row=" << r << " i=" << i;
    }
  }
}

TEST_F(Fp8QuantizeTest, AppendKvRowsWritesTheSlotsTheCpuWould) {
  const uint64_t seed = strata::testing::TestSeed();
  SCOPED_TRACE(seed);
  testing::Rng rng(seed);
  const int n_tokens = 150, n_pages = 5;
  std::vector<float> c = MakeRows(rng, n_tokens, kLatentDim), r = MakeRows(rng, n_tokens, kRopeDim);
  std::vector<int64_t> pos(n_tokens);
  std::vector<int> seq(n_tokens), table = {3, 0, 4, 1};  // two sequences of two pages
  for (int i = 0; i < n_tokens; ++i) {
    seq[i] = i % 2;
    pos[i] = 1 + i / 2;  // positions 1..75 of each sequence
  }
  DeviceBuffer dc(c.size() * 4), dr(r.size() * 4), dpos(n_tokens * 8), dseq(n_tokens * 4),
      dtab(table.size() * 4), dpool(n_pages * kPageBytes);
  dc.Upload(c.data(), c.size() * 4);
  dr.Upload(r.data(), r.size() * 4);
  dpos.Upload(pos.data(), n_tokens * 8);
  dseq.Upload(seq.data(), n_tokens * 4);
  dtab.Upload(table.data(), table.size() * 4);
  dpool.Poison(0x5A);
  AppendKvRowsParams p{dc.as<float>(), dr.as<float>(), dpos.as<int64_t>(), dseq.as<int>(),
                       dtab.as<int>(), 2, dpool.as<uint8_t>(), n_tokens};
  STRATA_CUDA_OK(LaunchAppendKvRows(p, nullptr));
  STRATA_CUDA_OK(cudaDeviceSynchronize());
  std::vector<uint8_t> pool(n_pages * kPageBytes), want(n_pages * kPageBytes, 0x5A);
  dpool.Download(pool.data(), pool.size());
  for (int i = 0; i < n_tokens; ++i) {
    uint8_t row[kV2RowBytes];
    const float cs = fp8::QuantizeRow(c.data() + i * kLatentDim, kLatentDim, row);
    std::memcpy(row + kLatentDim, &cs, 4);
    const float rs = fp8::QuantizeRow(r.data() + i * kRopeDim, kRopeDim, row + kLatentDim + 4);
    std::memcpy(row + kLatentDim + 4 + kRopeDim, &rs, 4);
    PackV2Row(row, static_cast<int>(pos[i] % 64), want.data() + table[seq[i] * 2 + pos[i] / 64] * kPageBytes);
  }
  EXPECT_EQ(0, std::memcmp(pool.data(), want.data(), pool.size()));
}

}  // namespace
}  // namespace strata::cuda
