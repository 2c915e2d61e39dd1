#include "model/v4/weights.h"

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "model/v4/quant.h"

namespace strata::v4 {
namespace {

std::string Shape(absl::Span<const int64_t> s) { return ShapeString(s); }

// How a linear weight may be stored.
enum class Allow { kFloatOrFp8, kExpert };

class Loader {
 public:
  Loader(const TensorStore& store, const V4Config& config, V4Weights* out)
      : store_(store), c_(config), out_(out) {}

  // The first of `names` the checkpoint holds; NOT_FOUND naming them all.
  absl::StatusOr<std::string> Resolve(const std::vector<std::string>& names) const {
    for (const std::string& n : names) {
      if (store_.Has(n)) return n;
    }
    return absl::NotFoundError(absl::StrCat(store_.dir(), ": no tensor \"", names[0], "\"",
                                            names.size() > 1 ? absl::StrCat(" (nor \"", absl::StrJoin(
                                                names.begin() + 1, names.end(), "\", \""), "\")") : ""));
  }

  // An error about tensor `name`'s contents, naming its file.
  absl::Status Invalid(const std::string& name, absl::string_view what) const {
    auto path = store_.PathOf(name);
    return absl::InvalidArgumentError(
        absl::StrCat(path.ok() ? *path : store_.dir(), ": tensor \"", name, "\": ", what));
  }

  // A decoding error of a quantised weight, naming it and its scales.
  absl::Status Corrupt(const std::string& name, const std::string& scale_name, const absl::Status& st) const {
    return Invalid(name, absl::StrCat(st.message(), " (block scales \"", scale_name, "\")"));
  }

  // A float tensor (F32, BF16, F16) of exactly `shape`.
  absl::StatusOr<std::vector<float>> Float(const std::vector<std::string>& names, std::vector<int64_t> shape) {
    ASSIGN_OR_RETURN(std::string name, Resolve(names));
    ASSIGN_OR_RETURN(TensorInfo info, store_.Info(name));
    if (!DTypeIsFloat(info.dtype) || info.dtype == DType::kF8E4M3) {
      return Invalid(name, absl::StrCat("dtype ", std::string(DTypeName(info.dtype)), " is not allowed here (F32, BF16 or F16)"));
    }
    ASSIGN_OR_RETURN(auto v, store_.ReadF32(name, shape));
    out_->bytes += v.size() * sizeof(float);
    return v;
  }

  // A linear weight [out, in]: float, FP8 + E8M0 blocks, or (experts) FP4.
  absl::Status Linear(const std::vector<std::string>& bases, int in, int out, Allow allow, LinearWeights* lw) {
    std::vector<std::string> names;
    for (const std::string& b : bases) names.push_back(b + ".weight");
    ASSIGN_OR_RETURN(std::string name, Resolve(names));
    const std::string scale_name = name.substr(0, name.size() - std::string_view(".weight").size()) + ".scale";
    ASSIGN_OR_RETURN(TensorInfo info, store_.Info(name));
    lw->in = in;
    lw->out = out;
    lw->w.assign(static_cast<size_t>(in) * out, 0.0f);
    const bool expert = allow == Allow::kExpert;
    if (expert && c_.expert_format == ExpertFormat::kFp4 && info.dtype != DType::kI8) {
      return Invalid(name, absl::StrCat("is ", std::string(DTypeName(info.dtype)), " but expert_dtype is \"fp4\" (packed I8 expected)"));
    }
    if (info.dtype == DType::kF8E4M3) {
      if (!c_.fp8_weights) return Invalid(name, "is F8_E4M3 but config.json has no quantization_config");
      if (info.shape != std::vector<int64_t>{out, in}) {
        return Invalid(name, absl::StrCat("expected shape ", Shape({out, in}), ", found ", Shape(info.shape)));
      }
      const int64_t sr = (out + kFp8Block - 1) / kFp8Block, sc = (in + kFp8Block - 1) / kFp8Block;
      ASSIGN_OR_RETURN(auto scales, Scales(name, scale_name, {sr, sc}));
      ASSIGN_OR_RETURN(auto codes, store_.ReadRaw(name));
      if (auto st = DequantFp8Blocks(codes, out, in, scales, lw->w.data()); !st.ok()) return Corrupt(name, scale_name, st);
    } else if (info.dtype == DType::kI8) {
      if (!expert || c_.expert_format != ExpertFormat::kFp4) {
        return Invalid(name, "is I8 (packed FP4), which only routed experts of an expert_dtype \"fp4\" checkpoint may be");
      }
      if (in % kFp4Group != 0) return Invalid(name, absl::StrCat("FP4 needs a multiple of 32 input columns, not ", in));
      if (info.shape != std::vector<int64_t>{out, in / 2}) {
        return Invalid(name, absl::StrCat("expected packed shape ", Shape({out, in / 2}), ", found ", Shape(info.shape)));
      }
      ASSIGN_OR_RETURN(auto scales, Scales(name, scale_name, {out, in / kFp4Group}));
      ASSIGN_OR_RETURN(auto packed, store_.ReadRaw(name));
      if (auto st = DequantFp4Rows(packed, out, in, scales, lw->w.data()); !st.ok()) return Corrupt(name, scale_name, st);
    } else {
      if (!DTypeIsFloat(info.dtype)) {
        return Invalid(name, absl::StrCat("dtype ", std::string(DTypeName(info.dtype)), " is not a weight dtype"));
      }
      if (store_.Has(scale_name)) return Invalid(scale_name, absl::StrCat("scales a ", std::string(DTypeName(info.dtype)), " weight"));
      const int64_t shape[] = {out, in};
      ASSIGN_OR_RETURN(lw->w, store_.ReadF32(name, shape));
    }
    out_->bytes += lw->w.size() * sizeof(float);
    return absl::OkStatus();
  }

