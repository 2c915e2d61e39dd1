// Sampler: turns one step of logits into the next token of one request.
//
// SamplingParams holds what a client asks for (temperature, top-k, top-p,
// min-p, seed, penalties, stopping, logprobs); Validate() checks it against a
// vocabulary. A Sampler applies those parameters to a logits row and draws a
// token with its own seeded generator:
//
//   penalties (repetition, frequency, presence)
//     -> temperature            (0 = greedy: argmax, ties to the lowest id)
//     -> top-k -> top-p -> min-p
//     -> draw from what is left
//
// The semantics, the order and every validation rule are described in
// docs/sampling.md; the comments below are the short form.
//
// Determinism: the n-th Sample() call of a Sampler uses the n-th output of a
// std::mt19937_64 seeded with seed(), whatever the parameters (greedy calls
// draw too, so the stream never shifts). That generator is fully specified by
// the C++ standard, the uniform draw is built from its bits by hand, every
// sum runs in a fixed order and ties are broken by token id, so the same seed
// and the same logits give the same tokens with any compiler and standard
// library. (The one caveat: std::exp may differ in its last bit between C
// libraries, which can only matter for a draw that lands within ~1e-16 of a
// boundary between two tokens.)
//
// Thread-safety: a Sampler is not thread-safe; it belongs to one request and
// is used by one thread at a time. Distinct Samplers share nothing. The free
// functions are thread-safe.
#ifndef STRATA_MODEL_SAMPLER_H_
#define STRATA_MODEL_SAMPLER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace strata {

// The most alternatives SamplingParams::logprobs may ask for (OpenAI's
// top_logprobs limit, and vLLM's default max_logprobs).
inline constexpr int kMaxLogprobs = 20;
// Limits on stop strings, so that one request cannot make stop matching
// expensive for the whole server.
inline constexpr int kMaxStopStrings = 64;
inline constexpr int kMaxStopStringBytes = 1024;

// What a client asks for. The defaults sample from the model's distribution
// unchanged (temperature 1, no truncation, no penalties), as vLLM does.
struct SamplingParams {
  // Divides the logits. 0 means greedy (argmax, ties to the lowest token id).
  // Must be finite and >= 0. Very small positive values approach greedy
  // smoothly (tokens tied at the maximum are then drawn uniformly).
  float temperature = 1.0f;

  // Keep only the top_k tokens with the largest (penalised) logits, ties to
  // the lowest id. 0 or -1 = off. Values >= the vocabulary size are the same
  // as off (clamped, not an error). Must be >= -1.
  int top_k = 0;

  // Nucleus sampling: keep the smallest set of most probable tokens whose
  // probability sums to at least top_p (measured after temperature and
  // top-k). Must be in (0, 1]; 1 = off.
  float top_p = 1.0f;

  // Keep only tokens whose probability is at least min_p times that of the
  // most probable token (after temperature). Must be in [0, 1]; 0 = off.
  float min_p = 0.0f;

  // Seeds the request's generator: the same seed, parameters and logits give
  // the same tokens. Unset: the Sampler draws one from std::random_device and
  // reports it (Sampler::seed()), so any run can be replayed.
  std::optional<uint64_t> seed;

  // HF / vLLM repetition penalty, for every token seen in the prompt or the
  // output: logit > 0 -> logit / p, otherwise logit * p. Must be finite and
  // > 0; 1 = off; > 1 discourages repetition.
  float repetition_penalty = 1.0f;

  // OpenAI penalties over the generated tokens only:
  //   logit -= frequency_penalty * count + presence_penalty * (count > 0).
  // Each must be in [-2, 2]; 0 = off. All three penalties are applied in float
  // arithmetic, each operation rounded once, so the GPU sampler gets the
  // same penalised logits bit for bit.
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;

  // Stop after this many generated tokens (must be > 0). Unset: stop at
  // end of sequence or when the context is full (OpenAI chat behaviour).
  std::optional<int> max_tokens;

  // Stop when the generated text contains one of these (matched across token
  // boundaries by StopMatcher; the stop string itself is not returned). Each
  // must be non-empty valid UTF-8 of at most kMaxStopStringBytes bytes; at
  // most kMaxStopStrings of them.
  std::vector<std::string> stop;

  // Stop when one of these tokens is generated. Each must be a valid id.
  std::vector<int> stop_token_ids;

  // Keep generating past the model's end-of-sequence tokens.
  bool ignore_eos = false;

  // Logprobs of the generated tokens. Unset: none. k: the sampled token's
  // logprob and rank plus the k most likely alternatives, 0 <= k <=
  // kMaxLogprobs. They are computed from the penalised logits before
  // temperature and truncation (see SampleLogprobs).
  std::optional<int> logprobs;
};

// Returns OK, or INVALID_ARGUMENT naming the first offending field and its
// value (for example "top_p must be in (0, 1], got 1.5").
absl::Status Validate(const SamplingParams& params, int vocab_size);

struct TokenLogprob {
  int token = 0;
  float logprob = 0.0f;

  friend bool operator==(const TokenLogprob&, const TokenLogprob&) = default;
};

// Logprobs reported with a sampled token. They describe the model's
// distribution after this request's penalties but before temperature, top-k,
// top-p and min-p: every token has a finite logprob, the numbers do not
// depend on how adventurous the sampling is, and a greedy request's token is
// always rank 1.
struct SampleLogprobs {
  float logprob = 0.0f;           // of the sampled token
  int rank = 0;                   // 1 + number of tokens strictly more likely
  std::vector<TokenLogprob> top;  // most likely first, ties to the lowest id
};

