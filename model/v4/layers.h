// The layer math of the DeepSeek-V4 CPU engine (docs/deepseek-v4.md §3).
// Internal to model/v4: callers use model/v4/engine.h.
//
// Every function computes each row with a fixed per-row order, and the
// sequence state is advanced token by token with the same code whatever the
// chunking, so a row's result never depends on the other rows of the batch
// or on how its sequence was split into steps.
#ifndef STRATA_MODEL_V4_LAYERS_H_
#define STRATA_MODEL_V4_LAYERS_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "common/thread_pool.h"
#include "model/v4/config.h"
#include "model/v4/sequence.h"
#include "model/v4/weights.h"

namespace strata::v4::internal {

// One RoPE table (main or compress): interleaved pairs (2i, 2i+1) of the
// trailing `rope_dim` channels of a vector, angle float32(pos) · inv_freq[i].
class RopeTable {
 public:
  RopeTable(const RopeConfig& rope, int rope_dim);
  // Rotates the last rope_dim values of x[0, n) at `pos`; `inverse` rotates
  // by the negative angle (cos, −sin).
  void Apply(float* x, int n, int64_t pos, bool inverse = false) const;
  const std::vector<float>& inv_freq() const { return inv_freq_; }

 private:
  int rope_dim_;
  std::vector<float> inv_freq_;
  float attention_factor_;
};

// One sequence's rows in a batch: rows [row_begin, row_begin + n) hold
// positions [pos_begin, pos_begin + n) of `seq`.
struct SeqRows {
  V4Sequence* seq;
  int row_begin;
  int n;
  int pos_begin;
};

// Appends one token's raw compressor projections (kv, gate: coff·width each)
// to `s`; when its block closes, pools it (gated softmax per channel, the
// previous block's Ca halves first for CSA), norms it and rotates it at the
// block's first position, and appends the row.
void CompressorPush(const CompressorWeights& w, const RopeTable& rope, double eps, const float* kv,
                    const float* gate, CompressorState* s);

// The attention sub-layer of layer `layer`. x: [rows, H], already
// input-normed. Advances every sequence's state of this layer by its rows
// (its window ring, compressor and indexer) and writes the o_b_proj output
// to out [rows, H].
void AttentionLayer(const V4Config& c, const V4LayerWeights& w, int layer, const RopeTable& main,
                    const RopeTable& compress, absl::Span<const SeqRows> seqs, int rows, const float* x,
                    float* out, ThreadPool* pool);

// The MoE sub-layer. x: [rows, H] (post-attention-normed); tokens: the row's
// token ids (hash routing). out: [rows, H].
void MoeLayer(const V4Config& c, const V4LayerWeights& w, int rows, const float* x, const int* tokens,
              float* out, ThreadPool* pool);

// Hyper-connection weights of every row. streams: [rows, n, H]. Writes
// post [rows, n], comb [rows, n, n] (comb[j][k]: input stream j to output
// stream k) and the collapsed sub-layer input [rows, H].
void HyperPre(const V4Config& c, const HyperWeights& w, int rows, const float* streams, float* post,
              float* comb, float* collapsed, ThreadPool* pool);

// streams[r][k] = Σ_j comb[r][j][k] · streams[r][j] + post[r][k] · out[r].
void HyperPost(const V4Config& c, int rows, const float* post, const float* comb, const float* out,
               float* streams);

// The final collapse: h [rows, H] = Σ_j pre_j · streams[r][j].
void HyperHead(const V4Config& c, const V4Weights& w, int rows, const float* streams, float* h,
               ThreadPool* pool);

// The `k` largest of scores[0, n): ties to the lower index, NaN lowest;
// returned ascending. k >= n selects all.
std::vector<int32_t> StableTopK(const float* scores, int n, int k);

}  // namespace strata::v4::internal

#endif  // STRATA_MODEL_V4_LAYERS_H_
