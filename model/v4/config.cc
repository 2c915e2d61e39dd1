#include "model/v4/config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace strata::v4 {
namespace {

using json = nlohmann::json;

constexpr const char* kSliding = "sliding_attention";
constexpr const char* kCsaName = "compressed_sparse_attention";
constexpr const char* kHcaName = "heavily_compressed_attention";

absl::Status Bad(std::string_view field, std::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("config.json: field '", std::string(field), "' ", std::string(why)));
}

std::string Show(const json& v) {
  std::string s = v.dump();
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

const json* Find(const json& j, std::string_view field) {
  auto it = j.find(std::string(field));
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

// An integer field in [lo, hi]; `def` when absent (or null) unless required.
absl::StatusOr<int64_t> GetInt(const json& j, std::string_view field, int64_t def, bool required,
                               int64_t lo, int64_t hi) {
  const json* v = Find(j, field);
  if (v == nullptr) {
    if (required) return Bad(field, "is required");
    return def;
  }
  int64_t x;
  if (v->is_number_integer() || v->is_number_unsigned()) {
    x = v->get<int64_t>();
  } else if (v->is_number_float() && std::floor(v->get<double>()) == v->get<double>() &&
             std::fabs(v->get<double>()) < 9e15) {
    x = static_cast<int64_t>(v->get<double>());
  } else {
    return Bad(field, absl::StrCat("must be an integer, got ", Show(*v)));
  }
  if (x < lo || x > hi) return Bad(field, absl::StrCat("must be in [", lo, ", ", hi, "], got ", x));
  return x;
}

absl::StatusOr<double> GetDouble(const json& j, std::string_view field, double def) {
  const json* v = Find(j, field);
  if (v == nullptr) return def;
  if (!v->is_number()) return Bad(field, absl::StrCat("must be a number, got ", Show(*v)));
  const double x = v->get<double>();
  if (!std::isfinite(x)) return Bad(field, "must be finite");
  return x;
}

absl::StatusOr<bool> GetBool(const json& j, std::string_view field, bool def) {
  const json* v = Find(j, field);
  if (v == nullptr) return def;
  if (!v->is_boolean()) return Bad(field, absl::StrCat("must be true or false, got ", Show(*v)));
  return v->get<bool>();
}

// A string field that must equal `want` when present; `prefix` names the
// enclosing object in messages.
absl::Status ExpectString(const json& j, std::string_view field, std::string_view want,
                          std::string_view prefix = "") {
  const json* v = Find(j, field);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_string() || v->get<std::string>() != want) {
    return Bad(absl::StrCat(std::string(prefix), std::string(field)),
               absl::StrCat("is ", Show(*v), "; only \"", std::string(want), "\" is supported"));
  }
  return absl::OkStatus();
}

absl::Status ExpectBool(const json& j, std::string_view field, bool want) {
  ASSIGN_OR_RETURN(bool v, GetBool(j, field, want));
  if (v != want) return Bad(field, absl::StrCat("is ", v ? "true" : "false", "; only ", want ? "true" : "false",
                                                " is supported for deepseek_v4"));
  return absl::OkStatus();
}

// An int, a list of ints, or null.
absl::Status AppendIds(const json& j, std::string_view field, std::vector<int>* out) {
  const json* v = Find(j, field);
  if (v == nullptr) return absl::OkStatus();
  auto one = [&](const json& x) -> absl::Status {
    if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > (1 << 30)) {
      return Bad(field, absl::StrCat("must be a token id or a list of token ids, got ", Show(*v)));
    }
    out->push_back(static_cast<int>(x.get<int64_t>()));
    return absl::OkStatus();
  };
  if (v->is_array()) {
    for (const auto& x : *v) RETURN_IF_ERROR(one(x));
    return absl::OkStatus();
  }
  return one(*v);
}

