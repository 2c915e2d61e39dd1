// Plain CPU references (double accumulation) for the kernels in kernels/cuda,
// and random paged caches to feed them. Used by the tests and the benchmark.
// Functions are thread-safe; the heavy ones use `threads` worker threads.
#ifndef STRATA_KERNELS_CUDA_REFERENCE_H_
#define STRATA_KERNELS_CUDA_REFERENCE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace strata::cuda::reference {

// A paged KV cache (kv_layout.h) with random contents for requests of the
// given lengths: every row is a random normal vector times a random row
// magnitude, quantised with fp8::QuantizeRow. Pages are shuffled in the pool;
// unused slots and a few spare pages hold random bytes (NaN codes included),
// which the kernels must never read.
struct PagedKv {
  std::vector<uint8_t> pool;       // n_pages * kPageBytes
  std::vector<int> page_table;     // batch * stride
  int64_t stride = 0;              // page-table row length
  std::vector<int> seq_lens;
  int64_t n_pages = 0;
};
PagedKv MakeRandomKv(const std::vector<int64_t>& lens, uint64_t seed, int threads);

// Same for DSA indexer keys (dsa_indexer.h index pages), 128-d keys.
PagedKv MakeRandomIndexKeys(const std::vector<int64_t>& lens, uint64_t seed, int threads);

// Overwrites about one code in `one_in` of the first `code_bytes` of every
// page with a NaN code (0x7F or 0xFF), which the kernels and the references
// read as 0 (fp8::Decode). Scales are left alone.
void SprinkleNanCodes(PagedKv* kv, size_t page_bytes, size_t code_bytes, int one_in, uint64_t seed);

// Attention of one request for a list of heads. q_abs: [heads_total][512],
// q_pe: [heads_total][64] (the values the kernel sees), `entries`: positions
// (null = dense 0..seq_len-1; entries < 0 or >= seq_len skipped).
// ctx: [head_list.size()][512], lse: [head_list.size()].
void MlaDecode(const PagedKv& kv, int b, const float* q_abs, const float* q_pe,
               const std::vector<int>& head_list, double softmax_scale, const int* entries,
               int64_t n_entries, int threads, std::vector<double>* ctx, std::vector<double>* lse);

// The query values the indexer scores with (dsa_indexer.h): each element of
// `heads` rows of 128 as the e4m3 pair hi + lo of its head's scaled value,
// scaled back.
void IndexerQueryAsScored(const float* q, int heads, float* out);

// Indexer scores of one request: score[t] = sum_h w_h ReLU(q_h . k_t), and
// bound[t] = sum_h |w_h| sum_d |q_hd k_td| (for error bounds).
void IndexerScores(const PagedKv& keys, int b, const float* q, const float* w, int heads,
                   std::vector<double>* score, std::vector<double>* bound);

// Top-k positions of scores[0..n) by TopkKey order, ties to the lower
// position, returned in increasing order and padded with -1 to k entries.
std::vector<int> Topk(const float* scores, int64_t n, int k);

struct ErrorStats {
  double max_abs_err = 0;   // max |got - ref|
  double max_abs_ref = 0;   // max |ref|
  double rel_l2 = 0;        // ||got - ref|| / ||ref||
  double cosine = 0;        // <got, ref> / (||got|| ||ref||)
  int64_t nonfinite = 0;    // NaN / inf entries in got
  double MaxRel() const { return max_abs_ref > 0 ? max_abs_err / max_abs_ref : max_abs_err; }
};
ErrorStats Compare(const float* got, const double* ref, int64_t n);

}  // namespace strata::cuda::reference

#endif  // STRATA_KERNELS_CUDA_REFERENCE_H_
