#include "kvstore/coli_kv3.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "kernels/fp8.h"
#include "kvstore/coli_kv.h"
#include "kvstore/crc32c.h"

namespace strata::kv {
namespace {

constexpr int32_t kMaxV3Width = 65536;
constexpr int kFp8Tile = 64;

int64_t RoundUp(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

void StoreU64(char* p, uint64_t v) { std::memcpy(p, &v, 8); }
uint64_t LoadU64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

const char* KindName(V3Kind k) {
  switch (k) {
    case V3Kind::kSliding:
      return "sliding";
    case V3Kind::kCsa:
      return "csa";
    case V3Kind::kHca:
      return "hca";
  }
  return "?";
}

// Token record bytes (int64, no overflow for headers within the field bounds).
int64_t TokenBytes(const V3Header& h, int64_t row_bytes) {
  int64_t b = 12;
  for (const V3Layer& l : h.layers) {
    if (h.window > 1) b += row_bytes;
    if (l.kind == V3Kind::kCsa) b += 4 * (4 * int64_t{h.head_dim} + 4 * int64_t{h.index_hd});
    if (l.kind == V3Kind::kHca) b += 4 * 2 * int64_t{h.head_dim};
  }
  return b;
}

int64_t RowBytes(const V3Header& h) {
  if (h.row_format == V3RowFormat::kF32) return 4 * int64_t{h.head_dim};
  const int64_t nope = h.head_dim - h.rope_dim;
  return RoundUp(nope + (nope + kFp8Tile - 1) / kFp8Tile + 2 * int64_t{h.rope_dim}, 8);
}

// The power-of-two exponent e with 2^e >= amax / 448, as small as possible,
// clamped to the E8M0 range; 0 (scale 1) for a zero or non-finite amax.
int Fp8Exponent(float amax) {
  if (!(amax > 0.0f) || !std::isfinite(amax)) return 0;
  int k;
  const float f = std::frexp(amax / 448.0f, &k);  // amax/448 = f · 2^k, f in [0.5, 1)
  const int e = f == 0.5f ? k - 1 : k;
  return std::clamp(e, -126, 127);
}

uint16_t ToBf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if (std::isnan(x)) return 0x7FC0;
  u += 0x7FFF + ((u >> 16) & 1);  // round to nearest, ties to even
  return static_cast<uint16_t>(u >> 16);
}

float FromBf16(uint16_t b) {
  const uint32_t u = uint32_t{b} << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

}  // namespace

std::string V3Header::ToString() const {
  std::string s = absl::StrCat("layers=", layers.size(), " head_dim=", head_dim, " rope_dim=", rope_dim,
                               " index_hd=", index_hd, " window=", window, " vocab=", vocab,
                               " row_format=", static_cast<int>(row_format), " kinds=");
  for (size_t i = 0; i < layers.size(); ++i) {
    absl::StrAppend(&s, i ? "," : "", KindName(layers[i].kind), "/", layers[i].rate);
  }
  return s;
}

absl::Status ValidateV3Header(const V3Header& h) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("bad v3 header (", h.ToString(), "): ", why));
  };
  if (h.layers.empty() || h.layers.size() > static_cast<size_t>(kMaxLayers)) {
    return bad(absl::StrCat("the layer count must be in [1, ", kMaxLayers, "]"));
  }
  if (h.head_dim < 1 || h.head_dim > kMaxV3Width) return bad("head_dim must be in [1, 65536]");
  if (h.rope_dim < 0 || h.rope_dim > h.head_dim) return bad("rope_dim must be in [0, head_dim]");
  if (h.index_hd < 0 || h.index_hd > kMaxV3Width) return bad("index_hd must be in [0, 65536]");
  if (h.window < 1 || h.window > kMaxV3Width) return bad("window must be in [1, 65536]");
  if (h.vocab < 1 || h.vocab > kMaxVocab) return bad("vocab must be in [1, 2^30]");
  if (h.row_format != V3RowFormat::kF32 && h.row_format != V3RowFormat::kFp8) {
    return bad("unknown row format");
  }
  for (size_t i = 0; i < h.layers.size(); ++i) {
    const V3Layer& l = h.layers[i];
    if (l.kind == V3Kind::kSliding) {
      if (l.rate != 0) return bad(absl::StrCat("layer ", i, ": a sliding layer has rate 0"));
    } else if (l.kind == V3Kind::kCsa || l.kind == V3Kind::kHca) {
      if (l.rate < 1 || l.rate > kMaxV3Width) return bad(absl::StrCat("layer ", i, ": rate must be in [1, 65536]"));
      if (l.kind == V3Kind::kCsa && h.index_hd < 1) return bad("a CSA layer needs index_hd >= 1");
    } else {
      return bad(absl::StrCat("layer ", i, ": unknown kind"));
    }
  }
  if (TokenBytes(h, RowBytes(h)) > kMaxRecordBytes) return bad("a token record would exceed 1 GiB");
  return absl::OkStatus();
}

