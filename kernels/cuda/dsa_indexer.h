// DeepSeek Sparse Attention on the GPU: the lightning-indexer score over fp8
// keys and the exact top-k selection (docs/design.md §3.4, §5.1;
// docs/gpu-kernels.md "DSA indexer and top-k").
//
//   score[b,t] = sum_h w[b,h] * ReLU(q[b,h] . k_t)      t < seq_lens[b]
//
// k_t is the dequantised key (codes * usable per-token scale). The queries
// are scored as e4m3 pairs: head h is scaled by s_h = 2^(7 - floor(log2 m_h)),
// m_h = max_d |q_hd| (s_h = 1 when m_h < 2^-119 or is not finite), and each
// x = q_hd * s_h is taken as hi + lo, hi = e4m3(x), lo = e4m3(x - hi), both
// rounded to nearest even; the score uses q'_hd = (hi + lo) / s_h, within
// 2^-8 |q_hd| + 2^-17 m_h of q_hd (a bf16 query: 2^-9 |q_hd|), and
// reference::IndexerQueryAsScored computes it. Keys live in
// index pages of 64 tokens (addressed through a page table like the KV cache):
//
//   offset   size          contents
//   0        64 x 128      key codes, token-major (slot s at s*128)
//   8192     64 x f32      key scales (slot s at 8192 + 4*s)
//   total    8448
//
// Top-k orders scores by the total order of TopkKey() below (larger first) and
// breaks ties toward the lower position; the selected positions are written
// in increasing order, padded with -1 when seq_len < k. With seq_len <= k
// every position is selected, so sparse attention equals dense attention.
//
// Launches are asynchronous on `stream`.
#ifndef STRATA_KERNELS_CUDA_DSA_INDEXER_H_
#define STRATA_KERNELS_CUDA_DSA_INDEXER_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace strata::cuda {

inline constexpr int kIndexDim = 128;
inline constexpr size_t kIndexPageScaleOffset = 64 * kIndexDim;             // 8192
inline constexpr size_t kIndexPageBytes = kIndexPageScaleOffset + 64 * 4;  // 8448
static_assert(kIndexPageBytes % 16 == 0, "index pages stay 16-byte aligned");

struct DsaIndexerParams {
  const void* q;             // [batch][index_heads][128] bf16 (q_is_bf16) or f32; scored as e4m3 pairs
  bool q_is_bf16 = true;
  const float* weights;      // [batch][index_heads] per-head weights (scales folded in)
  int batch = 0;
  int index_heads = 0;       // a multiple of 8, at most 64
  const uint8_t* pool;       // [n_pages][kIndexPageBytes]
  const int* page_table;     // [batch][page_table_stride]
  int64_t page_table_stride = 0;
  const int* seq_lens;       // [batch]
  // Optional: request b uses page_table row page_row[b] (null: row b), so
  // requests can share one table of per-sequence rows.
  const int* page_row = nullptr;
  int64_t max_seq_len = 0;   // max over seq_lens (sizes the grid)
  float* scores;             // [batch][score_stride] f32; [b][t] written for t < seq_lens[b]
  int64_t score_stride = 0;
};

cudaError_t LaunchDsaIndexer(const DsaIndexerParams& p, cudaStream_t stream);

struct TopkParams {
  const float* scores;       // [batch][score_stride]; seq_lens[b] <= score_stride
  int64_t score_stride = 0;
  const int* seq_lens;       // [batch]
  int batch = 0;
  int k = 0;                 // 1 .. 65535
  int* indices;              // [batch][k] selected positions, increasing, -1 padded
  // Scratch of TopkWorkspaceBytes(batch, score_stride) bytes, set to zero once
  // (cudaMemset) before its first use; every launch leaves the part that must
  // be zero at zero again, so later launches on the same stream with the same
  // batch and score_stride reuse it as is (after a launch with another shape,
  // zero it again). Null: the single-block kernel.
  void* workspace = nullptr;
};

inline constexpr int kTopkChunk = 2048;             // scores per block (multi-block path)
inline constexpr int kTopkBins1 = 2048;             // first-level histogram: the top 11 key bits
inline constexpr int kTopkBins2 = 2048;             // second level: the next 11 bits
inline constexpr int kTopkFrontInts = kTopkBins1 + kTopkBins2 + 8;  // per request: both histograms, counters

constexpr int64_t TopkChunks(int64_t score_stride) {
  return (score_stride + kTopkChunk - 1) / kTopkChunk;
}

inline size_t TopkWorkspaceBytes(int batch, int64_t score_stride) {
  const int64_t per = kTopkFrontInts + 5 * TopkChunks(score_stride) + 2 * score_stride;
  return static_cast<size_t>(batch) * static_cast<size_t>(per) * sizeof(int);
}

// With a workspace: three launches over chunks of 2048 scores (a histogram of
// the top 11 key bits across all chunks; the candidates of the threshold bin
// with a histogram of their next 11 bits, and an exact select among them on
// the last 10; then each chunk writes its positions at its offset). Without: one block per request, a three-pass radix select (11 + 11 +
// 10 bits) of the threshold, then one ordered pass that writes the selection.
// Both give the same result.
cudaError_t LaunchTopk(const TopkParams& p, cudaStream_t stream);

// The indexer and the multi-block top-k of the same requests, with top-k's
// first pass (the histogram) done by the indexer as it writes the scores: the
// selection LaunchDsaIndexer then LaunchTopk would make, in three launches
// instead of four, the last two allowed to start while the one before them
// finishes. Requests with seq_len <= k are not scored (their rows of `scores`
// are left as they were); every position is selected. REQUIRES: t.workspace
// (see TopkParams), and t.scores, score_stride, seq_lens and batch equal to
// p's; otherwise cudaErrorInvalidValue.
cudaError_t LaunchDsaIndexerTopk(const DsaIndexerParams& p, const TopkParams& t, cudaStream_t stream);

// The order top-k uses: larger key = preferred. Equal floats give equal keys;
// -0 orders just below +0.
inline uint32_t TopkKey(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

}  // namespace strata::cuda

#endif  // STRATA_KERNELS_CUDA_DSA_INDEXER_H_
