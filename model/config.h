// ModelConfig: the typed, validated view of a checkpoint's config.json for
// the MLA families Strata serves (deepseek_v3, deepseek_v32, glm_moe_dsa,
// glm4_moe_lite). Every derived rule (layer kinds, rope layout, softmax
// scale) is resolved here once, so layer code never looks at JSON.
// The exact meaning of every field is in docs/model-math.md.
//
// Thread-safety: plain value type.
#ifndef STRATA_MODEL_CONFIG_H_
#define STRATA_MODEL_CONFIG_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace strata {

// kDeepseekV4 is a serving view only (ParseModelConfig): what the
// coordinator and the workers need to place, schedule and route a
// deepseek_v4 model; its math and full config are model/v4/ (the MLA engine
// refuses it).
enum class ModelFamily { kDeepseekV3, kDeepseekV32, kGlmMoeDsa, kGlm4MoeLite, kDeepseekV4 };

// How a layer's attention chooses its rows.
enum class IndexerMode {
  kNone,    // dense attention (no DSA)
  kFull,    // runs its own lightning indexer and top-k
  kShared,  // reuses the selection of the nearest previous kFull layer
};

struct LayerSpec {
  bool moe = false;  // routed experts + shared experts; else a dense MLP
  IndexerMode indexer = IndexerMode::kNone;
};

struct RopeConfig {
  double theta = 10000.0;
  bool yarn = false;
  double factor = 1.0;          // as written in the config
  double yarn_factor = 1.0;     // factor used for frequencies (max_pos / original_max_pos when given)
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 0.0;          // 0 = absent
  double mscale_all_dim = 0.0;  // 0 = absent
  int64_t original_max_position_embeddings = 0;
  bool truncate = true;
  double attention_factor = 1.0;  // multiplies cos and sin
};

struct ModelConfig {
  std::string model_type;
  ModelFamily family = ModelFamily::kDeepseekV3;

  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;      // dense MLP
  int moe_intermediate_size = 0;  // one routed expert
  int num_layers = 0;             // num_hidden_layers (an MTP layer after them is ignored)
  int num_heads = 0;
  // The hidden state handed between pipeline stages is hidden_streams ×
  // hidden_size floats per token: hc_mult residual streams for deepseek_v4
  // (docs/deepseek-v4.md §3), one for the other families.
  int hidden_streams = 1;
  int stream_width() const { return hidden_streams * hidden_size; }

  int q_lora_rank = 0;  // 0: queries come from q_proj directly
  int kv_lora_rank = 0;
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;
  int v_head_dim = 0;
  bool attention_bias = false;

  int n_routed_experts = 0;
  int n_shared_experts = 0;
  int num_experts_per_tok = 0;
  int n_group = 1;
  int topk_group = 1;
  double routed_scaling_factor = 1.0;
  bool norm_topk_prob = true;

  double rms_norm_eps = 1e-6;
  int64_t max_position_embeddings = 0;
  RopeConfig rope;
  bool rope_interleave = true;  // main attention: pairs (2i, 2i+1); else halves
  double softmax_scale = 0.0;   // qk_head_dim^-0.5, times mscale^2 where the family applies it
  bool tie_word_embeddings = false;

  // DeepSeek Sparse Attention (zero / false when absent).
  bool has_dsa = false;
  int index_n_heads = 0;
  int index_head_dim = 0;
  int index_topk = 0;
  bool indexer_rope_interleave = false;

  std::vector<LayerSpec> layers;   // num_layers entries
  std::vector<int> eos_token_ids;  // config.json ∪ generation_config.json, sorted
  int bos_token_id = -1;

  int qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // Layers that keep an indexer key cache (kFull).
  int num_indexer_layers() const;
  // Position of layer `layer` among the kFull layers, or -1.
  int indexer_slot(int layer) const;
  // True when a pipeline may start a stage at `layer` (it does not depend on
  // a previous layer's DSA selection).
  bool can_cut_before(int layer) const;
};

// Resolves a stage's layer range (end < 0: num_layers) into *end and checks
// it: non-empty, inside the model, starting where a stage may start.
// INVALID_ARGUMENT naming the range otherwise.
absl::Status CheckStageRange(const ModelConfig& config, int begin, int* end);

// Parses config.json text. Unsupported values give INVALID_ARGUMENT naming
// the field and the value.
absl::StatusOr<ModelConfig> ParseModelConfig(std::string_view config_json);

// Reads <dir>/config.json and, when present, <dir>/generation_config.json
// (whose eos_token_id joins config.json's).
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& dir);

// The rope inverse frequencies (qk_rope_head_dim / 2 entries), YaRN applied.
std::vector<float> RopeInvFreq(const RopeConfig& rope, int rope_dim);

}  // namespace strata

#endif  // STRATA_MODEL_CONFIG_H_
