// The small-step GEMM kernels against a float64 product of the same bf16
// weights and f32 inputs, on fresh random data: [n][k] weights with output
// counts that leave partial warps and blocks, strided batches, accumulation,
// [k][n] weights as in the per-head absorption, a row's bits alone and with
// three more rows, and the shapes it refuses.
#include "kernels/cuda/small_gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "common/testing/test_seed.h"
#include "kernels/cuda/test_util.h"

namespace strata::cuda {
namespace {

using testing::DeviceBuffer;
using testing::FromBf16Bits;
using testing::ToBf16Bits;

struct Case {
  int m, n, k, batch;
  bool kn;                      // W stored [k][n]
  int64_t ldx, stride_x, ldw, stride_w, ldy, stride_y;
  bool accumulate;
};

class SmallGemmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = strata::testing::TestSeed();
  }

  // Runs one case on fresh data; returns y. Checks every output against the
  // float64 product within the f32 summation bound of its chain: the chain
  // of a [n][k] output is at most k / 32 + 5 additions (8 per lane chunk,
  // then the butterfly; the block-wide order's chain is shorter), of a
  // [k][n] output k.
  std::vector<float> Run(const Case& c, const std::vector<float>* x_in = nullptr) {
    testing::Rng rng(seed_ + (++calls_));
    const size_t nx = static_cast<size_t>(c.batch - 1) * c.stride_x + (c.m - 1) * c.ldx + c.k;
    const size_t nw = c.kn ? static_cast<size_t>(c.batch - 1) * c.stride_w + (c.k - 1) * c.ldw + c.n
                           : static_cast<size_t>(c.batch - 1) * c.stride_w + (c.n - 1) * c.ldw + c.k;
    const size_t ny = static_cast<size_t>(c.batch - 1) * c.stride_y + (c.m - 1) * c.ldy + c.n;
    std::vector<float> x(nx), y0(ny);
    std::vector<uint16_t> w(nw);
    // (weights first: their count does not depend on m)
    for (uint16_t& v : w) v = ToBf16Bits(rng.Normal() / std::sqrt(static_cast<float>(c.k)));
    for (float& v : x) v = rng.Normal() * static_cast<float>(std::exp(rng.Normal()));
    if (x_in != nullptr) x.assign(x_in->begin(), x_in->begin() + nx);
    for (float& v : y0) v = rng.Normal();
    DeviceBuffer dx(nx * 4), dw(nw * 2), dy(ny * 4);
    dx.Upload(x.data(), nx * 4);
    dw.Upload(w.data(), nw * 2);
    dy.Upload(y0.data(), ny * 4);
    GemmArgs a;
    a.type = GemmType::kBF16;
    a.m = c.m, a.n = c.n, a.k = c.k, a.batch = c.batch;
    a.x = dx.as<void>(), a.ldx = c.ldx, a.stride_x = c.stride_x;
    a.w = dw.as<void>(), a.ldw = c.ldw, a.stride_w = c.stride_w, a.w_is_kn = c.kn;
    a.y = dy.as<float>(), a.ldy = c.ldy, a.stride_y = c.stride_y;
    a.accumulate = c.accumulate;
    EXPECT_TRUE(SmallGemmSupports(a));
    EXPECT_EQ(LaunchSmallGemm(a, nullptr), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> y(ny);
    dy.Download(y.data(), ny * 4);
    const double chain = c.kn ? c.k : c.k / 32.0 + 6;
    int64_t bad = 0, untouched_bad = 0;
    double worst = 0;  // |error| / (sum |x w|), in units of the bound
    std::vector<bool> written(ny, false);
    for (int b = 0; b < c.batch; ++b) {
      for (int i = 0; i < c.m; ++i) {
        for (int j = 0; j < c.n; ++j) {
          double ref = 0, mag = 0;
          for (int l = 0; l < c.k; ++l) {
            const size_t wi = c.kn ? b * c.stride_w + static_cast<size_t>(l) * c.ldw + j
                                   : b * c.stride_w + static_cast<size_t>(j) * c.ldw + l;
            const double t = double{x[b * c.stride_x + i * c.ldx + l]} * FromBf16Bits(w[wi]);
            ref += t;
            mag += std::fabs(t);
          }
          const size_t yi = b * c.stride_y + i * c.ldy + j;
          written[yi] = true;
          const double base = c.accumulate ? double{y0[yi]} : 0.0;
          const double bound = chain * 0x1.0p-24 * (mag + std::fabs(base)) + 0x1.0p-24 * std::fabs(ref + base);
          const double err = std::fabs(y[yi] - (ref + base));
          worst = std::max(worst, err / bound);
          bad += !(err <= bound);
        }
      }
    }
    for (size_t e = 0; e < ny; ++e) untouched_bad += !written[e] && y[e] != y0[e];
    std::printf("m %d n %d k %d batch %d %s%s: worst error %.3f of the bound\n", c.m, c.n, c.k, c.batch,
                c.kn ? "[k][n]" : "[n][k]", c.accumulate ? " accumulate" : "", worst);
    EXPECT_EQ(bad, 0);
    EXPECT_EQ(untouched_bad, 0) << "outputs outside the product were written";
    last_x_ = x;
    return y;
  }

  uint64_t seed_ = 0;
  int calls_ = 0;
  std::vector<float> last_x_;
};

TEST_F(SmallGemmTest, RowMajorWeightsEveryRowCount) {
  for (int m = 1; m <= 4; ++m) {
    // 576, 1536 and 4100 outputs: a block per one, two or four weight rows
    // (k shorter and longer than the block's 2048-column stride, the last
    // block partial); 6000 and 9000: two or four rows per warp, the last warp
    // partial.
    Run({m, 576, 7168, 1, false, 7168, 0, 7168, 0, 576, 0, false});
    Run({m, 1536, 1024, 1, false, 1024, 0, 1024, 0, 1536, 0, m == 4});
    Run({m, 4100, 512, 1, false, 520, 0, 520, 0, 4104, 0, false});
    Run({m, 6000, 2048, 1, false, 2048, 0, 2048, 0, 6000, 0, false});
    Run({m, 9000, 256, 1, false, 256, 0, 256, 0, 9000, 0, m == 2});
  }
}

TEST_F(SmallGemmTest, StridedBatchesAsTheAbsorption) {
  // ctx = W_UV o_lat per head: W [128][512] at a stride of 256 x 512, x rows
  // of 8 heads x 512 with the head as the batch.
  const int heads = 8, L = 512, V = 128, NOPE = 128;
  Run({3, V, L, heads, false, int64_t{heads} * L, L, L, int64_t{NOPE + V} * L, int64_t{heads} * V, V, false});
  // q_abs = W_UK^T q_nope per head: W stored [k = 128][n = 512] (w_is_kn).
  const int QK = 192;
  for (int m = 1; m <= 4; ++m)
    Run({m, L, NOPE, heads, true, int64_t{heads} * QK, QK, L, int64_t{NOPE + V} * L, int64_t{heads} * L, L, m == 3});
}

TEST_F(SmallGemmTest, ARowsBitsDoNotDependOnTheOtherRows) {
  // [n][k] with a block per two rows and with four rows per warp, [k][n].
  const Case cases[] = {{4, 2048, 1024, 1, false, 1024, 0, 1024, 0, 2048, 0, false},
                        {4, 9000, 512, 1, false, 512, 0, 512, 0, 9000, 0, false},
                        {4, 512, 128, 2, true, 128, 512, 512, 128 * 512, 512, 2048, false}};
  for (const Case& four : cases) {
    const bool kn = four.kn;
    const std::vector<float> y4 = Run(four);
    // The same first row alone (x rows 1..3 unused), same weights (same seed).
    Case one = four;
    one.m = 1;
    --calls_;
    const std::vector<float> y1 = Run(one, &last_x_);
    int64_t differ = 0;
    for (int b = 0; b < four.batch; ++b)
      for (int j = 0; j < four.n; ++j) differ += y1[b * four.stride_y + j] != y4[b * four.stride_y + j];
    EXPECT_EQ(differ, 0) << (kn ? "[k][n]" : "[n][k]");
  }
}

// The checks read only the arguments (the pointers' alignment, never the
// data), before any CUDA call: they run without a device.
TEST(SmallGemmHostTest, RefusesWhatItCannotLoad) {
  alignas(256) static uint8_t x[4096], w[4096], y[4096];
  GemmArgs a;
  a.type = GemmType::kBF16;
  a.m = 1, a.n = 8, a.k = 64, a.x = x, a.ldx = 64, a.w = w, a.ldw = 64, a.y = reinterpret_cast<float*>(y), a.ldy = 8;
  EXPECT_TRUE(SmallGemmSupports(a));
  GemmArgs bad = a;
  bad.m = 5;
  EXPECT_FALSE(SmallGemmSupports(bad));
  EXPECT_EQ(LaunchSmallGemm(bad, nullptr), cudaErrorInvalidValue);
  bad = a;
  bad.type = GemmType::kF32;
  EXPECT_FALSE(SmallGemmSupports(bad));
  bad = a;
  bad.k = 60, bad.ldx = 60, bad.ldw = 60;
  EXPECT_FALSE(SmallGemmSupports(bad));
  bad = a;
  bad.w = w + 2;
  EXPECT_FALSE(SmallGemmSupports(bad));
  bad = a;
  bad.w_is_kn = true;
  bad.n = 7;
  EXPECT_FALSE(SmallGemmSupports(bad));
}

}  // namespace
}  // namespace strata::cuda
