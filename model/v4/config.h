// V4Config: the typed, validated view of a DeepSeek-V4 config.json
// (model_type "deepseek_v4": DeepSeek-V4-Flash, DeepSeek-V4-Pro). Both
// layouts are read: the one transformers' save_pretrained writes
// (`layer_types`, `mlp_layer_types`, `compress_rates`, nested
// `rope_parameters`, `partial_rotary_factor`) and the one DeepSeek ships
// (`compress_ratios` with MTP entries, `num_hash_layers`, flat `rope_scaling`,
// `qk_rope_head_dim`). Every derived rule (layer kinds, the two RoPE tables,
// the softmax scale) is resolved here once. The meaning of every field is in
// docs/deepseek-v4.md §1; anything Strata does not serve is refused with
// INVALID_ARGUMENT naming the field.
//
// Thread-safety: plain value type.
#ifndef STRATA_MODEL_V4_CONFIG_H_
#define STRATA_MODEL_V4_CONFIG_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "model/config.h"

namespace strata::v4 {

// How a layer's attention reads the past (docs/deepseek-v4.md §3.4–3.6).
enum class AttentionKind {
  kSliding,  // "sliding_attention": the window only
  kCsa,      // "compressed_sparse_attention": window + indexer-selected overlapping compressed rows
  kHca,      // "heavily_compressed_attention": window + every visible compressed row
};

// How a layer's MoE chooses its experts (§3.7).
enum class MlpKind {
  kHashMoe,  // "hash_moe": tid2eid[token]
  kMoe,      // "moe": top-k of sqrtsoftplus scores + correction bias
};

struct V4LayerSpec {
  AttentionKind attention = AttentionKind::kSliding;
  int compress_rate = 0;  // m: 0 for sliding layers
  MlpKind mlp = MlpKind::kMoe;
};

// How the routed experts of an FP8 checkpoint are stored (config.json
// `expert_dtype`; §2.2).
enum class ExpertFormat { kFloat, kFp8, kFp4 };

struct V4Config {
  std::string model_type;  // "deepseek_v4"

  int vocab_size = 0;
  int hidden_size = 0;       // H
  int num_layers = 0;        // num_hidden_layers (MTP layers after them are ignored)
  int num_heads = 0;         // nh
  int head_dim = 0;          // d: the shared K=V head
  int rope_dim = 0;          // dr: rotated trailing channels of every head (and of indexer heads)
  int q_lora_rank = 0;       // Q
  int o_groups = 0;          // G
  int o_lora_rank = 0;       // R
  int sliding_window = 0;    // W
  int index_n_heads = 0;     // ni
  int index_head_dim = 0;    // di
  int index_topk = 0;        // k
  int hc_mult = 0;           // n: residual streams
  int hc_sinkhorn_iters = 0;
  double hc_eps = 1e-6;
  int n_routed_experts = 0;     // E
  int num_experts_per_tok = 0;  // K
  int moe_intermediate_size = 0;  // I (routed and shared experts)
  double routed_scaling_factor = 1.5;
  double swiglu_limit = 10.0;
  double rms_norm_eps = 1e-6;  // every norm
  int64_t max_position_embeddings = 0;
  int compress_rate_csa = 4;
  int compress_rate_hca = 128;

  RopeConfig rope_main;      // sliding layers
  RopeConfig rope_compress;  // CSA / HCA layers, their compressors and indexers
  double softmax_scale = 0;  // head_dim^-0.5 (no YaRN mscale)

  bool fp8_weights = false;  // quantization_config present (FP8 linear weights with E8M0 scales)
  ExpertFormat expert_format = ExpertFormat::kFloat;

  std::vector<V4LayerSpec> layers;  // num_layers entries
  std::vector<int> eos_token_ids;   // config.json ∪ generation_config.json, sorted
  int bos_token_id = -1;

  // Rows the CSA compressor projects per token: 2·d; the HCA compressor: d.
  int compressor_width(const V4LayerSpec& l) const {
    return l.attention == AttentionKind::kCsa ? 2 * head_dim : head_dim;
  }
};

// "sliding_attention" / "compressed_sparse_attention" / "heavily_compressed_attention".
std::string_view AttentionKindName(AttentionKind kind);

// Parses config.json text. INVALID_ARGUMENT naming the field for anything
// malformed or unsupported.
absl::StatusOr<V4Config> ParseV4Config(std::string_view config_json);

// Reads <dir>/config.json and, when present, <dir>/generation_config.json
// (whose eos_token_id joins config.json's). Messages name the file.
absl::StatusOr<V4Config> LoadV4Config(const std::string& dir);

// The model_type of <dir>/config.json ("" when the field is absent or not a
// string). NOT_FOUND when the file is missing, INVALID_ARGUMENT when it is not
// a JSON object. Lets a tool pick the engine before loading anything.
absl::StatusOr<std::string> ReadModelType(const std::string& dir);

}  // namespace strata::v4

#endif  // STRATA_MODEL_V4_CONFIG_H_