std::string EncodeV3Header(const V3Header& h) {
  std::string s(static_cast<size_t>(44 + 8 * h.layers.size()), '\0');
  char* p = s.data();
  std::memcpy(p, kMagicV3.data(), 8);
  const int32_t f[8] = {kV3FormatTag, static_cast<int32_t>(h.layers.size()), h.head_dim, h.rope_dim,
                        h.index_hd,   h.window,                            h.vocab,    static_cast<int32_t>(h.row_format)};
  for (int i = 0; i < 8; ++i) StoreI32(p + 8 + 4 * i, f[i]);
  for (size_t l = 0; l < h.layers.size(); ++l) {
    StoreI32(p + 40 + 8 * l, static_cast<int32_t>(h.layers[l].kind));
    StoreI32(p + 44 + 8 * l, h.layers[l].rate);
  }
  const size_t n = s.size() - 4;
  StoreI32(p + n, static_cast<int32_t>(crc32c::Value(p, n)));
  return s;
}

absl::StatusOr<V3Header> DecodeV3Header(std::string_view b) {
  const std::string_view magic = b.substr(0, 8);
  if (magic != kMagicV3.substr(0, magic.size())) {
    return absl::InvalidArgumentError("not a .coli_kv v3 file: the magic is not COLIKV3");
  }
  if (b.size() < 44) {
    return absl::DataLossError(absl::StrCat("truncated v3 header: ", b.size(), " bytes, at least 44 needed"));
  }
  const char* p = b.data();
  const int32_t tag = LoadI32(p + 8);
  if (tag != kV3FormatTag) {
    return absl::DataLossError(absl::StrCat("corrupt v3 header: format tag ", tag, ", expected 2"));
  }
  const int32_t n = LoadI32(p + 12);
  if (n < 1 || n > kMaxLayers) {
    return absl::DataLossError(absl::StrCat("corrupt v3 header: layer count ", n, " not in [1, ", kMaxLayers, "]"));
  }
  const size_t bytes = 44 + 8 * static_cast<size_t>(n);
  if (b.size() < bytes) {
    return absl::DataLossError(
        absl::StrCat("truncated v3 header: ", b.size(), " bytes, ", bytes, " needed for ", n, " layers"));
  }
  const uint32_t want = crc32c::Value(p, bytes - 4);
  if (static_cast<uint32_t>(LoadI32(p + bytes - 4)) != want) {
    return absl::DataLossError("corrupt v3 header: CRC32C mismatch");
  }
  V3Header h;
  h.head_dim = LoadI32(p + 16);
  h.rope_dim = LoadI32(p + 20);
  h.index_hd = LoadI32(p + 24);
  h.window = LoadI32(p + 28);
  h.vocab = LoadI32(p + 32);
  h.row_format = static_cast<V3RowFormat>(LoadI32(p + 36));
  h.layers.resize(static_cast<size_t>(n));
  for (int l = 0; l < n; ++l) {
    h.layers[l].kind = static_cast<V3Kind>(LoadI32(p + 40 + 8 * l));
    h.layers[l].rate = LoadI32(p + 44 + 8 * l);
  }
  if (absl::Status s = ValidateV3Header(h); !s.ok()) {
    return absl::DataLossError(absl::StrCat("corrupt v3 header: ", s.message()));
  }
  return h;
}

