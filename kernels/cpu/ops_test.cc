#include "kernels/cpu/ops.h"

#include <cmath>
#include <random>
#include <vector>

#include "common/testing/test_seed.h"
#include "gtest/gtest.h"

namespace strata::cpu {
namespace {

std::vector<float> Random(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

TEST(CpuOpsTest, LinearMatchesDoubleReference) {
  std::mt19937 rng(strata::testing::TestSeed());
  ThreadPool pool(3);
  for (auto [rows, in, out] : {std::tuple{1, 7, 5}, {3, 64, 33}, {17, 130, 257}, {2, 1000, 40}}) {
    auto x = Random(rows * in, rng), w = Random(out * in, rng), b = Random(out, rng);
    std::vector<float> y(rows * out, NAN);
    Linear(x.data(), rows, w.data(), b.data(), in, out, y.data(), &pool);
    for (int r = 0; r < rows; ++r) {
      for (int o = 0; o < out; ++o) {
        double ref = b[o], mag = std::fabs(b[o]);
        for (int k = 0; k < in; ++k) {
          ref += static_cast<double>(x[r * in + k]) * w[o * in + k];
          mag += std::fabs(static_cast<double>(x[r * in + k]) * w[o * in + k]);
        }
        ASSERT_NEAR(y[r * out + o], ref, 1e-6 * mag + 1e-6) << r << "," << o;
      }
    }
  }
}

TEST(CpuOpsTest, LinearIsBatchInvariant) {
  std::mt19937 rng(strata::testing::TestSeed());
  ThreadPool pool(2);
  const int in = 300, out = 77, rows = 9;
  auto x = Random(rows * in, rng), w = Random(out * in, rng);
  std::vector<float> all(rows * out), one(out);
  Linear(x.data(), rows, w.data(), nullptr, in, out, all.data(), &pool);
  for (int r = 0; r < rows; ++r) {
    Linear(x.data() + r * in, 1, w.data(), nullptr, in, out, one.data(), nullptr);
    for (int o = 0; o < out; ++o) ASSERT_EQ(one[o], all[r * out + o]);
  }
}

TEST(CpuOpsTest, Norms) {
  std::mt19937 rng(strata::testing::TestSeed());
  const int n = 96;
  auto x = Random(n, rng), w = Random(n, rng), b = Random(n, rng);
  std::vector<float> y(n);
  RmsNorm(x.data(), w.data(), n, 1e-6, y.data());
  double ss = 0;
  for (float v : x) ss += double(v) * v;
  for (int i = 0; i < n; ++i) EXPECT_NEAR(y[i], w[i] * x[i] / std::sqrt(ss / n + 1e-6), 1e-5);
  LayerNorm(x.data(), w.data(), b.data(), n, 1e-6, y.data());
  double mean = 0, var = 0;
  for (float v : x) mean += v;
  mean /= n;
  for (float v : x) var += (v - mean) * (v - mean);
  var /= n;
  for (int i = 0; i < n; ++i) EXPECT_NEAR(y[i], (x[i] - mean) / std::sqrt(var + 1e-6) * w[i] + b[i], 1e-5);
}

}  // namespace
}  // namespace strata::cpu