double YarnMscale(double scale, double mscale) { return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

// One rope parameter dict (docs/model-math.md §1.2, §3.2). `where` names it in
// messages; `theta` is the base to use when the dict has none;
// `default_attention_factor_one` is V4's rule for the flat layout (the
// compress table gets attention_factor 1 unless the dict sets one).
absl::StatusOr<RopeConfig> ParseRopeDict(const json* p, const std::string& where, double theta,
                                         bool theta_required, bool default_attention_factor_one,
                                         const json& top, int64_t max_pos) {
  RopeConfig r;
  r.theta = theta;
  std::string type = "default";
  if (p != nullptr) {
    if (!p->is_object()) return Bad(where, absl::StrCat("must be an object, got ", Show(*p)));
    if (theta_required && Find(*p, "rope_theta") == nullptr) return Bad(where + ".rope_theta", "is required");
    ASSIGN_OR_RETURN(r.theta, GetDouble(*p, "rope_theta", theta));
    for (const char* key : {"rope_type", "type"}) {
      const json* t = Find(*p, key);
      if (t == nullptr) continue;
      if (!t->is_string()) return Bad(absl::StrCat(where, ".", key), "must be a string");
      type = t->get<std::string>();
      break;
    }
  }
  if (!(r.theta > 0)) return Bad(where + ".rope_theta", absl::StrCat("must be positive, got ", r.theta));
  if (type == "default") return r;
  if (type != "yarn") {
    return Bad(where + ".rope_type", absl::StrCat("is '", type, "'; supported rope types are 'default' and 'yarn'"));
  }
  const json& q = *p;
  r.yarn = true;
  ASSIGN_OR_RETURN(r.beta_fast, GetDouble(q, "beta_fast", 0.0));
  ASSIGN_OR_RETURN(r.beta_slow, GetDouble(q, "beta_slow", 0.0));
  if (r.beta_fast == 0.0) r.beta_fast = 32.0;  // a missing or zero value means the default
  if (r.beta_slow == 0.0) r.beta_slow = 1.0;
  ASSIGN_OR_RETURN(r.mscale, GetDouble(q, "mscale", 0.0));
  ASSIGN_OR_RETURN(r.mscale_all_dim, GetDouble(q, "mscale_all_dim", 0.0));
  ASSIGN_OR_RETURN(r.truncate, GetBool(q, "truncate", true));
  ASSIGN_OR_RETURN(int64_t top_orig,
                   GetInt(top, "original_max_position_embeddings", max_pos, false, 1, int64_t{1} << 40));
  ASSIGN_OR_RETURN(r.original_max_position_embeddings,
                   GetInt(q, "original_max_position_embeddings", top_orig, false, 1, int64_t{1} << 40));
  if (Find(q, "factor") == nullptr) {
    r.factor = static_cast<double>(max_pos) / static_cast<double>(r.original_max_position_embeddings);
  } else {
    ASSIGN_OR_RETURN(r.factor, GetDouble(q, "factor", 1.0));
  }
  if (!(r.factor > 0.0)) return Bad(where + ".factor", absl::StrCat("must be positive, got ", r.factor));
  r.yarn_factor = r.factor;
  if (Find(q, "attention_factor") != nullptr) {
    ASSIGN_OR_RETURN(r.attention_factor, GetDouble(q, "attention_factor", 1.0));
  } else if (default_attention_factor_one) {
    r.attention_factor = 1.0;
  } else if (r.mscale != 0.0 && r.mscale_all_dim != 0.0) {
    r.attention_factor = YarnMscale(r.factor, r.mscale) / YarnMscale(r.factor, r.mscale_all_dim);
  } else {
    r.attention_factor = YarnMscale(r.factor, 1.0);
  }
  return r;
}

absl::Status ParseRopes(const json& j, double partial_rotary, V4Config* c) {
  ASSIGN_OR_RETURN(double theta, GetDouble(j, "rope_theta", 10000.0));
  ASSIGN_OR_RETURN(double compress_theta, GetDouble(j, "compress_rope_theta", 160000.0));
  const json* params = nullptr;
  std::string where;
  // rope_scaling (the legacy name) wins when both are present, as in transformers.
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    const json* v = Find(j, key);
    if (v == nullptr || (v->is_object() && v->empty())) continue;
    if (!v->is_object()) return Bad(key, absl::StrCat("must be an object, got ", Show(*v)));
    params = v;
    where = key;
    break;
  }
  auto check_factor = [&](const json* p, const std::string& w) -> absl::Status {
    if (p == nullptr) return absl::OkStatus();
    ASSIGN_OR_RETURN(double f, GetDouble(*p, "partial_rotary_factor", partial_rotary));
    if (f != partial_rotary) {
      return Bad(w + ".partial_rotary_factor",
                 absl::StrCat("is ", f, " but the model's rotary factor is ", partial_rotary));
    }
    return absl::OkStatus();
  };
  const bool nested = params != nullptr && (params->contains("main") || params->contains("compress"));
  if (nested) {
    const json* main = Find(*params, "main");
    const json* comp = Find(*params, "compress");
    if (main == nullptr || comp == nullptr) {
      return Bad(where, "is nested by rope kind and needs both 'main' and 'compress'");
    }
    for (const auto& [key, value] : params->items()) {
      if (key != "main" && key != "compress" && value.is_object()) {
        return Bad(absl::StrCat(where, ".", key), "is not a deepseek_v4 rope kind (main, compress)");
      }
    }
    RETURN_IF_ERROR(check_factor(main, where + ".main"));
    RETURN_IF_ERROR(check_factor(comp, where + ".compress"));
    ASSIGN_OR_RETURN(c->rope_main, ParseRopeDict(main, where + ".main", theta, true, false, j,
                                                 c->max_position_embeddings));
    ASSIGN_OR_RETURN(c->rope_compress, ParseRopeDict(comp, where + ".compress", compress_theta, true, false, j,
                                                     c->max_position_embeddings));
    return absl::OkStatus();
  }
  // Flat (or absent): main is plain RoPE at rope_theta, never YaRN; compress
  // is the flat dict with compress_rope_theta as its base.
  RETURN_IF_ERROR(check_factor(params, where));
  ASSIGN_OR_RETURN(c->rope_main, ParseRopeDict(nullptr, "rope_theta", theta, false, false, j,
                                               c->max_position_embeddings));
  json comp = params != nullptr ? *params : json::object();
  comp["rope_theta"] = compress_theta;
  ASSIGN_OR_RETURN(c->rope_compress, ParseRopeDict(&comp, params != nullptr ? where : "compress_rope_theta",
                                                   compress_theta, false, true, j, c->max_position_embeddings));
  return absl::OkStatus();
}

