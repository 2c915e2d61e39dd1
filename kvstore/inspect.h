// The logic behind `strata kv inspect | verify | convert | import`: the CLI
// parses flags and calls these functions (docs/coli-kv.md, "Tools").
//
// Thread-safety: free functions; as thread-safe as the Env. Nothing here
// changes a file except ConvertSessionFile (its output) and ImportSession.
#ifndef STRATA_KVSTORE_INSPECT_H_
#define STRATA_KVSTORE_INSPECT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvstore/coli_kv.h"
#include "kvstore/coli_kv3.h"
#include "kvstore/manifest_v3.h"
#include "kvstore/env.h"
#include "kvstore/session_file.h"

namespace strata::kv {

struct InspectOptions {
  // How many leading token ids the report lists.
  int max_tokens = 16;
  // Read every committed record to count what sanitising would change
  // (NaN codes, inert rows, non-finite keys, token ids outside the vocab).
  bool scan_records = true;
  // Recompute the manifest's chunk checksums.
  bool verify_checksums = true;
  // When set, a manifest fingerprint that differs is a problem.
  std::optional<ModelIdentity> expected_fingerprint;
  // When set (`strata kv verify --full`), the manifest must record this model
  // digest; a manifest without one is a problem too (FAILED_PRECONDITION).
  std::optional<uint64_t> expected_model_digest;
};

// What Inspect found in a v3 file (docs/coli-kv.md, "Version 3").
struct V3InspectReport {
  V3Header header;
  int64_t token_record_bytes = 0;
  int32_t live_tokens = 0;  // N
  int32_t ring_slots = 0;   // R
  int64_t log_offset = 0;
  std::optional<V3Commit> commit;  // the current one, when one is valid
  int current = -1;                // which of the two commit records
  std::string other_commit;        // why the other is not current ("" when valid and older)
  std::vector<int32_t> live_token_ids;  // of positions [T − n, T), at most max_tokens
  std::optional<V3Manifest> manifest;   // when one parses
};

// What Inspect found. `problems` is empty for a healthy session file; each
// entry is a status with the code VerifyFile returns for it.
struct InspectReport {
  std::string path;
  uint64_t file_bytes = 0;
  std::string magic;  // "COLIKV1", "COLIKV2", "COLIKV3", or the first 8 bytes in hex
  std::optional<Header> header;  // when a v1/v2 header decodes
  std::optional<V3InspectReport> v3;  // when a v3 header decodes
  int64_t record_bytes = 0;
  int64_t nrec = 0;  // readable committed records
  bool torn = false;
  uint64_t bytes_after_records = 0;  // bytes past the committed records
  std::vector<int32_t> first_tokens;
  bool scanned = false;
  SanitizeStats sanitize;
  bool manifest_present = false;
  std::optional<Manifest> manifest;
  std::string checksums = "not checked";  // "ok", "mismatch", "not checked"
  std::vector<absl::Status> problems;

  // The report as one JSON object (keys documented in docs/coli-kv.md).
  std::string ToJson() const;
};

// NOT_FOUND when the file does not exist (other Env errors likewise); every
// problem with the contents is reported, not returned.
absl::StatusOr<InspectReport> Inspect(Env* env, const std::string& path,
                                      const InspectOptions& options);

// The v3 part of Inspect: fills report->v3, and with options.scan_records
// reads every live token record and the whole block log, each problem a
// DATA_LOSS entry; reads the v3 manifest (kvstore/manifest_v3.h) and checks
// it against the header, the committed tokens and the expected fingerprint
// and model digest (as for v1/v2: FAILED_PRECONDITION when there is none or
// it differs).
absl::Status InspectV3(Env* env, const std::string& path, const InspectOptions& options,
                       InspectReport* report);

// Inspect(...)->ToJson().
absl::StatusOr<std::string> InspectFile(Env* env, const std::string& path,
                                        const InspectOptions& options);

// OK when Inspect finds no problem; otherwise the first problem's status:
// DATA_LOSS (corrupt or torn file, checksum mismatch, sanitised values, bad
// token ids), INVALID_ARGUMENT (not a .coli_kv file), FAILED_PRECONDITION (no
// manifest, other fingerprint).
absl::Status VerifyFile(Env* env, const std::string& path, const InspectOptions& options);

// `strata kv convert --to v1|v2 IN OUT`: ConvertFile, and when IN has a
// manifest, OUT gets one too with the same fingerprint, indexer map,
// watermark and metadata and checksums recomputed over OUT's records.
// IN's manifest, when present, must be consistent (OpenCheckedSession rules,
// without fingerprint check). INVALID_ARGUMENT for an in-place conversion to
// v1 of a file with a manifest; ALREADY_EXISTS when IN has no manifest but
// OUT has one.
absl::Status ConvertSessionFile(Env* env, const std::string& in, const std::string& out,
                                Version to);

}  // namespace strata::kv

#endif  // STRATA_KVSTORE_INSPECT_H_
