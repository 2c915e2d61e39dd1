// The device sampler against the host Sampler (model/sampler.h), which is
// its reference: fresh random logits (plain, heavily tied, with NaN and
// infinities), every combination of temperature, top-k, top-p and min-p,
// with and without penalties (a random prompt, outputs among the largest
// logits), with and without logprobs, the same seeded draw on both sides. The tokens must be equal, except where
// the draw lands closer to a boundary between two tokens' cumulative shares
// than the device's float weights (2^-40 fixed point) can move it from the
// host's float64 ones (ShareErrorBound() derives that distance for each
// case): those are counted, and must stay rare.
#include "kernels/cuda/sampling.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <vector>

#include "common/testing/test_seed.h"
#include "gtest/gtest.h"
#include "kernels/cuda/test_util.h"
#include "model/sampler.h"

namespace strata::cuda {
namespace {

using testing::DeviceBuffer;
using testing::Rng;

struct Case {
  SamplingParams params;
  std::vector<float> logits;
  std::vector<int> prompt, output;  // tokens the request observed (penalties)
  SampleDraw draw;                  // what NextDraw() hands the device
  SampleLogprobs want_logprobs;     // the host's, when the case asks for them
};

// The Sampler's penalised logits (float64; NaN as -inf).
std::vector<double> Penalised(const Case& c) {
  std::vector<double> z(c.logits.begin(), c.logits.end());
  for (const PenaltyCount& e : c.draw.counts) {
    double& v = z[e.token];
    if (c.draw.repetition_penalty != 1.0f) v = v > 0 ? v / c.draw.repetition_penalty : v * c.draw.repetition_penalty;
    if (e.output > 0) v -= double{c.draw.frequency_penalty} * e.output + c.draw.presence_penalty;
  }
  for (double& v : z) v = std::isnan(v) ? -INFINITY : v;
  return z;
}

// A sampler with the case's parameters that has observed its tokens.
std::unique_ptr<Sampler> MakeSampler(const Case& c) {
  auto s = Sampler::Create(c.params, static_cast<int>(c.logits.size()));
  EXPECT_TRUE(s.ok());
  (*s)->ObservePrompt(c.prompt);
  for (int t : c.output) (*s)->Observe(t, /*is_prompt=*/false);
  return std::move(*s);
}

// Distance from u to the nearest boundary of the host Sampler's walk: the
// cumulative probabilities of the kept tokens in the order it walks them
// (ranking order once top-k or top-p applied, else id order).
double BoundaryDistance(const Case& c, double u) {
  const std::vector<double> probs = MakeSampler(c)->Probabilities(c.logits);
  const std::vector<double> z = Penalised(c);
  double m = -INFINITY;
  for (double v : z) m = std::max(m, v);
  int positive = 0;
  for (double v : z) positive += (m == INFINITY ? v == INFINITY : std::exp((v - m) / c.params.temperature) > 0);
  const bool ranked = (c.params.top_k > 0 && c.params.top_k < positive) || c.params.top_p < 1.0f;
  std::vector<int> order;
  for (int i = 0; i < static_cast<int>(probs.size()); ++i)
    if (probs[i] > 0) order.push_back(i);
  if (ranked) std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return z[a] > z[b]; });
  double cum = 0, best = std::fabs(u);
  for (int i : order) {
    cum += probs[i];
    best = std::min(best, std::fabs(u - cum));
  }
  return best;
}

