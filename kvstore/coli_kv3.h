// The `.coli_kv` version 3 layout (magic COLIKV3): the carried state of a
// DeepSeek-V4 sequence (docs/deepseek-v4.md §4.4) as a header, two commit
// records, a ring of per-token records and a log of per-closed-block records.
// Every byte is documented in docs/coli-kv.md, "Version 3"; this header is its
// code: the header and commit codecs, the record layout, the row encodings.
//
// Pure functions and immutable value types: thread-safe.
#ifndef STRATA_KVSTORE_COLI_KV3_H_
#define STRATA_KVSTORE_COLI_KV3_H_

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace strata::kv {

inline constexpr std::string_view kMagicV3{"COLIKV3\0", 8};
inline constexpr int32_t kV3FormatTag = 2;
// Header and commit records each start a region aligned to this many bytes,
// so that writing one commit record never touches a sector of another.
inline constexpr int64_t kV3RegionAlign = 4096;
inline constexpr int32_t kV3MaxTokens = 0x7FFFFFFF;

// A layer's attention kind as stored (docs/deepseek-v4.md §1.2).
enum class V3Kind : int32_t { kSliding = 0, kCsa = 1, kHca = 2 };

// How window rows and compressed rows are stored; everything else is f32.
enum class V3RowFormat : int32_t {
  kF32 = 0,  // head_dim f32: exact
  kFp8 = 1,  // DeepSeek's cache row: e4m3 nope values, one power-of-two scale per 64, bf16 rope
};

struct V3Layer {
  V3Kind kind = V3Kind::kSliding;
  int32_t rate = 0;  // m: 0 for sliding layers
  bool operator==(const V3Layer&) const = default;
};

// What the header stores.
struct V3Header {
  int32_t head_dim = 0;  // d: the shared K=V row
  int32_t rope_dim = 0;  // dr: trailing rotated channels of a row
  int32_t index_hd = 0;  // di: index key width (CSA layers)
  int32_t window = 0;    // W: the sliding window, W − 1 rows carried per layer
  int32_t vocab = 0;     // token ids are in [0, vocab)
  V3RowFormat row_format = V3RowFormat::kF32;
  std::vector<V3Layer> layers;

  bool operator==(const V3Header&) const = default;
  std::string ToString() const;
};

// INVALID_ARGUMENT unless 1 <= layers <= 1024, 1 <= head_dim <= 65536,
// 0 <= rope_dim <= head_dim, 0 <= index_hd <= 65536 (>= 1 with a CSA layer),
// 1 <= window <= 65536, 1 <= vocab <= 2^30, sliding layers rate 0 and the
// others 1 <= rate <= 65536, a known row format, and a token record of at
// most 1 GiB.
absl::Status ValidateV3Header(const V3Header& h);

// 44 + 8 · layers bytes: fixed fields, (kind, rate) per layer, CRC32C.
std::string EncodeV3Header(const V3Header& h);

// Parses and validates a header from the first bytes of a file:
//   INVALID_ARGUMENT  the bytes (up to 8) do not start like COLIKV3;
//   DATA_LOSS         too few bytes, tag not 2, layer count out of range, a
//                     CRC32C mismatch, or ValidateV3Header failing.
absl::StatusOr<V3Header> DecodeV3Header(std::string_view bytes);

// A commit record: the committed state of the file.
struct V3Commit {
  uint64_t seq = 0;         // >= 1; the larger valid one of the two is current
  int64_t num_tokens = 0;   // T
  uint64_t log_bytes = 0;   // committed bytes of the block log
  std::vector<int32_t> slots;  // min(T, live_tokens) entries: ring slot of position T − n + i
  bool operator==(const V3Commit&) const = default;
};

// Where everything lives, and the counts that follow from the header.
// REQUIRES (constructor): ValidateV3Header(h) is OK.
class V3Layout {
 public:
  explicit V3Layout(const V3Header& h);

  const V3Header& header() const { return h_; }
  int num_layers() const { return static_cast<int>(h_.layers.size()); }
  int window_slots() const { return h_.window - 1; }  // S = W − 1

  // Positions whose token records the state at any T needs: the last N.
  // N = max(S, m − 1 over HCA layers, 2m − 1 over CSA layers).
  int32_t live_tokens() const { return live_; }
  int32_t ring_slots() const { return 2 * live_; }  // R

  // Bytes of one stored row (window or compressed): 4·d for f32; for fp8
  // roundup8(nope + ceil(nope/64) + 2·dr) with nope = d − dr (584 at 512/64).
  int64_t row_bytes() const { return row_bytes_; }

  // Token record: position, token id, per layer its parts, CRC32C.
  int64_t token_bytes() const { return token_bytes_; }
  int64_t window_offset(int layer) const { return layer_off_[layer]; }  // S > 0 only
  // CSA: raw kv_proj (2d), gate_proj (2d), indexer kv (2di), indexer gate
  // (2di), f32; HCA: kv (d), gate (d). coff·width floats each.
  int64_t kv_offset(int layer) const { return layer_off_[layer] + (window_slots() > 0 ? row_bytes_ : 0); }
  int64_t gate_offset(int layer) const { return kv_offset(layer) + 4 * coff(layer) * h_.head_dim; }
  int64_t index_kv_offset(int layer) const { return gate_offset(layer) + 4 * coff(layer) * h_.head_dim; }
  int64_t index_gate_offset(int layer) const { return index_kv_offset(layer) + 8 * int64_t{h_.index_hd}; }
  int coff(int layer) const { return h_.layers[layer].kind == V3Kind::kCsa ? 2 : 1; }
  // A layer range's part of a token record: the bytes [slice_offset(begin),
  // slice_offset(end)) — each layer's parts are contiguous, in layer order.
  // REQUIRES: 0 <= layer <= num_layers().
  int64_t slice_offset(int layer) const { return layer_off_[layer]; }
  int64_t slice_bytes(int begin, int end) const { return layer_off_[end] - layer_off_[begin]; }
  // The first position whose token record the state at T needs: T − min(T, N).
  int64_t first_live(int64_t num_tokens) const { return num_tokens - std::min<int64_t>(num_tokens, live_); }

  // Block record: layer, block index, row, index key (CSA), CRC32C.
  int64_t block_bytes(int layer) const;  // 0 for sliding layers
  // Committed block-log bytes at T tokens: sum of floor(T/m) · block_bytes.
  uint64_t LogBytes(int64_t num_tokens) const;
  // The closes of the tokens (t0, t1], in log order: by close count c =
  // (w + 1) · m, then by layer. Each entry is (layer, block w).
  std::vector<std::pair<int, int32_t>> Closes(int64_t t0, int64_t t1) const;

  int64_t header_bytes() const { return 44 + 8 * int64_t{num_layers()}; }
  int64_t commit_bytes() const { return 32 + 4 * int64_t{live_}; }
  int64_t commit_offset(int which) const { return header_region_ + which * commit_region_; }
  int64_t ring_offset() const { return header_region_ + 2 * commit_region_; }
  int64_t slot_offset(int32_t slot) const { return ring_offset() + slot * token_bytes_; }
  int64_t log_offset() const { return ring_offset() + int64_t{ring_slots()} * token_bytes_; }

 private:
  V3Header h_;
  int32_t live_ = 0;
  int64_t row_bytes_ = 0;
  int64_t token_bytes_ = 0;
  std::vector<int64_t> layer_off_;
  int64_t header_region_ = 0;
  int64_t commit_region_ = 0;
};

// commit_bytes() bytes: seq, T, log bytes, the slot count, the slot table
// (unused entries −1), CRC32C.
std::string EncodeV3Commit(const V3Layout& layout, const V3Commit& c);
// DATA_LOSS unless the CRC32C matches, seq >= 1, 0 <= T <= 2^31 − 1, the slot
// count is min(T, live_tokens), the used slots distinct and in [0, R), the
// unused −1, and log_bytes == layout.LogBytes(T). A commit record that fails
// is treated as never written (a torn or lost write).
absl::StatusOr<V3Commit> DecodeV3Commit(const V3Layout& layout, std::string_view bytes);

// Sets / checks the CRC32C in the last 4 bytes of a token or block record.
void SealV3Record(char* rec, int64_t bytes);
bool V3RecordSealed(const char* rec, int64_t bytes);
// A sealed token record of position p: p, the token id, then `parts` (every
// layer's part, slice_bytes(0, num_layers()) bytes), then the CRC32C.
// REQUIRES: parts has that size.
std::string SealV3TokenRecord(const V3Layout& layout, int64_t p, int32_t token, std::string_view parts);

// Row codecs. f32: the bytes of the floats. fp8 (docs/coli-kv.md, "Version
// 3"): REQUIRES out/in have row_bytes() bytes, row has head_dim floats.
void EncodeV3Row(const V3Layout& layout, const float* row, char* out);
void DecodeV3Row(const V3Layout& layout, const char* in, float* row);

}  // namespace strata::kv

#endif  // STRATA_KVSTORE_COLI_KV3_H_