// A list of at least n entries; the first n are returned (MTP entries follow).
absl::StatusOr<std::vector<json>> GetList(const json& j, std::string_view field, int n) {
  const json* v = Find(j, field);
  if (v == nullptr) return std::vector<json>{};
  if (!v->is_array()) return Bad(field, absl::StrCat("must be a list, got ", Show(*v)));
  if (static_cast<int>(v->size()) < n) {
    return Bad(field, absl::StrCat("has ", v->size(), " entries but num_hidden_layers is ", n));
  }
  return std::vector<json>(v->begin(), v->end());
}

absl::Status ParseCompressRates(const json& j, V4Config* c) {
  if (const json* r = Find(j, "compress_rates")) {
    if (!r->is_object()) return Bad("compress_rates", absl::StrCat("must be an object, got ", Show(*r)));
    for (const auto& [key, value] : r->items()) {
      if (key != kCsaName && key != kHcaName) {
        return Bad("compress_rates", absl::StrCat("has unknown key '", key, "'; allowed: ", kCsaName, ", ", kHcaName));
      }
    }
    for (auto [key, rate] : {std::pair{kCsaName, &c->compress_rate_csa}, std::pair{kHcaName, &c->compress_rate_hca}}) {
      const json* v = Find(*r, key);
      if (v == nullptr) continue;
      if (!v->is_number_integer() || v->get<int64_t>() < 1 || v->get<int64_t>() > (1 << 20)) {
        return Bad(absl::StrCat("compress_rates.", key), absl::StrCat("must be an integer in [1, 1048576], got ", Show(*v)));
      }
      *rate = v->get<int>();
    }
  }
  ASSIGN_OR_RETURN(c->compress_rate_csa, GetInt(j, "compress_rate_csa", c->compress_rate_csa, false, 1, 1 << 20));
  ASSIGN_OR_RETURN(c->compress_rate_hca, GetInt(j, "compress_rate_hca", c->compress_rate_hca, false, 1, 1 << 20));
  return absl::OkStatus();
}

