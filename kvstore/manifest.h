// Manifest: the sidecar file kept next to each session's `.coli_kv` file
// (`<session>.coli_kv.manifest`): model fingerprint, dimensions, which layers
// own the indexer slots, CRC32C checksums of complete chunks of records, the
// last complete-turn watermark and free-form metadata. Serialised as strictly
// validated JSON followed by a CRC32C trailer line, replaced atomically; the
// format and its rules are in docs/coli-kv.md ("Manifest").
//
// Thread-safety: plain value type and pure functions; ReadManifest and
// WriteManifest are as thread-safe as the Env (two concurrent writers of the
// same manifest must be serialised by the caller).
#ifndef STRATA_KVSTORE_MANIFEST_H_
#define STRATA_KVSTORE_MANIFEST_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvstore/coli_kv.h"
#include "kvstore/coli_kv_file.h"
#include "kvstore/env.h"

namespace strata::kv {

struct Manifest {
  // Version 2 added fingerprint_version and the tail checksum; version 1
  // files still parse (fingerprint_version 1, no tail).
  static constexpr int kFormatVersion = 2;
  static constexpr int32_t kDefaultChunkRecords = 64;
  // The ModelFingerprint algorithm new manifests record (model/fingerprint.h).
  static constexpr int32_t kCurrentFingerprintVersion = 2;

  // Identifies the checkpoint the KV rows were computed with
  // (docs/coli-kv.md, "Manifest").
  uint64_t fingerprint = 0;
  // Which fingerprint algorithm computed `fingerprint`: 1 (config, headers,
  // two tensors; every version-1 manifest) or 2 (every tensor sampled).
  int32_t fingerprint_version = kCurrentFingerprintVersion;
  // The model digest (every byte of the checkpoint hashed), when the cluster
  // that created the session computed one; `strata kv verify --full`
  // compares it.
  std::optional<uint64_t> model_digest;
  // Equal to the data file's header dims.
  Dims dims;
  // indexer_layers[s] is the layer whose DSA indexer keys sit in slot s of a
  // record; nic entries, strictly increasing, each in [0, n_layers).
  std::vector<int32_t> indexer_layers;
  // Records per checksummed chunk.
  int32_t chunk_records = kDefaultChunkRecords;
  // chunk_crc32c[k]: CRC32C of the v2 encoding (RecordFormat::kV2) of records
  // [k·chunk_records, (k+1)·chunk_records). Covers complete chunks of
  // committed records only; may lag behind the data file's nrec.
  std::vector<uint32_t> chunk_crc32c;
  // The committed records after the complete chunks, when there are any:
  // tail_crc32c is the CRC32C of the v2 encoding of records [c, c +
  // tail_records) where c = chunk_crc32c.size() · chunk_records.
  // 0 <= tail_records < chunk_records; 0: no tail checksum.
  int32_t tail_records = 0;
  uint32_t tail_crc32c = 0;
  // Records [0, turn_watermark) hold complete turns; <= the file's nrec.
  int64_t turn_watermark = 0;
  // Client-defined key/values.
  std::map<std::string, std::string> metadata;

