// The layer math of the CPU engine, shared by Engine::RunLayers. Internal to
// model/: callers use model/engine.h.
//
// Every function computes each output row with a fixed per-row order, so a
// row's result does not depend on the other rows of the batch.
#ifndef STRATA_MODEL_LAYER_OPS_H_
#define STRATA_MODEL_LAYER_OPS_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "common/thread_pool.h"
#include "model/config.h"
#include "model/kv_cache.h"
#include "model/weights.h"

namespace strata::internal {

// Rotary embedding tables shared by attention and the indexer.
class Rope {
 public:
  Rope(const ModelConfig& config);
  // Rotates dim (even) values of x for position pos. Interleaved pairs
  // (2i, 2i+1) or halves (i, i + dim/2).
  void Apply(float* x, int dim, int64_t pos, bool interleave) const;

 private:
  std::vector<float> inv_freq_;
  float attention_factor_;
};

// One sequence's rows in a batch: rows [row_begin, row_begin + n) of the
// batch hold positions [pos_begin, pos_begin + n) of `kv`.
struct ChunkRows {
  SequenceKv* kv;
  int row_begin;
  int n;
  int pos_begin;
};

// Per batch row: the positions attention may read (sorted ascending), set
// by a kFull layer and reused by kShared layers.
using Selections = std::vector<std::vector<int32_t>>;

// Attention of one layer. x: [rows, hidden] (already input-normed).
// Appends the rows' cache entries to each chunk's `kv` layer `local_layer`,
// then writes the o_proj output to out [rows, hidden].
void AttentionLayer(const ModelConfig& c, const LayerWeights& w, int global_layer,
                    int local_layer, const Rope& rope, absl::Span<const ChunkRows> chunks,
                    int rows, const float* x, float* out, Selections* selections,
                    ThreadPool* pool);

// Dense MLP or MoE of one layer. x: [rows, hidden]; out: [rows, hidden].
void MlpLayer(const ModelConfig& c, const LayerWeights& w, bool moe, int rows, const float* x,
              float* out, ThreadPool* pool);

// Top-k positions of `scores` (n entries): the k largest, ties to the lower
// position, NaN ranked lowest; returned sorted ascending. k >= n selects all.
std::vector<int32_t> TopKPositions(const float* scores, int n, int k);

}  // namespace strata::internal

#endif  // STRATA_MODEL_LAYER_OPS_H_