  // The E8M0 companion of a quantised weight.
  absl::StatusOr<absl::Span<const uint8_t>> Scales(const std::string& weight, const std::string& scale,
                                                    std::vector<int64_t> shape) {
    if (!store_.Has(scale)) return absl::NotFoundError(absl::StrCat(store_.dir(), ": no tensor \"", scale,
                                                                    "\" (the block scales of \"", weight, "\")"));
    ASSIGN_OR_RETURN(TensorInfo info, store_.Info(scale));
    if (info.dtype != DType::kF8E8M0) {
      return Invalid(scale, absl::StrCat("block scales must be F8_E8M0, not ", std::string(DTypeName(info.dtype))));
    }
    if (info.shape != shape) {
      return Invalid(scale, absl::StrCat("expected shape ", Shape(shape), ", found ", Shape(info.shape)));
    }
    return store_.ReadRaw(scale);
  }

  absl::Status Hyper(const std::string& p, const std::string& which, HyperWeights* h) {
    const int n = c_.hc_mult, H = c_.hidden_size, m = (2 + n) * n;
    ASSIGN_OR_RETURN(h->fn, Float({p + "hc_" + which + "_fn"}, {m, int64_t{n} * H}));
    ASSIGN_OR_RETURN(h->base, Float({p + "hc_" + which + "_base"}, {m}));
    ASSIGN_OR_RETURN(h->scale, Float({p + "hc_" + which + "_scale"}, {3}));
    return absl::OkStatus();
  }

  absl::Status Compressor(const std::string& p, int width, int c, int m, CompressorWeights* w) {
    RETURN_IF_ERROR(Linear({p + "wkv"}, c_.hidden_size, c * width, Allow::kFloatOrFp8, &w->kv));
    RETURN_IF_ERROR(Linear({p + "wgate"}, c_.hidden_size, c * width, Allow::kFloatOrFp8, &w->gate));
    ASSIGN_OR_RETURN(w->position_bias, Float({p + "ape"}, {m, int64_t{c} * width}));
    ASSIGN_OR_RETURN(w->norm, Float({p + "norm.weight"}, {width}));
    return absl::OkStatus();
  }

