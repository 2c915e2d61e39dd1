// V3Manifest: the sidecar of a `.coli_kv` v3 file (DeepSeek-V4 state),
// `<session>.coli_kv.manifest` as for v1/v2 files, with the same trailer and
// the same strict JSON rules but its own key set (manifest `version` 3): the
// model fingerprint, the CRC32C of the data file's header (which ties the
// manifest to that file's layout), the turn watermark and metadata. No record
// checksums: every v3 token and block record carries its own CRC32C.
// Format: docs/coli-kv.md, "Manifest of a v3 file".
//
// Thread-safety: plain value type and pure functions; reads and writes are
// as thread-safe as the Env (writers of one manifest serialised by the
// caller).
#ifndef STRATA_KVSTORE_MANIFEST_V3_H_
#define STRATA_KVSTORE_MANIFEST_V3_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvstore/coli_kv3.h"
#include "kvstore/env.h"
#include "kvstore/manifest.h"

namespace strata::kv {

struct V3Manifest {
  // The model fingerprint (docs/coli-kv.md, "Model fingerprint") and its
  // algorithm version (1 or 2; new manifests record 2).
  uint64_t fingerprint = 0;
  int32_t fingerprint_version = Manifest::kCurrentFingerprintVersion;
  std::optional<uint64_t> model_digest;
  // The CRC32C the data file's header stores (V3HeaderCrc).
  uint32_t header_crc32c = 0;
  // Tokens [0, turn_watermark) hold complete turns; <= the file's T.
  int64_t turn_watermark = 0;
  std::map<std::string, std::string> metadata;

  bool operator==(const V3Manifest&) const = default;
};

// The CRC32C a v3 header stores (its last 4 bytes). REQUIRES: valid header.
uint32_t V3HeaderCrc(const V3Header& h);

// INVALID_ARGUMENT: fingerprint_version not 1 or 2, watermark outside
// [0, 2^31), metadata beyond the manifest limits.
absl::Status ValidateV3Manifest(const V3Manifest& m);
// REQUIRES: ValidateV3Manifest(m) is OK.
std::string SerializeV3Manifest(const V3Manifest& m);
// DATA_LOSS for anything malformed; FAILED_PRECONDITION when the bytes are a
// v1/v2 manifest (version 1 or 2) or a newer version.
absl::StatusOr<V3Manifest> ParseV3Manifest(std::string_view bytes);
// NOT_FOUND when missing; otherwise ParseV3Manifest's codes.
absl::StatusOr<V3Manifest> ReadV3Manifest(Env* env, const std::string& manifest_path);
// Replaces the manifest atomically (WriteManifest's protocol).
absl::Status WriteV3Manifest(Env* env, const std::string& manifest_path, const V3Manifest& m);

// The manifest's version-3 check against a data file's header and committed
// token count: DATA_LOSS when the header CRC32C differs or the watermark is
// beyond T.
absl::Status CheckV3ManifestAgainst(const V3Manifest& m, const V3Header& header, int64_t num_tokens);

}  // namespace strata::kv

#endif  // STRATA_KVSTORE_MANIFEST_V3_H_
