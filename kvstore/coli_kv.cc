#include "kvstore/coli_kv.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/fp8.h"

namespace strata::kv {

static_assert(std::endian::native == std::endian::little,
              ".coli_kv files are little-endian and read as plain bytes");

int32_t LoadI32(const char* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
float LoadF32(const char* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}
void StoreI32(char* p, int32_t v) { std::memcpy(p, &v, 4); }
void StoreF32(char* p, float v) { std::memcpy(p, &v, 4); }

std::string Dims::ToString() const {
  return absl::StrCat("n_layers=", n_layers, " kv_lora=", kv_lora, " qk_rope=", qk_rope,
                      " index_hd=", index_hd, " nic=", nic, " vocab=", vocab);
}

absl::Status ValidateDims(const Dims& d) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("bad dimensions (", d.ToString(), "): ", why));
  };
  if (d.n_layers < 1 || d.n_layers > kMaxLayers) {
    return bad(absl::StrCat("n_layers must be in [1, ", kMaxLayers, "]"));
  }
  if (d.kv_lora < 1 || d.kv_lora > kMaxRowWidth) {
    return bad(absl::StrCat("kv_lora must be in [1, ", kMaxRowWidth, "]"));
  }
  if (d.qk_rope < 0 || d.qk_rope > kMaxRowWidth) {
    return bad(absl::StrCat("qk_rope must be in [0, ", kMaxRowWidth, "]"));
  }
  if (d.index_hd < 0 || d.index_hd > kMaxRowWidth) {
    return bad(absl::StrCat("index_hd must be in [0, ", kMaxRowWidth, "]"));
  }
  if (d.nic < 0 || d.nic > d.n_layers) return bad("nic must be in [0, n_layers]");
  if (d.index_hd == 0 && d.nic != 0) return bad("nic must be 0 when index_hd is 0");
  if (d.vocab < 1 || d.vocab > kMaxVocab) {
    return bad(absl::StrCat("vocab must be in [1, ", kMaxVocab, "]"));
  }
  const int64_t v1 = 4 + int64_t{d.n_layers} * 4 * (int64_t{d.kv_lora} + d.qk_rope) +
                     int64_t{d.nic} * d.index_hd * 4;
  if (v1 > kMaxRecordBytes) return bad("a record would exceed 1 GiB");
  return absl::OkStatus();
}

void EncodeHeader(const Header& h, char* out) {
  std::memcpy(out, (h.version == Version::kV1 ? kMagicV1 : kMagicV2).data(), 8);
  StoreI32(out + 8, h.dims.n_layers);
  StoreI32(out + 12, h.dims.kv_lora);
  StoreI32(out + 16, h.dims.qk_rope);
  StoreI32(out + 20, h.dims.index_hd);
  StoreI32(out + 24, h.dims.nic);
  StoreI32(out + 28, h.dims.vocab);
  StoreI32(out + kNrecOffset, h.nrec);
  StoreI32(out + 36, h.version == Version::kV1 ? 0 : 1);
}

std::string EncodeHeader(const Header& h) {
  std::string s(kHeaderBytes, '\0');
  EncodeHeader(h, s.data());
  return s;
}

