// RMSNorm and rope of layer_ops.cu against CPU references on fresh random
// rows: the vectorised RMSNorm (rows held in registers, and rows longer than
// that read twice), the scalar one it falls back to (odd lengths, unaligned
// rows), in place and not; rope on many heads, interleaved and not, leaving
// the rest of each head untouched; the hi + lo bf16 split of GEMM inputs.
#include "kernels/cuda/layer_ops.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <vector>

#include "common/testing/test_seed.h"
#include "kernels/cuda/test_util.h"

namespace strata::cuda {
namespace {

using testing::DeviceBuffer;

class LayerOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = strata::testing::TestSeed();
  }
  uint64_t seed_ = 0;
};

// out = w * (x * inv) with inv = 1/sqrt(sum(x^2)/n + eps), the sum in double:
// the kernels' arithmetic. Products of floats are exact in double, so the
// order of the sum moves it by a few double ulps at most, far below what
// could change the float inv; the outputs must match bit for bit.
TEST_F(LayerOpsTest, RmsNormMatchesTheCpuBitForBit) {
  testing::Rng rng(seed_);
  const double eps = 1e-6;
  struct Case {
    int rows, n;
    int64_t stride;
    int offset;  // floats: 1 makes the rows unaligned (the scalar kernel)
    bool in_place;
  };
  const Case cases[] = {{3, 7168, 7168, 0, false}, {2, 512, 576, 0, true},  {4, 1536, 1536, 0, true},
                        {2, 9000, 9004, 0, false}, {3, 7169, 7169, 0, false}, {2, 7168, 7168, 1, true},
                        {1, 4, 4, 0, false}};
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "rows " << c.rows << " n " << c.n << " stride " << c.stride << " offset "
                                      << c.offset << " in place " << c.in_place);
    const size_t total = static_cast<size_t>(c.rows) * c.stride + c.offset;
    std::vector<float> x(total), w(c.n);
    for (float& v : x) v = rng.Normal() * 3.0f;
    for (float& v : w) v = 1.0f + 0.1f * rng.Normal();
    DeviceBuffer dx(total * 4), dw(c.n * 4 + 4), dout(total * 4);
    dx.Upload(x.data(), total * 4);
    dw.Upload(w.data(), c.n * 4);
    dout.Upload(x.data(), total * 4);  // columns past n are left alone
    const float* in = dx.as<float>() + c.offset;
    float* out = c.in_place ? dx.as<float>() + c.offset : dout.as<float>() + c.offset;
    ASSERT_EQ(LaunchRmsNorm(in, dw.as<float>(), c.rows, c.n, c.stride, eps, out, nullptr), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> got(total);
    (c.in_place ? dx : dout).Download(got.data(), total * 4);
    int64_t bad = 0, untouched_bad = 0;
    for (int r = 0; r < c.rows; ++r) {
      const float* xr = x.data() + c.offset + r * c.stride;
      double ss = 0;
      for (int i = 0; i < c.n; ++i) ss += static_cast<double>(xr[i]) * xr[i];
      const float inv = static_cast<float>(1.0 / std::sqrt(ss / c.n + eps));
      for (int i = 0; i < c.n; ++i) {
        const float want = w[i] * (xr[i] * inv);
        if (got[c.offset + r * c.stride + i] != want) ++bad;
      }
      for (int64_t i = c.n; i < c.stride; ++i)
        if (got[c.offset + r * c.stride + i] != xr[i]) ++untouched_bad;
    }
    EXPECT_EQ(bad, 0);
    EXPECT_EQ(untouched_bad, 0);
  }
}