  bool operator==(const Manifest&) const = default;
};

// What a caller knows of the identity of its model (model/fingerprint.h):
// the current fingerprint and, to accept sessions whose manifests record a
// version-1 fingerprint, the version-1 value.
struct ModelIdentity {
  ModelIdentity(uint64_t fp) : fingerprint(fp) {}  // NOLINT: a bare fingerprint converts
  ModelIdentity(uint64_t fp, std::optional<uint64_t> legacy) : fingerprint(fp), legacy_fingerprint(legacy) {}
  uint64_t fingerprint = 0;                     // version Manifest::kCurrentFingerprintVersion
  std::optional<uint64_t> legacy_fingerprint;  // version 1
};

// OK when the manifest's fingerprint equals the caller's value of the same
// algorithm version; FAILED_PRECONDITION naming both values otherwise (or
// saying that the caller has no value of that version). `what` names the
// session or file in the message.
absl::Status CheckModelIdentity(const Manifest& m, const ModelIdentity& model, std::string_view what);
// The same for a fingerprint of the given algorithm version (v3 manifests).
absl::Status CheckModelIdentity(uint64_t fingerprint, int32_t fingerprint_version, const ModelIdentity& model,
                                std::string_view what);

// The manifest `version` of a v3 data file's manifest (kvstore/manifest_v3.h);
// ParseManifest refuses it with FAILED_PRECONDITION.
inline constexpr int kV3ManifestVersion = 3;

// Limits enforced by ValidateManifest / ParseManifest.
inline constexpr uint64_t kMaxManifestBytes = uint64_t{64} << 20;
inline constexpr int32_t kMaxChunkRecords = 1 << 20;
inline constexpr size_t kMaxMetadataEntries = 1024;
inline constexpr size_t kMaxMetadataKeyBytes = 256;
inline constexpr size_t kMaxMetadataValueBytes = 64 * 1024;

// INVALID_ARGUMENT naming the first violated rule: dims (ValidateDims),
// indexer_layers, chunk_records in [1, kMaxChunkRecords], chunk count within
// 2^31 records, 0 <= tail_records < chunk_records (tail_crc32c 0 without a
// tail), fingerprint_version 1 or 2, 0 <= turn_watermark < 2^31, metadata
// sizes, metadata keys non-empty, keys and values valid UTF-8.
absl::Status ValidateManifest(const Manifest& m);

// REQUIRES: ValidateManifest(m) is OK.
std::string SerializeManifest(const Manifest& m);

// Parses a manifest file's bytes. DATA_LOSS for anything malformed (missing
// or bad trailer, checksum mismatch, JSON syntax, missing/unknown/duplicate
// keys, wrong types, values out of range); FAILED_PRECONDITION for a format
// version newer than kFormatVersion.
absl::StatusOr<Manifest> ParseManifest(std::string_view bytes);

// The manifest path of a data file: data_path + ".manifest".
std::string ManifestPath(const std::string& data_path);

// NOT_FOUND when the manifest does not exist; otherwise ParseManifest's codes.
absl::StatusOr<Manifest> ReadManifest(Env* env, const std::string& manifest_path);

// Replaces the manifest atomically (temporary file, Sync, Rename, SyncDir):
// after a crash the old or the new manifest is there, complete.
// INVALID_ARGUMENT when m is not valid.
absl::Status WriteManifest(Env* env, const std::string& manifest_path, const Manifest& m);

// CRC32C of the v2 encoding of each complete chunk k in [first_chunk,
// end_chunk). REQUIRES: end_chunk · chunk_records <= reader.nrec().
absl::StatusOr<std::vector<uint32_t>> ComputeChunkCrcs(const ColiKvReader& reader,
                                                       int32_t chunk_records,
                                                       int64_t first_chunk, int64_t end_chunk);

// Reads `count` records from record `first` on, in their v2 encoding, into
// *out (resized to count · record bytes).
using ReadV2Records = absl::FunctionRef<absl::Status(int64_t first, int64_t count, std::string* out)>;

// Sets m's chunk checksums and tail checksum to cover records [0, nrec): the
// chunks m already has are kept (not recomputed), the missing ones and the
// tail are computed from `read`. OUT_OF_RANGE when m's chunks cover more
// than nrec records.
absl::Status CoverRecords(int64_t nrec, ReadV2Records read, Manifest* m);

// CoverRecords over every committed record of `reader`.
absl::Status CoverCommittedRecords(const ColiKvReader& reader, Manifest* m);

// A range of records whose checksum in the manifest does not match.
struct ChecksumMismatch {
  int64_t first = 0;   // first record of the range
  int64_t count = 0;   // records in the range
  int64_t chunk = -1;  // the chunk's index; -1 for the tail
  uint32_t stored = 0;
  uint32_t computed = 0;
};

// Recomputes every checksum m holds (its chunks, then its tail) over the
// records of `reader`; returns the mismatches in record order.
// OUT_OF_RANGE when m covers more records than the reader commits.
absl::StatusOr<std::vector<ChecksumMismatch>> FindChecksumMismatches(const ColiKvReader& reader,
                                                                     const Manifest& m);

// "chunk K (records A to B)" or "the records after the last complete chunk
// (records A to B)", for error messages.
std::string DescribeRange(const ChecksumMismatch& m);

// First record after the complete chunks, and the end of what m's checksums
// cover (complete chunks and tail).
int64_t ChunkedRecords(const Manifest& m);
int64_t ChecksummedRecords(const Manifest& m);

// The slot → layer map to assume when none is given: empty when nic == 0,
// every layer when nic == n_layers; INVALID_ARGUMENT otherwise (the map must
// come from the model's config).
absl::StatusOr<std::vector<int32_t>> DefaultIndexerLayers(const Dims& dims);

}  // namespace strata::kv

#endif  // STRATA_KVSTORE_MANIFEST_H_
