#include "worker/kv_rows.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/fp8.h"

namespace strata::worker {
namespace {

void PutF32(float v, std::string* out) {
  char b[4];
  std::memcpy(b, &v, 4);
  out->append(b, 4);
}

float GetF32(const char* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}

}  // namespace

SliceLayout MakeSliceLayout(const ModelConfig& config, int begin, int end) {
  SliceLayout l;
  l.layer_begin = begin;
  l.layer_end = end;
  l.kv_lora = config.kv_lora_rank;
  l.rope = config.qk_rope_head_dim;
  l.index_dim = config.index_head_dim;
  for (int i = begin; i < end; ++i) {
    if (config.indexer_slot(i) >= 0) l.indexer_layers.push_back(i - begin);
  }
  return l;
}

void EncodeSlices(const SliceLayout& layout, const SequenceKv& kv, int first, int n, std::string* out) {
  const int L = layout.layer_end - layout.layer_begin;
  const int C = layout.kv_lora, R = layout.rope, K = layout.index_dim;
  out->reserve(out->size() + static_cast<size_t>(n) * layout.slice_bytes());
  std::vector<uint8_t> codes(std::max(C, R));
  for (int t = first; t < first + n; ++t) {
    for (int l = 0; l < L; ++l) {
      const LayerKv& lk = kv.layer(l);
      if (kv.dtype() == KvDtype::kFp8) {
        out->append(reinterpret_cast<const char*>(&lk.c_codes[static_cast<size_t>(t) * C]), C);
        PutF32(lk.c_scale[t], out);
        out->append(reinterpret_cast<const char*>(&lk.r_codes[static_cast<size_t>(t) * R]), R);
        PutF32(lk.r_scale[t], out);
      } else {
        float s = fp8::QuantizeRow(&lk.c[static_cast<size_t>(t) * C], C, codes.data());
        out->append(reinterpret_cast<const char*>(codes.data()), C);
        PutF32(s, out);
        s = fp8::QuantizeRow(&lk.r[static_cast<size_t>(t) * R], R, codes.data());
        out->append(reinterpret_cast<const char*>(codes.data()), R);
        PutF32(s, out);
      }
    }
    for (int l : layout.indexer_layers) {
      out->append(reinterpret_cast<const char*>(&kv.layer(l).index_k[static_cast<size_t>(t) * K]),
                  static_cast<size_t>(K) * 4);
    }
  }
}

absl::Status DecodeSlice(const SliceLayout& layout, const char* p, SequenceKv* kv) {
  const int L = layout.layer_end - layout.layer_begin;
  const int C = layout.kv_lora, R = layout.rope, K = layout.index_dim;
  for (int l = 0; l < L; ++l) {
    const auto* c = reinterpret_cast<const uint8_t*>(p);
    const float cs = GetF32(p + C);
    const auto* r = reinterpret_cast<const uint8_t*>(p + C + 4);
    const float rs = GetF32(p + C + 4 + R);
    if (!(std::isfinite(cs) && cs > 0) || !(std::isfinite(rs) && rs > 0)) {
      return absl::InvalidArgumentError(absl::StrCat("layer ", layout.layer_begin + l,
                                                     " has an unusable row scale (", cs, ", ", rs, ")"));
    }
    kv->AppendQuantizedRow(l, c, cs, r, rs);
    p += layout.layer_bytes();
  }
  std::vector<float> k(K);
  for (int l : layout.indexer_layers) {
    std::memcpy(k.data(), p, static_cast<size_t>(K) * 4);
    kv->AppendStoredIndexKey(l, k.data());
    p += static_cast<size_t>(K) * 4;
  }
  return absl::OkStatus();
}

}  // namespace strata::worker