absl::Status ParseLayerKinds(const json& j, V4Config* c) {
  const int n = c->num_layers;
  RETURN_IF_ERROR(ParseCompressRates(j, c));
  ASSIGN_OR_RETURN(auto types, GetList(j, "layer_types", n));
  ASSIGN_OR_RETURN(auto ratios, GetList(j, "compress_ratios", n));
  if (types.empty() && ratios.empty()) {
    return Bad("layer_types", "is required (or DeepSeek's compress_ratios): transformers' default layout "
                              "matches no released model");
  }
  std::vector<AttentionKind> from_types, from_ratios;
  for (size_t i = 0; i < types.size(); ++i) {
    const json& t = types[i];
    const std::string s = t.is_string() ? t.get<std::string>() : "";
    if (s == kSliding) {
      from_types.push_back(AttentionKind::kSliding);
    } else if (s == kCsaName) {
      from_types.push_back(AttentionKind::kCsa);
    } else if (s == kHcaName) {
      from_types.push_back(AttentionKind::kHca);
    } else {
      return Bad("layer_types", absl::StrCat("has unsupported entry ", Show(t), " at ", i, "; allowed: ", kSliding,
                                             ", ", kCsaName, ", ", kHcaName));
    }
  }
  for (size_t i = 0; i < ratios.size(); ++i) {
    const json& r = ratios[i];
    const int64_t v = r.is_number_integer() ? r.get<int64_t>() : -1;
    if (v == 0) {
      from_ratios.push_back(AttentionKind::kSliding);
    } else if (v == 4 || v == 128) {
      const AttentionKind kind = v == 4 ? AttentionKind::kCsa : AttentionKind::kHca;
      const int rate = v == 4 ? c->compress_rate_csa : c->compress_rate_hca;
      if (rate != v) {
        return Bad("compress_ratios", absl::StrCat("has ", v, " at ", i, " but the ", std::string(AttentionKindName(kind)),
                                                   " rate (compress_rates) is ", rate));
      }
      from_ratios.push_back(kind);
    } else {
      return Bad("compress_ratios", absl::StrCat("has unsupported entry ", Show(r), " at ", i,
                                                 "; allowed: 0 (sliding), 4 (CSA), 128 (HCA)"));
    }
  }
  for (int i = 0; i < n && !from_types.empty() && !from_ratios.empty(); ++i) {
    if (from_types[i] != from_ratios[i]) {
      return Bad("compress_ratios", absl::StrCat("disagrees with layer_types at layer ", i));
    }
  }
  const std::vector<AttentionKind>& kinds = from_types.empty() ? from_ratios : from_types;
  c->layers.assign(n, V4LayerSpec{});
  for (int i = 0; i < n; ++i) {
    V4LayerSpec& l = c->layers[i];
    l.attention = kinds[i];
    l.compress_rate = kinds[i] == AttentionKind::kCsa   ? c->compress_rate_csa
                      : kinds[i] == AttentionKind::kHca ? c->compress_rate_hca
                                                        : 0;
  }

  ASSIGN_OR_RETURN(auto mlp, GetList(j, "mlp_layer_types", n));
  const bool has_hash_count = Find(j, "num_hash_layers") != nullptr;
  ASSIGN_OR_RETURN(int64_t num_hash, GetInt(j, "num_hash_layers", 3, false, 0, 1 << 20));
  for (int i = 0; i < n; ++i) {
    MlpKind kind = i < num_hash ? MlpKind::kHashMoe : MlpKind::kMoe;
    if (!mlp.empty()) {
      const std::string s = mlp[i].is_string() ? mlp[i].get<std::string>() : "";
      if (s != "hash_moe" && s != "moe") {
        return Bad("mlp_layer_types", absl::StrCat("has unsupported entry ", Show(mlp[i]), " at ", i,
                                                   "; allowed: hash_moe, moe"));
      }
      const MlpKind listed = s == "hash_moe" ? MlpKind::kHashMoe : MlpKind::kMoe;
      if (has_hash_count && listed != kind) {
        return Bad("mlp_layer_types", absl::StrCat("disagrees with num_hash_layers (", num_hash, ") at layer ", i));
      }
      kind = listed;
    }
    c->layers[i].mlp = kind;
  }
  return absl::OkStatus();
}

