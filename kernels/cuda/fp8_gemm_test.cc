// The fp8 block-scaled GEMM runner (fp8_gemm.h) on fresh random data:
// - the activation quantiser gives fp8::QuantizeRow's codes and scales per
//   1×128 group, bit for bit (partial last group, all-zero and NaN-holding
//   groups, the padding of each row zeroed);
// - steps of more than eight rows (the library; row counts that are not
//   multiples of 16 padded) against a float64 product of the quantised
//   inputs and the decoded weights. The library does not document its fp8
//   accumulator (DeepSeek-V3's report measures about 14 bits kept per
//   addition); errors measured on the H200 reach 1.4 × 2^-11 of the
//   128-column blocks' magnitudes (m 300, k 1024). The bound, 2^-9 of those
//   magnitudes, is there to catch wiring mistakes (operand or scale layouts,
//   padding), which give errors of the size of the values (3447 × 2^-11 for
//   k = 1152 before such widths were taken off the library); the worst error
//   is printed, with the error against the unquantised inputs;
// - steps of at most eight rows give LaunchFp8Gemv's bits;
// - in the batch-invariant mode a row's bits do not depend on m.
#include "kernels/cuda/fp8_gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "common/testing/test_seed.h"
#include "kernels/cuda/test_util.h"
#include "kernels/fp8.h"

namespace strata::cuda {
namespace {

using testing::DeviceBuffer;

// A weight and inputs on the host and the device.
struct Problem {
  int m, n, k;
  std::vector<uint8_t> w;
  std::vector<float> scale, x, y0;
  DeviceBuffer dw, ds, dx, dy;
  int bk() const { return (k + kFp8BlockSize - 1) / kFp8BlockSize; }

  Problem(uint64_t seed, int m_, int n_, int k_) : m(m_), n(n_), k(k_) {
    testing::Rng rng(seed);
    const int bn = (n + kFp8BlockSize - 1) / kFp8BlockSize;
    w.resize(static_cast<size_t>(n) * k);
    for (uint8_t& v : w) v = static_cast<uint8_t>(rng.Next());
    scale.resize(static_cast<size_t>(bn) * bk());
    for (float& s : scale) s = std::ldexp(1.0f + static_cast<float>(rng.Uniform()), -8 - static_cast<int>(rng.Below(6)));
    x.resize(static_cast<size_t>(m) * k);
    for (float& v : x) v = rng.Normal() * static_cast<float>(std::exp(rng.Normal()));
    y0.resize(static_cast<size_t>(m) * n);
    for (float& v : y0) v = rng.Normal();
    dw = DeviceBuffer(w.size());
    ds = DeviceBuffer(scale.size() * 4);
    dx = DeviceBuffer(x.size() * 4);
    dy = DeviceBuffer(y0.size() * 4);
    dw.Upload(w.data(), w.size());
    // As the engine loads weights: NaN codes (about 1 in 128 here) become 0,
    // the value fp8::Decode gives them in the reference.
    STRATA_CUDA_OK(LaunchClearNanCodes(dw.as<uint8_t>(), static_cast<int64_t>(w.size()), nullptr));
    std::vector<uint8_t> cleared(w.size());
    dw.Download(cleared.data(), cleared.size());
    for (size_t i = 0; i < w.size(); ++i) {
      const uint8_t want = (w[i] & 0x7F) == 0x7F ? 0 : w[i];
      if (cleared[i] != want) {
        ADD_FAILURE() << "code " << i << ": 0x" << std::hex << int{w[i]} << " cleared to 0x" << int{cleared[i]};
        break;
      }
    }
    ds.Upload(scale.data(), scale.size() * 4);
    dx.Upload(x.data(), x.size() * 4);
    dy.Upload(y0.data(), y0.size() * 4);
  }

