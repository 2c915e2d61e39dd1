#include "kvstore/manifest.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "kvstore/crc32c.h"
#include "kvstore/manifest_internal.h"
#include "nlohmann/json.hpp"

namespace strata::kv {
namespace manifest_internal {
namespace {

constexpr std::string_view kTrailerPrefix = "crc32c ";
constexpr size_t kTrailerBytes = 7 + 8 + 1;  // "crc32c " + 8 hex digits + '\n'
// Nesting of a valid manifest: top object → dims/metadata object or array.
constexpr int kMaxDepth = 2;

}  // namespace

bool ValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    int n;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      n = 1;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    for (int k = 1; k <= n; ++k) {
      if (i + k >= s.size()) return false;
      const unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    static constexpr uint32_t kMin[4] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += static_cast<size_t>(n) + 1;
  }
  return true;
}

absl::Status Corrupt(absl::string_view why) {
  return absl::DataLossError(absl::StrCat("corrupt manifest: ", why));
}

// Largest nesting of objects and arrays outside strings (a linear scan that
// needs no memory, run before the parser so that it never builds deep stacks).
int MaxNesting(std::string_view s) {
  int depth = 0;
  int max_depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      max_depth = std::max(max_depth, ++depth);
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return max_depth;
}

// Reads an integer member in [lo, hi].
absl::StatusOr<int64_t> GetInt(const Json& obj, const char* key, int64_t lo, int64_t hi) {
  auto it = obj.find(key);
  if (it == obj.end()) return Corrupt(absl::StrCat("missing \"", key, "\""));
  if (!it->is_number_integer()) return Corrupt(absl::StrCat("\"", key, "\" is not an integer"));
  int64_t v;
  if (it->is_number_unsigned()) {
    const uint64_t u = it->get<uint64_t>();
    if (u > static_cast<uint64_t>(hi)) return Corrupt(absl::StrCat("\"", key, "\" out of range"));
    v = static_cast<int64_t>(u);
  } else {
    v = it->get<int64_t>();
  }
  if (v < lo || v > hi) return Corrupt(absl::StrCat("\"", key, "\" = ", v, " is out of range"));
  return v;
}

// 16 lowercase hex digits.
absl::StatusOr<uint64_t> ParseHex64(const std::string& s, absl::string_view key) {
  if (s.size() != 16) return Corrupt(absl::StrCat("\"", key, "\" must be 16 lowercase hex digits"));
  uint64_t v = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else {
      return Corrupt(absl::StrCat("\"", key, "\" must be 16 lowercase hex digits"));
    }
    v = v << 4 | static_cast<uint64_t>(d);
  }
  return v;
}

absl::Status CheckKeys(const Json& obj, std::initializer_list<std::string_view> keys,
                       absl::string_view what) {
  if (!obj.is_object()) return Corrupt(absl::StrCat(what, " is not an object"));
  for (const auto& [k, v] : obj.items()) {
    bool known = false;
    for (std::string_view want : keys) known = known || k == want;
    if (!known) return Corrupt(absl::StrCat("unknown key \"", k, "\" in ", what));
  }
  if (obj.size() != keys.size()) return Corrupt(absl::StrCat("missing keys in ", what));
  return absl::OkStatus();
}