absl::Status ParseQuantization(const json& j, V4Config* c) {
  if (const json* q = Find(j, "quantization_config")) {
    if (!q->is_object()) return Bad("quantization_config", absl::StrCat("must be an object, got ", Show(*q)));
    const json* m = Find(*q, "quant_method");
    if (m == nullptr || !m->is_string() || m->get<std::string>() != "fp8") {
      return Bad("quantization_config.quant_method",
                 absl::StrCat("is ", m == nullptr ? "absent" : Show(*m), "; only \"fp8\" is supported"));
    }
    RETURN_IF_ERROR(ExpectString(*q, "fmt", "e4m3", "quantization_config."));
    RETURN_IF_ERROR(ExpectString(*q, "scale_fmt", "ue8m0", "quantization_config."));
    if (const json* bs = Find(*q, "weight_block_size"); bs != nullptr && *bs != json::array({128, 128})) {
      return Bad("quantization_config.weight_block_size", absl::StrCat("is ", Show(*bs), "; only [128, 128] is supported"));
    }
    c->fp8_weights = true;
  }
  const json* e = Find(j, "expert_dtype");
  if (e == nullptr) {
    c->expert_format = c->fp8_weights ? ExpertFormat::kFp8 : ExpertFormat::kFloat;
    return absl::OkStatus();
  }
  const std::string s = e->is_string() ? e->get<std::string>() : "";
  if (s == "fp4" || s == "fp8") {
    if (!c->fp8_weights) return Bad("expert_dtype", absl::StrCat("is \"", s, "\" but there is no quantization_config"));
    c->expert_format = s == "fp4" ? ExpertFormat::kFp4 : ExpertFormat::kFp8;
  } else if (s == "bf16" || s == "float32" || s == "bfloat16") {
    c->expert_format = ExpertFormat::kFloat;
  } else {
    return Bad("expert_dtype", absl::StrCat("is ", Show(*e), "; supported: \"fp4\", \"fp8\", \"bf16\""));
  }
  return absl::OkStatus();
}

}  // namespace

std::string_view AttentionKindName(AttentionKind kind) {
  switch (kind) {
    case AttentionKind::kSliding:
      return kSliding;
    case AttentionKind::kCsa:
      return kCsaName;
    case AttentionKind::kHca:
      return kHcaName;
  }
  return "?";
}

