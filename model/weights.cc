#include "model/weights.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace strata {
namespace {

class Loader {
 public:
  Loader(const TensorStore& store, ModelWeights* out, bool keep_fp8)
      : store_(store), out_(out), keep_fp8_(keep_fp8) {}

  absl::StatusOr<std::vector<float>> Vec(const std::string& name, int64_t n) {
    const int64_t shape[] = {n};
    ASSIGN_OR_RETURN(auto v, store_.ReadF32(name, shape));
    out_->bytes += v.size() * sizeof(float);
    return v;
  }

  // fp8: the layer may keep an fp8 block-scaled weight as stored.
  absl::Status Lin(const std::string& prefix, int in, int out, bool bias, LinearWeights* lw, bool fp8 = false) {
    const int64_t shape[] = {out, in};
    const std::string name = prefix + ".weight";
    absl::StatusOr<TensorStore::Fp8Blocks> blocks = absl::FailedPreconditionError("not asked");
    if (fp8 && keep_fp8_) blocks = store_.ReadFp8Blocks(name, shape);
    if (blocks.ok()) {
      lw->fp8_codes = std::move(blocks->codes);
      lw->fp8_scales = std::move(blocks->scales);
      out_->bytes += lw->fp8_codes.size() + lw->fp8_scales.size() * sizeof(float);
    } else if (blocks.status().code() != absl::StatusCode::kFailedPrecondition) {
      return blocks.status();
    } else {
      ASSIGN_OR_RETURN(lw->w, store_.ReadF32(name, shape));
      out_->bytes += lw->w.size() * sizeof(float);
    }
    lw->in = in;
    lw->out = out;
    if (bias) {
      ASSIGN_OR_RETURN(lw->b, Vec(prefix + ".bias", out));
    }
    return absl::OkStatus();
  }

  absl::Status Mlp(const std::string& prefix, int hidden, int inter, MlpWeights* m, bool fp8 = false) {
    RETURN_IF_ERROR(Lin(prefix + ".gate_proj", hidden, inter, false, &m->gate, fp8));
    RETURN_IF_ERROR(Lin(prefix + ".up_proj", hidden, inter, false, &m->up, fp8));
    return Lin(prefix + ".down_proj", inter, hidden, false, &m->down, fp8);
  }

  absl::Status Experts(const std::string& prefix, int n, int hidden, int inter,
                       std::vector<MlpWeights>* experts) {
    experts->resize(n);
    if (store_.Has(prefix + ".gate_up_proj")) {
      const int64_t gu_shape[] = {n, 2 * inter, hidden};
      const int64_t d_shape[] = {n, hidden, inter};
      ASSIGN_OR_RETURN(auto gu, store_.ReadF32(prefix + ".gate_up_proj", gu_shape));
      ASSIGN_OR_RETURN(auto down, store_.ReadF32(prefix + ".down_proj", d_shape));
      const size_t m = static_cast<size_t>(inter) * hidden;
      for (int e = 0; e < n; ++e) {
        MlpWeights& x = (*experts)[e];
        const float* base = gu.data() + static_cast<size_t>(e) * 2 * m;
        x.gate = {std::vector<float>(base, base + m), {}, hidden, inter};
        x.up = {std::vector<float>(base + m, base + 2 * m), {}, hidden, inter};
        const float* d = down.data() + static_cast<size_t>(e) * m;
        x.down = {std::vector<float>(d, d + m), {}, inter, hidden};
      }
      out_->bytes += (gu.size() + down.size()) * sizeof(float);
      return absl::OkStatus();
    }
    for (int e = 0; e < n; ++e) {
      RETURN_IF_ERROR(Mlp(absl::StrCat(prefix, ".", e), hidden, inter, &(*experts)[e], true));
    }
    return absl::OkStatus();
  }

