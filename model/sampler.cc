#include "model/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace strata {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

absl::Status Invalid(absl::string_view field, absl::string_view rule,
                     absl::string_view got) {
  return absl::InvalidArgumentError(
      absl::StrCat("SamplingParams.", field, " ", rule, ", got ", got));
}

// True if `s` is well-formed UTF-8 (no overlong forms, surrogates or code
// points above U+10FFFF).
bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    int len;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > s.size()) return false;
    for (int j = 1; j < len; ++j) {
      const unsigned char d = static_cast<unsigned char>(s[i + j]);
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) ||
        (len == 4 && cp < 0x10000) || cp > 0x10FFFF ||
        (cp >= 0xD800 && cp <= 0xDFFF)) {
      return false;
    }
    i += len;
  }
  return true;
}

// A uniform double in [0, 1) from the top 53 bits of one generator output.
// Defined here rather than with std::uniform_real_distribution, whose
// algorithm differs between standard libraries.
double UniformFromBits(uint64_t bits) {
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

// Ordering used for every ranking: larger logit first, then lower id. It is
// a strict total order, so partial sorts give the same result everywhere.
struct ByLogitThenId {
  template <typename T>
  bool operator()(const T& a, const T& b) const {
    if (a.logit != b.logit) return a.logit > b.logit;
    return a.token < b.token;
  }
};

int ArgmaxLowestId(const std::vector<double>& z) {
  int best = 0;
  for (int i = 1; i < static_cast<int>(z.size()); ++i) {
    if (z[i] > z[best]) best = i;
  }
  return best;
}

// log-sum-exp of z, summed in id order. +inf if some entry is +inf, -inf if
// every entry is -inf.
double LogSumExp(const std::vector<double>& z) {
  double m = -kInf;
  for (double v : z) m = std::max(m, v);
  if (std::isinf(m)) return m;  // LogprobOf() special-cases both
  double sum = 0;
  for (double v : z) sum += std::exp(v - m);
  return m + std::log(sum);
}

// Logprob of entry value `v` of row `z` whose LogSumExp() is `lse`.
double LogprobOf(double v, const std::vector<double>& z, double lse) {
  if (lse == kInf) {  // some entries are +inf: uniform over them
    if (v != kInf) return -kInf;
    double n_inf = 0;
    for (double w : z) n_inf += (w == kInf) ? 1.0 : 0.0;
    return -std::log(n_inf);
  }
  if (lse == -kInf) return -kInf;
  return v - lse;
}

std::vector<TokenLogprob> TopLogprobsOf(const std::vector<double>& z, int k,
                                        double lse) {
  struct Entry {
    int token;
    double logit;
  };
  k = std::clamp(k, 0, static_cast<int>(z.size()));
  std::vector<TokenLogprob> out;
  if (k == 0) return out;
  std::vector<Entry> entries(z.size());
  for (size_t i = 0; i < z.size(); ++i) {
    entries[i] = {static_cast<int>(i), z[i]};
  }
  std::partial_sort(entries.begin(), entries.begin() + k, entries.end(),
                    ByLogitThenId());
  out.reserve(k);
  for (int i = 0; i < k; ++i) {
    out.push_back({entries[i].token,
                   static_cast<float>(LogprobOf(entries[i].logit, z, lse))});
  }
  return out;
}

// A logits row of the wrong length is a bug in the caller (the engine builds
// the Sampler and the row from the same config); penalties would index past
// the row, so stop rather than corrupt memory.
void CheckRowSize(size_t got, int want) {
  if (got != static_cast<size_t>(want)) {
    std::fprintf(stderr,
                 "Sampler: logits row has %zu entries, vocab_size is %d\n", got,
                 want);
    std::abort();
  }
}

std::vector<double> ToDoubles(absl::Span<const float> logits) {
  std::vector<double> z(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) {
    z[i] = std::isnan(logits[i]) ? -kInf : static_cast<double>(logits[i]);
  }
  return z;
}

}  // namespace

