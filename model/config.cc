#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace strata {
namespace {

using json = nlohmann::json;

absl::Status Bad(std::string_view field, std::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("config.json: field '", std::string(field), "' ", std::string(why)));
}

std::string Show(const json& v) {
  std::string s = v.dump();
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

// Reads an integer field. `required` fields must exist; a null value counts
// as absent. The value must lie in [lo, hi].
absl::StatusOr<int64_t> GetInt(const json& j, std::string_view field, int64_t def, bool required,
                               int64_t lo, int64_t hi) {
  auto it = j.find(std::string(field));
  if (it == j.end() || it->is_null()) {
    if (required) return Bad(field, "is required");
    return def;
  }
  int64_t v;
  if (it->is_number_integer() || it->is_number_unsigned()) {
    v = it->get<int64_t>();
  } else if (it->is_number_float() && std::floor(it->get<double>()) == it->get<double>() &&
             std::fabs(it->get<double>()) < 9e15) {
    v = static_cast<int64_t>(it->get<double>());
  } else {
    return Bad(field, absl::StrCat("must be an integer, got ", Show(*it)));
  }
  if (v < lo || v > hi) {
    return Bad(field, absl::StrCat("must be in [", lo, ", ", hi, "], got ", v));
  }
  return v;
}

absl::StatusOr<double> GetDouble(const json& j, std::string_view field, double def) {
  auto it = j.find(std::string(field));
  if (it == j.end() || it->is_null()) return def;
  if (!it->is_number()) return Bad(field, absl::StrCat("must be a number, got ", Show(*it)));
  double v = it->get<double>();
  if (!std::isfinite(v)) return Bad(field, "must be finite");
  return v;
}

absl::StatusOr<bool> GetBool(const json& j, std::string_view field, bool def) {
  auto it = j.find(std::string(field));
  if (it == j.end() || it->is_null()) return def;
  if (!it->is_boolean()) return Bad(field, absl::StrCat("must be true or false, got ", Show(*it)));
  return it->get<bool>();
}

// An int, a list of ints, or null.
absl::Status AppendIds(const json& j, std::string_view field, std::vector<int>* out) {
  auto it = j.find(std::string(field));
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  auto one = [&](const json& v) -> absl::Status {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > (1 << 30)) {
      return Bad(field, absl::StrCat("must be a token id or a list of token ids, got ", Show(*it)));
    }
    out->push_back(static_cast<int>(v.get<int64_t>()));
    return absl::OkStatus();
  };
  if (it->is_array()) {
    for (const auto& v : *it) RETURN_IF_ERROR(one(v));
    return absl::OkStatus();
  }
  return one(*it);
}