V3Layout::V3Layout(const V3Header& h) : h_(h) {
  int32_t live = window_slots();
  for (const V3Layer& l : h.layers) {
    if (l.kind == V3Kind::kHca) live = std::max(live, l.rate - 1);
    if (l.kind == V3Kind::kCsa) live = std::max(live, 2 * l.rate - 1);
  }
  live_ = live;
  row_bytes_ = RowBytes(h);
  token_bytes_ = TokenBytes(h, row_bytes_);
  int64_t off = 8;
  for (int l = 0; l < num_layers(); ++l) {
    layer_off_.push_back(off);
    if (window_slots() > 0) off += row_bytes_;
    if (h.layers[l].kind == V3Kind::kCsa) off += 4 * (4 * int64_t{h.head_dim} + 4 * int64_t{h.index_hd});
    if (h.layers[l].kind == V3Kind::kHca) off += 8 * int64_t{h.head_dim};
  }
  layer_off_.push_back(off);  // the end of the last layer's part
  header_region_ = RoundUp(header_bytes(), kV3RegionAlign);
  commit_region_ = RoundUp(commit_bytes(), kV3RegionAlign);
}

int64_t V3Layout::block_bytes(int layer) const {
  const V3Kind k = h_.layers[layer].kind;
  if (k == V3Kind::kSliding) return 0;
  return 12 + row_bytes_ + (k == V3Kind::kCsa ? 4 * int64_t{h_.index_hd} : 0);
}

uint64_t V3Layout::LogBytes(int64_t t) const {
  uint64_t b = 0;
  for (int l = 0; l < num_layers(); ++l) {
    if (h_.layers[l].rate > 0) b += static_cast<uint64_t>(t / h_.layers[l].rate) * block_bytes(l);
  }
  return b;
}

std::vector<std::pair<int, int32_t>> V3Layout::Closes(int64_t t0, int64_t t1) const {
  std::vector<std::pair<int, int32_t>> out;
  // (close count, layer) for every block closing in (t0, t1].
  std::vector<std::pair<int64_t, int>> keys;
  for (int l = 0; l < num_layers(); ++l) {
    const int64_t m = h_.layers[l].rate;
    if (m == 0) continue;
    for (int64_t w = t0 / m; (w + 1) * m <= t1; ++w) keys.emplace_back((w + 1) * m, l);
  }
  std::sort(keys.begin(), keys.end());
  for (const auto& [c, l] : keys) out.emplace_back(l, static_cast<int32_t>(c / h_.layers[l].rate - 1));
  return out;
}

std::string EncodeV3Commit(const V3Layout& L, const V3Commit& c) {
  std::string s(static_cast<size_t>(L.commit_bytes()), '\0');
  char* p = s.data();
  StoreU64(p, c.seq);
  StoreU64(p + 8, static_cast<uint64_t>(c.num_tokens));
  StoreU64(p + 16, c.log_bytes);
  StoreI32(p + 24, static_cast<int32_t>(c.slots.size()));
  for (int32_t i = 0; i < L.live_tokens(); ++i) {
    StoreI32(p + 28 + 4 * i, i < static_cast<int32_t>(c.slots.size()) ? c.slots[i] : -1);
  }
  const size_t n = s.size() - 4;
  StoreI32(p + n, static_cast<int32_t>(crc32c::Value(p, n)));
  return s;
}

absl::StatusOr<V3Commit> DecodeV3Commit(const V3Layout& L, std::string_view b) {
  if (b.size() < static_cast<size_t>(L.commit_bytes())) return absl::DataLossError("commit record cut off");
  const char* p = b.data();
  const size_t n = static_cast<size_t>(L.commit_bytes()) - 4;
  if (static_cast<uint32_t>(LoadI32(p + n)) != crc32c::Value(p, n)) {
    return absl::DataLossError("commit record: CRC32C mismatch");
  }
  V3Commit c;
  c.seq = LoadU64(p);
  const uint64_t t = LoadU64(p + 8);
  c.log_bytes = LoadU64(p + 16);
  const int32_t count = LoadI32(p + 24);
  if (c.seq < 1) return absl::DataLossError("commit record: seq 0");
  if (t > static_cast<uint64_t>(kV3MaxTokens)) return absl::DataLossError("commit record: token count out of range");
  c.num_tokens = static_cast<int64_t>(t);
  if (count != std::min<int64_t>(c.num_tokens, L.live_tokens())) {
    return absl::DataLossError(absl::StrCat("commit record: ", count, " live slots for ", c.num_tokens, " tokens"));
  }
  if (c.log_bytes != L.LogBytes(c.num_tokens)) {
    return absl::DataLossError(absl::StrCat("commit record: block log of ", c.log_bytes, " bytes, ",
                                            L.LogBytes(c.num_tokens), " expected for ", c.num_tokens, " tokens"));
  }
  std::vector<bool> used(static_cast<size_t>(L.ring_slots()), false);
  for (int32_t i = 0; i < L.live_tokens(); ++i) {
    const int32_t s = LoadI32(p + 28 + 4 * i);
    if (i >= count) {
      if (s != -1) return absl::DataLossError("commit record: an unused slot entry is not -1");
      continue;
    }
    if (s < 0 || s >= L.ring_slots() || used[static_cast<size_t>(s)]) {
      return absl::DataLossError(absl::StrCat("commit record: slot ", s, " out of range or used twice"));
    }
    used[static_cast<size_t>(s)] = true;
    c.slots.push_back(s);
  }
  return c;
}