absl::Status ValidateMetadata(const std::map<std::string, std::string>& metadata) {
  auto bad = [](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("invalid manifest: ", why));
  };
  if (metadata.size() > kMaxMetadataEntries) {
    return bad(absl::StrCat("more than ", kMaxMetadataEntries, " metadata entries"));
  }
  for (const auto& [k, v] : metadata) {
    if (k.empty() || k.size() > kMaxMetadataKeyBytes) {
      return bad(absl::StrCat("metadata keys must have 1 to ", kMaxMetadataKeyBytes, " bytes"));
    }
    if (v.size() > kMaxMetadataValueBytes) {
      return bad(absl::StrCat("metadata value of \"", k, "\" exceeds ", kMaxMetadataValueBytes,
                              " bytes"));
    }
    if (!ValidUtf8(k) || !ValidUtf8(v)) return bad("metadata must be valid UTF-8");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::map<std::string, std::string>> GetMetadata(const Json& j) {
  const Json& meta = j["metadata"];
  if (!meta.is_object()) return Corrupt("\"metadata\" is not an object");
  std::map<std::string, std::string> out;
  for (const auto& [k, v] : meta.items()) {
    if (!v.is_string()) return Corrupt("metadata values must be strings");
    out.emplace(k, v.get<std::string>());
  }
  return out;
}

std::string SealManifest(const Json& j) {
  std::string body = j.dump() + "\n";
  body += absl::StrFormat("crc32c %08x\n", crc32c::Value(body));
  return body;
}

}  // namespace manifest_internal

using namespace manifest_internal;  // NOLINT: this file's own helpers

std::string ManifestPath(const std::string& data_path) { return data_path + ".manifest"; }

absl::Status ValidateManifest(const Manifest& m) {
  RETURN_IF_ERROR(ValidateDims(m.dims));
  auto bad = [](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("invalid manifest: ", why));
  };
  if (static_cast<int64_t>(m.indexer_layers.size()) != m.dims.nic) {
    return bad(absl::StrCat("indexer_layers has ", m.indexer_layers.size(), " entries, nic is ",
                            m.dims.nic));
  }
  for (size_t i = 0; i < m.indexer_layers.size(); ++i) {
    const int32_t l = m.indexer_layers[i];
    if (l < 0 || l >= m.dims.n_layers) return bad(absl::StrCat("indexer layer ", l, " out of range"));
    if (i > 0 && l <= m.indexer_layers[i - 1]) return bad("indexer_layers must be strictly increasing");
  }
  if (m.chunk_records < 1 || m.chunk_records > kMaxChunkRecords) {
    return bad(absl::StrCat("chunk_records must be in [1, ", kMaxChunkRecords, "]"));
  }
  if (static_cast<int64_t>(m.chunk_crc32c.size()) > kMaxRecords / m.chunk_records) {
    return bad("more checksummed chunks than a file can hold");
  }
  if (m.tail_records < 0 || m.tail_records >= m.chunk_records) {
    return bad(absl::StrCat("tail_records must be in [0, chunk_records = ", m.chunk_records, ")"));
  }
  if (m.tail_records == 0 && m.tail_crc32c != 0) return bad("tail_crc32c without tail records");
  if (ChunkedRecords(m) + m.tail_records > kMaxRecords) return bad("checksums cover more than 2^31 records");
  if (m.fingerprint_version < 1 || m.fingerprint_version > Manifest::kCurrentFingerprintVersion) {
    return bad(absl::StrCat("fingerprint_version must be in [1, ", Manifest::kCurrentFingerprintVersion, "]"));
  }
  if (m.turn_watermark < 0 || m.turn_watermark > kMaxRecords) {
    return bad("turn_watermark out of range");
  }
  return ValidateMetadata(m.metadata);
}

std::string SerializeManifest(const Manifest& m) {
  Json dims = Json::object();
  dims["n_layers"] = m.dims.n_layers;
  dims["kv_lora"] = m.dims.kv_lora;
  dims["qk_rope"] = m.dims.qk_rope;
  dims["index_hd"] = m.dims.index_hd;
  dims["nic"] = m.dims.nic;
  dims["vocab"] = m.dims.vocab;
  Json j = Json::object();
  j["format"] = std::string(kFormatName);
  j["version"] = Manifest::kFormatVersion;
  j["fingerprint"] = absl::StrFormat("%016x", m.fingerprint);
  j["fingerprint_version"] = m.fingerprint_version;
  j["model_digest"] = m.model_digest.has_value() ? absl::StrFormat("%016x", *m.model_digest) : std::string();
  j["dims"] = std::move(dims);
  j["indexer_layers"] = m.indexer_layers;
  j["chunk_records"] = m.chunk_records;
  j["chunk_crc32c"] = m.chunk_crc32c;
  j["tail_records"] = m.tail_records;
  j["tail_crc32c"] = m.tail_crc32c;
  j["turn_watermark"] = m.turn_watermark;
  Json meta = Json::object();
  for (const auto& [k, v] : m.metadata) meta[k] = v;
  j["metadata"] = std::move(meta);
  return SealManifest(j);
}

