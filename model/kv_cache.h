// SequenceKv: the KV cache of one sequence for the layers one engine (or one
// pipeline stage) owns, on the host.
//
// Per layer and token it keeps the MLA row — the normed latent c
// (kv_lora floats) and the roped key r (qk_rope floats) — and, for layers
// that run a DSA indexer, the indexer key (index_head_dim floats). With
// KvDtype::kFp8 the latent and rope parts are quantised per row exactly as
// docs/design.md §4.3 says; the codes and scales are kept (for export to .coli_kv
// v2) together with their dequantised values (what attention reads).
// Indexer keys are float32 unless fp8 indexer keys are enabled, in which
// case they go through the same codec (one scale per key).
//
// Thread-safety: not thread-safe; the engine appends from one thread per
// sequence and may read rows from many threads between appends.
#ifndef STRATA_MODEL_KV_CACHE_H_
#define STRATA_MODEL_KV_CACHE_H_

#include <cstdint>
#include <vector>

namespace strata {

enum class KvDtype { kF32, kFp8 };

struct LayerKv {
  std::vector<float> c;  // [tokens, kv_lora], dequantised when fp8
  std::vector<float> r;  // [tokens, rope]
  std::vector<uint8_t> c_codes, r_codes;  // fp8 only
  std::vector<float> c_scale, r_scale;    // fp8 only, one per token
  std::vector<float> index_k;             // [tokens, index_head_dim], indexer layers only
};

class SequenceKv {
 public:
  SequenceKv(int num_layers, int kv_lora, int rope, int index_dim, KvDtype dtype, bool fp8_index)
      : kv_lora_(kv_lora), rope_(rope), index_dim_(index_dim), dtype_(dtype), fp8_index_(fp8_index),
        layers_(num_layers) {}

  // Tokens whose rows every layer holds.
  int num_tokens() const { return num_tokens_; }
  KvDtype dtype() const { return dtype_; }
  int kv_lora() const { return kv_lora_; }
  int rope() const { return rope_; }
  int index_dim() const { return index_dim_; }

  LayerKv& layer(int i) { return layers_[i]; }
  const LayerKv& layer(int i) const { return layers_[i]; }
  int num_layers() const { return static_cast<int>(layers_.size()); }

  // Appends one token's row to layer i (quantising it in fp8 mode).
  void AppendRow(int layer, const float* c, const float* r);
  void AppendIndexKey(int layer, const float* k);
  // Appends one token's row to layer i from its stored form (a .coli_kv v2
  // row: kv_lora fp8 codes + scale, rope codes + scale). In fp8 mode the
  // codes, the scales and the dequantised floats are exactly what AppendRow
  // keeps for the floats these codes were quantised from; in f32 mode only
  // the dequantised floats are kept. No recomputation: used to load a
  // session from the KV store.
  void AppendQuantizedRow(int layer, const uint8_t* c_codes, float c_scale, const uint8_t* r_codes,
                          float r_scale);
  // Appends an indexer key as stored (index_dim floats, taken verbatim, never
  // re-quantised: with fp8 indexer keys the stored values are already the
  // dequantised ones).
  void AppendStoredIndexKey(int layer, const float* k);
  // Called once every layer has appended `n` rows.
  void Commit(int n) { num_tokens_ += n; }
  // Drops every row from position `n` on (n <= num_tokens()).
  void Truncate(int n);

  // Host bytes used.
  uint64_t bytes() const;

 private:
  int kv_lora_, rope_, index_dim_;
  KvDtype dtype_;
  bool fp8_index_;
  int num_tokens_ = 0;
  std::vector<LayerKv> layers_;
};

}  // namespace strata

#endif  // STRATA_MODEL_KV_CACHE_H_