absl::Status Validate(const SamplingParams& p, int vocab_size) {
  if (vocab_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("vocab_size must be positive, got ", vocab_size));
  }
  if (!(std::isfinite(p.temperature) && p.temperature >= 0.0f)) {
    return Invalid("temperature", "must be finite and >= 0 (0 = greedy)",
                   absl::StrCat(p.temperature));
  }
  if (p.top_k < -1) {
    return Invalid("top_k", "must be >= 1, or 0 or -1 for off",
                   absl::StrCat(p.top_k));
  }
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) {
    return Invalid("top_p", "must be in (0, 1] (1 = off)",
                   absl::StrCat(p.top_p));
  }
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) {
    return Invalid("min_p", "must be in [0, 1] (0 = off)",
                   absl::StrCat(p.min_p));
  }
  if (!(std::isfinite(p.repetition_penalty) && p.repetition_penalty > 0.0f)) {
    return Invalid("repetition_penalty", "must be finite and > 0 (1 = off)",
                   absl::StrCat(p.repetition_penalty));
  }
  if (!(p.frequency_penalty >= -2.0f && p.frequency_penalty <= 2.0f)) {
    return Invalid("frequency_penalty", "must be in [-2, 2] (0 = off)",
                   absl::StrCat(p.frequency_penalty));
  }
  if (!(p.presence_penalty >= -2.0f && p.presence_penalty <= 2.0f)) {
    return Invalid("presence_penalty", "must be in [-2, 2] (0 = off)",
                   absl::StrCat(p.presence_penalty));
  }
  if (p.max_tokens.has_value() && *p.max_tokens <= 0) {
    return Invalid("max_tokens", "must be > 0 when set",
                   absl::StrCat(*p.max_tokens));
  }
  if (p.stop.size() > static_cast<size_t>(kMaxStopStrings)) {
    return Invalid(
        "stop", absl::StrCat("may hold at most ", kMaxStopStrings, " strings"),
        absl::StrCat(p.stop.size()));
  }
  for (size_t i = 0; i < p.stop.size(); ++i) {
    const std::string field = absl::StrCat("stop[", i, "]");
    const std::string& s = p.stop[i];
    if (s.empty()) return Invalid(field, "must not be empty", "\"\"");
    if (s.size() > static_cast<size_t>(kMaxStopStringBytes)) {
      return Invalid(
          field,
          absl::StrCat("must be at most ", kMaxStopStringBytes, " bytes"),
          absl::StrCat(s.size(), " bytes"));
    }
    if (!IsValidUtf8(s)) {
      return Invalid(field, "must be valid UTF-8", "invalid bytes");
    }
  }
  for (size_t i = 0; i < p.stop_token_ids.size(); ++i) {
    const int id = p.stop_token_ids[i];
    if (id < 0 || id >= vocab_size) {
      return Invalid(
          absl::StrCat("stop_token_ids[", i, "]"),
          absl::StrCat("must be a token id in [0, ", vocab_size, ")"),
          absl::StrCat(id));
    }
  }
  if (p.logprobs.has_value() &&
      (*p.logprobs < 0 || *p.logprobs > kMaxLogprobs)) {
    return Invalid("logprobs",
                   absl::StrCat("must be in [0, ", kMaxLogprobs, "] when set"),
                   absl::StrCat(*p.logprobs));
  }
  return absl::OkStatus();
}

std::vector<TokenLogprob> TopLogprobs(absl::Span<const float> logits, int k) {
  const std::vector<double> z = ToDoubles(logits);
  return TopLogprobsOf(z, k, LogSumExp(z));
}

TokenStop CheckTokenStop(const SamplingParams& params,
                         absl::Span<const int> eos_token_ids, int token,
                         int num_generated) {
  if (!params.ignore_eos &&
      std::find(eos_token_ids.begin(), eos_token_ids.end(), token) !=
          eos_token_ids.end()) {
    return TokenStop::kEos;
  }
  if (std::find(params.stop_token_ids.begin(), params.stop_token_ids.end(),
                token) != params.stop_token_ids.end()) {
    return TokenStop::kStopToken;
  }
  if (params.max_tokens.has_value() && num_generated >= *params.max_tokens) {
    return TokenStop::kLength;
  }
  return TokenStop::kNone;
}

absl::StatusOr<std::unique_ptr<Sampler>> Sampler::Create(
    const SamplingParams& params, int vocab_size) {
  if (absl::Status s = Validate(params, vocab_size); !s.ok()) return s;
  return std::unique_ptr<Sampler>(new Sampler(params, vocab_size));
}