  absl::Status Tid2Eid(const std::string& name, std::vector<int32_t>* out) {
    ASSIGN_OR_RETURN(TensorInfo info, store_.Info(name));
    const int V = c_.vocab_size, K = c_.num_experts_per_tok;
    if (info.shape != std::vector<int64_t>{V, K}) {
      return Invalid(name, absl::StrCat("expected shape ", Shape({V, K}), ", found ", Shape(info.shape)));
    }
    ASSIGN_OR_RETURN(auto raw, store_.ReadRaw(name));
    out->resize(static_cast<size_t>(V) * K);
    for (size_t i = 0; i < out->size(); ++i) {
      int64_t v;
      switch (info.dtype) {
        case DType::kI64: {
          std::memcpy(&v, raw.data() + 8 * i, 8);
          break;
        }
        case DType::kI32: {
          int32_t x;
          std::memcpy(&x, raw.data() + 4 * i, 4);
          v = x;
          break;
        }
        case DType::kU8:
          v = raw[i];
          break;
        case DType::kI8:
          v = static_cast<int8_t>(raw[i]);
          break;
        default:
          return Invalid(name, absl::StrCat("dtype ", std::string(DTypeName(info.dtype)), " is not an integer type"));
      }
      if (v < 0 || v >= c_.n_routed_experts) {
        return Invalid(name, absl::StrCat("token ", i / K, " maps to expert ", v, ", outside [0, ",
                                          c_.n_routed_experts, ")"));
      }
      (*out)[i] = static_cast<int32_t>(v);
    }
    return absl::OkStatus();
  }

  absl::Status Layer(int l, V4LayerWeights* L) {
    const V4LayerSpec& spec = c_.layers[l];
    const int H = c_.hidden_size, d = c_.head_dim, nh = c_.num_heads, Q = c_.q_lora_rank;
    const int G = c_.o_groups, R = c_.o_lora_rank, E = c_.n_routed_experts, I = c_.moe_intermediate_size;
    // The layer prefix: transformers' (model.layers.l.) or the release's (layers.l.).
    const std::string tf = absl::StrCat("model.layers.", l, "."), ds = absl::StrCat("layers.", l, ".");
    const std::string p = store_.Has(tf + "attn_norm.weight") || !store_.Has(ds + "attn_norm.weight") ? tf : ds;
    ASSIGN_OR_RETURN(L->attn_norm, Float({p + "attn_norm.weight"}, {H}));
    ASSIGN_OR_RETURN(L->ffn_norm, Float({p + "ffn_norm.weight"}, {H}));
    RETURN_IF_ERROR(Hyper(p, "attn", &L->hc_attn));
    RETURN_IF_ERROR(Hyper(p, "ffn", &L->hc_ffn));
    const std::string a = p + "attn.";
    RETURN_IF_ERROR(Linear({a + "wq_a"}, H, Q, Allow::kFloatOrFp8, &L->q_a));
    ASSIGN_OR_RETURN(L->q_norm, Float({a + "q_norm.weight"}, {Q}));
    RETURN_IF_ERROR(Linear({a + "wq_b"}, Q, nh * d, Allow::kFloatOrFp8, &L->q_b));
    RETURN_IF_ERROR(Linear({a + "wkv"}, H, d, Allow::kFloatOrFp8, &L->kv));
    ASSIGN_OR_RETURN(L->kv_norm, Float({a + "kv_norm.weight", a + "norm.weight"}, {d}));
    RETURN_IF_ERROR(Linear({a + "wo_a"}, nh * d / G, G * R, Allow::kFloatOrFp8, &L->o_a));
    RETURN_IF_ERROR(Linear({a + "wo_b"}, G * R, H, Allow::kFloatOrFp8, &L->o_b));
    ASSIGN_OR_RETURN(L->sinks, Float({a + "attn_sink"}, {nh}));
    if (spec.attention != AttentionKind::kSliding) {
      const int c = spec.attention == AttentionKind::kCsa ? 2 : 1;
      RETURN_IF_ERROR(Compressor(a + "compressor.", d, c, spec.compress_rate, &L->compressor));
    }
    if (spec.attention == AttentionKind::kCsa) {
      IndexerWeights& x = L->indexer;
      const int ni = c_.index_n_heads, di = c_.index_head_dim;
      const std::string i1 = a + "indexer.", i2 = a + "compressor.indexer.";
      const std::string ip = store_.Has(i2 + "wq_b.weight") ? i2 : i1;
      RETURN_IF_ERROR(Linear({ip + "wq_b"}, Q, ni * di, Allow::kFloatOrFp8, &x.q_b));
      RETURN_IF_ERROR(Linear({ip + "weights_proj", ip + "scorer.weights_proj"}, H, ni, Allow::kFloatOrFp8,
                             &x.weights_proj));
      const std::string cp = store_.Has(ip + "compressor.wkv.weight") ? ip + "compressor." : ip;
      RETURN_IF_ERROR(Compressor(cp, di, 2, spec.compress_rate, &x.compressor));
    }
    const std::string f = p + "ffn.";
    RETURN_IF_ERROR(Linear({f + "gate"}, H, E, Allow::kFloatOrFp8, &L->router));
    if (spec.mlp == MlpKind::kMoe) {
      ASSIGN_OR_RETURN(L->router_bias, Float({f + "gate.bias"}, {E}));
    } else {
      ASSIGN_OR_RETURN(std::string name, Resolve({f + "gate.tid2eid"}));
      RETURN_IF_ERROR(Tid2Eid(name, &L->tid2eid));
    }
    L->experts.resize(E);
    for (int e = 0; e < E; ++e) {
      const std::string x = absl::StrCat(f, "experts.", e, ".");
      MlpWeights& m = L->experts[e];
      RETURN_IF_ERROR(Linear({x + "w1"}, H, I, Allow::kExpert, &m.gate));
      RETURN_IF_ERROR(Linear({x + "w3"}, H, I, Allow::kExpert, &m.up));
      RETURN_IF_ERROR(Linear({x + "w2"}, I, H, Allow::kExpert, &m.down));
    }
    const std::string s = f + "shared_experts.";
    RETURN_IF_ERROR(Linear({s + "w1"}, H, I, Allow::kFloatOrFp8, &L->shared.gate));
    RETURN_IF_ERROR(Linear({s + "w3"}, H, I, Allow::kFloatOrFp8, &L->shared.up));
    RETURN_IF_ERROR(Linear({s + "w2"}, I, H, Allow::kFloatOrFp8, &L->shared.down));
    return absl::OkStatus();
  }

