// Absorbed MLA decode over the paged fp8 KV cache (docs/design.md §3.3, §5.1;
// docs/gpu-kernels.md "Absorbed MLA decode"). For each request b and head h, with one
// query token:
//
//   s_t = softmax_scale * (q_abs[b,h] . c_t + q_pe[b,h] . r_t)
//   out[b,h] = sum_t softmax(s)_t c_t        (the latent context, 512-d f32)
//   lse[b,h] = log sum_t exp(s_t)             (natural log; -inf when no token)
//
// over the tokens t of request b (dense: positions 0 .. seq_lens[b]-1; sparse:
// the positions listed in indices[b], entries < 0 or >= seq_lens[b] skipped).
// c_t, r_t are the dequantised cache rows (codes * usable scale; NaN codes and
// unusable scales read as zero, as on the CPU).
//
// Flash-decoding: the token range of a request is cut into splits whose count
// depends only on that request's length (so a request's bits do not depend on
// the rest of the batch); each block handles one split for 64 heads (when the
// splits outnumber the SMs, several consecutive splits of a request through
// one pipeline), then a merge kernel combines the partial results with their
// max and sum. Tensor cores: bf16 wgmma with the fp8 codes widened exactly to
// bf16 and the per-token scales applied in f32.
//
// Host functions are thread-compatible; launches are asynchronous on `stream`.
#ifndef STRATA_KERNELS_CUDA_MLA_DECODE_H_
#define STRATA_KERNELS_CUDA_MLA_DECODE_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

namespace strata::cuda {

struct MlaDecodeParams {
  // Queries: one token per request. bf16 (q_is_bf16) or f32, which the
  // kernel rounds to bf16 (nearest even) on load: against the unrounded
  // queries that alone costs ~2 bf16 eps in relative L2 (measured in
  // mla_decode_test, FloatQueriesNotRepresentableInBf16).
  const void* q_abs;         // [batch][heads][512]
  const void* q_pe;          // [batch][heads][64]
  bool q_is_bf16 = true;
  int batch = 0;
  int heads = 0;             // any count >= 1; blocks take 64 heads each
  float softmax_scale = 1.0f;

  // The cache (kv_layout.h).
  const uint8_t* pool;       // [n_pages][kPageBytes]
  const int* page_table;     // [batch][page_table_stride] pool page of each logical page
  int64_t page_table_stride = 0;
  const int* seq_lens;       // [batch] tokens in each request's cache
  // Optional: request b uses page_table row page_row[b] (null: row b), so
  // requests can share one table of per-sequence rows.
  const int* page_row = nullptr;

  // Sparse attention: null for dense. Otherwise positions to attend.
  const int* indices = nullptr;  // [batch][index_stride]; < 0 means "no entry"
  int64_t index_stride = 0;

  // The plan (MlaDecodePlan, copied to the device).
  const int* work;           // [num_work][4] {request, split, tile_begin, tile_end}
  int num_work = 0;
  const int* split_offset;   // [batch + 1] first partial slot of each request

  // Workspace: total_splits = split_offset[batch].
  float* o_partial;          // unnormalised partial contexts, MlaPartialFloats(total_splits, heads)
                             // floats in the kernels' own layout
  float* ml_partial;         // [total_splits][heads][2] {running max (log2 units), sum}

  // Outputs.
  float* out;                // [batch][heads][512] f32
  float* lse;                // [batch][heads] f32
};

// How a length is cut into splits. Depends on nothing but the arguments, so a
// request gets the same splits whatever else is in its batch.
struct MlaSplitPolicy {
  int num_sms = 132;             // the device's multiprocessor count
  int min_tiles_per_split = 8;   // dense; a tile is 64 tokens
  // Sparse (a tile is 64 index entries). A DSA selection of k = 2048 is only
  // 32 tiles: small splits spread one request over more SMs (B = 1 latency),
  // at the price of a block prologue and 256 KB of f32 partials per split at
  // large batch. On the H200 (bench/RESULTS.md): 1 is fastest at B = 1, 8 at
  // B = 64, and 2 is within 1.3x and 1.5x of both.
  int sparse_min_tiles_per_split = 2;
};

// Number of splits for a request of `length` tokens (dense) or index entries
// (sparse) with `heads` heads.
int MlaSplitCount(int64_t length, int heads, const MlaSplitPolicy& policy, bool sparse = false);

// The work list of one launch, built on the host from host-side lengths.
struct MlaDecodePlan {
  std::vector<int> work;          // 4 ints per work item, see MlaDecodeParams::work
  std::vector<int> split_offset;  // batch + 1 entries
  int num_work = 0;
  int total_splits = 0;
};

// lengths[b]: seq_lens[b] for dense; for sparse (sparse = true) the number of
// leading entries of indices[b] to walk: index_stride, or fewer when the
// entries after them are all < 0 (a selection of min(seq_len, k) positions).
MlaDecodePlan PlanMlaDecode(const int64_t* lengths, int batch, int heads,
                            const MlaSplitPolicy& policy, bool sparse = false);

// The split partials' layout (o_partial): by groups of kMlaPartialHeads
// heads, each 64 blocks of 8 dims holding those dims of the group's heads in
// turn, so that a warp's stores from the wgmma accumulators (8 heads x 8 dims)
// and the merge's loads (8 heads x 64 dims) are contiguous. The float index of
// the first of the 8 dims that hold dim d of head h in split slot `slot`:
inline constexpr int kMlaPartialHeads = 8;
constexpr int64_t MlaPartialBlock(int heads, int slot, int h, int d) {
  const int groups = (heads + kMlaPartialHeads - 1) / kMlaPartialHeads;
  return ((static_cast<int64_t>(slot) * groups + h / kMlaPartialHeads) * (512 / 8) + d / 8) * (8 * kMlaPartialHeads) +
         (h % kMlaPartialHeads) * 8;
}
// ... and of any dim d.
constexpr int64_t MlaPartialIndex(int heads, int slot, int h, int d) {
  return MlaPartialBlock(heads, slot, h, d - d % 8) + d % 8;
}

// Workspace floats needed for o_partial (heads rounded up to whole groups).
inline int64_t MlaPartialFloats(int total_splits, int heads) {
  return static_cast<int64_t>(total_splits) * ((heads + kMlaPartialHeads - 1) / kMlaPartialHeads) *
         kMlaPartialHeads * 512;
}

// Launches the split kernel and the merge. REQUIRES: params filled from a plan
// for these lengths; the device supports 200 KB of shared memory per block.
cudaError_t LaunchMlaDecode(const MlaDecodeParams& p, cudaStream_t stream);

}  // namespace strata::cuda

#endif  // STRATA_KERNELS_CUDA_MLA_DECODE_H_
