#include "model/v4/sequence.h"

namespace strata::v4 {

uint64_t CompressorState::bytes() const {
  return (rows.size() + open_kv.size() + open_gate.size() + overlap_kv.size() + overlap_gate.size()) *
         sizeof(float);
}

V4Sequence::V4Sequence(const V4Config& c) : head_dim_(c.head_dim), layers_(c.num_layers) {
  for (int l = 0; l < c.num_layers; ++l) {
    const V4LayerSpec& spec = c.layers[l];
    V4LayerState& s = layers_[l];
    s.window_slots = c.sliding_window - 1;
    s.window.assign(static_cast<size_t>(s.window_slots) * c.head_dim, 0.0f);
    if (spec.attention != AttentionKind::kSliding) {
      s.compressor.width = c.head_dim;
      s.compressor.coff = spec.attention == AttentionKind::kCsa ? 2 : 1;
      s.compressor.rate = spec.compress_rate;
    }
    if (spec.attention == AttentionKind::kCsa) {
      s.indexer.width = c.index_head_dim;
      s.indexer.coff = 2;
      s.indexer.rate = spec.compress_rate;
    }
  }
}

const float* V4Sequence::WindowRow(int layer, int64_t u) const {
  const V4LayerState& s = layers_[layer];
  return s.window.data() + static_cast<size_t>(u % s.window_slots) * head_dim_;
}

uint64_t V4Sequence::bytes() const {
  uint64_t b = 0;
  for (const V4LayerState& s : layers_) b += s.window.size() * sizeof(float) + s.compressor.bytes() + s.indexer.bytes();
  return b;
}

}  // namespace strata::v4