Sampler::Sampler(const SamplingParams& params, int vocab_size)
    : params_(params),
      vocab_size_(vocab_size),
      track_counts_(params.repetition_penalty != 1.0f ||
                    params.frequency_penalty != 0.0f ||
                    params.presence_penalty != 0.0f) {
  if (!params_.seed.has_value()) {
    std::random_device rd;
    const uint64_t hi = rd();
    const uint64_t lo = rd();
    params_.seed = (hi << 32) ^ lo;
  }
  rng_.seed(*params_.seed);
}

void Sampler::Observe(int token, bool is_prompt) {
  if (!track_counts_ || token < 0 || token >= vocab_size_) return;
  if (is_prompt) {
    // Only the repetition penalty looks at the prompt.
    if (params_.repetition_penalty != 1.0f) ++counts_[token].prompt;
  } else {
    ++counts_[token].output;
  }
}

void Sampler::ObservePrompt(absl::Span<const int> tokens) {
  for (int t : tokens) Observe(t, /*is_prompt=*/true);
}

void Sampler::Penalize(absl::Span<const float> logits,
                       std::vector<double>* out) const {
  std::vector<double>& z = *out;
  z.resize(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) {
    z[i] = static_cast<double>(logits[i]);
  }
  if (track_counts_) {
    // In float arithmetic, one rounding per operation, as the GPU sampler
    // does (kernels/cuda/sampling.cu): each step is computed in double and
    // rounded to float, which for +, -, * and / is the correctly rounded
    // float result (double has more than twice float's precision) and
    // leaves nothing a compiler could fuse into an FMA. In double, a
    // penalised logit could differ from the GPU's in the last float bit and
    // reorder near-ties, and with them the token a seed draws.
    const double rep = params_.repetition_penalty;
    const double freq = params_.frequency_penalty;
    const double pres = params_.presence_penalty;
    auto round = [](double x) { return static_cast<double>(static_cast<float>(x)); };
    // Each token's update depends only on its own counts, so the map's
    // iteration order does not matter.
    for (const auto& [token, c] : counts_) {
      double& v = z[token];
      if (rep != 1.0) v = round(v > 0 ? v / rep : v * rep);
      if (c.output > 0) {
        const double step = round(round(freq * static_cast<float>(c.output)) + pres);
        v = round(v - step);
      }
    }
  }
  for (double& v : z) {
    if (std::isnan(v)) v = -kInf;
  }
}

void Sampler::Candidates(const std::vector<double>& z,
                         std::vector<Candidate>* out) const {
  std::vector<Candidate>& cand = *out;
  cand.clear();
  const int n = static_cast<int>(z.size());
  double m = -kInf;
  for (double v : z) m = std::max(m, v);
  if (greedy() || m == -kInf) {
    // Greedy, or nothing above -inf (then token 0 by the same rule).
    const int best = ArgmaxLowestId(z);
    cand.push_back({best, z[best], 1.0});
    return;
  }

  // Temperature. exp((z - m) / T) <= 1 never overflows; tokens whose weight
  // underflows to 0 could never be drawn and are dropped here. If some
  // logits are +inf, the limit is uniform over them.
  const double t = params_.temperature;
  for (int i = 0; i < n; ++i) {
    double w;
    if (m == kInf) {
      w = z[i] == kInf ? 1.0 : 0.0;
    } else {
      w = std::exp((z[i] - m) / t);
    }
    if (w > 0) cand.push_back({i, z[i], w});
  }
  // From here on `cand` is in id order, or in ranking order once a step has
  // sorted it; either way sums below run in an order fixed by the inputs.

  // Top-k: the k largest logits, ties to the lowest id.
  const int k = params_.top_k;
  if (k > 0 && k < static_cast<int>(cand.size())) {
    std::partial_sort(cand.begin(), cand.begin() + k, cand.end(),
                      ByLogitThenId());
    cand.resize(k);
  }

  // Top-p: the shortest ranked prefix whose mass reaches top_p of what is
  // left. The ranking is extended in growing chunks so that a peaked
  // distribution does not pay for sorting the whole vocabulary.
  if (params_.top_p < 1.0f) {
    double total = 0;
    for (const Candidate& c : cand) total += c.weight;
    const double target = static_cast<double>(params_.top_p) * total;
    const size_t size = cand.size();
    size_t sorted = 0;
    size_t chunk_end = std::min<size_t>(64, size);
    double cum = 0;
    size_t keep = size;
    while (true) {
      // Bring the next chunk of the ranking to the front, in order. A heap
      // selection is cheapest for small chunks, nth_element for large ones.
      if (chunk_end - sorted <= 1024) {
        std::partial_sort(cand.begin() + sorted, cand.begin() + chunk_end,
                          cand.end(), ByLogitThenId());
      } else {
        std::nth_element(cand.begin() + sorted, cand.begin() + chunk_end - 1,
                         cand.end(), ByLogitThenId());
        std::sort(cand.begin() + sorted, cand.begin() + chunk_end,
                  ByLogitThenId());
      }
      for (; sorted < chunk_end; ++sorted) {
        cum += cand[sorted].weight;
        if (cum >= target) break;
      }
      if (sorted < chunk_end) {
        keep = sorted + 1;
        break;
      }
      if (chunk_end == size) break;  // rounding: keep everything
      chunk_end = std::min(size, chunk_end * 4);
    }
    cand.resize(keep);
  }

  // Min-p: probability >= min_p * the largest probability. Truncation only
  // renormalises, which leaves these ratios unchanged.
  if (params_.min_p > 0.0f) {
    double w_max = 0;
    for (const Candidate& c : cand) w_max = std::max(w_max, c.weight);
    const double threshold = static_cast<double>(params_.min_p) * w_max;
    cand.erase(std::remove_if(cand.begin(), cand.end(),
                              [threshold](const Candidate& c) {
                                return c.weight < threshold;
                              }),
               cand.end());
  }
}