namespace manifest_internal {

absl::StatusOr<Json> ParseManifestJson(std::string_view bytes, int64_t* version) {
  if (bytes.size() > kMaxManifestBytes) return Corrupt("larger than 64 MiB");
  if (bytes.size() < kTrailerBytes + 3) return Corrupt("too short");
  const std::string_view body = bytes.substr(0, bytes.size() - kTrailerBytes);
  const std::string_view trailer = bytes.substr(bytes.size() - kTrailerBytes);
  if (trailer.substr(0, kTrailerPrefix.size()) != kTrailerPrefix || trailer.back() != '\n' ||
      body.back() != '\n') {
    return Corrupt("missing the crc32c trailer line");
  }
  uint32_t want = 0;
  for (char c : trailer.substr(kTrailerPrefix.size(), 8)) {
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else {
      return Corrupt("the trailer's checksum is not 8 lowercase hex digits");
    }
    want = want << 4 | static_cast<uint32_t>(d);
  }
  const uint32_t got = crc32c::Value(body);
  if (got != want) {
    return Corrupt(absl::StrFormat("checksum mismatch (stored %08x, computed %08x)", want, got));
  }

  if (MaxNesting(body) > kMaxDepth + 1) return Corrupt("nested too deeply");
  // Parse with a callback that also rejects deep nesting (belt and braces)
  // and duplicate keys.
  bool too_deep = false;
  bool duplicate = false;
  std::vector<std::set<std::string>> keys;
  Json::parser_callback_t cb = [&](int depth, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
      case Json::parse_event_t::array_start:
        if (depth > kMaxDepth) too_deep = true;
        if (event == Json::parse_event_t::object_start) keys.emplace_back();
        return !too_deep;
      case Json::parse_event_t::object_end:
        if (!keys.empty()) keys.pop_back();
        return !too_deep;
      case Json::parse_event_t::key:
        if (!keys.empty() && parsed.is_string() &&
            !keys.back().insert(parsed.get<std::string>()).second) {
          duplicate = true;
        }
        return true;
      default:
        return !too_deep;
    }
  };
  Json j = Json::parse(body.begin(), body.end(), cb, /*allow_exceptions=*/false);
  if (too_deep) return Corrupt("nested too deeply");
  if (j.is_discarded()) return Corrupt("not valid JSON");
  if (duplicate) return Corrupt("duplicate key");
  if (!j.is_object()) return Corrupt("not a JSON object");

  // Identify the format and version before checking the key set, so that a
  // newer version gets its own error.
  auto fmt = j.find("format");
  if (fmt == j.end() || !fmt->is_string() || fmt->get<std::string>() != kFormatName) {
    return Corrupt(absl::StrCat("\"format\" is not \"", kFormatName, "\""));
  }
  ASSIGN_OR_RETURN(*version, GetInt(j, "version", 1, std::numeric_limits<int32_t>::max()));
  return j;
}

}  // namespace manifest_internal