double YarnGetMscale(double scale, double mscale) {
  if (scale <= 1.0) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

absl::Status ParseRope(const json& j, ModelConfig* c) {
  const json* params = nullptr;
  std::string where;
  // rope_scaling (the legacy name) wins when both are present, as in transformers.
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    auto it = j.find(key);
    if (it != j.end() && !it->is_null() && !(it->is_object() && it->empty())) {
      if (!it->is_object()) return Bad(key, absl::StrCat("must be an object, got ", Show(*it)));
      params = &*it;
      where = key;
      break;
    }
  }
  RopeConfig& r = c->rope;
  ASSIGN_OR_RETURN(r.theta, GetDouble(j, "rope_theta", 10000.0));
  std::string type = "default";
  if (params != nullptr) {
    ASSIGN_OR_RETURN(r.theta, GetDouble(*params, "rope_theta", r.theta));
    for (const char* key : {"rope_type", "type"}) {
      auto it = params->find(key);
      if (it != params->end() && !it->is_null()) {
        if (!it->is_string()) return Bad(absl::StrCat(where, ".", key), "must be a string");
        type = it->get<std::string>();
        break;
      }
    }
  }
  if (!(r.theta > 0)) return Bad("rope_theta", absl::StrCat("must be positive, got ", r.theta));
  if (type == "default") {
    r.yarn = false;
  } else if (type == "yarn") {
    r.yarn = true;
    const json& p = *params;
    ASSIGN_OR_RETURN(r.factor, GetDouble(p, "factor", 1.0));
    if (!(r.factor > 0.0)) return Bad(where + ".factor", absl::StrCat("must be positive, got ", r.factor));
    ASSIGN_OR_RETURN(r.beta_fast, GetDouble(p, "beta_fast", 0.0));
    ASSIGN_OR_RETURN(r.beta_slow, GetDouble(p, "beta_slow", 0.0));
    if (r.beta_fast == 0.0) r.beta_fast = 32.0;  // a missing or zero value means the default
    if (r.beta_slow == 0.0) r.beta_slow = 1.0;
    ASSIGN_OR_RETURN(r.mscale, GetDouble(p, "mscale", 0.0));
    ASSIGN_OR_RETURN(r.mscale_all_dim, GetDouble(p, "mscale_all_dim", 0.0));
    ASSIGN_OR_RETURN(bool truncate, GetBool(p, "truncate", true));
    r.truncate = truncate;
    ASSIGN_OR_RETURN(int64_t top_orig,
                     GetInt(j, "original_max_position_embeddings", c->max_position_embeddings, false, 1,
                            int64_t{1} << 40));
    ASSIGN_OR_RETURN(r.original_max_position_embeddings,
                     GetInt(p, "original_max_position_embeddings", top_orig, false, 1, int64_t{1} << 40));
    // The frequencies use `factor`; a missing factor means max / original.
    auto f = p.find("factor");
    if (f == p.end() || f->is_null()) {
      r.factor = static_cast<double>(c->max_position_embeddings) /
                 static_cast<double>(r.original_max_position_embeddings);
    }
    r.yarn_factor = r.factor;
    auto af = p.find("attention_factor");
    if (af != p.end() && !af->is_null()) {
      ASSIGN_OR_RETURN(r.attention_factor, GetDouble(p, "attention_factor", 1.0));
    } else if (r.mscale != 0.0 && r.mscale_all_dim != 0.0) {
      r.attention_factor =
          YarnGetMscale(r.yarn_factor, r.mscale) / YarnGetMscale(r.yarn_factor, r.mscale_all_dim);
    } else {
      r.attention_factor = YarnGetMscale(r.yarn_factor, 1.0);
    }
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.json: field '", where, ".rope_type' is '", type,
        "'; supported rope types are 'default' and 'yarn'"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> GetStringList(const json& j, std::string_view field,
                                                       const std::set<std::string>& allowed,
                                                       int expected_len) {
  std::vector<std::string> out;
  auto it = j.find(std::string(field));
  if (it == j.end() || it->is_null()) return out;
  if (!it->is_array()) return Bad(field, absl::StrCat("must be a list, got ", Show(*it)));
  for (const auto& v : *it) {
    if (!v.is_string() || !allowed.count(v.get<std::string>())) {
      return Bad(field, absl::StrCat("has unsupported entry ", Show(v), "; allowed: ",
                                     absl::StrJoin(allowed, ", ")));
    }
    out.push_back(v.get<std::string>());
  }
  // An MTP layer may add entries after num_hidden_layers; those are ignored.
  if (static_cast<int>(out.size()) < expected_len) {
    return Bad(field, absl::StrCat("has ", out.size(), " entries but num_hidden_layers is ",
                                   expected_len));
  }
  out.resize(expected_len);
  return out;
}

absl::Status ParseLayers(const json& j, ModelConfig* c) {
  const int n = c->num_layers;
  c->layers.assign(n, LayerSpec{});
  ASSIGN_OR_RETURN(auto mlp_types, GetStringList(j, "mlp_layer_types", {"dense", "sparse"}, n));
  ASSIGN_OR_RETURN(int64_t freq, GetInt(j, "moe_layer_freq", 1, false, 1, 1 << 20));
  if (freq != 1) return Bad("moe_layer_freq", absl::StrCat("is ", freq, "; only 1 is supported"));
  ASSIGN_OR_RETURN(int64_t first_dense, GetInt(j, "first_k_dense_replace", 3, false, 0, 1 << 20));
  if (c->family == ModelFamily::kGlm4MoeLite) first_dense = 1;  // glm4_moe_lite: one dense layer
  std::vector<bool> derived(n);
  for (int i = 0; i < n; ++i) derived[i] = c->n_routed_experts > 0 && i >= first_dense;
  if (c->family == ModelFamily::kDeepseekV3) {
    // deepseek_v3 reads only first_k_dense_replace; a contradicting list is refused.
    for (int i = 0; i < n && !mlp_types.empty(); ++i) {
      if ((mlp_types[i] == "sparse") != derived[i]) {
        return Bad("mlp_layer_types", absl::StrCat("disagrees with first_k_dense_replace (", first_dense,
                                                   ") at layer ", i, "; deepseek_v3 uses first_k_dense_replace"));
      }
    }
    mlp_types.clear();
  }
  for (int i = 0; i < n; ++i) c->layers[i].moe = mlp_types.empty() ? derived[i] : mlp_types[i] == "sparse";
  for (int i = 0; i < n; ++i) {
    if (c->layers[i].moe && c->n_routed_experts == 0) {
      return Bad("mlp_layer_types", absl::StrCat("marks layer ", i, " sparse but n_routed_experts is 0"));
    }
  }

  if (!c->has_dsa) return absl::OkStatus();
  ASSIGN_OR_RETURN(auto idx_types, GetStringList(j, "indexer_types", {"full", "shared"}, n));
  if (idx_types.empty()) {
    auto pat = j.find("index_topk_pattern");
    if (pat != j.end() && !pat->is_null()) {
      if (!pat->is_string() || pat->get<std::string>().size() < static_cast<size_t>(n)) {
        return Bad("index_topk_pattern", absl::StrCat("must be a string of F/S with one letter per layer, got ", Show(*pat)));
      }
      for (int i = 0; i < n; ++i) {
        char ch = pat->get<std::string>()[i];
        if (ch != 'F' && ch != 'S') return Bad("index_topk_pattern", absl::StrCat("has letter '", std::string(1, ch), "'; only F and S are allowed"));
        idx_types.push_back(ch == 'F' ? "full" : "shared");
      }
    } else {
      const bool glm = c->family == ModelFamily::kGlmMoeDsa;
      ASSIGN_OR_RETURN(int64_t freq, GetInt(j, "index_topk_freq", 1, false, 0, 1 << 20));
      ASSIGN_OR_RETURN(int64_t offset, GetInt(j, "index_skip_topk_offset", glm ? 2 : 0, false, 0, 1 << 20));
      freq = std::max<int64_t>(freq, 1);
      for (int i = 0; i < n; ++i) {
        idx_types.push_back(std::max<int64_t>(i - offset + 1, 0) % freq == 0 ? "full" : "shared");
      }
    }
  }
  for (int i = 0; i < n; ++i) {
    c->layers[i].indexer = idx_types[i] == "full" ? IndexerMode::kFull : IndexerMode::kShared;
  }
  if (n > 0 && c->layers[0].indexer == IndexerMode::kShared) {
    return Bad("indexer_types", "marks layer 0 'shared', but a shared layer needs a previous full layer");
  }
  return absl::OkStatus();
}

}  // namespace

int ModelConfig::num_indexer_layers() const {
  int n = 0;
  for (const auto& l : layers) n += l.indexer == IndexerMode::kFull;
  return n;
}

int ModelConfig::indexer_slot(int layer) const {
  if (layer < 0 || layer >= num_layers || layers[layer].indexer != IndexerMode::kFull) return -1;
  int slot = 0;
  for (int i = 0; i < layer; ++i) slot += layers[i].indexer == IndexerMode::kFull;
  return slot;
}

bool ModelConfig::can_cut_before(int layer) const {
  if (layer <= 0 || layer >= num_layers) return layer == 0;
  return layers[layer].indexer != IndexerMode::kShared;
}

absl::Status CheckStageRange(const ModelConfig& config, int begin, int* end) {
  if (*end < 0) *end = config.num_layers;
  if (begin < 0 || *end > config.num_layers || begin >= *end) {
    return absl::InvalidArgumentError(absl::StrCat("layer range [", begin, ", ", *end,
                                                   ") is empty or outside the model's ", config.num_layers,
                                                   " layers"));
  }
  if (!config.can_cut_before(begin)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a stage cannot start at layer ", begin,
        ": it reuses the previous layer's DSA selection (a 'shared' indexer layer)"));
  }
  return absl::OkStatus();
}