std::string SealV3TokenRecord(const V3Layout& L, int64_t p, int32_t token, std::string_view parts) {
  std::string rec(static_cast<size_t>(L.token_bytes()), '\0');
  StoreI32(rec.data(), static_cast<int32_t>(p));
  StoreI32(rec.data() + 4, token);
  std::memcpy(rec.data() + L.slice_offset(0), parts.data(), parts.size());
  SealV3Record(rec.data(), L.token_bytes());
  return rec;
}

void SealV3Record(char* rec, int64_t bytes) {
  StoreI32(rec + bytes - 4, static_cast<int32_t>(crc32c::Value(rec, static_cast<size_t>(bytes - 4))));
}

bool V3RecordSealed(const char* rec, int64_t bytes) {
  return static_cast<uint32_t>(LoadI32(rec + bytes - 4)) == crc32c::Value(rec, static_cast<size_t>(bytes - 4));
}

void EncodeV3Row(const V3Layout& L, const float* row, char* out) {
  const V3Header& h = L.header();
  if (h.row_format == V3RowFormat::kF32) {
    std::memcpy(out, row, static_cast<size_t>(L.row_bytes()));
    return;
  }
  std::memset(out, 0, static_cast<size_t>(L.row_bytes()));
  const int nope = h.head_dim - h.rope_dim;
  const int tiles = (nope + kFp8Tile - 1) / kFp8Tile;
  char* rope = out + nope;
  char* scales = rope + 2 * h.rope_dim;
  for (int t = 0; t < tiles; ++t) {
    const int b = t * kFp8Tile, e = std::min(nope, b + kFp8Tile);
    float amax = 0;
    for (int i = b; i < e; ++i) {
      if (!std::isnan(row[i])) amax = std::max(amax, std::fabs(row[i]));
    }
    const int x = Fp8Exponent(amax);
    scales[t] = static_cast<char>(static_cast<uint8_t>(x + 127));
    for (int i = b; i < e; ++i) out[i] = static_cast<char>(fp8::Encode(std::ldexp(row[i], -x)));
  }
  for (int i = 0; i < h.rope_dim; ++i) {
    const uint16_t v = ToBf16(row[nope + i]);
    std::memcpy(rope + 2 * i, &v, 2);
  }
}

void DecodeV3Row(const V3Layout& L, const char* in, float* row) {
  const V3Header& h = L.header();
  if (h.row_format == V3RowFormat::kF32) {
    std::memcpy(row, in, static_cast<size_t>(L.row_bytes()));
    return;
  }
  const int nope = h.head_dim - h.rope_dim;
  const int tiles = (nope + kFp8Tile - 1) / kFp8Tile;
  const char* rope = in + nope;
  const char* scales = rope + 2 * h.rope_dim;
  for (int t = 0; t < tiles; ++t) {
    // E8M0: 2^(byte − 127); 0xFF (NaN in E8M0) reads as scale 1.
    const uint8_t eb = static_cast<uint8_t>(scales[t]);
    const int x = eb == 0xFF ? 0 : static_cast<int>(eb) - 127;
    for (int i = t * kFp8Tile; i < std::min(nope, (t + 1) * kFp8Tile); ++i) {
      row[i] = std::ldexp(fp8::Decode(static_cast<uint8_t>(in[i])), x);
    }
  }
  for (int i = 0; i < h.rope_dim; ++i) {
    uint16_t v;
    std::memcpy(&v, rope + 2 * i, 2);
    row[nope + i] = FromBf16(v);
  }
}

}  // namespace strata::kv
