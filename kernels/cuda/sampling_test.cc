// The device sampler against the host Sampler (model/sampler.h), which is
// its reference: fresh random logits (plain, heavily tied, with NaN and
// infinities), every combination of temperature, top-k, top-p and min-p,
// the same seeded draw on both sides. The tokens must be equal, except where
// the draw lands within 1e-6 of a boundary between two tokens' cumulative
// shares (the device uses float weights in 2^-40 fixed point, the host
// float64): those are counted, and must stay rare.
#include "kernels/cuda/sampling.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/test_util.h"
#include "model/sampler.h"

namespace strata::cuda {
namespace {

using testing::DeviceBuffer;
using testing::FreshSeed;
using testing::HaveDevice;
using testing::Rng;

struct Case {
  SamplingParams params;
  std::vector<float> logits;
};

// Distance from u to the nearest boundary of the host Sampler's walk: the
// cumulative probabilities of the kept tokens in the order it walks them
// (ranking order once top-k or top-p applied, else id order).
double BoundaryDistance(const Case& c, double u) {
  auto s = Sampler::Create(c.params, static_cast<int>(c.logits.size()));
  const std::vector<double> probs = (*s)->Probabilities(c.logits);
  double m = -INFINITY;
  for (float v : c.logits) m = std::max(m, std::isnan(v) ? -INFINITY : static_cast<double>(v));
  int positive = 0;
  for (float v : c.logits) {
    const double z = std::isnan(v) ? -INFINITY : v;
    positive += (m == INFINITY ? z == INFINITY : std::exp((z - m) / c.params.temperature) > 0);
  }
  const bool ranked = (c.params.top_k > 0 && c.params.top_k < positive) || c.params.top_p < 1.0f;
  std::vector<int> order;
  for (int i = 0; i < static_cast<int>(probs.size()); ++i)
    if (probs[i] > 0) order.push_back(i);
  if (ranked) {
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      const float x = std::isnan(c.logits[a]) ? -INFINITY : c.logits[a];
      const float y = std::isnan(c.logits[b]) ? -INFINITY : c.logits[b];
      return x > y;
    });
  }
  double cum = 0, best = std::fabs(u);
  for (int i : order) {
    cum += probs[i];
    best = std::min(best, std::fabs(u - cum));
  }
  return best;
}

std::vector<float> MakeLogits(int kind, int n, Rng& rng) {
  std::vector<float> x(n);
  for (float& v : x) v = 3.0f * rng.Normal();
  if (kind == 1) {  // heavy ties: quarter steps
    for (float& v : x) v = std::round(v * 2.0f) / 4.0f;
  } else if (kind == 2) {  // NaN, -inf and a few +0 / -0
    for (int i = 0; i < n / 50; ++i) x[rng.Below(n)] = std::numeric_limits<float>::quiet_NaN();
    for (int i = 0; i < n / 50; ++i) x[rng.Below(n)] = -INFINITY;
    x[rng.Below(n)] = -0.0f;
    x[rng.Below(n)] = 0.0f;
  } else if (kind == 3) {  // two +inf: they share the draw
    x[rng.Below(n)] = INFINITY;
    x[rng.Below(n)] = INFINITY;
  } else if (kind == 4) {  // nothing above -inf
    for (int i = 0; i < n; ++i) x[i] = (i % 3 == 0) ? std::numeric_limits<float>::quiet_NaN() : -INFINITY;
  }
  return x;
}

