// The `.coli_kv` session file format (v1: f32 rows, v2: fp8 rows + f32
// scales): header, record layout, per-record conversion and sanitisation.
// Every byte is documented in docs/coli-kv.md; this header is its code.
//
// All integers and floats are little-endian; Strata builds only on
// little-endian hosts (checked at compile time), so records are plain bytes.
//
// Everything here is a pure function or an immutable value type: thread-safe.
#ifndef STRATA_KVSTORE_COLI_KV_H_
#define STRATA_KVSTORE_COLI_KV_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace strata::kv {

inline constexpr int kHeaderBytes = 40;
inline constexpr int kNrecOffset = 32;
inline constexpr std::string_view kMagicV1{"COLIKV1\0", 8};
inline constexpr std::string_view kMagicV2{"COLIKV2\0", 8};

enum class Version : int32_t { kV1 = 1, kV2 = 2 };

// Upper bounds a header must respect (docs/coli-kv.md, "Header"); they keep
// every size computation far from overflow.
inline constexpr int32_t kMaxLayers = 1024;
inline constexpr int32_t kMaxRowWidth = 65536;  // kv_lora, qk_rope, index_hd
inline constexpr int32_t kMaxVocab = 1 << 30;
inline constexpr int64_t kMaxRecordBytes = int64_t{1} << 30;

// The dimensions stored in the header.
struct Dims {
  int32_t n_layers = 0;
  int32_t kv_lora = 0;   // latent width (512 for DeepSeek-V3 and GLM-5)
  int32_t qk_rope = 0;   // rope key width (64)
  int32_t index_hd = 0;  // DSA indexer key width; 0 without DSA
  int32_t nic = 0;       // number of layers with an indexer cache
  int32_t vocab = 0;     // token ids are in [0, vocab)

  bool operator==(const Dims&) const = default;
  std::string ToString() const;
};

// INVALID_ARGUMENT unless 1 <= n_layers <= kMaxLayers, 1 <= kv_lora,
// 0 <= qk_rope, 0 <= index_hd (all widths <= kMaxRowWidth), 0 <= nic <=
// n_layers, nic == 0 when index_hd == 0, 1 <= vocab <= kMaxVocab, and a v1
// record (the larger) fits in kMaxRecordBytes.
absl::Status ValidateDims(const Dims& dims);

struct Header {
  Version version = Version::kV2;
  Dims dims;
  int32_t nrec = 0;  // committed records as stored
};

// Writes the 40 header bytes. REQUIRES: out has 40 bytes.
void EncodeHeader(const Header& header, char* out);
std::string EncodeHeader(const Header& header);

// Parses and validates 40 header bytes:
//   INVALID_ARGUMENT  the bytes (up to 8) do not start like COLIKV1 or COLIKV2
//                     (not a .coli_kv file);
//   DATA_LOSS         fewer than 40 bytes (a cut-off header);
//   DATA_LOSS         format tag not matching the magic, dims out of bounds
//                     (see ValidateDims), negative nrec.
absl::StatusOr<Header> DecodeHeader(std::string_view bytes);

// Where each field of a record lives (offsets from the start of the record).
// REQUIRES (constructor): ValidateDims(dims) is OK.
class RecordLayout {
 public:
  RecordLayout(Version version, const Dims& dims);

  Version version() const { return version_; }
  const Dims& dims() const { return dims_; }

  // v1: 4·(kv_lora + qk_rope); v2: kv_lora + qk_rope + 8.
  int64_t layer_bytes() const { return layer_bytes_; }
  int64_t indexer_bytes() const { return int64_t{dims_.index_hd} * 4; }
  int64_t record_bytes() const { return record_bytes_; }

