// `strata kv inspect | verify` for v3 files (docs/coli-kv.md, "Version 3",
// "Tools").
#include <algorithm>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "kvstore/coli_kv3_file.h"
#include "kvstore/inspect.h"
#include "kvstore/manifest_v3.h"

namespace strata::kv {
namespace {

// The manifest of a v3 file: present, parsable, belonging to this header,
// and (when asked) recording the caller's model.
void CheckV3Manifest(Env* env, const std::string& path, const ColiKv3Reader& rd, const InspectOptions& options,
                     InspectReport* r) {
  absl::StatusOr<V3Manifest> m = ReadV3Manifest(env, ManifestPath(path));
  if (absl::IsNotFound(m.status())) {
    r->problems.push_back(absl::FailedPreconditionError(
        "no manifest: a v3 file written outside the store has no model fingerprint to compare"));
    return;
  }
  r->manifest_present = true;
  if (!m.ok()) {
    r->problems.push_back(m.status());
    return;
  }
  if (absl::Status s = CheckV3ManifestAgainst(*m, rd.header(), rd.num_tokens()); !s.ok()) r->problems.push_back(s);
  if (options.expected_fingerprint.has_value()) {
    absl::Status s = CheckModelIdentity(m->fingerprint, m->fingerprint_version, *options.expected_fingerprint,
                                        "the session");
    if (!s.ok()) r->problems.push_back(s);
  }
  if (options.expected_model_digest.has_value()) {
    if (!m->model_digest.has_value()) {
      r->problems.push_back(absl::FailedPreconditionError(
          "the manifest records no model digest to compare (the session was created without "
          "strata-coordinator --model-digest); its sampled fingerprint is all there is"));
    } else if (*m->model_digest != *options.expected_model_digest) {
      r->problems.push_back(absl::FailedPreconditionError(
          absl::StrFormat("model digest %016x differs from the model's %016x: another checkpoint",
                          *m->model_digest, *options.expected_model_digest)));
    }
  }
  r->v3->manifest = *std::move(m);
}

}  // namespace

absl::Status InspectV3(Env* env, const std::string& path, const InspectOptions& options, InspectReport* r) {
  absl::StatusOr<std::unique_ptr<ColiKv3Reader>> reader = ColiKv3Reader::Open(env, path);
  if (!reader.ok()) {
    if (absl::IsNotFound(reader.status())) return reader.status();
    r->problems.push_back(reader.status());  // a corrupt header, or no valid commit record
    return absl::OkStatus();
  }
  const ColiKv3Reader& rd = **reader;
  const V3Layout& L = rd.layout();
  V3InspectReport& v = r->v3.emplace();
  v.header = L.header();
  v.token_record_bytes = L.token_bytes();
  v.live_tokens = L.live_tokens();
  v.ring_slots = L.ring_slots();
  v.log_offset = L.log_offset();
  v.commit = rd.commit();
  v.current = rd.current();
  v.other_commit = rd.other_commit_problem();
  CheckV3Manifest(env, path, rd, options, r);
  std::string buf;
  for (int64_t p = rd.first_live(); p < rd.num_tokens(); ++p) {
    const bool listed = static_cast<int64_t>(v.live_token_ids.size()) < std::max(options.max_tokens, 0);
    if (!options.scan_records && !listed) break;
    if (absl::Status s = rd.ReadTokenRecord(p, &buf); !s.ok()) {
      r->problems.push_back(s);
      continue;
    }
    if (listed) v.live_token_ids.push_back(LoadI32(buf.data() + 4));
  }
  if (options.scan_records) {
    if (absl::Status s = rd.ReadBlockLog(&buf); !s.ok()) r->problems.push_back(s);
  }
  return absl::OkStatus();
}

}  // namespace strata::kv