absl::StatusOr<V4Config> ParseV4Config(std::string_view config_json) {
  json j = json::parse(config_json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError("config.json: not a JSON object");
  V4Config c;
  const json* mt = Find(j, "model_type");
  if (mt == nullptr || !mt->is_string()) return Bad("model_type", "is required and must be a string");
  c.model_type = mt->get<std::string>();
  if (c.model_type != "deepseek_v4") {
    return Bad("model_type", absl::StrCat("is '", c.model_type, "'; this parser reads deepseek_v4 only"));
  }
  constexpr int64_t kBig = int64_t{1} << 24;
  ASSIGN_OR_RETURN(c.vocab_size, GetInt(j, "vocab_size", 0, true, 1, int64_t{1} << 22));
  ASSIGN_OR_RETURN(c.hidden_size, GetInt(j, "hidden_size", 0, true, 1, kBig));
  ASSIGN_OR_RETURN(c.num_layers, GetInt(j, "num_hidden_layers", 0, true, 1, 4096));
  ASSIGN_OR_RETURN(c.num_heads, GetInt(j, "num_attention_heads", 0, true, 1, 4096));
  ASSIGN_OR_RETURN(int64_t kv_heads, GetInt(j, "num_key_value_heads", 1, false, 1, 4096));
  if (kv_heads != 1) return Bad("num_key_value_heads", absl::StrCat("must be 1 (one shared K=V head), got ", kv_heads));
  ASSIGN_OR_RETURN(c.head_dim, GetInt(j, "head_dim", 0, true, 2, 1 << 16));
  ASSIGN_OR_RETURN(c.q_lora_rank, GetInt(j, "q_lora_rank", 0, true, 1, kBig));
  ASSIGN_OR_RETURN(c.o_groups, GetInt(j, "o_groups", 0, true, 1, 4096));
  ASSIGN_OR_RETURN(c.o_lora_rank, GetInt(j, "o_lora_rank", 0, true, 1, kBig));
  if (c.num_heads % c.o_groups != 0) {
    return Bad("o_groups", absl::StrCat("must divide num_attention_heads (", c.num_heads, "), got ", c.o_groups));
  }
  ASSIGN_OR_RETURN(c.sliding_window, GetInt(j, "sliding_window", 0, true, 1, int64_t{1} << 30));
  ASSIGN_OR_RETURN(c.hc_mult, GetInt(j, "hc_mult", 4, false, 1, 64));
  ASSIGN_OR_RETURN(c.hc_sinkhorn_iters, GetInt(j, "hc_sinkhorn_iters", 20, false, 1, 1000));
  ASSIGN_OR_RETURN(c.hc_eps, GetDouble(j, "hc_eps", 1e-6));
  ASSIGN_OR_RETURN(c.rms_norm_eps, GetDouble(j, "rms_norm_eps", 1e-6));
  if (c.hc_eps < 0) return Bad("hc_eps", "must not be negative");
  if (c.rms_norm_eps < 0) return Bad("rms_norm_eps", "must not be negative");
  ASSIGN_OR_RETURN(c.max_position_embeddings,
                   GetInt(j, "max_position_embeddings", 1048576, false, 1, int64_t{1} << 40));

  // Experts: n_routed_experts (alias num_local_experts), moe_intermediate_size (alias intermediate_size).
  const bool has_e = Find(j, "n_routed_experts") != nullptr, has_local = Find(j, "num_local_experts") != nullptr;
  ASSIGN_OR_RETURN(c.n_routed_experts, GetInt(j, has_e ? "n_routed_experts" : "num_local_experts", 0, true, 1, 1 << 16));
  if (has_e && has_local) {
    ASSIGN_OR_RETURN(int64_t alias, GetInt(j, "num_local_experts", 0, true, 1, 1 << 16));
    if (alias != c.n_routed_experts) return Bad("num_local_experts", "disagrees with n_routed_experts");
  }
  const bool has_moe_i = Find(j, "moe_intermediate_size") != nullptr;
  ASSIGN_OR_RETURN(c.moe_intermediate_size,
                   GetInt(j, has_moe_i ? "moe_intermediate_size" : "intermediate_size", 0, true, 1, kBig));
  if (has_moe_i && Find(j, "intermediate_size") != nullptr) {
    ASSIGN_OR_RETURN(int64_t alias, GetInt(j, "intermediate_size", 0, true, 1, kBig));
    if (alias != c.moe_intermediate_size) return Bad("intermediate_size", "disagrees with moe_intermediate_size");
  }
  ASSIGN_OR_RETURN(c.num_experts_per_tok, GetInt(j, "num_experts_per_tok", 0, true, 1, c.n_routed_experts));
  ASSIGN_OR_RETURN(int64_t shared, GetInt(j, "n_shared_experts", 1, false, 0, 1 << 10));
  if (shared != 1) return Bad("n_shared_experts", absl::StrCat("must be 1 (the modeling code builds one), got ", shared));
  ASSIGN_OR_RETURN(c.routed_scaling_factor, GetDouble(j, "routed_scaling_factor", 1.5));
  ASSIGN_OR_RETURN(c.swiglu_limit, GetDouble(j, "swiglu_limit", 10.0));
  if (!(c.swiglu_limit > 0)) return Bad("swiglu_limit", absl::StrCat("must be positive, got ", c.swiglu_limit));
  RETURN_IF_ERROR(ExpectString(j, "scoring_func", "sqrtsoftplus"));
  RETURN_IF_ERROR(ExpectString(j, "hidden_act", "silu"));
  RETURN_IF_ERROR(ExpectString(j, "topk_method", "noaux_tc"));
  RETURN_IF_ERROR(ExpectBool(j, "norm_topk_prob", true));
  RETURN_IF_ERROR(ExpectBool(j, "attention_bias", false));
  RETURN_IF_ERROR(ExpectBool(j, "mlp_bias", false));
  RETURN_IF_ERROR(ExpectBool(j, "tie_word_embeddings", false));

  // Rotated width: partial_rotary_factor, or DeepSeek's qk_rope_head_dim.
  const json* prf = Find(j, "partial_rotary_factor");
  const json* qkr = Find(j, "qk_rope_head_dim");
  double factor = 64.0 / 512.0;
  if (prf != nullptr) {
    ASSIGN_OR_RETURN(factor, GetDouble(j, "partial_rotary_factor", factor));
    if (!(factor > 0 && factor <= 1)) return Bad("partial_rotary_factor", absl::StrCat("must be in (0, 1], got ", factor));
  }
  c.rope_dim = static_cast<int>(c.head_dim * factor);  // int(head_dim * factor), as transformers
  if (qkr != nullptr) {
    ASSIGN_OR_RETURN(int64_t r, GetInt(j, "qk_rope_head_dim", 0, true, 2, c.head_dim));
    if (prf != nullptr && r != c.rope_dim) {
      return Bad("qk_rope_head_dim", absl::StrCat("is ", r, " but head_dim * partial_rotary_factor is ", c.rope_dim));
    }
    c.rope_dim = static_cast<int>(r);
    factor = static_cast<double>(r) / c.head_dim;
  }
  if (c.rope_dim < 2 || c.rope_dim % 2 != 0 || c.rope_dim > c.head_dim) {
    return Bad("partial_rotary_factor", absl::StrCat("gives ", c.rope_dim, " rotated dims; need an even number in [2, ",
                                                     c.head_dim, "]"));
  }
  c.softmax_scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  RETURN_IF_ERROR(ParseRopes(j, factor, &c));
  RETURN_IF_ERROR(ParseLayerKinds(j, &c));

  const bool any_csa = std::any_of(c.layers.begin(), c.layers.end(),
                                   [](const V4LayerSpec& l) { return l.attention == AttentionKind::kCsa; });
  ASSIGN_OR_RETURN(c.index_n_heads, GetInt(j, "index_n_heads", 0, any_csa, 1, 4096));
  ASSIGN_OR_RETURN(c.index_head_dim, GetInt(j, "index_head_dim", 0, any_csa, 2, 1 << 16));
  ASSIGN_OR_RETURN(c.index_topk, GetInt(j, "index_topk", 0, any_csa, 1, int64_t{1} << 30));
  if (any_csa && c.index_head_dim < c.rope_dim) {
    return Bad("index_head_dim", absl::StrCat("must be >= the rotated width (", c.rope_dim, "), got ", c.index_head_dim));
  }
  RETURN_IF_ERROR(ParseQuantization(j, &c));
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

absl::StatusOr<std::string> ReadModelType(const std::string& dir) {
  bool exists = false;
  const std::string path = dir + "/config.json";
  ASSIGN_OR_RETURN(std::string text, ReadSmallFile(path, &exists));
  if (!exists) return absl::NotFoundError(absl::StrCat(path, ": cannot open (is this a model directory?)"));
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  const json* mt = Find(j, "model_type");
  return mt != nullptr && mt->is_string() ? mt->get<std::string>() : std::string();
}

absl::StatusOr<V4Config> LoadV4Config(const std::string& dir) {
  bool exists = false;
  const std::string path = dir + "/config.json";
  ASSIGN_OR_RETURN(std::string text, ReadSmallFile(path, &exists));
  if (!exists) return absl::NotFoundError(absl::StrCat(path, ": cannot open (is this a model directory?)"));
  auto cfg = ParseV4Config(text);
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
      return absl::InvalidArgumentError(
          absl::StrCat(dir, ": eos_token_id ", id, " is outside the vocabulary (", cfg->vocab_size, ")"));
    }
  }
  return cfg;
}

}  // namespace strata::v4
