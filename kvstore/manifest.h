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
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvstore/coli_kv.h"
#include "kvstore/coli_kv_file.h"
#include "kvstore/env.h"

namespace strata::kv {

struct Manifest {
  static constexpr int kFormatVersion = 1;
  static constexpr int32_t kDefaultChunkRecords = 64;

  // Identifies the checkpoint the KV rows were computed with (docs/design.md §4.6).
  uint64_t fingerprint = 0;
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
  // Records [0, turn_watermark) hold complete turns; <= the file's nrec.
  int64_t turn_watermark = 0;
  // Client-defined key/values.
  std::map<std::string, std::string> metadata;

  bool operator==(const Manifest&) const = default;
};

// Limits enforced by ValidateManifest / ParseManifest.
inline constexpr uint64_t kMaxManifestBytes = uint64_t{64} << 20;
inline constexpr int32_t kMaxChunkRecords = 1 << 20;
inline constexpr size_t kMaxMetadataEntries = 1024;
inline constexpr size_t kMaxMetadataKeyBytes = 256;
inline constexpr size_t kMaxMetadataValueBytes = 64 * 1024;

// INVALID_ARGUMENT naming the first violated rule: dims (ValidateDims),
// indexer_layers, chunk_records in [1, kMaxChunkRecords], chunk count within
// 2^31 records, 0 <= turn_watermark < 2^31, metadata sizes, metadata keys
// non-empty, keys and values valid UTF-8.
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

// The slot → layer map to assume when none is given: empty when nic == 0,
// every layer when nic == n_layers; INVALID_ARGUMENT otherwise (the map must
// come from the model's config).
absl::StatusOr<std::vector<int32_t>> DefaultIndexerLayers(const Dims& dims);

}  // namespace strata::kv

#endif  // STRATA_KVSTORE_MANIFEST_H_