  absl::Status Range(int begin, int end) {
    const int V = c_.vocab_size, H = c_.hidden_size, n = c_.hc_mult;
    if (begin == 0) {
      ASSIGN_OR_RETURN(out_->embed, Float({"model.embed_tokens.weight", "embed.weight"}, {V, H}));
    }
    if (end == c_.num_layers) {
      RETURN_IF_ERROR(Linear({"head", "lm_head"}, H, V, Allow::kFloatOrFp8, &out_->head));
      ASSIGN_OR_RETURN(out_->final_norm, Float({"model.norm.weight", "norm.weight"}, {H}));
      ASSIGN_OR_RETURN(out_->hc_head_fn, Float({"model.hc_head.hc_fn", "hc_head_fn"}, {n, int64_t{n} * H}));
      ASSIGN_OR_RETURN(out_->hc_head_base, Float({"model.hc_head.hc_base", "hc_head_base"}, {n}));
      ASSIGN_OR_RETURN(auto scale, Float({"model.hc_head.hc_scale", "hc_head_scale"}, {1}));
      out_->hc_head_scale = scale[0];
    }
    out_->layers.resize(c_.num_layers);
    for (int l = begin; l < end; ++l) RETURN_IF_ERROR(Layer(l, &out_->layers[l]));
    return absl::OkStatus();
  }

 private:
  const TensorStore& store_;
  const V4Config& c_;
  V4Weights* out_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<V4Weights>> LoadV4Weights(const TensorStore& store, const V4Config& config) {
  return LoadV4Weights(store, config, 0, config.num_layers);
}

absl::StatusOr<std::unique_ptr<V4Weights>> LoadV4Weights(const TensorStore& store, const V4Config& config,
                                                         int layer_begin, int layer_end) {
  if (layer_begin < 0 || layer_begin >= layer_end || layer_end > config.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("layer range [", layer_begin, ", ", layer_end,
                                                   ") is not within the model's ", config.num_layers, " layers"));
  }
  auto w = std::make_unique<V4Weights>();
  Loader loader(store, config, w.get());
  RETURN_IF_ERROR(loader.Range(layer_begin, layer_end));
  return w;
}

}  // namespace strata::v4
