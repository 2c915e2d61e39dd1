// The fp8 block-scaled small-step GEMM against a float64 product of the same
// decoded weights (fp8::Decode, the CPU codec) and f32 inputs, on fresh random
// data, in both forms: every row count 1..8, output counts that pick each
// launch shape (tensor cores: one 16-row tile per block of 32, 16 or 8
// warps, two or four per block of 8; CUDA
// cores: a block along k per one, two or four rows, a warp per one or two),
// shapes whose last scale block is partial in n and k, padded leading
// dimensions, accumulation; a row's bits alone and beside seven others; NaN
// codes (about 1 in 128 of the random codes) read as 0; weights of e4m3's
// two smallest binades and inputs over 40 binades; and the arguments it
// refuses.
#include "kernels/cuda/fp8_gemv.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "common/testing/test_seed.h"
#include "kernels/cuda/test_util.h"
#include "kernels/fp8.h"

namespace strata::cuda {
namespace {

using testing::DeviceBuffer;

struct Case {
  int m, n, k;
  int64_t ldx, ldw, ldy;
  bool accumulate;
  Fp8GemvForm form = Fp8GemvForm::kTensorCores;  // kAuto is tried where it says
  // Codes of the two smallest binades only (e4m3's subnormals and its
  // smallest normals: f16 subnormals in the tensor-core form), and x over
  // 2^-20 .. 2^20 (past f16's range) within each row.
  bool extremes = false;
};

// The form that runs: kAuto takes the CUDA cores for m = 1 only.
Fp8GemvForm Ran(const Case& c) {
  if (c.form != Fp8GemvForm::kAuto) return c.form;
  return c.m == 1 ? Fp8GemvForm::kCudaCores : Fp8GemvForm::kTensorCores;
}

const char* FormName(const Case& c) {
  const char* ran = Ran(c) == Fp8GemvForm::kTensorCores ? "tensor cores" : "CUDA cores";
  return c.form == Fp8GemvForm::kAuto ? (Ran(c) == Fp8GemvForm::kTensorCores ? "auto: tensor cores" : "auto: CUDA cores")
                                      : ran;
}

// The bound on |y - exact| that each form's summation order allows, given
// mag = sum_l |x_l W(j, l)| (plus |y0| when accumulating), wx = max_l |x_l|
// * sum_l |W(j, l)|, in f32 units (2^-24 for round to nearest, 2^-23 where
// the tensor cores may truncate).
double Bound(const Case& c, double mag, double wx) {
  if (Ran(c) == Fp8GemvForm::kCudaCores) {
    // 16 products per chunk, one multiply-add per chunk of the lane (k / 512
    // at most), a butterfly of 5 and, in the split form, 7 more additions.
    return (16 + c.k / 512.0 + 5 + 7 + 2) * 0x1.0p-24 * mag;
  }
  // x = 2^e (hi + lo) + r, |r| <= 2^-22 |x| + 2^-37 max|x| (fp8_gemv.cu);
  // products exact; per 64-column step 8 mma of 16 products each into fresh
  // accumulators (17 terms each), a multiply-add per step of the warp (k /
  // 512 at most), 31 additions over the warps (32 at most), and the
  // accumulation.
  return (0x1.0p-22 + (8 * 17 + c.k / 512.0 + 31 + 2) * 0x1.0p-23) * mag + 0x1.0p-37 * wx;
}

class Fp8GemvTest : public ::testing::Test {
 protected:
  void SetUp() override { seed_ = strata::testing::TestSeed(); }

