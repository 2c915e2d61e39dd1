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

// Token record parts of a layer range, one slice per position from `first`
// on, `stride` bytes apart; `rel` turns a record offset into a slice offset.
struct Slices {
  const char* base;
  int64_t first;
  int64_t stride;
  int64_t rel;
  const char* at(int64_t p, int64_t record_off) const { return base + (p - first) * stride + record_off - rel; }
};

// What a compressor keeps of the tokens [t − t mod m (− m for CSA), t).
void TakeCompressor(const Slices& sl, int64_t t, int64_t kv_off, int64_t gate_off, CompressorState* s) {
  const int64_t m = s->rate, open = t - t % m;
  const size_t cw = static_cast<size_t>(s->coff) * s->width;
  if (s->coff == 2 && t >= m) {
    for (int64_t p = open - m; p < open; ++p) {
      AppendFloats(&s->overlap_kv, sl.at(p, kv_off), static_cast<size_t>(s->width));
      AppendFloats(&s->overlap_gate, sl.at(p, gate_off), static_cast<size_t>(s->width));
    }
  }
  for (int64_t p = open; p < t; ++p) {
    AppendFloats(&s->open_kv, sl.at(p, kv_off), cw);
    AppendFloats(&s->open_gate, sl.at(p, gate_off), cw);
  }
}

absl::Status CheckRange(const kv::V3Layout& L, int begin, int end) {
  if (begin < 0 || begin >= end || end > L.num_layers()) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer range [", begin, ", ", end, ") is not within [0, ", L.num_layers(), ")"));
  }
  return absl::OkStatus();
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

absl::Status EncodeV4Step(const V4Config& c, const V4Sequence& seq, int begin, int end, int64_t t0,
                          const kv::V3Layout& L, std::string* slices, std::string* blocks) {
  RETURN_IF_ERROR(CheckHeader(c, L.header()));
  RETURN_IF_ERROR(CheckRange(L, begin, end));
  const int64_t t = seq.num_tokens();
  if (t0 < 0 || t0 > t) {
    return absl::FailedPreconditionError(
        absl::StrCat("the step starts at ", t0, " tokens; the sequence has ", t));
  }
  const int S = L.window_slots();
  const int64_t first = std::max(t0, L.first_live(t)), sb = L.slice_bytes(begin, end), rel = L.slice_offset(begin);
  slices->assign(static_cast<size_t>((t - first) * sb), '\0');
  for (int64_t p = first; p < t; ++p) {
    char* rec = slices->data() + (p - first) * sb - rel;  // record offsets index it
    for (int l = begin; l < end; ++l) {
      const V4LayerState& st = seq.layer(l);
      if (S > 0 && p >= t - S) kv::EncodeV3Row(L, seq.WindowRow(l, p), rec + L.window_offset(l));
      if (c.layers[l].attention == AttentionKind::kSliding) continue;
      PutCompressor(st.compressor, t, p, rec, L.kv_offset(l), L.gate_offset(l));
      if (c.layers[l].attention == AttentionKind::kCsa) {
        PutCompressor(st.indexer, t, p, rec, L.index_kv_offset(l), L.index_gate_offset(l));
      }
    }
  }
  blocks->clear();
  for (const auto& [l, b] : L.Closes(t0, t)) {
    if (l < begin || l >= end) continue;
    std::string rec(static_cast<size_t>(L.block_bytes(l)), '\0');
    kv::StoreI32(rec.data(), l);
    kv::StoreI32(rec.data() + 4, b);
    kv::EncodeV3Row(L, seq.layer(l).compressor.row(b), rec.data() + 8);
    if (c.layers[l].attention == AttentionKind::kCsa) {
      PutFloats(rec.data(), 8 + L.row_bytes(), seq.layer(l).indexer.row(b), static_cast<size_t>(c.index_head_dim));
    }
    kv::SealV3Record(rec.data(), L.block_bytes(l));
    *blocks += rec;
  }
  return absl::OkStatus();
}