  Fp8GemvArgs Args(bool accumulate) const {
    Fp8GemvArgs a;
    a.m = m, a.n = n, a.k = k;
    a.x = dx.as<float>(), a.ldx = k;
    a.w = dw.as<uint8_t>(), a.ldw = k;
    a.scale = ds.as<float>(), a.ld_scale = bk();
    a.y = dy.as<float>(), a.ldy = n;
    a.accumulate = accumulate;
    return a;
  }

  double W(int j, int l) const {
    return double{fp8::Decode(w[static_cast<size_t>(j) * k + l])} *
           scale[static_cast<size_t>(j / kFp8BlockSize) * bk() + l / kFp8BlockSize];
  }

  std::vector<float> Result() const {
    std::vector<float> y(y0.size());
    dy.Download(y.data(), y.size() * 4);
    return y;
  }
};

TEST(Fp8GemmTest, ActivationQuantisationIsTheCpuCodecPerGroup) {
  const uint64_t seed = strata::testing::TestSeed();
  testing::Rng rng(seed);
  for (const int k : {128, 1040, 7168, 16}) {
    const int m = 37, rows = 48, groups = (k + 127) / 128;
    const int64_t ldc = k + 32;
    std::vector<float> x(static_cast<size_t>(m) * k);
    for (float& v : x) v = std::ldexp(rng.Normal(), static_cast<int>(rng.Below(30)) - 15);
    // Row 1: all zero; row 2: a NaN in its first group; row 3: tiny values.
    for (int c = 0; c < k; ++c) x[k + c] = 0.0f;
    x[2 * k + 5] = std::numeric_limits<float>::quiet_NaN();
    for (int c = 0; c < k; ++c) x[3 * k + c] = 1e-37f * rng.Normal();
    DeviceBuffer dx(x.size() * 4), dc(static_cast<size_t>(rows) * ldc), ds(static_cast<size_t>(groups) * rows * 4);
    dx.Upload(x.data(), x.size() * 4);
    std::vector<uint8_t> junk(static_cast<size_t>(rows) * ldc, 0x55);
    dc.Upload(junk.data(), junk.size());
    ASSERT_EQ(
        LaunchQuantizeGroups128(dx.as<float>(), m, k, k, dc.as<uint8_t>(), ldc, ds.as<float>(), rows, nullptr),
        cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<uint8_t> codes(junk.size());
    std::vector<float> scales(static_cast<size_t>(groups) * rows);
    dc.Download(codes.data(), codes.size());
    ds.Download(scales.data(), scales.size() * 4);
    int64_t code_diff = 0, scale_diff = 0, pad_diff = 0;
    for (int i = 0; i < m; ++i) {
      for (int g = 0; g < groups; ++g) {
        const int c0 = g * 128, len = std::min(128, k - c0);
        uint8_t ref[128];
        const float s = fp8::QuantizeRow(&x[static_cast<size_t>(i) * k + c0], len, ref);
        scale_diff += std::memcmp(&s, &scales[static_cast<size_t>(g) * rows + i], 4) != 0;
        code_diff += std::memcmp(ref, &codes[static_cast<size_t>(i) * ldc + c0], len) != 0;
      }
      for (int64_t c = k; c < ldc; ++c) pad_diff += codes[static_cast<size_t>(i) * ldc + c] != 0;
    }
    // The padding rows: zero codes, scale 1.
    for (int i = m; i < rows; ++i) {
      for (int64_t c = 0; c < ldc; ++c) pad_diff += codes[static_cast<size_t>(i) * ldc + c] != 0;
      for (int g = 0; g < groups; ++g) scale_diff += scales[static_cast<size_t>(g) * rows + i] != 1.0f;
    }
    EXPECT_EQ(code_diff, 0) << "k " << k << " seed " << seed;
    EXPECT_EQ(scale_diff, 0) << "k " << k;
    EXPECT_EQ(pad_diff, 0) << "k " << k;
  }
  EXPECT_EQ(LaunchQuantizeGroups128(nullptr, 1, 16, 16, nullptr, 16, nullptr, 1, nullptr), cudaErrorInvalidValue);
}

TEST(Fp8GemmTest, LargeStepsRunTheLibraryWithinTheFp8TensorCoreBound) {
  const uint64_t seed = strata::testing::TestSeed();
  auto runner = Fp8GemmRunner::Create(false);
  ASSERT_TRUE(runner.ok()) << runner.status();
  struct Shape {
    int m, n, k;
    bool accumulate;
  };
  int calls = 0;
  for (const Shape sh : {Shape{9, 576, 7168, false}, Shape{16, 1200, 2560, true}, Shape{33, 3000, 1536, false},
                         Shape{300, 1200, 1024, false}, Shape{129, 256, 2048, true}}) {
    Problem p(seed + (++calls), sh.m, sh.n, sh.k);
    const absl::Status st = (*runner)->Run(p.Args(sh.accumulate), nullptr);
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> y = p.Result();
    const int groups = p.bk();
    double worst = 0, worst_unquantised = 0;
    int64_t bad = 0;
    std::vector<uint8_t> q(128);
    std::vector<double> xq(p.k);
    for (int i = 0; i < p.m; ++i) {
      for (int g = 0; g < groups; ++g) {
        const int c0 = g * 128, len = std::min(128, p.k - c0);
        const float s = fp8::QuantizeRow(&p.x[static_cast<size_t>(i) * p.k + c0], len, q.data());
        for (int c = 0; c < len; ++c) xq[c0 + c] = double{fp8::Decode(q[c])} * s;
      }
      for (int j = 0; j < p.n; ++j) {
        double ref = 0, exact = 0, bound_mag = 0, mag = 0;
        for (int g = 0; g < groups; ++g) {
          double block = 0;
          for (int l = g * 128; l < std::min(p.k, g * 128 + 128); ++l) {
            const double wv = p.W(j, l), t = xq[l] * wv;
            ref += t;
            block += std::fabs(t);
            exact += double{p.x[static_cast<size_t>(i) * p.k + l]} * wv;
            mag += std::fabs(double{p.x[static_cast<size_t>(i) * p.k + l]} * wv);
          }
          bound_mag += block;
        }
        const size_t yi = static_cast<size_t>(i) * p.n + j;
        const double base = sh.accumulate ? double{p.y0[yi]} : 0.0;
        const double bound = 0x1.0p-9 * bound_mag + 0x1.0p-23 * (std::fabs(ref) + std::fabs(base));
        const double err = std::fabs(y[yi] - (ref + base));
        worst = std::isnan(err) ? INFINITY : std::max(worst, err / bound);
        bad += !(err <= bound);
        worst_unquantised = std::max(worst_unquantised, std::fabs(y[yi] - (exact + base)) / (mag + 1e-30));
      }
    }
    std::printf("library m %d n %d k %d%s: worst error %.3f of the bound; against the unquantised inputs %.2e of "
                "sum |x W|\n",
                sh.m, sh.n, sh.k, sh.accumulate ? " accumulate" : "", worst, worst_unquantised);
    EXPECT_EQ(bad, 0) << "m " << sh.m << " n " << sh.n << " k " << sh.k << " seed " << seed;
  }
  EXPECT_EQ((*runner)->library_calls(), 5);
}

// Runs `a` through the runner and returns y.
std::vector<float> RunnerResult(Fp8GemmRunner& r, const Problem& p, const Fp8GemvArgs& a) {
  EXPECT_TRUE(r.Run(a, nullptr).ok());
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return p.Result();
}

// Widths the library gets wrong on the H200 (k = 1040: a partial last
// 128-column block, non-finite outputs; k = 1152: nine blocks, errors of the
// size of the values) run the GEMV, eight rows at a time.
TEST(Fp8GemmTest, WidthsOtherThanMultiplesOf512RunTheGemv) {
  const uint64_t seed = strata::testing::TestSeed();
  auto runner = Fp8GemmRunner::Create(false);
  ASSERT_TRUE(runner.ok()) << runner.status();
  for (int k : {1040, 1152}) {
    Problem p(seed + k, 20, 1200, k);
    const std::vector<float> via_runner = RunnerResult(**runner, p, p.Args(false));
    EXPECT_EQ((*runner)->library_calls(), 0);
    for (int i0 = 0; i0 < p.m; i0 += kFp8GemvMaxRows) {
      Fp8GemvArgs a = p.Args(false);
      a.m = std::min(kFp8GemvMaxRows, p.m - i0);
      a.x += static_cast<int64_t>(i0) * a.ldx;
      a.y += static_cast<int64_t>(i0) * a.ldy;
      a.form = Fp8GemvForm::kAuto;
      ASSERT_EQ(LaunchFp8Gemv(a, nullptr), cudaSuccess);
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> direct = p.Result();
    int64_t differ = 0;
    for (size_t e = 0; e < direct.size(); ++e) differ += direct[e] != via_runner[e];
    EXPECT_EQ(differ, 0) << "k " << k << " seed " << seed;
  }
}

TEST(Fp8GemmTest, SmallStepsAreTheGemvsBits) {
  const uint64_t seed = strata::testing::TestSeed();
  auto runner = Fp8GemmRunner::Create(false);
  ASSERT_TRUE(runner.ok()) << runner.status();
  for (int m : {1, 2, 8}) {
    Problem p(seed + m, m, 3000, 1536);
    const std::vector<float> via_runner = RunnerResult(**runner, p, p.Args(false));
    Fp8GemvArgs a = p.Args(false);
    a.form = Fp8GemvForm::kAuto;
    ASSERT_EQ(LaunchFp8Gemv(a, nullptr), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> direct = p.Result();
    int64_t differ = 0;
    for (size_t e = 0; e < direct.size(); ++e) differ += direct[e] != via_runner[e];
    EXPECT_EQ(differ, 0) << "m " << m << " seed " << seed;
  }
  EXPECT_EQ((*runner)->library_calls(), 0);
}

TEST(Fp8GemmTest, BatchInvariantModeKeepsARowsBits) {
  const uint64_t seed = strata::testing::TestSeed();
  auto runner = Fp8GemmRunner::Create(true);
  ASSERT_TRUE(runner.ok()) << runner.status();
  Problem big(seed, 40, 1200, 1040);
  const std::vector<float> y40 = RunnerResult(**runner, big, big.Args(false));
  for (int m : {1, 3, 9, 17}) {
    Fp8GemvArgs a = big.Args(false);
    a.m = m;
    // Rows 0 .. m-1 of the same inputs; the outputs go to a fresh buffer.
    DeviceBuffer out(static_cast<size_t>(m) * big.n * 4);
    a.y = out.as<float>();
    ASSERT_TRUE((*runner)->Run(a, nullptr).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> y(static_cast<size_t>(m) * big.n);
    out.Download(y.data(), y.size() * 4);
    int64_t differ = 0;
    for (size_t e = 0; e < y.size(); ++e) differ += y[e] != y40[e];
    EXPECT_EQ(differ, 0) << "m " << m << " seed " << seed;
  }
  EXPECT_EQ((*runner)->library_calls(), 0);
}

TEST(Fp8GemmTest, RefusesArgumentsTheKernelsCannotTake) {
  auto runner = Fp8GemmRunner::Create(false);
  ASSERT_TRUE(runner.ok()) << runner.status();
  Problem p(1, 16, 256, 256);
  Fp8GemvArgs a = p.Args(false);
  a.k = 250;  // not a multiple of 16
  EXPECT_EQ((*runner)->Run(a, nullptr).code(), absl::StatusCode::kInvalidArgument);
  a = p.Args(false);
  a.m = 70000;
  EXPECT_EQ((*runner)->Run(a, nullptr).code(), absl::StatusCode::kInvalidArgument);
  a = p.Args(false);
  a.m = 0;
  EXPECT_TRUE((*runner)->Run(a, nullptr).ok());
}

}  // namespace
}  // namespace strata::cuda
