#include "model/random_model.h"

#include <cstring>
#include <functional>
#include <fstream>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/config.h"
#include "model/safetensors_writer.h"

namespace strata {
namespace {

// Collects a checkpoint's tensors: with values drawn (WriteRandomModel), or
// names and shapes only (CheckpointTensorShapes).
class Builder {
 public:
  Builder(uint64_t seed, bool draw) : seed_(seed), draw_(draw) {}

  // Gaussian values of standard deviation `std` around `mean`. Each tensor
  // draws from its own stream (seed, name), so a tensor has the same values
  // in every config that contains it.
  std::vector<float> Draw(const std::string& name, int64_t n, float std, float mean = 0.0f) {
    std::mt19937_64 rng(seed_ ^ std::hash<std::string>{}(name));
    std::normal_distribution<float> dist(mean, std);
    std::vector<float> v(n);
    for (auto& x : v) x = dist(rng);
    return v;
  }
  void Add(const std::string& name, std::vector<int64_t> shape, float std, float mean = 0.0f) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    if (!draw_) {
      shapes_.emplace_back(name, std::move(shape));
      return;
    }
    Put(name, std::move(shape), Draw(name, n, std, mean));
  }
  void Put(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& v) {
    TensorToWrite t;
    t.name = name;
    t.dtype = DType::kF32;
    t.shape = std::move(shape);
    t.data.resize(v.size() * sizeof(float));
    std::memcpy(t.data.data(), v.data(), t.data.size());
    tensors_.push_back(std::move(t));
  }
  void Linear(const std::string& prefix, int in, int out, bool bias = false) {
    Add(prefix + ".weight", {out, in}, 1.0f / std::sqrt(static_cast<float>(in)));
    if (bias) Add(prefix + ".bias", {out}, 0.1f);
  }
  void Norm(const std::string& name, int n) { Add(name, {n}, 0.2f, 1.0f); }
  void Mlp(const std::string& prefix, int hidden, int inter) {
    Linear(prefix + ".gate_proj", hidden, inter);
    Linear(prefix + ".up_proj", hidden, inter);
    Linear(prefix + ".down_proj", inter, hidden);
  }
  const std::vector<TensorToWrite>& tensors() const { return tensors_; }
  const std::vector<TensorShape>& shapes() const { return shapes_; }

 private:
  uint64_t seed_;
  bool draw_;
  std::vector<TensorToWrite> tensors_;
  std::vector<TensorShape> shapes_;
};

// Every tensor of a checkpoint of `c`, in the order a checkpoint lists them.
void BuildTensors(const ModelConfig& c, const RandomModelOptions& options, Builder& b) {
  const int H = c.hidden_size;
  b.Add("model.embed_tokens.weight", {c.vocab_size, H}, 1.0f);
  b.Norm("model.norm.weight", H);
  if (!c.tie_word_embeddings) b.Linear("lm_head", H, c.vocab_size);
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    b.Norm(p + "input_layernorm.weight", H);
    b.Norm(p + "post_attention_layernorm.weight", H);
    const std::string a = p + "self_attn.";
    if (c.q_lora_rank == 0) {
      b.Linear(a + "q_proj", H, c.num_heads * c.qk_head_dim());
    } else {
      b.Linear(a + "q_a_proj", H, c.q_lora_rank, c.attention_bias);
      b.Norm(a + "q_a_layernorm.weight", c.q_lora_rank);
      b.Linear(a + "q_b_proj", c.q_lora_rank, c.num_heads * c.qk_head_dim());
    }
    b.Linear(a + "kv_a_proj_with_mqa", H, c.kv_lora_rank + c.qk_rope_head_dim, c.attention_bias);
    b.Norm(a + "kv_a_layernorm.weight", c.kv_lora_rank);
    b.Linear(a + "kv_b_proj", c.kv_lora_rank, c.num_heads * (c.qk_nope_head_dim + c.v_head_dim));
    b.Linear(a + "o_proj", c.num_heads * c.v_head_dim, H, c.attention_bias);
    if (c.has_dsa) {  // shared layers carry indexer weights too, as checkpoints do
      b.Linear(a + "indexer.wq_b", c.q_lora_rank, c.index_n_heads * c.index_head_dim);
      b.Linear(a + "indexer.wk", H, c.index_head_dim);
      b.Linear(a + "indexer.weights_proj", H, c.index_n_heads);
      b.Norm(a + "indexer.k_norm.weight", c.index_head_dim);
      b.Add(a + "indexer.k_norm.bias", {c.index_head_dim}, 0.1f);
    }
    if (!c.layers[i].moe) {
      b.Mlp(p + "mlp", H, c.intermediate_size);
      continue;
    }
    b.Linear(p + "mlp.gate", H, c.n_routed_experts);
    b.Add(p + "mlp.gate.e_score_correction_bias", {c.n_routed_experts}, 0.05f);
    const int I = c.moe_intermediate_size;
    if (options.fused_experts) {  // (WriteRandomModel only)
      // The values the per-expert layout would hold, packed [E, 2I, H] and [E, H, I].
      std::vector<float> gate_up, down;
      const float sh = 1.0f / std::sqrt(static_cast<float>(H)), si = 1.0f / std::sqrt(static_cast<float>(I));
      for (int e = 0; e < c.n_routed_experts; ++e) {
        const std::string x = absl::StrCat(p, "mlp.experts.", e);
        for (const char* part : {".gate_proj.weight", ".up_proj.weight"}) {
          auto v = b.Draw(x + part, static_cast<int64_t>(I) * H, sh);
          gate_up.insert(gate_up.end(), v.begin(), v.end());
        }
        auto d = b.Draw(x + ".down_proj.weight", static_cast<int64_t>(H) * I, si);
        down.insert(down.end(), d.begin(), d.end());
      }
      b.Put(p + "mlp.experts.gate_up_proj", {c.n_routed_experts, 2 * I, H}, gate_up);
      b.Put(p + "mlp.experts.down_proj", {c.n_routed_experts, H, I}, down);
    } else {
      for (int e = 0; e < c.n_routed_experts; ++e) b.Mlp(absl::StrCat(p, "mlp.experts.", e), H, I);
    }
    if (c.n_shared_experts > 0) b.Mlp(p + "mlp.shared_experts", H, I * c.n_shared_experts);
  }
}

}  // namespace

std::vector<TensorShape> CheckpointTensorShapes(const ModelConfig& config) {
  Builder b(0, /*draw=*/false);
  BuildTensors(config, RandomModelOptions{}, b);
  return b.shapes();
}

absl::Status WriteRandomModel(const std::string& dir, const std::string& config_json,
                              const RandomModelOptions& options) {
  ASSIGN_OR_RETURN(ModelConfig c, ParseModelConfig(config_json));
  Builder b(options.seed, /*draw=*/true);
  BuildTensors(c, options, b);
  RETURN_IF_ERROR(WriteSafetensors(dir + "/model.safetensors", b.tensors()));
  std::ofstream out(dir + "/config.json", std::ios::binary | std::ios::trunc);
  out << config_json;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat(dir, "/config.json: write failed"));
  return absl::OkStatus();
}

}  // namespace strata
