#include "kvstore/manifest_v3.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "kvstore/coli_kv.h"
#include "kvstore/manifest_internal.h"

namespace strata::kv {

using namespace manifest_internal;  // NOLINT: the shared manifest helpers

uint32_t V3HeaderCrc(const V3Header& h) {
  const std::string bytes = EncodeV3Header(h);
  return static_cast<uint32_t>(LoadI32(bytes.data() + bytes.size() - 4));
}

absl::Status ValidateV3Manifest(const V3Manifest& m) {
  if (m.fingerprint_version < 1 || m.fingerprint_version > Manifest::kCurrentFingerprintVersion) {
    return absl::InvalidArgumentError(absl::StrCat("invalid manifest: fingerprint_version must be in [1, ",
                                                   Manifest::kCurrentFingerprintVersion, "]"));
  }
  if (m.turn_watermark < 0 || m.turn_watermark > kMaxRecords) {
    return absl::InvalidArgumentError("invalid manifest: turn_watermark out of range");
  }
  return ValidateMetadata(m.metadata);
}

std::string SerializeV3Manifest(const V3Manifest& m) {
  Json j = Json::object();
  j["format"] = std::string(kFormatName);
  j["version"] = kV3ManifestVersion;
  j["fingerprint"] = absl::StrFormat("%016x", m.fingerprint);
  j["fingerprint_version"] = m.fingerprint_version;
  j["model_digest"] = m.model_digest.has_value() ? absl::StrFormat("%016x", *m.model_digest) : std::string();
  j["header_crc32c"] = m.header_crc32c;
  j["turn_watermark"] = m.turn_watermark;
  Json meta = Json::object();
  for (const auto& [k, v] : m.metadata) meta[k] = v;
  j["metadata"] = std::move(meta);
  return SealManifest(j);
}

absl::StatusOr<V3Manifest> ParseV3Manifest(std::string_view bytes) {
  int64_t version = 0;
  ASSIGN_OR_RETURN(Json j, ParseManifestJson(bytes, &version));
  if (version != kV3ManifestVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "manifest version ", version, " is not the manifest of a v3 data file (version ", kV3ManifestVersion, ")"));
  }
  RETURN_IF_ERROR(CheckKeys(j,
                            {"format", "version", "fingerprint", "fingerprint_version", "model_digest",
                             "header_crc32c", "turn_watermark", "metadata"},
                            "the manifest"));
  V3Manifest m;
  const Json& fp = j["fingerprint"];
  if (!fp.is_string()) return Corrupt("\"fingerprint\" must be 16 lowercase hex digits");
  ASSIGN_OR_RETURN(m.fingerprint, ParseHex64(fp.get_ref<const std::string&>(), "fingerprint"));
  ASSIGN_OR_RETURN(m.fingerprint_version, GetInt(j, "fingerprint_version", 1, Manifest::kCurrentFingerprintVersion));
  const Json& digest = j["model_digest"];
  if (!digest.is_string()) return Corrupt("\"model_digest\" must be a string");
  if (!digest.get_ref<const std::string&>().empty()) {
    ASSIGN_OR_RETURN(m.model_digest, ParseHex64(digest.get_ref<const std::string&>(), "model_digest"));
  }
  ASSIGN_OR_RETURN(int64_t crc, GetInt(j, "header_crc32c", 0, 0xFFFFFFFFll));
  m.header_crc32c = static_cast<uint32_t>(crc);
  ASSIGN_OR_RETURN(m.turn_watermark, GetInt(j, "turn_watermark", 0, kMaxRecords));
  ASSIGN_OR_RETURN(m.metadata, GetMetadata(j));
  if (absl::Status s = ValidateV3Manifest(m); !s.ok()) return Corrupt(s.message());
  return m;
}

absl::StatusOr<V3Manifest> ReadV3Manifest(Env* env, const std::string& manifest_path) {
  absl::StatusOr<std::string> bytes = ReadFileToString(env, manifest_path, kMaxManifestBytes);
  if (!bytes.ok()) {
    if (absl::IsFailedPrecondition(bytes.status())) return Corrupt(bytes.status().message());
    return bytes.status();
  }
  absl::StatusOr<V3Manifest> m = ParseV3Manifest(*bytes);
  if (!m.ok()) return absl::Status(m.status().code(), absl::StrCat(manifest_path, ": ", m.status().message()));
  return m;
}

absl::Status WriteV3Manifest(Env* env, const std::string& manifest_path, const V3Manifest& m) {
  RETURN_IF_ERROR(ValidateV3Manifest(m));
  return WriteFileAtomically(env, manifest_path, SerializeV3Manifest(m));
}

absl::Status CheckV3ManifestAgainst(const V3Manifest& m, const V3Header& header, int64_t num_tokens) {
  const uint32_t crc = V3HeaderCrc(header);
  if (m.header_crc32c != crc) {
    return absl::DataLossError(absl::StrFormat(
        "the manifest belongs to another data file (header CRC32C %08x, the file's is %08x)", m.header_crc32c, crc));
  }
  if (m.turn_watermark > num_tokens) {
    return absl::DataLossError(
        absl::StrCat("the turn watermark ", m.turn_watermark, " is beyond the ", num_tokens, " committed tokens"));
  }
  return absl::OkStatus();
}

}  // namespace strata::kv