// The CPU's rope: cos and sin of the f32 angle in double, scaled in float.
// The device may fuse x0 * cs - x1 * sn into one FMA, so each output is
// allowed two roundings of its terms: 2^-23 * (|x0 cs| + |x1 sn|) for the
// first, 2^-23 * (|x1 cs| + |x0 sn|) for the second.
TEST_F(LayerOpsTest, RopeMatchesTheCpu) {
  testing::Rng rng(seed_ + 1);
  const int rows = 5, heads = 128, head_stride = 192, nope = 128, dim = 64;
  const int64_t row_stride = int64_t{heads} * head_stride;
  std::vector<int64_t> pos = {0, 1, 4095, 131071, 1048575};
  std::vector<float> inv_freq(dim / 2);
  for (int i = 0; i < dim / 2; ++i) inv_freq[i] = static_cast<float>(std::pow(10000.0, -2.0 * i / dim));
  const float factor = 1.25f;
  for (bool interleave : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "interleave " << interleave);
    std::vector<float> x(static_cast<size_t>(rows) * row_stride);
    for (float& v : x) v = rng.Normal();
    DeviceBuffer dx(x.size() * 4), dpos(pos.size() * 8), dfreq(inv_freq.size() * 4);
    dx.Upload(x.data(), x.size() * 4);
    dpos.Upload(pos.data(), pos.size() * 8);
    dfreq.Upload(inv_freq.data(), inv_freq.size() * 4);
    ASSERT_EQ(LaunchRope(dx.as<float>() + nope, rows, row_stride, heads, head_stride, dim, dpos.as<int64_t>(),
                         dfreq.as<float>(), factor, interleave, nullptr),
              cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> got(x.size());
    dx.Download(got.data(), got.size() * 4);
    int64_t bad = 0, untouched_bad = 0;
    double worst = 0;  // in units of one float rounding of |x0 cs| + |x1 sn|
    std::array<int, 3> worst_at = {0, 0, 0};
    for (int r = 0; r < rows; ++r) {
      for (int h = 0; h < heads; ++h) {
        const size_t base = r * row_stride + h * head_stride;
        for (int i = 0; i < nope; ++i)
          if (got[base + i] != x[base + i]) ++untouched_bad;
        for (int i = 0; i < dim / 2; ++i) {
          const float angle = inv_freq[i] * static_cast<float>(pos[r]);
          const float cs = static_cast<float>(std::cos(static_cast<double>(angle))) * factor;
          const float sn = static_cast<float>(std::sin(static_cast<double>(angle))) * factor;
          const size_t a = base + nope + (interleave ? 2 * i : i);
          const size_t b = base + nope + (interleave ? 2 * i + 1 : i + dim / 2);
          const float x0 = x[a], x1 = x[b];
          const double want_a = static_cast<double>(x0) * cs - static_cast<double>(x1) * sn;
          const double want_b = static_cast<double>(x1) * cs + static_cast<double>(x0) * sn;
          const double tol_a = 0x1.0p-23 * (std::fabs(x0 * cs) + std::fabs(x1 * sn)) + 1e-30;
          const double tol_b = 0x1.0p-23 * (std::fabs(x1 * cs) + std::fabs(x0 * sn)) + 1e-30;
          const double e = 2 * std::max(std::fabs(got[a] - want_a) / tol_a, std::fabs(got[b] - want_b) / tol_b);
          if (e > worst) {
            worst = e;
            worst_at = {r, h, i};
          }
          if (std::fabs(got[a] - want_a) > tol_a || std::fabs(got[b] - want_b) > tol_b) ++bad;
        }
      }
    }
    std::printf("interleave %d: worst error %.2f roundings at position %lld, head %d, pair %d; %lld pairs beyond two roundings\n",
                interleave, worst, static_cast<long long>(pos[worst_at[0]]), worst_at[1], worst_at[2],
                static_cast<long long>(bad));
    EXPECT_EQ(bad, 0);
    EXPECT_EQ(untouched_bad, 0);
  }
}

