// V4Weights: every tensor of a DeepSeek-V4 checkpoint the forward needs,
// converted to float32 at load time (docs/deepseek-v4.md §2).
//
// Names: DeepSeek's, with or without transformers' `model.` prefix (what
// save_pretrained writes: `model.layers.{l}.attn.wq_a.weight`,
// `model.embed_tokens.weight`, `model.hc_head.hc_fn`, `head.weight`; the
// release: `layers.{l}.attn.wq_a.weight`, `embed.weight`, `hc_head_fn`), the
// KV norm as `attn.kv_norm` or `attn.norm`, routed experts one tensor per
// expert (`ffn.experts.{e}.w1.weight`). MTP tensors (`mtp.*`) are ignored.
//
// Dtypes: F32, BF16 or F16 anywhere; F8_E4M3 with an F8_E8M0 `.scale`
// (128×128 blocks) for linear weights when config.json has a
// quantization_config; I8-packed FP4 with per-32 F8_E8M0 `.scale` for routed
// experts when expert_dtype is "fp4" (model/v4/quant.h). `tid2eid` is any
// integer dtype with ids in [0, n_routed_experts).
//
// Every failure names the tensor and the file (or directory): NOT_FOUND for
// a missing tensor, INVALID_ARGUMENT for a wrong shape, dtype or encoding.
//
// Thread-safety: immutable after LoadV4Weights returns.
#ifndef STRATA_MODEL_V4_WEIGHTS_H_
#define STRATA_MODEL_V4_WEIGHTS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "model/safetensors.h"
#include "model/v4/config.h"
#include "model/weights.h"

namespace strata::v4 {

// A gated pooling compressor (CSA: c = 2, HCA: c = 1; also the CSA
// indexer's own, at index_head_dim).
struct CompressorWeights {
  LinearWeights kv;                   // [c·width, H]
  LinearWeights gate;                 // [c·width, H]
  std::vector<float> position_bias;   // [m, c·width]
  std::vector<float> norm;            // [width]
};

// The CSA lightning indexer.
struct IndexerWeights {
  CompressorWeights compressor;  // width index_head_dim, c = 2
  LinearWeights q_b;             // [ni·di, Q]
  LinearWeights weights_proj;    // [ni, H]
};

// One manifold-constrained hyper-connection (mHC).
struct HyperWeights {
  std::vector<float> fn;     // [(2+n)·n, n·H]
  std::vector<float> base;   // [(2+n)·n]
  std::vector<float> scale;  // [3]
};

struct V4LayerWeights {
  std::vector<float> attn_norm, ffn_norm;  // [H]
  HyperWeights hc_attn, hc_ffn;
  LinearWeights q_a;                 // [Q, H]
  std::vector<float> q_norm;         // [Q]
  LinearWeights q_b;                 // [nh·d, Q]
  LinearWeights kv;                  // [d, H]
  std::vector<float> kv_norm;        // [d]
  LinearWeights o_a;                 // [G·R, nh·d/G]
  LinearWeights o_b;                 // [H, G·R]
  std::vector<float> sinks;          // [nh]
  CompressorWeights compressor;      // CSA, HCA
  IndexerWeights indexer;            // CSA
  LinearWeights router;              // [E, H]
  std::vector<float> router_bias;    // moe: [E]
  std::vector<int32_t> tid2eid;      // hash_moe: [V, K]
  std::vector<MlpWeights> experts;   // E: gate = w1, up = w3, down = w2
  MlpWeights shared;
};

struct V4Weights {
  std::vector<float> embed;       // [V, H]
  LinearWeights head;             // [V, H]
  std::vector<float> final_norm;  // [H]
  std::vector<float> hc_head_fn;  // [n, n·H]
  std::vector<float> hc_head_base;   // [n]
  float hc_head_scale = 1.0f;
  std::vector<V4LayerWeights> layers;
  uint64_t bytes = 0;  // float32 bytes held
};

absl::StatusOr<std::unique_ptr<V4Weights>> LoadV4Weights(const TensorStore& store, const V4Config& config);
// One pipeline stage's share: layers [layer_begin, layer_end) (the others
// left empty), the embedding when layer_begin is 0, the hyper head, final
// norm and lm_head when layer_end is the last layer. INVALID_ARGUMENT for a
// range outside the model.
absl::StatusOr<std::unique_ptr<V4Weights>> LoadV4Weights(const TensorStore& store, const V4Config& config,
                                                         int layer_begin, int layer_end);

}  // namespace strata::v4

#endif  // STRATA_MODEL_V4_WEIGHTS_H_
