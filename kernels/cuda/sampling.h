// Sampling on the device: one token per logits row with the rules of
// model/sampler.h, and the logprobs a row asks for:
//
//   penalties (repetition, frequency, presence; applied to the listed
//   tokens of the row, in place)
//     -> temperature (0 = greedy: argmax, ties to the lowest id)
//     -> top-k -> top-p -> min-p -> draw
//
// NaN logits count as -inf; +inf logits, when present, share the draw
// uniformly; a row with nothing above -inf gives token 0. The draw `u` in
// [0, 1) comes from the request's host generator (Sampler::NextDraw), so
// a seeded request replays on any worker.
//
// Arithmetic. A token's weight is exp((x - max) / T) in float (hardware
// exp2), held as a 2^-40 fixed-point integer; every sum is an integer sum,
// so the result is exact, order-free and the same on every run. Each
// truncation step keeps a prefix of the ranking (larger logit first, then
// lower id), found by a radix select over the logits' order-preserving bits
// (eight 4-bit passes; each thread sums into its own column of a bucket
// table, so there are no atomics) and a scan over tied logits in id
// order. The draw walks the kept tokens in ranking order when top-k or top-p
// applied, else in id order, as the host Sampler does. Compared with the
// Sampler's float64 weights this picks the same token unless the draw lands
// within the float weights' error of a boundary between two tokens' shares:
// typically below 1e-7, at most a few 1e-6 (129 280 tokens), and a whole
// token's share when a top-p or min-p cut lies that close to a token
// (ShareErrorBound() in sampling_test.cc derives the bound). Logprobs: log-sum-exp in float64 over the
// penalised row, the sampled token's rank, and the k most likely tokens
// (larger logit, then lower id), with the Sampler's rules for infinities.
//
// One block of 1024 threads per row; 128 KiB of shared memory.
#ifndef STRATA_KERNELS_CUDA_SAMPLING_H_
#define STRATA_KERNELS_CUDA_SAMPLING_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace strata::cuda {

// One row's parameters (validated by the host: see SamplingParams).
struct SampleRow {
  float temperature = 1.0f;  // 0 = greedy
  int top_k = 0;             // <= 0: off
  float top_p = 1.0f;        // (0, 1]; 1 = off
  float min_p = 0.0f;        // [0, 1]; 0 = off
  double u = 0.0;            // the draw, in [0, 1)
  float repetition = 1.0f;   // penalties, as SamplingParams
  float frequency = 0.0f;
  float presence = 0.0f;
  int penalty_begin = 0;     // the row's entries in SampleParams::penalties
  int penalty_count = 0;
  int logprobs = -1;         // alternatives to report (<= kSampleMaxLogprobs); -1: none
};

// The most alternatives a row may ask for (SamplingParams' limit).
inline constexpr int kSampleMaxLogprobs = 20;

// What the Sampler reports with a token (SampleLogprobs): from the penalised
// logits before temperature and truncation.
struct SampleLogprobsOut {
  float logprob;                     // of the sampled token
  int rank;                          // 1 + tokens with a larger logit
  int count;                         // alternatives below
  int token[kSampleMaxLogprobs];     // most likely first, ties to the lower id
  float value[kSampleMaxLogprobs];   // their logprobs
};

// A token of a row the penalties apply to (Sampler's counts).
struct PenaltyEntry {
  int token;
  int prompt;  // occurrences in the prompt
  int output;  // times generated
};

struct SampleParams {
  float* logits = nullptr;        // [rows][ld]; penalised in place
  int64_t ld = 0;
  int rows = 0;
  int vocab = 0;                  // 1 .. kSampleMaxVocab
  const SampleRow* row = nullptr; // device, [rows]
  const PenaltyEntry* penalties = nullptr;  // device; null when no row has any
  int* tokens = nullptr;          // device, [rows]
  SampleLogprobsOut* logprobs = nullptr;  // device, [rows]; null when no row asks
};

// Fixed-point sums of up to this many weights of at most 2^40 fit 64 bits.
inline constexpr int kSampleMaxVocab = 1 << 22;

// cudaErrorInvalidValue for a vocabulary outside 1 .. kSampleMaxVocab.
// Penalty entries with a token outside the vocabulary are ignored.
cudaError_t LaunchSampleRows(const SampleParams& p, cudaStream_t stream);

}  // namespace strata::cuda

#endif  // STRATA_KERNELS_CUDA_SAMPLING_H_