// Runs the cases on the device with the given draws.
std::vector<int> DeviceTokens(const std::vector<Case>& cases, const std::vector<double>& u) {
  const int rows = static_cast<int>(cases.size()), n = static_cast<int>(cases[0].logits.size());
  std::vector<float> logits(static_cast<size_t>(rows) * n);
  std::vector<SampleRow> rp(rows);
  for (int r = 0; r < rows; ++r) {
    std::copy(cases[r].logits.begin(), cases[r].logits.end(), logits.begin() + static_cast<size_t>(r) * n);
    const SamplingParams& p = cases[r].params;
    rp[r] = SampleRow{p.temperature, p.top_k, p.top_p, p.min_p, u[r]};
  }
  DeviceBuffer d_logits(logits.size() * 4), d_rows(rp.size() * sizeof(SampleRow)), d_tokens(rows * 4);
  d_logits.Upload(logits.data(), logits.size() * 4);
  d_rows.Upload(rp.data(), rp.size() * sizeof(SampleRow));
  d_tokens.Poison();
  SampleParams p;
  p.logits = d_logits.as<float>();
  p.ld = n;
  p.rows = rows;
  p.vocab = n;
  p.row = d_rows.as<SampleRow>();
  p.tokens = d_tokens.as<int>();
  EXPECT_EQ(LaunchSampleRows(p, nullptr), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<int> tokens(rows);
  d_tokens.Download(tokens.data(), rows * 4);
  return tokens;
}

void CheckAgainstSampler(int vocab, const std::vector<int>& kinds, int draws) {
  const uint64_t seed = FreshSeed();
  std::printf("vocab %d, seed %llu\n", vocab, static_cast<unsigned long long>(seed));
  Rng rng(seed);
  std::vector<Case> cases;
  std::vector<double> u;
  std::vector<int> want;
  for (int kind : kinds) {
    const std::vector<float> x = MakeLogits(kind, vocab, rng);
    for (float t : {0.0f, 0.3f, 1.0f, 1.7f}) {
      for (int k : {0, 1, 7, 100}) {
        for (float top_p : {1.0f, 0.9f, 0.3f}) {
          for (float min_p : {0.0f, 0.1f}) {
            for (int d = 0; d < draws; ++d) {
              Case c;
              c.params.temperature = t;
              c.params.top_k = k;
              c.params.top_p = top_p;
              c.params.min_p = min_p;
              c.params.seed = rng.Next();
              c.logits = x;
              auto host = Sampler::Create(c.params, vocab);
              auto draw = Sampler::Create(c.params, vocab);
              ASSERT_TRUE(host.ok() && draw.ok());
              u.push_back((*draw)->NextDraw().u);
              want.push_back((*host)->Sample(c.logits));
              cases.push_back(std::move(c));
            }
          }
        }
      }
    }
  }
  const std::vector<int> got = DeviceTokens(cases, u);
  EXPECT_EQ(DeviceTokens(cases, u), got) << "not deterministic";
  int near = 0, compared = 0;
  for (size_t r = 0; r < cases.size(); ++r) {
    if (got[r] == want[r]) {
      ++compared;
      continue;
    }
    const double dist = cases[r].params.temperature == 0.0f ? INFINITY : BoundaryDistance(cases[r], u[r]);
    if (dist < 1e-6) {
      ++near;
      continue;
    }
    ++compared;
    const SamplingParams& p = cases[r].params;
    ADD_FAILURE() << "row " << r << " (T " << p.temperature << ", top_k " << p.top_k << ", top_p " << p.top_p
                  << ", min_p " << p.min_p << ", u " << u[r] << "): device token " << got[r] << ", host token "
                  << want[r] << ", draw " << dist << " from a boundary; seed " << seed;
  }
  std::printf("%d rows agree or differ, %d within 1e-6 of a boundary (skipped)\n", compared, near);
  EXPECT_LE(near, static_cast<int>(cases.size()) / 100);
}

TEST(SampleRowsTest, MatchesTheHostSamplerOnSmallVocabularies) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  CheckAgainstSampler(5000, {0, 1, 2, 3, 4}, 3);
}

TEST(SampleRowsTest, MatchesTheHostSamplerOnDeepSeeksVocabulary) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  CheckAgainstSampler(129280, {0, 1}, 1);
}

TEST(SampleRowsTest, RejectsBadVocabularies) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  SampleParams p;
  p.rows = 1;
  p.vocab = 0;
  p.ld = 1;
  EXPECT_EQ(LaunchSampleRows(p, nullptr), cudaErrorInvalidValue);
  p.vocab = 10;
  p.ld = 5;  // rows would overlap
  EXPECT_EQ(LaunchSampleRows(p, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace strata::cuda
