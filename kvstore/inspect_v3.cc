// `strata kv inspect | verify` for v3 files (docs/coli-kv.md, "Version 3",
// "Tools").
#include <algorithm>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kvstore/coli_kv3_file.h"
#include "kvstore/inspect.h"

namespace strata::kv {

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
  if (options.expected_fingerprint.has_value() || options.expected_model_digest.has_value()) {
    r->problems.push_back(absl::FailedPreconditionError(
        "a v3 file records no model fingerprint yet: there is nothing to compare the model with"));
  }
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