absl::StatusOr<Header> DecodeHeader(std::string_view b) {
  const std::string_view magic = b.substr(0, 8);
  if (magic == std::string_view("COLIKV3\0", 8)) {
    return absl::InvalidArgumentError(
        "a .coli_kv v3 file (DeepSeek-V4 sequence state, docs/coli-kv.md \"Version 3\"): not a v1/v2 session");
  }
  if (magic != kMagicV1.substr(0, magic.size()) && magic != kMagicV2.substr(0, magic.size())) {
    return absl::InvalidArgumentError("not a .coli_kv file: the magic is neither COLIKV1 nor COLIKV2");
  }
  if (b.size() < static_cast<size_t>(kHeaderBytes)) {
    return absl::DataLossError(
        absl::StrCat("truncated header: ", b.size(), " bytes, a .coli_kv header has 40"));
  }
  Header h;
  h.version = magic == kMagicV1 ? Version::kV1 : Version::kV2;
  const char* p = b.data();
  h.dims.n_layers = LoadI32(p + 8);
  h.dims.kv_lora = LoadI32(p + 12);
  h.dims.qk_rope = LoadI32(p + 16);
  h.dims.index_hd = LoadI32(p + 20);
  h.dims.nic = LoadI32(p + 24);
  h.dims.vocab = LoadI32(p + 28);
  h.nrec = LoadI32(p + kNrecOffset);
  const int32_t tag = LoadI32(p + 36);
  const int32_t want_tag = h.version == Version::kV1 ? 0 : 1;
  if (tag != want_tag) {
    return absl::DataLossError(absl::StrCat("corrupt header: format tag ", tag, " does not match magic ",
                                            h.version == Version::kV1 ? "COLIKV1" : "COLIKV2",
                                            " (expected ", want_tag, ")"));
  }
  if (absl::Status s = ValidateDims(h.dims); !s.ok()) {
    return absl::DataLossError(absl::StrCat("corrupt header: ", s.message()));
  }
  if (h.nrec < 0) return absl::DataLossError(absl::StrCat("corrupt header: nrec ", h.nrec, " < 0"));
  return h;
}

RecordLayout::RecordLayout(Version version, const Dims& dims) : version_(version), dims_(dims) {
  layer_bytes_ = version == Version::kV1 ? int64_t{4} * (dims.kv_lora + dims.qk_rope)
                                         : int64_t{dims.kv_lora} + dims.qk_rope + 8;
  record_bytes_ = 4 + int64_t{dims.n_layers} * layer_bytes_ + int64_t{dims.nic} * dims.index_hd * 4;
}

void SanitizeStats::Add(const SanitizeStats& o) {
  nan_codes += o.nan_codes;
  inert_rows += o.inert_rows;
  nonfinite_keys += o.nonfinite_keys;
  bad_tokens += o.bad_tokens;
}

namespace {

// Sanitises one fp8 row of n codes followed by its f32 scale.
void SanitizeRow(char* codes, int n, char* scale_p, SanitizeStats* st) {
  if (!fp8::ScaleIsUsable(LoadF32(scale_p))) {
    std::memset(codes, 0, static_cast<size_t>(n));
    StoreF32(scale_p, 1.0f);
    ++st->inert_rows;
    return;
  }
  for (int i = 0; i < n; ++i) {
    if ((static_cast<uint8_t>(codes[i]) & 0x7F) == 0x7F) {
      codes[i] = 0;
      ++st->nan_codes;
    }
  }
}

}  // namespace

void SanitizeV2Record(const RecordLayout& L, char* rec, SanitizeStats* stats) {
  SanitizeStats local;
  SanitizeStats* st = stats != nullptr ? stats : &local;
  const Dims& d = L.dims();
  const int32_t token = LoadI32(rec);
  if (token < 0 || token >= d.vocab) ++st->bad_tokens;
  for (int l = 0; l < d.n_layers; ++l) {
    SanitizeRow(rec + L.latent_offset(l), d.kv_lora, rec + L.latent_scale_offset(l), st);
    SanitizeRow(rec + L.rope_offset(l), d.qk_rope, rec + L.rope_scale_offset(l), st);
  }
  for (int s = 0; s < d.nic; ++s) {
    char* k = rec + L.indexer_offset(s);
    for (int i = 0; i < d.index_hd; ++i) {
      if (!std::isfinite(LoadF32(k + 4 * i))) {
        StoreF32(k + 4 * i, 0.0f);
        ++st->nonfinite_keys;
      }
    }
  }
}