absl::Status DecodeV4Stage(const V4Config& c, const kv::V3Layout& L, int begin, int end, int64_t t,
                           std::string_view slices, std::string_view blocks, V4Sequence* seq) {
  RETURN_IF_ERROR(CheckHeader(c, L.header()));
  RETURN_IF_ERROR(CheckRange(L, begin, end));
  if (seq->num_tokens() != 0 || seq->num_layers() != L.num_layers()) {
    return absl::InvalidArgumentError("the state is decoded into a new sequence of this model");
  }
  const int64_t first = L.first_live(t), sb = L.slice_bytes(begin, end);
  if (t < 0 || static_cast<int64_t>(slices.size()) != (t - first) * sb) {
    return absl::DataLossError(absl::StrCat("the state of ", t, " tokens takes ", t - first, " token slices of ", sb,
                                            " bytes; got ", slices.size(), " bytes"));
  }
  int64_t want = 0;
  for (const auto& [l, b] : L.Closes(0, t)) {
    if (l >= begin && l < end) want += L.block_bytes(l);
  }
  if (static_cast<int64_t>(blocks.size()) != want) {
    return absl::DataLossError(absl::StrCat("the blocks of layers [", begin, ", ", end, ") at ", t, " tokens take ",
                                            want, " bytes; got ", blocks.size()));
  }
  const Slices sl{slices.data(), first, sb, L.slice_offset(begin)};
  const int S = L.window_slots();
  for (int l = begin; l < end; ++l) {
    V4LayerState& st = seq->layer(l);
    for (int64_t u = std::max<int64_t>(0, t - S); u < t && S > 0; ++u) {
      kv::DecodeV3Row(L, sl.at(u, L.window_offset(l)), st.window.data() + static_cast<size_t>(u % S) * c.head_dim);
    }
    if (c.layers[l].attention == AttentionKind::kSliding) continue;
    TakeCompressor(sl, t, L.kv_offset(l), L.gate_offset(l), &st.compressor);
    if (c.layers[l].attention == AttentionKind::kCsa) {
      TakeCompressor(sl, t, L.index_kv_offset(l), L.index_gate_offset(l), &st.indexer);
    }
  }
  // The blocks in close order: each layer's rows arrive in block order.
  std::vector<float> row(static_cast<size_t>(c.head_dim));
  size_t at = 0;
  for (const auto& [l, b] : L.Closes(0, t)) {
    if (l < begin || l >= end) continue;
    const char* rec = blocks.data() + at;
    if (!kv::V3RecordSealed(rec, L.block_bytes(l)) || kv::LoadI32(rec) != l || kv::LoadI32(rec + 4) != b) {
      return absl::DataLossError(absl::StrCat("the block record of layer ", l, " block ", b,
                                              " is damaged or out of order"));
    }
    kv::DecodeV3Row(L, rec + 8, row.data());
    V4LayerState& st = seq->layer(l);
    st.compressor.rows.insert(st.compressor.rows.end(), row.begin(), row.end());
    if (c.layers[l].attention == AttentionKind::kCsa) {
      AppendFloats(&st.indexer.rows, rec + 8 + L.row_bytes(), static_cast<size_t>(c.index_head_dim));
    }
    at += static_cast<size_t>(L.block_bytes(l));
  }
  return absl::OkStatus();
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
  std::string slices, blocks;
  RETURN_IF_ERROR(EncodeV4Step(c, seq, 0, L.num_layers(), t0, L, &slices, &blocks));
  const int64_t first = std::max(t0, L.first_live(t));
  std::vector<std::string> recs;
  for (int64_t p = first; p < t; ++p) {
    recs.push_back(kv::SealV3TokenRecord(L, p, new_tokens[static_cast<size_t>(p - t0)],
                                         std::string_view(slices).substr(
                                             static_cast<size_t>((p - first) * L.slice_bytes(0, L.num_layers())),
                                             static_cast<size_t>(L.slice_bytes(0, L.num_layers())))));
  }
  return w->Append(t, recs, blocks);
}

absl::StatusOr<std::unique_ptr<V4Sequence>> LoadV4Sequence(const V4Config& c, const kv::ColiKv3Reader& r) {
  const kv::V3Layout& L = r.layout();
  RETURN_IF_ERROR(CheckHeader(c, L.header()));
  const int64_t t = r.num_tokens(), first = r.first_live();
  const int64_t sb = L.slice_bytes(0, L.num_layers());
  std::string slices, rec;
  for (int64_t p = first; p < t; ++p) {
    RETURN_IF_ERROR(r.ReadTokenRecord(p, &rec));
    slices.append(rec, static_cast<size_t>(L.slice_offset(0)), static_cast<size_t>(sb));
  }
  std::string log;
  RETURN_IF_ERROR(r.ReadBlockLog(&log));
  auto seq = std::make_unique<V4Sequence>(c);
  RETURN_IF_ERROR(DecodeV4Stage(c, L, 0, L.num_layers(), t, slices, log, seq.get()));
  seq->Commit(static_cast<int>(t));
  return seq;
}

}  // namespace strata::v4