// deepseek_v4's serving view: sizes, layer count, context, token ids; every
// layer a whole pipeline unit (its window and compressors stay with it). The
// V4 engine parses and checks the rest (model/v4/config.h) when it loads.
absl::Status ParseV4ServingView(const json& j, ModelConfig* c) {
  constexpr int64_t kBig = int64_t{1} << 24;
  ASSIGN_OR_RETURN(c->vocab_size, GetInt(j, "vocab_size", 0, true, 1, int64_t{1} << 22));
  ASSIGN_OR_RETURN(c->hidden_size, GetInt(j, "hidden_size", 0, true, 1, kBig));
  ASSIGN_OR_RETURN(c->num_layers, GetInt(j, "num_hidden_layers", 0, true, 1, 4096));
  ASSIGN_OR_RETURN(c->num_heads, GetInt(j, "num_attention_heads", 0, true, 1, 4096));
  ASSIGN_OR_RETURN(c->hidden_streams, GetInt(j, "hc_mult", 4, false, 1, 64));
  ASSIGN_OR_RETURN(c->max_position_embeddings, GetInt(j, "max_position_embeddings", 1048576, false, 1, int64_t{1} << 31));
  ASSIGN_OR_RETURN(c->kv_lora_rank, GetInt(j, "head_dim", 512, false, 1, 65536));
  ASSIGN_OR_RETURN(c->index_head_dim, GetInt(j, "index_head_dim", 128, false, 0, 65536));
  c->layers.assign(static_cast<size_t>(c->num_layers), LayerSpec{true, IndexerMode::kNone});
  RETURN_IF_ERROR(AppendIds(j, "eos_token_id", &c->eos_token_ids));
  std::vector<int> bos;
  RETURN_IF_ERROR(AppendIds(j, "bos_token_id", &bos));
  c->bos_token_id = bos.empty() ? -1 : bos[0];
  std::sort(c->eos_token_ids.begin(), c->eos_token_ids.end());
  c->eos_token_ids.erase(std::unique(c->eos_token_ids.begin(), c->eos_token_ids.end()), c->eos_token_ids.end());
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> ParseModelConfig(std::string_view config_json) {
  json j = json::parse(config_json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("config.json: not a JSON object");
  }
  ModelConfig c;
  auto mt = j.find("model_type");
  if (mt == j.end() || !mt->is_string()) return Bad("model_type", "is required and must be a string");
  c.model_type = mt->get<std::string>();
  if (c.model_type == "deepseek_v3") {
    c.family = ModelFamily::kDeepseekV3;
  } else if (c.model_type == "deepseek_v32") {
    c.family = ModelFamily::kDeepseekV32;
  } else if (c.model_type == "glm_moe_dsa") {
    c.family = ModelFamily::kGlmMoeDsa;
  } else if (c.model_type == "glm4_moe_lite") {
    c.family = ModelFamily::kGlm4MoeLite;
  } else if (c.model_type == "deepseek_v4") {
    c.family = ModelFamily::kDeepseekV4;
    RETURN_IF_ERROR(ParseV4ServingView(j, &c));
    return c;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.json: field 'model_type' is '", c.model_type,
        "'; supported: deepseek_v3, deepseek_v32, glm_moe_dsa, glm4_moe_lite, deepseek_v4"));
  }
  constexpr int64_t kBig = int64_t{1} << 24;
  ASSIGN_OR_RETURN(c.vocab_size, GetInt(j, "vocab_size", 0, true, 1, int64_t{1} << 22));
  ASSIGN_OR_RETURN(c.hidden_size, GetInt(j, "hidden_size", 0, true, 1, kBig));
  ASSIGN_OR_RETURN(c.intermediate_size, GetInt(j, "intermediate_size", 0, true, 1, kBig));
  ASSIGN_OR_RETURN(c.num_layers, GetInt(j, "num_hidden_layers", 0, true, 1, 4096));
  ASSIGN_OR_RETURN(c.num_heads, GetInt(j, "num_attention_heads", 0, true, 1, 4096));
  ASSIGN_OR_RETURN(c.q_lora_rank, GetInt(j, "q_lora_rank", 0, false, 0, kBig));
  ASSIGN_OR_RETURN(c.kv_lora_rank, GetInt(j, "kv_lora_rank", 0, true, 1, kBig));
  ASSIGN_OR_RETURN(c.qk_nope_head_dim, GetInt(j, "qk_nope_head_dim", 0, true, 0, kBig));
  ASSIGN_OR_RETURN(c.qk_rope_head_dim, GetInt(j, "qk_rope_head_dim", 0, true, 2, kBig));
  ASSIGN_OR_RETURN(c.v_head_dim, GetInt(j, "v_head_dim", 0, true, 1, kBig));
  if (c.qk_rope_head_dim % 2 != 0) {
    return Bad("qk_rope_head_dim", absl::StrCat("must be even, got ", c.qk_rope_head_dim));
  }
  ASSIGN_OR_RETURN(int64_t kv_heads, GetInt(j, "num_key_value_heads", c.num_heads, false, 1, 4096));
  if (kv_heads != c.num_heads) {
    return Bad("num_key_value_heads", absl::StrCat("must equal num_attention_heads (", c.num_heads,
                                                   ") for MLA, got ", kv_heads));
  }
  ASSIGN_OR_RETURN(c.attention_bias, GetBool(j, "attention_bias", false));
  ASSIGN_OR_RETURN(c.n_routed_experts, GetInt(j, "n_routed_experts", 0, false, 0, 1 << 16));
  ASSIGN_OR_RETURN(c.moe_intermediate_size, GetInt(j, "moe_intermediate_size", 0, c.n_routed_experts > 0, 0, kBig));
  ASSIGN_OR_RETURN(c.n_shared_experts, GetInt(j, "n_shared_experts", 0, false, 0, 1 << 10));
  ASSIGN_OR_RETURN(c.num_experts_per_tok, GetInt(j, "num_experts_per_tok", 0, c.n_routed_experts > 0, 0, 1 << 16));
  ASSIGN_OR_RETURN(c.n_group, GetInt(j, "n_group", 1, false, 1, 1 << 16));
  ASSIGN_OR_RETURN(c.topk_group, GetInt(j, "topk_group", 1, false, 1, 1 << 16));
  ASSIGN_OR_RETURN(c.routed_scaling_factor, GetDouble(j, "routed_scaling_factor", 1.0));
  ASSIGN_OR_RETURN(c.norm_topk_prob, GetBool(j, "norm_topk_prob", true));
  ASSIGN_OR_RETURN(c.rms_norm_eps, GetDouble(j, "rms_norm_eps", 1e-6));
  ASSIGN_OR_RETURN(c.max_position_embeddings, GetInt(j, "max_position_embeddings", 4096, false, 1, int64_t{1} << 40));
  ASSIGN_OR_RETURN(c.tie_word_embeddings, GetBool(j, "tie_word_embeddings", false));
  if (c.n_routed_experts > 0) {
    if (c.n_routed_experts % c.n_group != 0) {
      return Bad("n_group", absl::StrCat("must divide n_routed_experts (", c.n_routed_experts, "), got ", c.n_group));
    }
    if (c.n_routed_experts / c.n_group < 2) {
      return Bad("n_group", "must leave at least 2 experts per group (groups are scored by their top-2)");
    }
    if (c.topk_group > c.n_group) {
      return Bad("topk_group", absl::StrCat("must be <= n_group (", c.n_group, "), got ", c.topk_group));
    }
    if (c.num_experts_per_tok < 1 || c.num_experts_per_tok > c.topk_group * (c.n_routed_experts / c.n_group)) {
      return Bad("num_experts_per_tok", absl::StrCat("must be in [1, experts in the chosen groups], got ",
                                                     c.num_experts_per_tok));
    }
  }
  ASSIGN_OR_RETURN(double partial_rotary, GetDouble(j, "partial_rotary_factor", 1.0));
  if (partial_rotary != 1.0) {
    return Bad("partial_rotary_factor", absl::StrCat("is ", partial_rotary, "; only 1.0 is supported"));
  }
  auto act = j.find("hidden_act");
  if (act != j.end() && !act->is_null() && (!act->is_string() || act->get<std::string>() != "silu")) {
    return Bad("hidden_act", absl::StrCat("is ", Show(*act), "; only \"silu\" is supported"));
  }
  auto sf = j.find("scoring_func");
  if (sf != j.end() && !sf->is_null() && (!sf->is_string() || sf->get<std::string>() != "sigmoid")) {
    return Bad("scoring_func", absl::StrCat("is ", Show(*sf), "; only \"sigmoid\" is supported"));
  }
  auto tm = j.find("topk_method");
  if (tm != j.end() && !tm->is_null() && (!tm->is_string() || tm->get<std::string>() != "noaux_tc")) {
    return Bad("topk_method", absl::StrCat("is ", Show(*tm), "; only \"noaux_tc\" is supported"));
  }
  auto qc = j.find("quantization_config");
  if (qc != j.end() && !qc->is_null()) {
    std::string method = qc->is_object() ? qc->value("quant_method", "") : "";
    if (method != "fp8") {
      return Bad("quantization_config.quant_method", absl::StrCat("is '", method, "'; only 'fp8' is supported"));
    }
    auto bs = qc->find("weight_block_size");
    if (bs != qc->end() && *bs != json::array({128, 128})) {
      return Bad("quantization_config.weight_block_size", absl::StrCat("is ", Show(*bs), "; only [128, 128] is supported"));
    }
  }

  RETURN_IF_ERROR(ParseRope(j, &c));
  switch (c.family) {
    case ModelFamily::kDeepseekV3: {
      ASSIGN_OR_RETURN(c.rope_interleave, GetBool(j, "rope_interleave", true));
      break;
    }
    case ModelFamily::kGlm4MoeLite: {
      ASSIGN_OR_RETURN(c.rope_interleave, GetBool(j, "rope_interleave", true));
      break;
    }
    case ModelFamily::kDeepseekV32:
      c.rope_interleave = true;
      c.has_dsa = true;
      c.indexer_rope_interleave = false;
      break;
    case ModelFamily::kGlmMoeDsa:
      c.rope_interleave = true;
      c.has_dsa = true;
      c.indexer_rope_interleave = true;
      break;
    case ModelFamily::kDeepseekV4:  // returned above (its serving view)
      break;
  }
  c.softmax_scale = 1.0 / std::sqrt(static_cast<double>(c.qk_head_dim()));
  if (c.rope.yarn && c.rope.mscale_all_dim != 0.0) {
    const double m = YarnGetMscale(c.rope.factor, c.rope.mscale_all_dim);
    c.softmax_scale *= m * m;
  }
  if (c.has_dsa) {
    ASSIGN_OR_RETURN(c.index_n_heads, GetInt(j, "index_n_heads", 0, true, 1, 4096));
    ASSIGN_OR_RETURN(c.index_head_dim, GetInt(j, "index_head_dim", 0, true, 2, kBig));
    ASSIGN_OR_RETURN(c.index_topk, GetInt(j, "index_topk", 0, true, 1, int64_t{1} << 30));
    if (c.index_head_dim < c.qk_rope_head_dim) {
      return Bad("index_head_dim", absl::StrCat("must be >= qk_rope_head_dim (", c.qk_rope_head_dim, "), got ", c.index_head_dim));
    }
    if (c.q_lora_rank == 0) {
      return Bad("q_lora_rank", absl::StrCat("must be set for ", c.model_type, " (the indexer reads the query latent)"));
    }
  }
  RETURN_IF_ERROR(ParseLayers(j, &c));
  RETURN_IF_ERROR(AppendIds(j, "eos_token_id", &c.eos_token_ids));
  std::vector<int> bos;
  RETURN_IF_ERROR(AppendIds(j, "bos_token_id", &bos));
  c.bos_token_id = bos.empty() ? -1 : bos[0];
  std::sort(c.eos_token_ids.begin(), c.eos_token_ids.end());
  c.eos_token_ids.erase(std::unique(c.eos_token_ids.begin(), c.eos_token_ids.end()), c.eos_token_ids.end());
  return c;
}