void QuantizeV1Record(const Dims& d, const char* v1, char* v2) {
  const RecordLayout a(Version::kV1, d);
  const RecordLayout b(Version::kV2, d);
  std::memcpy(v2, v1, 4);
  std::vector<float> row(static_cast<size_t>(std::max(d.kv_lora, d.qk_rope)));
  for (int l = 0; l < d.n_layers; ++l) {
    std::memcpy(row.data(), v1 + a.latent_offset(l), size_t{4} * d.kv_lora);
    StoreF32(v2 + b.latent_scale_offset(l),
             fp8::QuantizeRow(row.data(), d.kv_lora,
                              reinterpret_cast<uint8_t*>(v2 + b.latent_offset(l))));
    std::memcpy(row.data(), v1 + a.rope_offset(l), size_t{4} * d.qk_rope);
    StoreF32(v2 + b.rope_scale_offset(l),
             fp8::QuantizeRow(row.data(), d.qk_rope,
                              reinterpret_cast<uint8_t*>(v2 + b.rope_offset(l))));
  }
  std::memcpy(v2 + b.indexer_offset(0), v1 + a.indexer_offset(0),
              static_cast<size_t>(int64_t{d.nic} * b.indexer_bytes()));
}

void DequantizeV2Record(const Dims& d, const char* v2, char* v1) {
  const RecordLayout a(Version::kV1, d);
  const RecordLayout b(Version::kV2, d);
  std::memcpy(v1, v2, 4);
  std::vector<float> row(static_cast<size_t>(std::max(d.kv_lora, d.qk_rope)));
  for (int l = 0; l < d.n_layers; ++l) {
    fp8::DequantizeRow(reinterpret_cast<const uint8_t*>(v2 + b.latent_offset(l)),
                       LoadF32(v2 + b.latent_scale_offset(l)), d.kv_lora, row.data());
    std::memcpy(v1 + a.latent_offset(l), row.data(), size_t{4} * d.kv_lora);
    fp8::DequantizeRow(reinterpret_cast<const uint8_t*>(v2 + b.rope_offset(l)),
                       LoadF32(v2 + b.rope_scale_offset(l)), d.qk_rope, row.data());
    std::memcpy(v1 + a.rope_offset(l), row.data(), size_t{4} * d.qk_rope);
  }
  std::memcpy(v1 + a.indexer_offset(0), v2 + b.indexer_offset(0),
              static_cast<size_t>(int64_t{d.nic} * b.indexer_bytes()));
}

RecordBuilder::RecordBuilder(const Dims& dims)
    : layout_(Version::kV2, dims), buf_(static_cast<size_t>(layout_.record_bytes()), '\0') {
  Reset();
}

void RecordBuilder::Reset() {
  std::fill(buf_.begin(), buf_.end(), '\0');
  for (int l = 0; l < layout_.dims().n_layers; ++l) {
    StoreF32(buf_.data() + layout_.latent_scale_offset(l), 1.0f);
    StoreF32(buf_.data() + layout_.rope_scale_offset(l), 1.0f);
  }
}

void RecordBuilder::SetToken(int32_t token) { StoreI32(buf_.data(), token); }

void RecordBuilder::SetLayer(int layer, const float* latent, const float* rope) {
  const Dims& d = layout_.dims();
  char* p = buf_.data();
  StoreF32(p + layout_.latent_scale_offset(layer),
           fp8::QuantizeRow(latent, d.kv_lora,
                            reinterpret_cast<uint8_t*>(p + layout_.latent_offset(layer))));
  StoreF32(p + layout_.rope_scale_offset(layer),
           fp8::QuantizeRow(rope, d.qk_rope,
                            reinterpret_cast<uint8_t*>(p + layout_.rope_offset(layer))));
}

void RecordBuilder::SetLayerCodes(int layer, std::span<const uint8_t> latent, float latent_scale,
                                  std::span<const uint8_t> rope, float rope_scale) {
  char* p = buf_.data();
  std::memcpy(p + layout_.latent_offset(layer), latent.data(), latent.size());
  StoreF32(p + layout_.latent_scale_offset(layer), latent_scale);
  std::memcpy(p + layout_.rope_offset(layer), rope.data(), rope.size());
  StoreF32(p + layout_.rope_scale_offset(layer), rope_scale);
}

void RecordBuilder::SetIndexerKeys(int slot, const float* keys) {
  std::memcpy(buf_.data() + layout_.indexer_offset(slot), keys,
              static_cast<size_t>(layout_.indexer_bytes()));
}

}  // namespace strata::kv