absl::StatusOr<Manifest> ParseManifest(std::string_view bytes) {
  int64_t version = 0;
  ASSIGN_OR_RETURN(Json j, ParseManifestJson(bytes, &version));
  if (version == kV3ManifestVersion) {
    return absl::FailedPreconditionError(
        "manifest version 3 belongs to a v3 (DeepSeek-V4) data file: read it with ReadV3Manifest");
  }
  if (version > Manifest::kFormatVersion) {
    return absl::FailedPreconditionError(absl::StrCat("manifest format version ", version,
                                                      " is newer than this build supports (",
                                                      Manifest::kFormatVersion, ")"));
  }
  if (version == 1) {
    RETURN_IF_ERROR(CheckKeys(j,
                              {"format", "version", "fingerprint", "dims", "indexer_layers",
                               "chunk_records", "chunk_crc32c", "turn_watermark", "metadata"},
                              "the manifest"));
  } else {
    RETURN_IF_ERROR(CheckKeys(j,
                              {"format", "version", "fingerprint", "fingerprint_version", "model_digest",
                               "dims", "indexer_layers", "chunk_records", "chunk_crc32c", "tail_records",
                               "tail_crc32c", "turn_watermark", "metadata"},
                              "the manifest"));
  }
  Manifest m;
  m.fingerprint_version = 1;
  if (version >= 2) {
    ASSIGN_OR_RETURN(m.fingerprint_version,
                     GetInt(j, "fingerprint_version", 1, Manifest::kCurrentFingerprintVersion));
    ASSIGN_OR_RETURN(m.tail_records, GetInt(j, "tail_records", 0, kMaxChunkRecords - 1));
    ASSIGN_OR_RETURN(int64_t tail_crc, GetInt(j, "tail_crc32c", 0, 0xFFFFFFFFll));
    m.tail_crc32c = static_cast<uint32_t>(tail_crc);
    const Json& digest = j["model_digest"];
    if (!digest.is_string()) return Corrupt("\"model_digest\" must be a string");
    if (!digest.get_ref<const std::string&>().empty()) {
      ASSIGN_OR_RETURN(m.model_digest, ParseHex64(digest.get_ref<const std::string&>(), "model_digest"));
    }
  }
  const Json& fp = j["fingerprint"];
  if (!fp.is_string()) return Corrupt("\"fingerprint\" must be 16 lowercase hex digits");
  ASSIGN_OR_RETURN(m.fingerprint, ParseHex64(fp.get_ref<const std::string&>(), "fingerprint"));
  const Json& dims = j["dims"];
  RETURN_IF_ERROR(
      CheckKeys(dims, {"n_layers", "kv_lora", "qk_rope", "index_hd", "nic", "vocab"}, "\"dims\""));
  constexpr int64_t kI32 = std::numeric_limits<int32_t>::max();
  ASSIGN_OR_RETURN(m.dims.n_layers, GetInt(dims, "n_layers", 0, kI32));
  ASSIGN_OR_RETURN(m.dims.kv_lora, GetInt(dims, "kv_lora", 0, kI32));
  ASSIGN_OR_RETURN(m.dims.qk_rope, GetInt(dims, "qk_rope", 0, kI32));
  ASSIGN_OR_RETURN(m.dims.index_hd, GetInt(dims, "index_hd", 0, kI32));
  ASSIGN_OR_RETURN(m.dims.nic, GetInt(dims, "nic", 0, kI32));
  ASSIGN_OR_RETURN(m.dims.vocab, GetInt(dims, "vocab", 0, kI32));

  const Json& il = j["indexer_layers"];
  if (!il.is_array() || il.size() > static_cast<size_t>(kMaxLayers)) {
    return Corrupt("\"indexer_layers\" must be an array of at most 1024 integers");
  }
  for (const Json& v : il) {
    if (!v.is_number_integer()) return Corrupt("\"indexer_layers\" must hold integers");
    if (v.is_number_unsigned() ? v.get<uint64_t>() > static_cast<uint64_t>(kMaxLayers)
                               : (v.get<int64_t>() < 0 || v.get<int64_t>() > kMaxLayers)) {
      return Corrupt("indexer layer out of range");
    }
    m.indexer_layers.push_back(static_cast<int32_t>(v.get<int64_t>()));
  }
  ASSIGN_OR_RETURN(m.chunk_records, GetInt(j, "chunk_records", 1, kMaxChunkRecords));
  const Json& crcs = j["chunk_crc32c"];
  if (!crcs.is_array() || crcs.size() > static_cast<size_t>(kMaxRecords)) {
    return Corrupt("\"chunk_crc32c\" must be an array");
  }
  m.chunk_crc32c.reserve(crcs.size());
  for (const Json& v : crcs) {
    if (!v.is_number_unsigned() || v.get<uint64_t>() > 0xFFFFFFFFu) {
      return Corrupt("\"chunk_crc32c\" must hold integers in [0, 2^32)");
    }
    m.chunk_crc32c.push_back(static_cast<uint32_t>(v.get<uint64_t>()));
  }
  ASSIGN_OR_RETURN(m.turn_watermark, GetInt(j, "turn_watermark", 0, kMaxRecords));
  ASSIGN_OR_RETURN(m.metadata, GetMetadata(j));
  if (absl::Status s = ValidateManifest(m); !s.ok()) return Corrupt(s.message());
  return m;
}