  // Runs one case on fresh data (x replaced by *x_in when given); checks every
  // output against the float64 product within the f32 bound of its chain: 16
  // products per chunk, one multiply-add per chunk of the lane (k / 512 at
  // most), a butterfly of 5 and, in the split form, 7 more additions.
  std::vector<float> Run(const Case& c, const std::vector<float>* x_in = nullptr) {
    testing::Rng rng(seed_ + (++calls_));
    const int bn = (c.n + kFp8BlockSize - 1) / kFp8BlockSize, bk = (c.k + kFp8BlockSize - 1) / kFp8BlockSize;
    const size_t nw = static_cast<size_t>(c.n) * c.ldw, nx = static_cast<size_t>(c.m - 1) * c.ldx + c.k;
    const size_t ny = static_cast<size_t>(c.m - 1) * c.ldy + c.n;
    std::vector<uint8_t> w(nw);
    std::vector<float> scale(static_cast<size_t>(bn) * bk), x(nx), y0(ny);
    for (uint8_t& v : w) {
      v = static_cast<uint8_t>(rng.Next());  // NaN codes too: they read as 0
      if (c.extremes) v &= 0x8F;             // exponent field 0 or 1
    }
    // Block scales over several binades, as a checkpoint's are.
    for (float& s : scale) s = std::ldexp(1.0f + static_cast<float>(rng.Uniform()), -8 - static_cast<int>(rng.Below(6)));
    for (float& v : x) {
      v = c.extremes ? std::ldexp(rng.Normal(), static_cast<int>(rng.Below(41)) - 20)
                     : rng.Normal() * static_cast<float>(std::exp(rng.Normal()));
    }
    if (x_in != nullptr) x.assign(x_in->begin(), x_in->begin() + nx);
    for (float& v : y0) v = rng.Normal();
    DeviceBuffer dx(nx * 4), dw(nw), ds(scale.size() * 4), dy(ny * 4);
    dx.Upload(x.data(), nx * 4);
    dw.Upload(w.data(), nw);
    ds.Upload(scale.data(), scale.size() * 4);
    dy.Upload(y0.data(), ny * 4);
    Fp8GemvArgs a;
    a.m = c.m, a.n = c.n, a.k = c.k;
    a.x = dx.as<float>(), a.ldx = c.ldx;
    a.w = dw.as<uint8_t>(), a.ldw = c.ldw;
    a.scale = ds.as<float>(), a.ld_scale = bk;
    a.y = dy.as<float>(), a.ldy = c.ldy;
    a.accumulate = c.accumulate;
    a.form = c.form;
    EXPECT_TRUE(Fp8GemvSupports(a));
    EXPECT_EQ(LaunchFp8Gemv(a, nullptr), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> y(ny);
    dy.Download(y.data(), ny * 4);
    int64_t bad = 0, untouched_bad = 0, nonfinite = 0;
    double worst = 0;
    std::vector<bool> written(ny, false);
    for (int i = 0; i < c.m; ++i) {
      for (int j = 0; j < c.n; ++j) {
        double ref = 0, mag = 0, wabs = 0, xmax = 0;
        for (int l = 0; l < c.k; ++l) {
          const double wv = double{fp8::Decode(w[static_cast<size_t>(j) * c.ldw + l])} *
                            scale[static_cast<size_t>(j / kFp8BlockSize) * bk + l / kFp8BlockSize];
          const double t = double{x[static_cast<size_t>(i) * c.ldx + l]} * wv;
          ref += t;
          mag += std::fabs(t);
          wabs += std::fabs(wv);
          xmax = std::max(xmax, std::fabs(double{x[static_cast<size_t>(i) * c.ldx + l]}));
        }
        const size_t yi = static_cast<size_t>(i) * c.ldy + j;
        written[yi] = true;
        const double base = c.accumulate ? double{y0[yi]} : 0.0;
        const double bound = Bound(c, mag + std::fabs(base), xmax * wabs) + 0x1.0p-24 * std::fabs(ref + base);
        const double err = std::fabs(y[yi] - (ref + base));
        nonfinite += !std::isfinite(y[yi]);
        worst = std::max(worst, err / bound);
        bad += !(err <= bound);
      }
    }
    for (size_t e = 0; e < ny; ++e) untouched_bad += !written[e] && y[e] != y0[e];
    std::printf("%s m %d n %d k %d%s: worst error %.3f of the bound\n", FormName(c), c.m, c.n, c.k,
                c.accumulate ? " accumulate" : "", worst);
    EXPECT_EQ(nonfinite, 0);
    EXPECT_EQ(bad, 0);
    EXPECT_EQ(untouched_bad, 0) << "outputs outside the product were written";
    last_x_ = x;
    return y;
  }

  uint64_t seed_ = 0;
  int calls_ = 0;
  std::vector<float> last_x_;
};

TEST_F(Fp8GemvTest, EveryRowCountAndLaunchForm) {
  for (Fp8GemvForm form : {Fp8GemvForm::kTensorCores, Fp8GemvForm::kCudaCores}) {
    for (int m = 1; m <= kFp8GemvMaxRows; ++m) {
      // Tensor cores: 576 outputs take a 16-row tile per block of 32 warps,
      // 1200 and 2200 of 16, 5000 of 8, 9000 two tiles, 17000 four (partial
      // last tiles and blocks); k 1040 ends in
      // a partial 64-column step and a partial scale block. CUDA cores: 576
      // outputs a block per row along k (DeepSeek's kv_a, k 7168); 1200 a
      // block per two rows; 2200 four; 3000 and 5000 a warp per one and two
      // rows, the last warp partial.
      Run({m, 576, 7168, 7168, 7168, 576, false, form});
      Run({m, 1200, 1040, 1040, 1056, 1204, m == 3, form});
      Run({m, 2200, 512, 516, 512, 2200, false, form});
      Run({m, 3000, 1536, 1536, 1536, 3000, m == 5, form});
      Run({m, 5000, 1536, 1540, 1536, 5000, false, form});
      if (form != Fp8GemvForm::kCudaCores) {
        Run({m, 9000, 512, 512, 512, 9000, m == 2, form});
        Run({m, 17000, 256, 256, 272, 17000, false, form});
        Run({m, 128, 7168, 7168, 7168, 128, false, form});
      }
    }
  }
}

TEST_F(Fp8GemvTest, TinyWeightsAndWideInputs) {
  for (Fp8GemvForm form : {Fp8GemvForm::kTensorCores, Fp8GemvForm::kCudaCores}) {
    for (int m : {1, 3, 8}) {
      Case c{m, 3000, 1536, 1536, 1536, 3000, false, form};
      c.extremes = true;
      Run(c);
    }
  }
}

TEST_F(Fp8GemvTest, ARowsBitsDoNotDependOnTheOtherRows) {
  for (const Case& eight :
       {Case{8, 576, 7168, 7168, 7168, 576, false}, Case{8, 17000, 1536, 1536, 1536, 17000, false},
        Case{8, 3000, 1536, 1536, 1536, 3000, false},
        Case{8, 576, 7168, 7168, 7168, 576, false, Fp8GemvForm::kCudaCores},
        Case{8, 5000, 1536, 1536, 1536, 5000, false, Fp8GemvForm::kCudaCores}}) {
    const std::vector<float> y8 = Run(eight);
    Case one = eight;
    one.m = 1;
    --calls_;  // the same weights (same seed), x's first row
    const std::vector<float> y1 = Run(one, &last_x_);
    int64_t differ = 0;
    for (int j = 0; j < eight.n; ++j) differ += y1[j] != y8[j];
    EXPECT_EQ(differ, 0) << "n " << eight.n;
  }
}

// kAuto gives the CUDA-core form's bits for one row and the tensor-core
// form's for more (the same weights and inputs through both).
TEST_F(Fp8GemvTest, AutoTakesTheCudaCoresForOneRowOnly) {
  for (int m : {1, 2, 8}) {
    Case c{m, 3000, 1536, 1536, 1536, 3000, false, Fp8GemvForm::kAuto};
    const std::vector<float> y_auto = Run(c);
    c.form = m == 1 ? Fp8GemvForm::kCudaCores : Fp8GemvForm::kTensorCores;
    --calls_;  // the same weights (same seed) and x
    const std::vector<float> y_form = Run(c, &last_x_);
    int64_t differ = 0;
    for (size_t j = 0; j < y_auto.size(); ++j) differ += y_auto[j] != y_form[j];
    EXPECT_EQ(differ, 0) << "m " << m;
  }
}

// The checks read only the arguments, before any CUDA call: they run without
// a device.
TEST(Fp8GemvHostTest, RefusesWhatItCannotLoad) {
  alignas(256) static uint8_t x[4096], w[4096], s[64], y[4096];
  Fp8GemvArgs a;
  a.m = 1, a.n = 8, a.k = 256;
  a.x = reinterpret_cast<float*>(x), a.ldx = 256;
  a.w = w, a.ldw = 256;
  a.scale = reinterpret_cast<float*>(s), a.ld_scale = 2;
  a.y = reinterpret_cast<float*>(y), a.ldy = 8;
  EXPECT_TRUE(Fp8GemvSupports(a));
  Fp8GemvArgs bad = a;
  bad.m = kFp8GemvMaxRows + 1;
  EXPECT_FALSE(Fp8GemvSupports(bad));
  EXPECT_EQ(LaunchFp8Gemv(bad, nullptr), cudaErrorInvalidValue);
  bad = a;
  bad.m = 0;
  EXPECT_FALSE(Fp8GemvSupports(bad));
  bad = a;
  bad.k = 250, bad.ldx = 252, bad.ldw = 256;  // k not a multiple of 16
  EXPECT_FALSE(Fp8GemvSupports(bad));
  bad = a;
  bad.w = w + 8;  // codes not 16-byte aligned
  EXPECT_FALSE(Fp8GemvSupports(bad));
  bad = a;
  bad.ld_scale = 1;  // fewer scale columns than k's blocks
  EXPECT_FALSE(Fp8GemvSupports(bad));
  bad = a;
  bad.scale = nullptr;
  EXPECT_FALSE(Fp8GemvSupports(bad));
}

}  // namespace
}  // namespace strata::cuda
