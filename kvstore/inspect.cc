#include "kvstore/inspect.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "kvstore/coli_kv_file.h"
#include "kvstore/manifest.h"
#include "nlohmann/json.hpp"

namespace strata::kv {
namespace {

using Json = nlohmann::json;

constexpr int64_t kScanStep = 64;  // records per read while scanning
constexpr size_t kMaxChecksumProblems = 8;

Json DimsJson(const Dims& d) {
  return Json{{"n_layers", d.n_layers}, {"kv_lora", d.kv_lora}, {"qk_rope", d.qk_rope},
              {"index_hd", d.index_hd}, {"nic", d.nic},         {"vocab", d.vocab}};
}

void CheckManifest(const ColiKvReader& reader, const InspectOptions& options, InspectReport* r) {
  const Manifest& m = *r->manifest;
  bool consistent = true;
  if (m.dims != reader.dims()) {
    r->problems.push_back(absl::DataLossError("the manifest's dimensions differ from the header's"));
    consistent = false;
  }
  const int64_t covered = ChecksummedRecords(m);
  if (covered > reader.nrec()) {
    r->problems.push_back(absl::DataLossError(absl::StrCat(
        "the manifest checksums ", covered, " records but only ", reader.nrec(), " are committed")));
    consistent = false;
  }
  if (m.turn_watermark > reader.nrec()) {
    r->problems.push_back(absl::DataLossError(absl::StrCat("the turn watermark ", m.turn_watermark,
                                                           " is beyond the committed records")));
  }
  if (options.expected_fingerprint.has_value()) {
    if (absl::Status s = CheckModelIdentity(m, *options.expected_fingerprint, "the session"); !s.ok()) {
      r->problems.push_back(s);
    }
  }
  if (options.expected_model_digest.has_value()) {
    if (!m.model_digest.has_value()) {
      r->problems.push_back(absl::FailedPreconditionError(
          "the manifest records no model digest to compare (the session was created without "
          "strata-coordinator --model-digest); its sampled fingerprint is all there is"));
    } else if (*m.model_digest != *options.expected_model_digest) {
      r->problems.push_back(absl::FailedPreconditionError(absl::StrFormat(
          "model digest %016x differs from the model's %016x: another checkpoint (the bytes differ "
          "somewhere)",
          *m.model_digest, *options.expected_model_digest)));
    }
  }
  if (!options.verify_checksums || !consistent) return;
  absl::StatusOr<std::vector<ChecksumMismatch>> bad = FindChecksumMismatches(reader, m);
  if (!bad.ok()) {
    r->problems.push_back(bad.status());
    return;
  }
  r->checksums = bad->empty() ? "ok" : "mismatch";
  for (size_t k = 0; k < bad->size() && k < kMaxChecksumProblems; ++k) {
    r->problems.push_back(absl::DataLossError(absl::StrCat("checksum mismatch in ", DescribeRange((*bad)[k]))));
  }
}

Json V3Json(const V3InspectReport& v) {
  Json layers = Json::array();
  for (const V3Layer& l : v.header.layers) layers.push_back(Json::array({static_cast<int>(l.kind), l.rate}));
  Json j{{"head_dim", v.header.head_dim},
         {"rope_dim", v.header.rope_dim},
         {"index_hd", v.header.index_hd},
         {"window", v.header.window},
         {"vocab", v.header.vocab},
         {"row_format", v.header.row_format == V3RowFormat::kF32 ? "f32" : "fp8"},
         {"layers", std::move(layers)},
         {"token_record_bytes", v.token_record_bytes},
         {"live_tokens", v.live_tokens},
         {"ring_slots", v.ring_slots},
         {"log_offset", v.log_offset},
         {"current_commit", v.current},
         {"other_commit", v.other_commit},
         {"live_token_ids", v.live_token_ids}};
  if (v.commit.has_value()) {
    j["seq"] = v.commit->seq;
    j["num_tokens"] = v.commit->num_tokens;
    j["log_bytes"] = v.commit->log_bytes;
  }
  return j;
}

}  // namespace

absl::StatusOr<InspectReport> Inspect(Env* env, const std::string& path,
                                      const InspectOptions& options) {
  InspectReport r;
  r.path = path;
  ASSIGN_OR_RETURN(r.file_bytes, env->FileSize(path));
  {
    ASSIGN_OR_RETURN(std::unique_ptr<File> f, env->Open(path, OpenMode::kRead));
    char buf[kHeaderBytes];
    ASSIGN_OR_RETURN(size_t got, f->Read(0, kHeaderBytes, buf));
    const std::string_view head(buf, got);
    if (head.substr(0, 8) == kMagicV1) {
      r.magic = "COLIKV1";
    } else if (head.substr(0, 8) == kMagicV2) {
      r.magic = "COLIKV2";
    } else if (head.substr(0, 8) == kMagicV3) {
      r.magic = "COLIKV3";
    } else {
      for (char c : head.substr(0, 8)) absl::StrAppendFormat(&r.magic, "%02x", static_cast<uint8_t>(c));
    }
    if (r.magic == "COLIKV3") {
      RETURN_IF_ERROR(InspectV3(env, path, options, &r));
      return r;
    }
    absl::StatusOr<Header> h = DecodeHeader(head);
    if (!h.ok()) {
      r.problems.push_back(h.status());
      return r;
    }
    r.header = *h;
  }
  ASSIGN_OR_RETURN(std::unique_ptr<ColiKvReader> reader, ColiKvReader::Open(env, path));
  r.record_bytes = reader->layout().record_bytes();
  r.nrec = reader->nrec();
  r.torn = reader->torn();
  r.bytes_after_records = r.file_bytes - static_cast<uint64_t>(reader->layout().file_offset(r.nrec));
  if (r.torn) {
    r.problems.push_back(absl::DataLossError(
        absl::StrCat("torn: the header commits ", r.header->nrec, " records, the file holds ",
                     r.nrec, " complete ones")));
  }
  std::string buf;
  const int64_t ntok = std::min<int64_t>(std::max(options.max_tokens, 0), r.nrec);
  RETURN_IF_ERROR(reader->ReadRecords(0, ntok, RecordFormat::kStored, &buf));
  for (int64_t i = 0; i < ntok; ++i) r.first_tokens.push_back(LoadI32(buf.data() + i * r.record_bytes));

  if (options.scan_records) {
    r.scanned = true;
    for (int64_t p = 0; p < r.nrec; p += kScanStep) {
      RETURN_IF_ERROR(reader->ReadRecords(p, std::min(kScanStep, r.nrec - p),
                                          RecordFormat::kV2Sanitized, &buf, &r.sanitize));
    }
    if (!r.sanitize.clean()) {
      r.problems.push_back(absl::DataLossError(absl::StrCat(
          "loading sanitises ", r.sanitize.nan_codes, " NaN codes, ", r.sanitize.inert_rows,
          " rows with unusable scales, ", r.sanitize.nonfinite_keys,
          " non-finite indexer key values; ", r.sanitize.bad_tokens, " token ids are outside the vocab")));
    }
  }

  absl::StatusOr<Manifest> m = ReadManifest(env, ManifestPath(path));
  if (absl::IsNotFound(m.status())) {
    r.problems.push_back(absl::FailedPreconditionError(
        "no manifest: a file from another engine must be imported first (strata kv import)"));
  } else if (!m.ok()) {
    r.manifest_present = true;
    r.problems.push_back(m.status());
  } else {
    r.manifest_present = true;
    r.manifest = *std::move(m);
    CheckManifest(*reader, options, &r);
  }
  return r;
}

std::string InspectReport::ToJson() const {
  Json j = Json::object();
  j["path"] = path;
  j["file_bytes"] = file_bytes;
  j["magic"] = magic;
  if (header.has_value()) {
    j["version"] = header->version == Version::kV1 ? 1 : 2;
    j["dims"] = DimsJson(header->dims);
    j["header_nrec"] = header->nrec;
    j["record_bytes"] = record_bytes;
    j["nrec"] = nrec;
    j["torn"] = torn;
    j["bytes_after_records"] = bytes_after_records;
    j["first_tokens"] = first_tokens;
  } else if (v3.has_value()) {
    j["version"] = 3;
    j["v3"] = V3Json(*v3);
  } else {
    j["version"] = nullptr;
  }
  if (scanned) {
    j["sanitize"] = Json{{"nan_codes", sanitize.nan_codes},
                         {"inert_rows", sanitize.inert_rows},
                         {"nonfinite_keys", sanitize.nonfinite_keys},
                         {"bad_tokens", sanitize.bad_tokens}};
  }
  Json man = Json::object();
  man["present"] = manifest_present;
  if (manifest.has_value()) {
    man["fingerprint"] = absl::StrFormat("%016x", manifest->fingerprint);
    man["indexer_layers"] = manifest->indexer_layers;
    man["chunk_records"] = manifest->chunk_records;
    man["fingerprint_version"] = manifest->fingerprint_version;
    man["model_digest"] =
        manifest->model_digest.has_value() ? absl::StrFormat("%016x", *manifest->model_digest) : std::string();
    man["checksummed_records"] = ChecksummedRecords(*manifest);
    man["turn_watermark"] = manifest->turn_watermark;
    Json meta = Json::object();
    for (const auto& [k, v] : manifest->metadata) meta[k] = v;
    man["metadata"] = std::move(meta);
  } else if (v3.has_value() && v3->manifest.has_value()) {
    const V3Manifest& m3 = *v3->manifest;
    man["fingerprint"] = absl::StrFormat("%016x", m3.fingerprint);
    man["fingerprint_version"] = m3.fingerprint_version;
    man["model_digest"] = m3.model_digest.has_value() ? absl::StrFormat("%016x", *m3.model_digest) : std::string();
    man["header_crc32c"] = m3.header_crc32c;
    man["turn_watermark"] = m3.turn_watermark;
    Json meta = Json::object();
    for (const auto& [k, v] : m3.metadata) meta[k] = v;
    man["metadata"] = std::move(meta);
  }
  man["checksums"] = checksums;
  j["manifest"] = std::move(man);
  Json probs = Json::array();
  for (const absl::Status& s : problems) {
    probs.push_back(Json{{"code", absl::StatusCodeToString(s.code())}, {"message", std::string(s.message())}});
  }
  j["problems"] = std::move(probs);
  j["ok"] = problems.empty();
  // Replace, never throw, on bytes that are not UTF-8 (paths can be anything).
  return j.dump(2, ' ', false, Json::error_handler_t::replace);
}

absl::StatusOr<std::string> InspectFile(Env* env, const std::string& path,
                                        const InspectOptions& options) {
  ASSIGN_OR_RETURN(InspectReport r, Inspect(env, path, options));
  return r.ToJson();
}

absl::Status VerifyFile(Env* env, const std::string& path, const InspectOptions& options) {
  ASSIGN_OR_RETURN(InspectReport r, Inspect(env, path, options));
  if (r.problems.empty()) return absl::OkStatus();
  const absl::Status& first = r.problems.front();
  return absl::Status(first.code(), absl::StrCat(path, ": ", first.message(),
                                                 r.problems.size() > 1
                                                     ? absl::StrCat(" (and ", r.problems.size() - 1,
                                                                    " more problems)")
                                                     : std::string()));
}

absl::Status ConvertSessionFile(Env* env, const std::string& in, const std::string& out,
                                Version to) {
  const bool has_manifest = env->FileExists(ManifestPath(in));
  if (has_manifest && in == out && to == Version::kV1) {
    return absl::InvalidArgumentError(
        "converting a session to v1 in place would invalidate its manifest; write to another path");
  }
  if (!has_manifest && env->FileExists(ManifestPath(out))) {
    return absl::AlreadyExistsError(absl::StrCat(
        ManifestPath(out), " exists and ", in, " has no manifest to replace it with"));
  }
  std::optional<Manifest> manifest;
  if (has_manifest) {
    CheckOptions check;
    ASSIGN_OR_RETURN(CheckedSession s, OpenCheckedSession(env, in, check));
    manifest = std::move(s.manifest);
  }
  RETURN_IF_ERROR(ConvertFile(env, in, out, to));
  if (!manifest.has_value()) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::unique_ptr<ColiKvReader> reader, ColiKvReader::Open(env, out));
  manifest->chunk_crc32c.clear();
  RETURN_IF_ERROR(CoverCommittedRecords(*reader, &*manifest));
  return WriteManifest(env, ManifestPath(out), *manifest);
}

}  // namespace strata::kv
