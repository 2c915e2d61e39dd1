// A session on disk is a `.coli_kv` data file plus its manifest
// (docs/coli-kv.md, "Sessions on disk"). These functions open the pair with
// every consistency check, and take a foreign file (one written by colibri,
// without a manifest) in by an explicit import.
//
// Thread-safety: free functions, as thread-safe as the Env; callers serialise
// work on one session.
#ifndef STRATA_KVSTORE_SESSION_FILE_H_
#define STRATA_KVSTORE_SESSION_FILE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvstore/coli_kv_file.h"
#include "kvstore/env.h"
#include "kvstore/manifest.h"

namespace strata::kv {

struct CheckOptions {
  // When set, a manifest with another fingerprint is refused
  // (FAILED_PRECONDITION, CheckModelIdentity).
  std::optional<ModelIdentity> expected_fingerprint;
  // Recompute the CRC32C of every chunk the manifest covers and compare.
  bool verify_checksums = true;
};

struct CheckedSession {
  std::unique_ptr<ColiKvReader> reader;
  Manifest manifest;
};

// Opens data file + manifest and checks, in this order:
//   NOT_FOUND            the data file is missing;
//   (reader errors)      DATA_LOSS / INVALID_ARGUMENT from the header;
//   FAILED_PRECONDITION  no manifest: the file must be imported first;
//   DATA_LOSS            manifest unreadable, or its dims differ from the header,
//                        or it checksums more records than the file commits,
//                        or its watermark is beyond the committed records;
//   FAILED_PRECONDITION  fingerprint differs from expected_fingerprint (the
//                        rows were computed by another checkpoint);
//   DATA_LOSS            a chunk checksum does not match (names the chunk).
absl::StatusOr<CheckedSession> OpenCheckedSession(Env* env, const std::string& data_path,
                                                  const CheckOptions& options);

struct ImportOptions {
  // The model's dimensions; the file's header must hold exactly these.
  Dims dims;
  uint64_t fingerprint = 0;  // the current version
  std::optional<uint64_t> model_digest;
  // Slot → layer map (Manifest::indexer_layers); empty means
  // DefaultIndexerLayers(dims).
  std::vector<int32_t> indexer_layers;
  int32_t chunk_records = Manifest::kDefaultChunkRecords;
  std::map<std::string, std::string> metadata;
};

// Takes a manifest-less data file in: checks its header against
// options.dims (FAILED_PRECONDITION naming the differing fields), computes
// the checksums of its complete chunks, sets the turn watermark to its
// committed records, and writes the manifest atomically. ALREADY_EXISTS when
// the file has a manifest; NOT_FOUND when the file is missing;
// INVALID_ARGUMENT for a bad indexer layer list.
absl::Status ImportSession(Env* env, const std::string& data_path, const ImportOptions& options);

}  // namespace strata::kv

#endif  // STRATA_KVSTORE_SESSION_FILE_H_