  static constexpr int64_t token_offset() { return 0; }
  int64_t layer_offset(int layer) const { return 4 + layer * layer_bytes_; }
  int64_t latent_offset(int layer) const { return layer_offset(layer); }
  // v2 only.
  int64_t latent_scale_offset(int layer) const { return layer_offset(layer) + dims_.kv_lora; }
  int64_t rope_offset(int layer) const {
    return layer_offset(layer) +
           (version_ == Version::kV1 ? int64_t{4} * dims_.kv_lora : dims_.kv_lora + 4);
  }
  // v2 only.
  int64_t rope_scale_offset(int layer) const { return rope_offset(layer) + dims_.qk_rope; }
  int64_t indexer_offset(int slot) const {
    return 4 + int64_t{dims_.n_layers} * layer_bytes_ + slot * indexer_bytes();
  }
  // Offset of record p in the file.
  int64_t file_offset(int64_t p) const { return kHeaderBytes + p * record_bytes_; }

 private:
  Version version_;
  Dims dims_;
  int64_t layer_bytes_;
  int64_t record_bytes_;
};

// Counts of what Sanitize changed.
struct SanitizeStats {
  int64_t nan_codes = 0;        // fp8 codes 0x7F / 0xFF set to 0x00
  int64_t inert_rows = 0;       // rows with an unusable scale, set to zero codes, scale 1
  int64_t nonfinite_keys = 0;   // indexer key values that were NaN or ±inf, set to 0
  int64_t bad_tokens = 0;       // token ids outside [0, vocab) (not changed)

  void Add(const SanitizeStats& o);
  bool clean() const { return nan_codes + inert_rows + nonfinite_keys + bad_tokens == 0; }
};

// Sanitises one v2 record in place (docs/coli-kv.md, "Sanitising on load"):
// NaN codes become 0; a row whose scale is not finite and positive
// (fp8::ScaleIsUsable) becomes inert: all codes 0 and scale 1.0, the exact
// bytes QuantizeRow gives an all-zero row; non-finite indexer key values
// become 0. Token ids are only counted. REQUIRES: rec has
// layout.record_bytes() bytes and layout.version() == kV2.
void SanitizeV2Record(const RecordLayout& layout, char* rec, SanitizeStats* stats);

// Quantises one v1 record into v2 bytes with the fp8 codec: token id and
// indexer keys copied, the latent and the rope row of each layer quantised
// separately (fp8::QuantizeRow). Deterministic: the bytes a v1 → v2 upgrade
// writes. REQUIRES: v1 has record_bytes of a v1 layout, v2 of a v2 layout, for
// the same dims.
void QuantizeV1Record(const Dims& dims, const char* v1, char* v2);

// Decodes one (sanitised) v2 record into v1 bytes: each value is
// Decode(code) · scale. REQUIRES: sizes as above.
void DequantizeV2Record(const Dims& dims, const char* v2, char* v1);

// Builds one v2 record in a staging buffer ("one staging buffer per record").
// Not thread-safe; reuse with Reset.
class RecordBuilder {
 public:
  // REQUIRES: ValidateDims(dims) is OK.
  explicit RecordBuilder(const Dims& dims);

  void Reset();  // all bytes zero, every scale 1.0
  void SetToken(int32_t token);
  // Quantises the latent (kv_lora floats) and rope (qk_rope floats) of a layer.
  // REQUIRES: 0 <= layer < n_layers.
  void SetLayer(int layer, const float* latent, const float* rope);
  // Stores already quantised rows. REQUIRES: spans sized kv_lora and qk_rope.
  void SetLayerCodes(int layer, std::span<const uint8_t> latent, float latent_scale,
                     std::span<const uint8_t> rope, float rope_scale);
  // REQUIRES: 0 <= slot < nic; keys has index_hd floats.
  void SetIndexerKeys(int slot, const float* keys);

  std::string_view bytes() const { return buf_; }
  const RecordLayout& layout() const { return layout_; }

 private:
  RecordLayout layout_;
  std::string buf_;
};

// Little-endian scalar access into record bytes.
int32_t LoadI32(const char* p);
float LoadF32(const char* p);
void StoreI32(char* p, int32_t v);
void StoreF32(char* p, float v);

}  // namespace strata::kv

#endif  // STRATA_KVSTORE_COLI_KV_H_
