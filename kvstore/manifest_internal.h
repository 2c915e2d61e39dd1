// The JSON helpers the manifest parsers share (kvstore/manifest.cc for v1/v2
// data files, kvstore/manifest_v3.cc for v3 ones): the trailer and checksum,
// strict key sets, ranged integers, hex fingerprints, metadata limits
// (docs/coli-kv.md, "Manifest"). Internal to kvstore/.
//
// Pure functions: thread-safe.
#ifndef STRATA_KVSTORE_MANIFEST_INTERNAL_H_
#define STRATA_KVSTORE_MANIFEST_INTERNAL_H_

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <map>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace strata::kv::manifest_internal {

using Json = nlohmann::json;

inline constexpr char kFormatName[] = "strata.coli_kv.manifest";
inline constexpr int64_t kMaxRecords = std::numeric_limits<int32_t>::max();

bool ValidUtf8(std::string_view s);
// DATA_LOSS "corrupt manifest: <why>".
absl::Status Corrupt(absl::string_view why);
// An integer member in [lo, hi] (DATA_LOSS when missing, not an integer or
// out of range).
absl::StatusOr<int64_t> GetInt(const Json& obj, const char* key, int64_t lo, int64_t hi);
// 16 lowercase hex digits.
absl::StatusOr<uint64_t> ParseHex64(const std::string& s, absl::string_view key);
// DATA_LOSS unless obj is an object with exactly these keys.
absl::Status CheckKeys(const Json& obj, std::initializer_list<std::string_view> keys, absl::string_view what);
// INVALID_ARGUMENT when the metadata breaks the manifest's limits.
absl::Status ValidateMetadata(const std::map<std::string, std::string>& metadata);
// The "metadata" member (an object of strings).
absl::StatusOr<std::map<std::string, std::string>> GetMetadata(const Json& j);
// The JSON line followed by its crc32c trailer line.
std::string SealManifest(const Json& j);
// Checks size, trailer, checksum, nesting, duplicate keys and "format";
// returns the object and its "version" (not yet compared with anything).
absl::StatusOr<Json> ParseManifestJson(std::string_view bytes, int64_t* version);

}  // namespace strata::kv::manifest_internal

#endif  // STRATA_KVSTORE_MANIFEST_INTERNAL_H_
