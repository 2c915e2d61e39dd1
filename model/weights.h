// Weights of the layers one engine (or one pipeline stage) owns, converted
// to float32 at load time. Only the tensors of the requested layers are
// read from the checkpoint (plus the embedding for the first stage and the
// final norm and lm_head for the last).
//
// Tensor names follow the Hugging Face checkpoints of the supported
// families; routed experts may be stored per expert
// (`mlp.experts.{e}.{gate,up,down}_proj.weight`) or fused
// (`mlp.experts.gate_up_proj` [E, 2I, H], `mlp.experts.down_proj` [E, H, I]).
//
// Thread-safety: immutable after LoadWeights returns.
#ifndef STRATA_MODEL_WEIGHTS_H_
#define STRATA_MODEL_WEIGHTS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/config.h"
#include "model/safetensors.h"

namespace strata {

// A Linear layer: w is [out, in] row-major; b is empty or [out].
// Loaded with keep_fp8, a weight stored as F8_E4M3 with 128×128 block scales
// stays in that form instead: w is empty, fp8_codes [out][in] holds the
// codes and fp8_scales [ceil(out/128)][ceil(in/128)] the scales as f32
// (W = Decode(code) * scale; docs/gpu-engine.md, "fp8 weights").
struct LinearWeights {
  std::vector<float> w;
  std::vector<float> b;
  int in = 0;
  int out = 0;
  std::vector<uint8_t> fp8_codes;
  std::vector<float> fp8_scales;
  const float* bias() const { return b.empty() ? nullptr : b.data(); }
  bool is_fp8() const { return !fp8_codes.empty(); }
};

struct MlpWeights {
  LinearWeights gate, up, down;
};

struct IndexerWeights {
  LinearWeights wq_b;          // [index_n_heads * index_head_dim, q_lora_rank]
  LinearWeights wk;            // [index_head_dim, hidden]
  LinearWeights weights_proj;  // [index_n_heads, hidden]
  std::vector<float> k_norm_w, k_norm_b;  // LayerNorm over index_head_dim
};

struct LayerWeights {
  std::vector<float> input_norm, post_attention_norm;
  // Attention. q_proj when q_lora_rank == 0, else q_a -> q_a_norm -> q_b.
  LinearWeights q_proj, q_a, q_b;
  std::vector<float> q_a_norm;
  LinearWeights kv_a;  // [kv_lora + rope, hidden]
  std::vector<float> kv_a_norm;
  LinearWeights kv_b;  // [heads * (nope + v), kv_lora]
  LinearWeights o;     // [hidden, heads * v]
  IndexerWeights indexer;  // only for IndexerMode::kFull layers
  // MLP.
  MlpWeights dense;                // !moe
  LinearWeights router;            // moe: [experts, hidden]
  std::vector<float> router_bias;  // moe: e_score_correction_bias [experts]
  std::vector<MlpWeights> experts; // moe
  MlpWeights shared;               // moe with n_shared_experts > 0
};

struct ModelWeights {
  int layer_begin = 0;
  int layer_end = 0;                  // exclusive
  std::vector<float> embed;           // [vocab, hidden], first stage only
  std::vector<float> final_norm;      // last stage only
  LinearWeights lm_head;              // last stage only
  std::vector<LayerWeights> layers;   // layer_end - layer_begin entries
  uint64_t bytes = 0;                 // bytes held (f32 values, fp8 codes and scales)
};

struct LoadOptions {
  // Keep fp8 block-scaled weights as stored (LinearWeights::fp8_codes) for
  // the Linear layers a GPU engine runs as fp8: every projection, the dense
  // and shared-expert MLPs and the routed experts stored per expert; not
  // kv_b (the per-head absorption reads it as a matrix), the router, or
  // experts stored fused. Only for callers that handle that form (the GPU
  // engine; the CPU engine needs f32).
  bool keep_fp8 = false;
};

// Loads layers [layer_begin, layer_end); with_embedding / with_head add the
// embedding and the final norm + lm_head. Errors name the tensor.
absl::StatusOr<std::unique_ptr<ModelWeights>> LoadWeights(const TensorStore& store,
                                                          const ModelConfig& config,
                                                          int layer_begin, int layer_end,
                                                          bool with_embedding, bool with_head,
                                                          const LoadOptions& options = {});

}  // namespace strata

#endif  // STRATA_MODEL_WEIGHTS_H_