// The k largest entries of log_softmax(logits), most likely first, ties to
// the lowest id; k is clamped to [0, logits.size()]. NaN counts as -inf.
std::vector<TokenLogprob> TopLogprobs(absl::Span<const float> logits, int k);

// Why generation ends after a token, judged by the token alone (stop strings
// are StopMatcher's job).
enum class TokenStop {
  kNone,       // keep going
  kEos,        // an end-of-sequence token, and ignore_eos is off
  kStopToken,  // one of params.stop_token_ids
  kLength,     // the max_tokens-th generated token
};

// Checks in that order: EOS, stop token, length. `num_generated` counts
// `token` itself. The token that ends generation is still part of the output
// token ids; whether its text is shown is the caller's choice.
TokenStop CheckTokenStop(const SamplingParams& params,
                         absl::Span<const int> eos_token_ids, int token,
                         int num_generated);

// A token a request's penalties apply to: its prompt occurrences (they feed
// the repetition penalty only) and how many times it was generated.
struct PenaltyCount {
  int token = 0;
  int prompt = 0;
  int output = 0;
};

// One draw made elsewhere (a GPU worker's device sampler,
// kernels/cuda/sampling.h): the request's penalties and truncation
// parameters and the uniform number in [0, 1) its Sample() call would have
// used.
struct SampleDraw {
  float temperature = 1.0f;
  int top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  double u = 0.0;
  float repetition_penalty = 1.0f;
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  std::vector<PenaltyCount> counts;  // by token id; empty when no penalty is on
  int logprobs = -1;                 // alternatives to report; -1: no logprobs
};

class Sampler {
 public:
  // Validates `params` against `vocab_size` (INVALID_ARGUMENT if bad).
  static absl::StatusOr<std::unique_ptr<Sampler>> Create(
      const SamplingParams& params, int vocab_size);

  Sampler(const Sampler&) = delete;
  Sampler& operator=(const Sampler&) = delete;

  // The parameters, with `seed` always set (to the drawn one if it was not).
  const SamplingParams& params() const { return params_; }
  uint64_t seed() const { return *params_.seed; }
  int vocab_size() const { return vocab_size_; }
  bool greedy() const { return params_.temperature == 0.0f; }
  // Greedy with no penalties and no logprobs: the token is the argmax of the
  // raw logits, so it can be chosen elsewhere (a GPU worker's device argmax)
  // and reported with ConsumeDraw().
  bool plain_greedy() const { return greedy() && !track_counts_ && !params_.logprobs.has_value(); }
  // Advances the generator exactly as one Sample() call does, for a token a
  // plain_greedy() sampler did not choose itself: the stream stays where
  // Sample() would have left it.
  void ConsumeDraw();
  // The same, returning what a device sampler (kernels/cuda/sampling.h)
  // needs to draw this token and report its logprobs as Sample() would: the
  // penalties with the counts observed so far, the truncation parameters,
  // the uniform draw and the number of alternatives.
  SampleDraw NextDraw();
  // Number of Sample() calls so far (= generator outputs used).
  int64_t num_samples() const { return num_samples_; }

  // Records a token for the penalties: prompt tokens feed the repetition
  // penalty, generated tokens all three. Sample() does not record its own
  // result; the caller observes every token it keeps. Ids outside
  // [0, vocab_size) are ignored (the engine validates prompts first).
  void Observe(int token, bool is_prompt);
  void ObservePrompt(absl::Span<const int> tokens);

  // Applies penalties -> temperature -> top-k -> top-p -> min-p and draws.
  // If `logprobs` is not null it is filled as described at SampleLogprobs,
  // with params().logprobs.value_or(0) alternatives. NaN logits count as
  // -inf; if no logit is above -inf the result is token 0.
  // REQUIRES: logits.size() == vocab_size() (a mismatch is a caller bug and
  // aborts the process rather than read or write out of bounds).
  int Sample(absl::Span<const float> logits,
             SampleLogprobs* logprobs = nullptr);

  // The distribution Sample() would draw from now (one-hot when greedy), as
  // vocab_size() probabilities. Does not touch the generator. Costs a copy of
  // the row and a sort; meant for tests and diagnostics.
  // REQUIRES: logits.size() == vocab_size().
  std::vector<double> Probabilities(absl::Span<const float> logits) const;

 private:
  struct Counts {
    int prompt = 0;
    int output = 0;
  };
  struct Candidate {
    int token;
    double logit;   // penalised, before temperature
    double weight;  // unnormalised probability after temperature
  };

  Sampler(const SamplingParams& params, int vocab_size);

  // Writes the penalised logits (NaN replaced by -inf) to *out.
  void Penalize(absl::Span<const float> logits, std::vector<double>* out) const;
  // Fills *out with the tokens Sample() may draw and their weights.
  void Candidates(const std::vector<double>& z,
                  std::vector<Candidate>* out) const;

  SamplingParams params_;
  const int vocab_size_;
  const bool track_counts_;  // any penalty on
  std::mt19937_64 rng_;
  int64_t num_samples_ = 0;
  absl::flat_hash_map<int, Counts> counts_;

  // Scratch reused across Sample() calls.
  std::vector<double> z_;
  std::vector<Candidate> candidates_;
};

}  // namespace strata

#endif  // STRATA_MODEL_SAMPLER_H_
