#include "model/v4/kv_state.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kvstore/coli_kv.h"

namespace strata::v4 {
namespace {

kv::V3Kind KindOf(AttentionKind a) {
  switch (a) {
    case AttentionKind::kSliding:
      return kv::V3Kind::kSliding;
    case AttentionKind::kCsa:
      return kv::V3Kind::kCsa;
    case AttentionKind::kHca:
      return kv::V3Kind::kHca;
  }
  return kv::V3Kind::kSliding;
}

absl::Status CheckHeader(const V4Config& c, const kv::V3Header& h) {
  const kv::V3Header want = V4KvHeader(c, h.row_format);
  if (h == want) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("the file's state is not this model's: file ", h.ToString(), "; model ", want.ToString()));
}

// Copies n floats of `src` (or zeros when null) to rec + off.
void PutFloats(char* rec, int64_t off, const float* src, size_t n) {
  if (src != nullptr) std::memcpy(rec + off, src, 4 * n);
}

// Token record fields of one compressor: what `s` keeps of position p.
void PutCompressor(const CompressorState& s, int64_t t, int64_t p, char* rec, int64_t kv_off, int64_t gate_off) {
  const int64_t m = s.rate, open = t - t % m;
  const size_t cw = static_cast<size_t>(s.coff) * s.width;
  if (p >= open) {
    const size_t at = static_cast<size_t>(p - open) * cw;
    PutFloats(rec, kv_off, s.open_kv.data() + at, cw);
    PutFloats(rec, gate_off, s.open_gate.data() + at, cw);
  } else if (s.coff == 2 && !s.overlap_kv.empty() && p >= open - m) {
    const size_t at = static_cast<size_t>(p - (open - m)) * s.width;
    PutFloats(rec, kv_off, s.overlap_kv.data() + at, s.width);  // the Ca half; Cb is dead
    PutFloats(rec, gate_off, s.overlap_gate.data() + at, s.width);
  }
}

// Appends n floats stored at p (any alignment) to v.
void AppendFloats(std::vector<float>* v, const char* p, size_t n) {
  const size_t at = v->size();
  v->resize(at + n);
  std::memcpy(v->data() + at, p, 4 * n);
}

// What a compressor keeps of the tokens [t − t mod m (− m for CSA), t).
void TakeCompressor(const std::vector<std::string>& recs, int64_t first, int64_t t, int64_t kv_off, int64_t gate_off,
                    CompressorState* s) {
  const int64_t m = s->rate, open = t - t % m;
  const size_t cw = static_cast<size_t>(s->coff) * s->width;
  if (s->coff == 2 && t >= m) {
    for (int64_t p = open - m; p < open; ++p) {
      const std::string& r = recs[static_cast<size_t>(p - first)];
      AppendFloats(&s->overlap_kv, r.data() + kv_off, static_cast<size_t>(s->width));
      AppendFloats(&s->overlap_gate, r.data() + gate_off, static_cast<size_t>(s->width));
    }
  }
  for (int64_t p = open; p < t; ++p) {
    const std::string& r = recs[static_cast<size_t>(p - first)];
    AppendFloats(&s->open_kv, r.data() + kv_off, cw);
    AppendFloats(&s->open_gate, r.data() + gate_off, cw);
  }
}

}  // namespace

kv::V3Header V4KvHeader(const V4Config& c, kv::V3RowFormat format) {
  kv::V3Header h;
  h.head_dim = c.head_dim;
  h.rope_dim = c.rope_dim;
  h.index_hd = c.index_head_dim;
  h.window = c.sliding_window;
  h.vocab = c.vocab_size;
  h.row_format = format;
  for (const V4LayerSpec& l : c.layers) h.layers.push_back({KindOf(l.attention), l.compress_rate});
  return h;
}