int Sampler::Sample(absl::Span<const float> logits, SampleLogprobs* logprobs) {
  CheckRowSize(logits.size(), vocab_size_);
  // One generator output per call, used or not, so the stream never shifts.
  const double u = UniformFromBits(rng_());
  ++num_samples_;

  Penalize(logits, &z_);
  Candidates(z_, &candidates_);

  double total = 0;
  for (const Candidate& c : candidates_) total += c.weight;
  const double target = u * total;
  int token = candidates_.back().token;  // if rounding leaves cum < target
  double cum = 0;
  for (const Candidate& c : candidates_) {
    cum += c.weight;
    if (cum > target) {
      token = c.token;
      break;
    }
  }

  if (logprobs != nullptr) {
    const double lse = LogSumExp(z_);
    logprobs->logprob = static_cast<float>(LogprobOf(z_[token], z_, lse));
    int rank = 1;
    for (double v : z_) rank += v > z_[token] ? 1 : 0;
    logprobs->rank = rank;
    logprobs->top = TopLogprobsOf(z_, params_.logprobs.value_or(0), lse);
  }
  return token;
}

void Sampler::ConsumeDraw() {
  rng_();
  ++num_samples_;
}

SampleDraw Sampler::NextDraw() {
  ++num_samples_;
  SampleDraw d;
  d.temperature = params_.temperature;
  d.top_k = params_.top_k;
  d.top_p = params_.top_p;
  d.min_p = params_.min_p;
  d.u = UniformFromBits(rng_());
  d.repetition_penalty = params_.repetition_penalty;
  d.frequency_penalty = params_.frequency_penalty;
  d.presence_penalty = params_.presence_penalty;
  d.logprobs = params_.logprobs.value_or(-1);
  d.counts.reserve(counts_.size());
  for (const auto& [token, c] : counts_) d.counts.push_back({token, c.prompt, c.output});
  std::sort(d.counts.begin(), d.counts.end(),
            [](const PenaltyCount& a, const PenaltyCount& b) { return a.token < b.token; });
  return d;
}

std::vector<double> Sampler::Probabilities(
    absl::Span<const float> logits) const {
  CheckRowSize(logits.size(), vocab_size_);
  std::vector<double> z;
  std::vector<Candidate> cand;
  Penalize(logits, &z);
  Candidates(z, &cand);
  double total = 0;
  for (const Candidate& c : cand) total += c.weight;
  std::vector<double> probs(vocab_size_, 0.0);
  for (const Candidate& c : cand) probs[c.token] = c.weight / total;
  return probs;
}

}  // namespace strata