// How far the device's cumulative shares can be from the host's, for one
// case: a draw farther than this from every host boundary must give the same
// token on both sides.
//
// Sums are not where the two differ: the device adds 64-bit integers (exact,
// in any order) and the host adds float64 weights (relative error below
// n * 2^-53, ~1e-11 for 129 280 terms). The weights differ. The host's is
// exp((z - m) / T) in float64 (within an ulp, 2^-52); the device's, in units
// of the largest weight, is
//   floor(2^40 * ex2.approx(fl(fl(z - m) * fl(fl(log2 e) / T)))) / 2^40
// (sampling.cu, Weight()) with the same float z, m and T (the host rounds its
// penalties to float as the device does). Per token, against
// w = exp((z - m) / T):
//   - the exponent a = (z - m) log2(e) / T carries three float roundings
//     (subtraction, division, product; 2^-24 each) and fl(log2 e)'s own
//     error (1.3e-8): a relative error eps <= 3 * 2^-24 + 1.3e-8, which
//     moves 2^a by a factor exp(eps * |a| ln 2) = exp(eps * |ln w|): the far
//     tokens carry more of it than the near ones;
//   - ex2.approx.f32 (what exp2f compiles to) is within 2 ulp: a relative
//     error rho <= 2^-22;
//   - the truncation to the 2^-40 grid (a weight below it is dropped): < 2^-40.
// So |w_dev - w| <= w * ((1 + rho) exp(eps |ln w|) - 1) + 2^-40 =: err(w),
// and a cumulative share C(j) / T moves by at most E = sum err(w) / T (the
// prefix's errors count with weight 1 - P, the rest's with weight P). E grows
// with the mean |ln w| of the kept shares (at most ln n): up to ~2.6e-6 for
// 129 280 tokens (the roundings mostly cancel: ~3e-8 is typical). The draw
// adds 2^-40 (floor(u * total)) and the host's own roundings n * 2^-52.
//
// Truncation can keep a different set, which moves every later boundary by
// the shares of the tokens in doubt (weight Q). At T 1.7 and top-p 0.9 over
// 129 280 tokens a token at the cut holds ~4e-6 of the mass, so a cut within
// E of it moves the boundaries by up to that: the likely cause of a miss
// 2.8e-6 from a boundary that the earlier fixed 1e-6 margin failed on (an
// emulation of these weights on the host flipped 1 cut in 300 such cases,
// moving a boundary by 3.9e-6). Top-p cuts at the first
// ranked prefix whose share reaches top_p, so each token whose prefix share
// interval comes within E of top_p may be in or out; min-p keeps w >= min_p
// (the largest weight is 1 on both sides), so each token with
// |w - min_p| <= err(w) + 2^-40 (the device rounds the threshold up to its
// grid) may be in or out. Top-k counts ranks, which are exact on both sides
// (the device ranks only tokens of nonzero fixed-point weight; those it
// misses weigh < 2^-40 each, inside err). The tests' logits keep |z - m| / T
// far from float64 exp's underflow at -745, so both sides count the same
// candidates. The bound is E + Q / (T - Q) over the host's final set.
double ShareErrorBound(const Case& c) {
  const double log2e = 1.4426950408889634;
  const double eps = 3 * 0x1.0p-24 + std::fabs(static_cast<double>(static_cast<float>(log2e)) - log2e) / log2e;
  const double rho = 0x1.0p-22, grid = 0x1.0p-40;
  const std::vector<double> z = Penalised(c);
  double m = -INFINITY;
  for (double v : z) m = std::max(m, v);
  if (c.params.temperature == 0.0f || m == -INFINITY) return 0.0;  // argmax: no weights
  struct Weight {
    int id;
    double z, w;
  };
  std::vector<Weight> kept;
  for (int i = 0; i < static_cast<int>(z.size()); ++i) {
    const double w = m == INFINITY ? (z[i] == INFINITY ? 1.0 : 0.0) : std::exp((z[i] - m) / c.params.temperature);
    if (w > 0) kept.push_back({i, z[i], w});
  }
  // With +inf logits every weight is exactly 1 or 0 on both sides.
  auto err = [&](double w) {
    return m == INFINITY ? 0.0 : w * ((1 + rho) * std::exp(eps * std::fabs(std::log(w))) - 1) + grid;
  };
  const int k = c.params.top_k;
  const bool ranked = (k > 0 && k < static_cast<int>(kept.size())) || c.params.top_p < 1.0f;
  if (ranked) std::stable_sort(kept.begin(), kept.end(), [](const Weight& a, const Weight& b) { return a.z > b.z; });
  if (k > 0 && k < static_cast<int>(kept.size())) kept.resize(k);
  std::vector<double> top_p_doubt;  // weights of the tokens top-p may keep or drop
  if (c.params.top_p < 1.0f) {
    double total = 0, e = 0;
    for (const Weight& t : kept) total += t.w, e += err(t.w);
    e /= total;
    const double p = c.params.top_p;
    double before = 0;
    size_t cut = kept.size();
    for (size_t j = 0; j < kept.size(); ++j) {
      const double lo = before / total, hi = (before + kept[j].w) / total;
      if (lo < p + e && hi >= p - e) top_p_doubt.push_back(kept[j].w);
      if (cut == kept.size() && hi >= p) cut = j + 1;  // the host's cut
      before += kept[j].w;
    }
    // A single token in the window is the cut itself on both sides.
    if (top_p_doubt.size() == 1) top_p_doubt.clear();
    kept.resize(cut);
  }
  double doubt = 0;  // Q
  double threshold = 0;  // min-p's: the largest weight is 1 on both sides
  if (c.params.min_p > 0.0f) {
    double w_max = 0;
    for (const Weight& t : kept) w_max = std::max(w_max, t.w);
    threshold = static_cast<double>(c.params.min_p) * w_max;
    std::vector<Weight> left;
    for (const Weight& t : kept) {
      if (std::fabs(t.w - threshold) <= err(t.w) + grid) doubt += t.w;
      if (t.w >= threshold) left.push_back(t);
    }
    kept = std::move(left);
  }
  // Top-p's doubtful tokens matter only where min-p may keep them.
  for (double w : top_p_doubt) doubt += w + err(w) + grid >= threshold ? w : 0.0;
  double total = 0, e = 0;
  for (const Weight& t : kept) total += t.w, e += err(t.w);
  if (doubt >= total) return 1.0;
  return e / total + doubt / (total - doubt) + grid + static_cast<double>(z.size()) * 0x1.0p-52;
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
std::vector<int> DeviceTokens(const std::vector<Case>& cases, std::vector<SampleLogprobsOut>* logprobs = nullptr) {
  const int rows = static_cast<int>(cases.size()), n = static_cast<int>(cases[0].logits.size());
  std::vector<float> logits(static_cast<size_t>(rows) * n);
  std::vector<SampleRow> rp(rows);
  std::vector<PenaltyEntry> pen;
  for (int r = 0; r < rows; ++r) {
    std::copy(cases[r].logits.begin(), cases[r].logits.end(), logits.begin() + static_cast<size_t>(r) * n);
    const SampleDraw& d = cases[r].draw;
    rp[r] = SampleRow{d.temperature,       d.top_k,
                      d.top_p,             d.min_p,
                      d.u,                 d.repetition_penalty,
                      d.frequency_penalty, d.presence_penalty,
                      static_cast<int>(pen.size()), static_cast<int>(d.counts.size()),
                      logprobs != nullptr ? d.logprobs : -1};
    for (const PenaltyCount& c : d.counts) pen.push_back({c.token, c.prompt, c.output});
  }
  DeviceBuffer d_logits(logits.size() * 4), d_rows(rp.size() * sizeof(SampleRow)), d_tokens(rows * 4),
      d_pen(std::max<size_t>(1, pen.size()) * sizeof(PenaltyEntry)), d_lp(rows * sizeof(SampleLogprobsOut));
  d_logits.Upload(logits.data(), logits.size() * 4);
  d_rows.Upload(rp.data(), rp.size() * sizeof(SampleRow));
  if (!pen.empty()) d_pen.Upload(pen.data(), pen.size() * sizeof(PenaltyEntry));
  d_tokens.Poison();
  SampleParams p;
  p.logits = d_logits.as<float>();
  p.ld = n;
  p.rows = rows;
  p.vocab = n;
  p.row = d_rows.as<SampleRow>();
  p.penalties = pen.empty() ? nullptr : d_pen.as<PenaltyEntry>();
  p.tokens = d_tokens.as<int>();
  p.logprobs = logprobs != nullptr ? d_lp.as<SampleLogprobsOut>() : nullptr;
  EXPECT_EQ(LaunchSampleRows(p, nullptr), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<int> tokens(rows);
  d_tokens.Download(tokens.data(), rows * 4);
  if (logprobs != nullptr) {
    logprobs->resize(rows);
    d_lp.Download(logprobs->data(), rows * sizeof(SampleLogprobsOut));
  }
  return tokens;
}

// Logprobs (float) against the host's (float64, rounded): infinities equal,
// finite values within 1e-5 (the device penalises in float); the same rank
// and the same alternatives in the same order.
void CheckLogprobs(const SampleLogprobs& want, const SampleLogprobsOut& got, int k, int row) {
  auto close = [](float a, float b) { return std::isinf(a) || std::isinf(b) ? a == b : std::fabs(a - b) <= 1e-5f; };
  EXPECT_TRUE(close(got.logprob, want.logprob)) << "row " << row << ": " << got.logprob << " vs " << want.logprob;
  EXPECT_EQ(got.rank, want.rank) << "row " << row;
  ASSERT_EQ(got.count, static_cast<int>(want.top.size())) << "row " << row;
  ASSERT_EQ(got.count, k) << "row " << row;
  for (int j = 0; j < got.count; ++j) {
    EXPECT_EQ(got.token[j], want.top[j].token) << "row " << row << " alternative " << j;
    EXPECT_TRUE(close(got.value[j], want.top[j].logprob)) << "row " << row << " alternative " << j;
  }
}

void CheckAgainstSampler(int vocab, const std::vector<int>& kinds, int draws) {
  const uint64_t seed = strata::testing::TestSeed();
  std::printf("vocab %d, seed %llu\n", vocab, static_cast<unsigned long long>(seed));
  Rng rng(seed);
  std::vector<Case> cases;
  std::vector<int> want;
  for (int kind : kinds) {
    const std::vector<float> x = MakeLogits(kind, vocab, rng);
    // Penalised requests observe a random prompt and outputs half of which
    // are among the 30 largest logits, where the penalties change the draw.
    std::vector<int> top(vocab);
    for (int i = 0; i < vocab; ++i) top[i] = i;
    std::partial_sort(top.begin(), top.begin() + 30, top.end(), [&](int a, int b) {
      const float xa = std::isnan(x[a]) ? -INFINITY : x[a], xb = std::isnan(x[b]) ? -INFINITY : x[b];
      return xa > xb;
    });
    for (float t : {0.0f, 0.3f, 1.0f, 1.7f}) {
      for (int k : {0, 1, 7, 100}) {
        for (float top_p : {1.0f, 0.9f, 0.3f}) {
          for (float min_p : {0.0f, 0.1f}) {
            for (bool penalised : {false, true}) {
              for (int d = 0; d < draws; ++d) {
                Case c;
                c.params.temperature = t;
                c.params.top_k = k;
                c.params.top_p = top_p;
                c.params.min_p = min_p;
                c.params.seed = rng.Next();
                if (penalised) {
                  c.params.repetition_penalty = 1.3f;
                  c.params.frequency_penalty = 0.5f;
                  c.params.presence_penalty = -0.4f;
                  for (int i = 0; i < 40; ++i) c.prompt.push_back(static_cast<int>(rng.Below(vocab)));
                  for (int i = 0; i < 24; ++i)
                    c.output.push_back(i % 2 ? top[rng.Below(30)] : static_cast<int>(rng.Below(vocab)));
                }
                // Every third case asks for 0, 5 or 20 alternatives.
                if (cases.size() % 3 == 0) c.params.logprobs = std::vector<int>{0, 5, 20}[cases.size() / 3 % 3];
                c.logits = x;
                c.draw = MakeSampler(c)->NextDraw();
                want.push_back(MakeSampler(c)->Sample(c.logits, c.params.logprobs ? &c.want_logprobs : nullptr));
                cases.push_back(std::move(c));
              }
            }
          }
        }
      }
    }
  }
  std::vector<SampleLogprobsOut> lps;
  const std::vector<int> got = DeviceTokens(cases, &lps);
  EXPECT_EQ(DeviceTokens(cases), got) << "not deterministic";
  int near = 0, compared = 0;
  int with_logprobs = 0;
  double widest_near = 0;  // the largest margin of a row skipped
  for (size_t r = 0; r < cases.size(); ++r) {
    if (got[r] == want[r]) {
      ++compared;
      if (cases[r].params.logprobs) {
        ++with_logprobs;
        CheckLogprobs(cases[r].want_logprobs, lps[r], *cases[r].params.logprobs, static_cast<int>(r));
      }
      continue;
    }
    const double dist = cases[r].params.temperature == 0.0f ? INFINITY : BoundaryDistance(cases[r], cases[r].draw.u);
    const double margin = ShareErrorBound(cases[r]);
    if (dist <= margin) {
      ++near;
      widest_near = std::max(widest_near, margin);
      continue;
    }
    ++compared;
    const SamplingParams& p = cases[r].params;
    ADD_FAILURE() << "row " << r << " (T " << p.temperature << ", top_k " << p.top_k << ", top_p " << p.top_p
                  << ", min_p " << p.min_p << ", penalties " << !cases[r].draw.counts.empty() << ", u "
                  << cases[r].draw.u << "): device token " << got[r] << ", host token "
                  << want[r] << ", draw " << dist << " from a boundary (margin " << margin << "); seed " << seed;
  }
  std::printf("%d rows agree or differ, %d within their margin of a boundary (skipped; widest margin %.3g); "
              "logprobs checked on %d\n",
              compared, near, widest_near, with_logprobs);
  EXPECT_LE(near, static_cast<int>(cases.size()) / 100);
}

TEST(SampleRowsTest, MatchesTheHostSamplerOnSmallVocabularies) {
  CheckAgainstSampler(5000, {0, 1, 2, 3, 4}, 3);
}

TEST(SampleRowsTest, MatchesTheHostSamplerOnDeepSeeksVocabulary) {
  CheckAgainstSampler(129280, {0, 1}, 1);
}

// Refused before any CUDA call: runs without a device.
TEST(SampleRowsHostTest, RejectsBadVocabularies) {
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