 private:
  const TensorStore& store_;
  ModelWeights* out_;
  bool keep_fp8_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ModelWeights>> LoadWeights(const TensorStore& store,
                                                          const ModelConfig& c,
                                                          int layer_begin, int layer_end,
                                                          bool with_embedding, bool with_head,
                                                          const LoadOptions& options) {
  if (layer_begin < 0 || layer_end > c.num_layers || layer_begin > layer_end) {
    return absl::InvalidArgumentError(absl::StrCat("layer range [", layer_begin, ", ", layer_end,
                                                   ") is outside the model's ", c.num_layers, " layers"));
  }
  auto w = std::make_unique<ModelWeights>();
  w->layer_begin = layer_begin;
  w->layer_end = layer_end;
  Loader ld(store, w.get(), options.keep_fp8);
  const int H = c.hidden_size;
  if (with_embedding) {
    const int64_t shape[] = {c.vocab_size, H};
    ASSIGN_OR_RETURN(w->embed, store.ReadF32("model.embed_tokens.weight", shape));
    w->bytes += w->embed.size() * sizeof(float);
  }
  if (with_head) {
    ASSIGN_OR_RETURN(w->final_norm, ld.Vec("model.norm.weight", H));
    if (c.tie_word_embeddings && !store.Has("lm_head.weight")) {
      const int64_t shape[] = {c.vocab_size, H};
      ASSIGN_OR_RETURN(w->lm_head.w, store.ReadF32("model.embed_tokens.weight", shape));
      w->lm_head.in = H;
      w->lm_head.out = c.vocab_size;
      w->bytes += w->lm_head.w.size() * sizeof(float);
    } else {
      RETURN_IF_ERROR(ld.Lin("lm_head", H, c.vocab_size, false, &w->lm_head, true));
    }
  }
  const int heads = c.num_heads;
  for (int i = layer_begin; i < layer_end; ++i) {
    LayerWeights& L = w->layers.emplace_back();
    const std::string p = absl::StrCat("model.layers.", i, ".");
    ASSIGN_OR_RETURN(L.input_norm, ld.Vec(p + "input_layernorm.weight", H));
    ASSIGN_OR_RETURN(L.post_attention_norm, ld.Vec(p + "post_attention_layernorm.weight", H));
    const std::string a = p + "self_attn.";
    if (c.q_lora_rank == 0) {
      RETURN_IF_ERROR(ld.Lin(a + "q_proj", H, heads * c.qk_head_dim(), false, &L.q_proj, true));
    } else {
      RETURN_IF_ERROR(ld.Lin(a + "q_a_proj", H, c.q_lora_rank, c.attention_bias, &L.q_a, true));
      ASSIGN_OR_RETURN(L.q_a_norm, ld.Vec(a + "q_a_layernorm.weight", c.q_lora_rank));
      RETURN_IF_ERROR(ld.Lin(a + "q_b_proj", c.q_lora_rank, heads * c.qk_head_dim(), false, &L.q_b, true));
    }
    RETURN_IF_ERROR(ld.Lin(a + "kv_a_proj_with_mqa", H, c.kv_lora_rank + c.qk_rope_head_dim,
                           c.attention_bias, &L.kv_a, true));
    ASSIGN_OR_RETURN(L.kv_a_norm, ld.Vec(a + "kv_a_layernorm.weight", c.kv_lora_rank));
    RETURN_IF_ERROR(ld.Lin(a + "kv_b_proj", c.kv_lora_rank, heads * (c.qk_nope_head_dim + c.v_head_dim),
                           false, &L.kv_b));
    RETURN_IF_ERROR(ld.Lin(a + "o_proj", heads * c.v_head_dim, H, c.attention_bias, &L.o, true));
    if (c.layers[i].indexer == IndexerMode::kFull) {
      const std::string x = a + "indexer.";
      IndexerWeights& ix = L.indexer;
      RETURN_IF_ERROR(ld.Lin(x + "wq_b", c.q_lora_rank, c.index_n_heads * c.index_head_dim, false, &ix.wq_b, true));
      RETURN_IF_ERROR(ld.Lin(x + "wk", H, c.index_head_dim, false, &ix.wk, true));
      RETURN_IF_ERROR(ld.Lin(x + "weights_proj", H, c.index_n_heads, false, &ix.weights_proj, true));
      ASSIGN_OR_RETURN(ix.k_norm_w, ld.Vec(x + "k_norm.weight", c.index_head_dim));
      ASSIGN_OR_RETURN(ix.k_norm_b, ld.Vec(x + "k_norm.bias", c.index_head_dim));
    }
    const std::string m = p + "mlp.";
    if (!c.layers[i].moe) {
      RETURN_IF_ERROR(ld.Mlp(p + "mlp", H, c.intermediate_size, &L.dense, true));
      continue;
    }
    RETURN_IF_ERROR(ld.Lin(m + "gate", H, c.n_routed_experts, false, &L.router));
    if (store.Has(m + "gate.e_score_correction_bias")) {
      ASSIGN_OR_RETURN(L.router_bias, ld.Vec(m + "gate.e_score_correction_bias", c.n_routed_experts));
    } else {
      L.router_bias.assign(c.n_routed_experts, 0.0f);
    }
    RETURN_IF_ERROR(ld.Experts(m + "experts", c.n_routed_experts, H, c.moe_intermediate_size, &L.experts));
    if (c.n_shared_experts > 0) {
      RETURN_IF_ERROR(
          ld.Mlp(m + "shared_experts", H, c.moe_intermediate_size * c.n_shared_experts, &L.shared, true));
    }
  }
  return w;
}

}  // namespace strata
