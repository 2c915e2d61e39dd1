// V4Sequence: everything one DeepSeek-V4 sequence carries between steps, on
// the host, in float32 (the exact mode). The layout is documented in
// docs/deepseek-v4.md §4.4 (a later step persists it in the KV store); every
// count is a function of num_tokens() alone, so the token count is the only
// header the state needs.
//
// Per layer, with T = num_tokens(), W the sliding window, m the layer's
// compression rate, c = 2 for CSA and 1 for HCA, d = head_dim,
// di = index_head_dim:
//   window        ring of W − 1 rows of d: the normed, roped K=V row of
//                 position u sits in slot u mod (W − 1), for the last
//                 min(T, W − 1) positions
//   compressor    (CSA, HCA) rows: floor(T/m) pooled rows of d (normed, roped
//                 at w·m); open: the raw kv_proj and gate_proj outputs (c·d
//                 each, gate without position bias) of the T mod m tokens of
//                 the open block; overlap (CSA, once a block has closed): the
//                 last closed block's m Ca halves, kv [m, d] and gate [m, d]
//                 (raw, like open: the bias is added when they are pooled)
//   indexer       (CSA) the same at width di: rows are the index keys
//
// Thread-safety: not thread-safe; the engine updates a sequence from one
// thread and may read it from many between updates.
#ifndef STRATA_MODEL_V4_SEQUENCE_H_
#define STRATA_MODEL_V4_SEQUENCE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "model/v4/config.h"

namespace strata::v4 {

// The carried state of one gated pooling compressor.
struct CompressorState {
  int width = 0;  // d, or di for the indexer's
  int coff = 1;   // 2: overlapping (CSA), 1: HCA
  int rate = 0;   // m
  std::vector<float> rows;          // [closed blocks, width]
  std::vector<float> open_kv;       // [open tokens, coff·width]
  std::vector<float> open_gate;     // [open tokens, coff·width], without position bias
  std::vector<float> overlap_kv;    // CSA: [m, width] once a block has closed, else empty
  std::vector<float> overlap_gate;  // CSA: [m, width], raw (without position bias)

  int num_rows() const { return width == 0 ? 0 : static_cast<int>(rows.size() / width); }
  int open_tokens() const { return width == 0 ? 0 : static_cast<int>(open_kv.size() / (coff * width)); }
  const float* row(int w) const { return rows.data() + static_cast<size_t>(w) * width; }
  uint64_t bytes() const;
};

struct V4LayerState {
  int window_slots = 0;       // W − 1
  std::vector<float> window;  // [window_slots, d]
  CompressorState compressor;  // CSA, HCA (width 0 for sliding layers)
  CompressorState indexer;     // CSA (width 0 otherwise)
};

class V4Sequence {
 public:
  explicit V4Sequence(const V4Config& config);

  // Tokens every layer has consumed.
  int num_tokens() const { return num_tokens_; }
  int num_layers() const { return static_cast<int>(layers_.size()); }
  V4LayerState& layer(int i) { return layers_[i]; }
  const V4LayerState& layer(int i) const { return layers_[i]; }

  // The window row of position u. REQUIRES: T − window_slots <= u < T (the
  // committed positions the ring still holds).
  const float* WindowRow(int layer, int64_t u) const;

  // Called once every layer has consumed `n` more tokens.
  void Commit(int n) { num_tokens_ += n; }

  // Host bytes held.
  uint64_t bytes() const;

  // A deep copy (explicit: the state of a long sequence is large).
  std::unique_ptr<V4Sequence> Copy() const { return std::unique_ptr<V4Sequence>(new V4Sequence(*this)); }

 private:
  V4Sequence(const V4Sequence&) = default;

  int head_dim_ = 0;
  int num_tokens_ = 0;
  std::vector<V4LayerState> layers_;
};

}  // namespace strata::v4

#endif  // STRATA_MODEL_V4_SEQUENCE_H_