absl::StatusOr<Manifest> ReadManifest(Env* env, const std::string& manifest_path) {
  absl::StatusOr<std::string> bytes = ReadFileToString(env, manifest_path, kMaxManifestBytes);
  if (!bytes.ok()) {
    if (absl::IsFailedPrecondition(bytes.status())) return Corrupt(bytes.status().message());
    return bytes.status();
  }
  absl::StatusOr<Manifest> m = ParseManifest(*bytes);
  if (!m.ok()) {
    return absl::Status(m.status().code(), absl::StrCat(manifest_path, ": ", m.status().message()));
  }
  return m;
}

absl::Status WriteManifest(Env* env, const std::string& manifest_path, const Manifest& m) {
  RETURN_IF_ERROR(ValidateManifest(m));
  return WriteFileAtomically(env, manifest_path, SerializeManifest(m));
}

absl::StatusOr<std::vector<uint32_t>> ComputeChunkCrcs(const ColiKvReader& reader,
                                                       int32_t chunk_records,
                                                       int64_t first_chunk, int64_t end_chunk) {
  if (chunk_records < 1 || first_chunk < 0 || end_chunk < first_chunk ||
      end_chunk > reader.nrec() / chunk_records) {
    return absl::OutOfRangeError(absl::StrCat("chunks [", first_chunk, ", ", end_chunk,
                                              ") of ", chunk_records,
                                              " records are not all committed"));
  }
  std::vector<uint32_t> out;
  out.reserve(static_cast<size_t>(end_chunk - first_chunk));
  std::string buf;
  for (int64_t k = first_chunk; k < end_chunk; ++k) {
    RETURN_IF_ERROR(reader.ReadRecords(k * chunk_records, chunk_records, RecordFormat::kV2, &buf));
    out.push_back(crc32c::Value(buf));
  }
  return out;
}

absl::Status CheckModelIdentity(const Manifest& m, const ModelIdentity& model, std::string_view what) {
  return CheckModelIdentity(m.fingerprint, m.fingerprint_version, model, what);
}

absl::Status CheckModelIdentity(uint64_t fingerprint, int32_t fingerprint_version, const ModelIdentity& model,
                                std::string_view what) {
  struct {
    uint64_t fingerprint;
    int32_t fingerprint_version;
  } m{fingerprint, fingerprint_version};
  std::optional<uint64_t> want = model.fingerprint;
  if (m.fingerprint_version != Manifest::kCurrentFingerprintVersion) want = model.legacy_fingerprint;
  if (!want.has_value()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s records a version-%d model fingerprint (%016x) and the caller has no fingerprint of that "
        "version to compare it with",
        what, m.fingerprint_version, m.fingerprint));
  }
  if (*want == m.fingerprint) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrFormat(
      "%s was computed with another model checkpoint (fingerprint %016x, the loaded model has %016x); "
      "refusing to mix KV rows of different models",
      what, m.fingerprint, *want));
}

int64_t ChunkedRecords(const Manifest& m) {
  return static_cast<int64_t>(m.chunk_crc32c.size()) * m.chunk_records;
}