namespace {
absl::StatusOr<std::string> ReadSmallFile(const std::string& path, bool* exists) {
  std::ifstream in(path, std::ios::binary);
  *exists = static_cast<bool>(in);
  if (!in) return std::string();
  std::ostringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  if (s.size() > (64u << 20)) return absl::InvalidArgumentError(absl::StrCat(path, ": larger than 64 MiB"));
  return s;
}
}  // namespace

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& dir) {
  bool exists = false;
  const std::string path = dir + "/config.json";
  ASSIGN_OR_RETURN(std::string text, ReadSmallFile(path, &exists));
  if (!exists) return absl::NotFoundError(absl::StrCat(path, ": cannot open (is this a model directory?)"));
  auto cfg = ParseModelConfig(text);
  if (!cfg.ok()) return absl::Status(cfg.status().code(), absl::StrCat(path, ": ", cfg.status().message()));
  ASSIGN_OR_RETURN(std::string gen, ReadSmallFile(dir + "/generation_config.json", &exists));
  if (exists) {
    json g = json::parse(gen, nullptr, false);
    if (g.is_discarded() || !g.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(dir, "/generation_config.json: not a JSON object"));
    }
    auto st = AppendIds(g, "eos_token_id", &cfg->eos_token_ids);
    if (!st.ok()) return absl::InvalidArgumentError(absl::StrCat(dir, "/generation_config.json: ", st.message()));
    std::sort(cfg->eos_token_ids.begin(), cfg->eos_token_ids.end());
    cfg->eos_token_ids.erase(std::unique(cfg->eos_token_ids.begin(), cfg->eos_token_ids.end()),
                             cfg->eos_token_ids.end());
  }
  for (int id : cfg->eos_token_ids) {
    if (id >= cfg->vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(dir, ": eos_token_id ", id, " is outside the vocabulary (",
                                                     cfg->vocab_size, ")"));
    }
  }
  return cfg;
}