absl::Status SaveV4Sequence(const V4Config& c, const V4Sequence& seq, absl::Span<const int> new_tokens,
                            kv::ColiKv3Writer* w) {
  const kv::V3Layout& L = w->layout();
  RETURN_IF_ERROR(CheckHeader(c, L.header()));
  const int64_t t0 = w->num_tokens(), t = seq.num_tokens();
  if (t0 > t) {
    return absl::FailedPreconditionError(
        absl::StrCat("the file commits ", t0, " tokens, more than the sequence's ", t));
  }
  if (static_cast<int64_t>(new_tokens.size()) != t - t0) {
    return absl::InvalidArgumentError(
        absl::StrCat("saving tokens [", t0, ", ", t, ") takes ", t - t0, " token ids; got ", new_tokens.size()));
  }
  if (t == t0) return absl::OkStatus();

  const int S = L.window_slots();
  std::vector<std::string> recs;
  for (int64_t p = std::max(t0, t - L.live_tokens()); p < t; ++p) {
    std::string rec(static_cast<size_t>(L.token_bytes()), '\0');
    kv::StoreI32(rec.data(), static_cast<int32_t>(p));
    kv::StoreI32(rec.data() + 4, new_tokens[static_cast<size_t>(p - t0)]);
    for (int l = 0; l < L.num_layers(); ++l) {
      const V4LayerState& st = seq.layer(l);
      if (S > 0 && p >= t - S) kv::EncodeV3Row(L, seq.WindowRow(l, p), rec.data() + L.window_offset(l));
      if (c.layers[l].attention == AttentionKind::kSliding) continue;
      PutCompressor(st.compressor, t, p, rec.data(), L.kv_offset(l), L.gate_offset(l));
      if (c.layers[l].attention == AttentionKind::kCsa) {
        PutCompressor(st.indexer, t, p, rec.data(), L.index_kv_offset(l), L.index_gate_offset(l));
      }
    }
    kv::SealV3Record(rec.data(), L.token_bytes());
    recs.push_back(std::move(rec));
  }
  std::string blocks;
  for (const auto& [l, b] : L.Closes(t0, t)) {
    std::string rec(static_cast<size_t>(L.block_bytes(l)), '\0');
    kv::StoreI32(rec.data(), l);
    kv::StoreI32(rec.data() + 4, b);
    kv::EncodeV3Row(L, seq.layer(l).compressor.row(b), rec.data() + 8);
    if (c.layers[l].attention == AttentionKind::kCsa) {
      PutFloats(rec.data(), 8 + L.row_bytes(), seq.layer(l).indexer.row(b), static_cast<size_t>(c.index_head_dim));
    }
    kv::SealV3Record(rec.data(), L.block_bytes(l));
    blocks += rec;
  }
  return w->Append(t, recs, blocks);
}

absl::StatusOr<std::unique_ptr<V4Sequence>> LoadV4Sequence(const V4Config& c, const kv::ColiKv3Reader& r) {
  const kv::V3Layout& L = r.layout();
  RETURN_IF_ERROR(CheckHeader(c, L.header()));
  const int64_t t = r.num_tokens(), first = r.first_live();
  std::vector<std::string> recs(static_cast<size_t>(t - first));
  for (int64_t p = first; p < t; ++p) RETURN_IF_ERROR(r.ReadTokenRecord(p, &recs[static_cast<size_t>(p - first)]));
  std::string log;
  RETURN_IF_ERROR(r.ReadBlockLog(&log));

  auto seq = std::make_unique<V4Sequence>(c);
  const int S = L.window_slots();
  for (int l = 0; l < L.num_layers(); ++l) {
    V4LayerState& st = seq->layer(l);
    for (int64_t u = std::max<int64_t>(0, t - S); u < t && S > 0; ++u) {
      kv::DecodeV3Row(L, recs[static_cast<size_t>(u - first)].data() + L.window_offset(l),
                      st.window.data() + static_cast<size_t>(u % S) * c.head_dim);
    }
    if (c.layers[l].attention == AttentionKind::kSliding) continue;
    TakeCompressor(recs, first, t, L.kv_offset(l), L.gate_offset(l), &st.compressor);
    if (c.layers[l].attention == AttentionKind::kCsa) {
      TakeCompressor(recs, first, t, L.index_kv_offset(l), L.index_gate_offset(l), &st.indexer);
    }
  }
  // The block log, in close order: each layer's rows arrive in block order.
  std::vector<float> row(static_cast<size_t>(c.head_dim));
  size_t at = 0;
  for (const auto& [l, b] : L.Closes(0, t)) {
    const char* rec = log.data() + at;
    kv::DecodeV3Row(L, rec + 8, row.data());
    V4LayerState& st = seq->layer(l);
    st.compressor.rows.insert(st.compressor.rows.end(), row.begin(), row.end());
    if (c.layers[l].attention == AttentionKind::kCsa) {
      AppendFloats(&st.indexer.rows, rec + 8 + L.row_bytes(), static_cast<size_t>(c.index_head_dim));
    }
    at += static_cast<size_t>(L.block_bytes(l));
  }
  seq->Commit(static_cast<int>(t));
  return seq;
}

}  // namespace strata::v4