// Refused before any CUDA call (the data is never read): runs without a device.
TEST(LayerOpsHostTest, RopeRefusesAnOddOrOutOfRangeDimension) {
  float x[64] = {};
  for (int dim : {7, 0, -2, 8194}) {
    EXPECT_EQ(LaunchRope(x, 1, 8, 1, 8, dim, nullptr, nullptr, 1.0f, false, nullptr), cudaErrorInvalidValue)
        << "dim " << dim;
  }
}

// GEMM inputs as hi + lo bf16 rows, from a strided batch (gaps between rows
// and batches that must not be read into the output), and the sum of the
// product's two halves back into a strided output.
TEST_F(LayerOpsTest, SplitBf16AndAddHalves) {
  testing::Rng rng(seed_ + 2);
  const int batch = 3, m = 5, k = 37, n = 29;
  const int64_t ldx = 40, stride_x = m * ldx + 3, ldy = 31, stride_y = m * ldy + 2;
  std::vector<float> x(batch * stride_x);
  for (float& v : x) v = rng.Normal() * std::exp2(static_cast<float>(static_cast<int>(rng.Uniform() * 40) - 20));
  DeviceBuffer dx(x.size() * 4), dout(static_cast<size_t>(batch) * 2 * m * k * 2);
  dx.Upload(x.data(), x.size() * 4);
  ASSERT_EQ(LaunchSplitBf16(dx.as<float>(), batch, m, k, ldx, stride_x, dout.as<void>(), nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint16_t> got(static_cast<size_t>(batch) * 2 * m * k);
  dout.Download(got.data(), got.size() * 2);
  int64_t bad_hi = 0, bad_lo = 0;
  double worst = 0;  // |hi + lo - v| / |v| in units of 2^-16 (|v - hi| <= 2^-8 |v|, lo rounds that)
  for (int b = 0; b < batch; ++b)
    for (int i = 0; i < m; ++i)
      for (int l = 0; l < k; ++l) {
        const float v = x[b * stride_x + i * ldx + l];
        const uint16_t hi = got[(static_cast<size_t>(b) * 2 * m + i) * k + l];
        const uint16_t lo = got[(static_cast<size_t>(b) * 2 * m + m + i) * k + l];
        bad_hi += hi != testing::ToBf16Bits(v);
        bad_lo += lo != testing::ToBf16Bits(v - testing::FromBf16Bits(hi));
        const double sum = double{testing::FromBf16Bits(hi)} + testing::FromBf16Bits(lo);
        if (v != 0) worst = std::max(worst, std::fabs(sum - v) / std::fabs(double{v}) * 0x1.0p16);
      }
  std::printf("hi + lo vs the f32 input: worst relative error %.3f x 2^-16\n", worst);
  EXPECT_EQ(bad_hi, 0);
  EXPECT_EQ(bad_lo, 0);
  EXPECT_LE(worst, 1.0);

  std::vector<float> y2(static_cast<size_t>(batch) * 2 * m * n), y(batch * stride_y);
  for (float& v : y2) v = rng.Normal();
  for (float& v : y) v = rng.Normal();
  DeviceBuffer dy2(y2.size() * 4), dy(y.size() * 4);
  dy2.Upload(y2.data(), y2.size() * 4);
  dy.Upload(y.data(), y.size() * 4);
  ASSERT_EQ(LaunchAddSplitHalves(dy2.as<float>(), batch, m, n, dy.as<float>(), ldy, stride_y, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> ygot(y.size());
  dy.Download(ygot.data(), ygot.size() * 4);
  std::vector<float> want = y;  // gaps keep their values
  for (int b = 0; b < batch; ++b)
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j)
        want[b * stride_y + i * ldy + j] = y2[(static_cast<size_t>(b) * 2 * m + i) * n + j] +
                                           y2[(static_cast<size_t>(b) * 2 * m + m + i) * n + j];
  int64_t bad = 0;
  for (size_t e = 0; e < y.size(); ++e) bad += ygot[e] != want[e];
  EXPECT_EQ(bad, 0);
}

}  // namespace
}  // namespace strata::cuda