std::vector<float> RopeInvFreq(const RopeConfig& rope, int dim) {
  const int half = dim / 2;
  std::vector<float> inv(half);
  for (int i = 0; i < half; ++i) {
    const float pos_freq = static_cast<float>(std::pow(rope.theta, static_cast<double>(2 * i) / dim));
    inv[i] = 1.0f / pos_freq;
  }
  if (!rope.yarn) return inv;
  const double base = rope.theta;
  const double orig = static_cast<double>(rope.original_max_position_embeddings);
  auto correction_dim = [&](double rotations) {
    return (dim * std::log(orig / (rotations * 2 * M_PI))) / (2 * std::log(base));
  };
  double low = correction_dim(rope.beta_fast);
  double high = correction_dim(rope.beta_slow);
  if (rope.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;
  const float factor = static_cast<float>(rope.yarn_factor);
  for (int i = 0; i < half; ++i) {
    const float pos_freq = static_cast<float>(std::pow(rope.theta, static_cast<double>(2 * i) / dim));
    const float extrap = 1.0f / pos_freq;
    const float interp = 1.0f / (factor * pos_freq);
    float ramp = static_cast<float>((i - low) / (high - low));
    ramp = std::clamp(ramp, 0.0f, 1.0f);
    const float extrap_factor = 1.0f - ramp;
    inv[i] = interp * (1.0f - extrap_factor) + extrap * extrap_factor;
  }
  return inv;
}

}  // namespace strata