int64_t ChecksummedRecords(const Manifest& m) { return ChunkedRecords(m) + m.tail_records; }

absl::Status CoverRecords(int64_t nrec, ReadV2Records read, Manifest* m) {
  const int64_t have = static_cast<int64_t>(m->chunk_crc32c.size());
  const int64_t want = nrec / m->chunk_records;
  if (want < have) {
    return absl::OutOfRangeError(absl::StrCat("the manifest checksums ", ChunkedRecords(*m),
                                              " records, only ", nrec, " are committed"));
  }
  std::string buf;
  for (int64_t k = have; k < want; ++k) {
    RETURN_IF_ERROR(read(k * m->chunk_records, m->chunk_records, &buf));
    m->chunk_crc32c.push_back(crc32c::Value(buf));
  }
  m->tail_records = static_cast<int32_t>(nrec - ChunkedRecords(*m));
  m->tail_crc32c = 0;
  if (m->tail_records > 0) {
    RETURN_IF_ERROR(read(ChunkedRecords(*m), m->tail_records, &buf));
    m->tail_crc32c = crc32c::Value(buf);
  }
  return absl::OkStatus();
}

absl::Status CoverCommittedRecords(const ColiKvReader& reader, Manifest* m) {
  return CoverRecords(
      reader.nrec(),
      [&](int64_t first, int64_t count, std::string* out) {
        return reader.ReadRecords(first, count, RecordFormat::kV2, out);
      },
      m);
}

absl::StatusOr<std::vector<ChecksumMismatch>> FindChecksumMismatches(const ColiKvReader& reader,
                                                                     const Manifest& m) {
  if (ChecksummedRecords(m) > reader.nrec()) {
    return absl::OutOfRangeError(absl::StrCat("the manifest checksums ", ChecksummedRecords(m),
                                              " records, the file commits ", reader.nrec()));
  }
  const int64_t chunks = static_cast<int64_t>(m.chunk_crc32c.size());
  ASSIGN_OR_RETURN(std::vector<uint32_t> crcs, ComputeChunkCrcs(reader, m.chunk_records, 0, chunks));
  std::vector<ChecksumMismatch> out;
  for (int64_t k = 0; k < chunks; ++k) {
    const uint32_t stored = m.chunk_crc32c[static_cast<size_t>(k)];
    if (crcs[static_cast<size_t>(k)] == stored) continue;
    out.push_back(ChecksumMismatch{k * m.chunk_records, m.chunk_records, k, stored,
                                   crcs[static_cast<size_t>(k)]});
  }
  if (m.tail_records > 0) {
    std::string buf;
    RETURN_IF_ERROR(reader.ReadRecords(ChunkedRecords(m), m.tail_records, RecordFormat::kV2, &buf));
    const uint32_t got = crc32c::Value(buf);
    if (got != m.tail_crc32c) {
      out.push_back(ChecksumMismatch{ChunkedRecords(m), m.tail_records, -1, m.tail_crc32c, got});
    }
  }
  return out;
}

std::string DescribeRange(const ChecksumMismatch& m) {
  const std::string records = absl::StrCat("records ", m.first, " to ", m.first + m.count - 1);
  if (m.chunk < 0) return absl::StrCat("the records after the last complete chunk (", records, ")");
  return absl::StrCat("chunk ", m.chunk, " (", records, ")");
}

absl::StatusOr<std::vector<int32_t>> DefaultIndexerLayers(const Dims& dims) {
  std::vector<int32_t> layers;
  if (dims.nic == 0) return layers;
  if (dims.nic == dims.n_layers) {
    for (int32_t l = 0; l < dims.n_layers; ++l) layers.push_back(l);
    return layers;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(dims.nic, " of ", dims.n_layers,
                   " layers have an indexer cache: the list of those layers must be given "
                   "(it comes from the model's config)"));
}

}  // namespace strata::kv
