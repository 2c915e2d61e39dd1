// GemmRunner against a float64 product of the same bf16 operands, for row
// counts that share an algorithm row class and ones that do not, and the
// number of heuristic queries those row counts cost.
#include "kernels/cuda/gemm.h"

#include <cmath>
#include <cstdio>
#include <vector>

#include "common/testing/test_seed.h"
#include "gtest/gtest.h"
#include "kernels/cuda/test_util.h"

namespace strata::cuda {
namespace {

using testing::DeviceBuffer;
using testing::FromBf16Bits;
using testing::Rng;
using testing::ToBf16Bits;

struct Problem {
  int max_m, n, k;
  std::vector<uint16_t> x, w;  // bf16 bits: [max_m][k], [n][k]
};

Problem MakeProblem(int max_m, int n, int k, uint64_t seed) {
  Problem p{max_m, n, k, {}, {}};
  Rng rng(seed);
  p.x.resize(static_cast<size_t>(max_m) * k);
  p.w.resize(static_cast<size_t>(n) * k);
  for (auto& v : p.x) v = ToBf16Bits(rng.Normal());
  for (auto& v : p.w) v = ToBf16Bits(rng.Normal() / std::sqrt(static_cast<float>(k)));
  return p;
}

// Largest |y - ref| / (sum over l of |x w|) over the first m rows: the
// relative error of each dot product against its own magnitude.
double WorstError(const Problem& p, int m, const std::vector<float>& y) {
  double worst = 0;
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < p.n; ++j) {
      double ref = 0, mag = 0;
      for (int l = 0; l < p.k; ++l) {
        const double t = static_cast<double>(FromBf16Bits(p.x[static_cast<size_t>(i) * p.k + l])) *
                         FromBf16Bits(p.w[static_cast<size_t>(j) * p.k + l]);
        ref += t;
        mag += std::fabs(t);
      }
      const double got = y[static_cast<size_t>(i) * p.n + j];
      if (!std::isfinite(got)) return INFINITY;
      worst = std::max(worst, std::fabs(got - ref) / std::max(mag, 1e-30));
    }
  }
  return worst;
}

// y[m][n] = x[m][k] W^T for the problem's row-major operands on the device.
GemmArgs ArgsFor(const Problem& p, int m, const DeviceBuffer& x, const DeviceBuffer& w, const DeviceBuffer& y) {
  GemmArgs a;
  a.m = m;
  a.n = p.n;
  a.k = p.k;
  a.x = x.as<void>();
  a.ldx = p.k;
  a.w = w.as<void>();
  a.ldw = p.k;
  a.y = y.as<float>();
  a.ldy = p.n;
  return a;
}

TEST(GemmRunnerTest, EveryRowCountIsRightAndRowClassesShareAQuery) {
  const uint64_t seed = strata::testing::TestSeed();
  const Problem p = MakeProblem(/*max_m=*/600, /*n=*/384, /*k=*/512, seed);
  DeviceBuffer x(p.x.size() * 2), w(p.w.size() * 2), y(static_cast<size_t>(p.max_m) * p.n * 4);
  x.Upload(p.x.data(), p.x.size() * 2);
  w.Upload(p.w.data(), p.w.size() * 2);
  auto runner = GemmRunner::Create(/*batch_invariant=*/false);
  ASSERT_TRUE(runner.ok()) << runner.status();

  // Row counts 17..600 fall in the classes 32, 64, ..., 1024: at most one
  // query per class, plus one per m whose class algorithm cuBLASLt refuses.
  const std::vector<int> ms = {1, 2, 7, 16, 17, 23, 31, 32, 33, 40, 57, 64, 65, 100, 127,
                               128, 129, 200, 255, 256, 257, 300, 401, 512, 513, 600};
  for (int m : ms) {
    y.Poison();
    const GemmArgs a = ArgsFor(p, m, x, w, y);
    ASSERT_TRUE((*runner)->Run(a, nullptr).ok()) << "m=" << m;
    std::vector<float> out(static_cast<size_t>(m) * p.n);
    y.Download(out.data(), out.size() * 4);
    // f32 accumulation of exact bf16 products: ~k * 2^-24 relative at worst.
    EXPECT_LT(WorstError(p, m, out), 1e-4) << "m=" << m;
  }
  const int classes = 4 + 6;  // m = 1, 2, 7, 16; then 32, 64, ..., 1024
  std::printf("%zu row counts, %lld heuristic queries, %lld plain-kernel calls\n", ms.size(),
              static_cast<long long>((*runner)->heuristic_queries()),
              static_cast<long long>((*runner)->fallback_calls()));
  // (exact-m keys would cost one query per row count: 26)
  EXPECT_LE((*runner)->heuristic_queries(), classes + 3) << "more than 3 class algorithms refused";
  EXPECT_EQ((*runner)->fallback_calls(), 0);
}

// accumulate: y += x W^T on top of what y holds, through cuBLASLt and
// through the plain kernel, for a decode-sized and a prefill-sized m.
TEST(GemmRunnerTest, AccumulateAddsToTheOutput) {
  const uint64_t seed = strata::testing::TestSeed();
  const Problem p = MakeProblem(/*max_m=*/300, /*n=*/256, /*k=*/384, seed);
  DeviceBuffer x(p.x.size() * 2), w(p.w.size() * 2), y(static_cast<size_t>(p.max_m) * p.n * 4);
  x.Upload(p.x.data(), p.x.size() * 2);
  w.Upload(p.w.data(), p.w.size() * 2);
  auto runner = GemmRunner::Create(/*batch_invariant=*/false);
  ASSERT_TRUE(runner.ok()) << runner.status();
  Rng rng(seed + 1);
  for (int m : {3, 300}) {
    std::vector<float> y0(static_cast<size_t>(m) * p.n);
    for (float& v : y0) v = rng.Normal();
    for (bool plain : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "m=" << m << (plain ? " plain kernel" : " cuBLASLt"));
      y.Upload(y0.data(), y0.size() * 4);
      GemmArgs a = ArgsFor(p, m, x, w, y);
      a.accumulate = true;
      if (plain) {
        ASSERT_EQ(LaunchPlainGemm(a, nullptr), cudaSuccess);
      } else {
        ASSERT_TRUE((*runner)->Run(a, nullptr).ok());
      }
      std::vector<float> out(y0.size());
      y.Download(out.data(), out.size() * 4);
      for (size_t e = 0; e < out.size(); ++e) out[e] -= y0[e];  // exact enough: see the bound
      // The product's own error (~k 2^-24 of its magnitude) plus one f32
      // rounding of the sum and one of the subtraction, each ~2^-24 |y0|:
      // |y0| ~ 1 and the products' magnitudes ~ 1 too, so 1e-4 holds.
      EXPECT_LT(WorstError(p, m, out), 1e-4);
    }
  }
}

}  // namespace
}  // namespace strata::cuda
