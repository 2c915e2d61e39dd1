#include "kvstore/session_file.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace strata::kv {
namespace {

std::string DimsDiff(const Dims& file, const Dims& want) {
  std::vector<std::string> diffs;
  auto cmp = [&](const char* name, int32_t a, int32_t b) {
    if (a != b) diffs.push_back(absl::StrCat(name, " ", a, " (expected ", b, ")"));
  };
  cmp("n_layers", file.n_layers, want.n_layers);
  cmp("kv_lora", file.kv_lora, want.kv_lora);
  cmp("qk_rope", file.qk_rope, want.qk_rope);
  cmp("index_hd", file.index_hd, want.index_hd);
  cmp("nic", file.nic, want.nic);
  cmp("vocab", file.vocab, want.vocab);
  return absl::StrJoin(diffs, ", ");
}

}  // namespace

absl::StatusOr<CheckedSession> OpenCheckedSession(Env* env, const std::string& data_path,
                                                  const CheckOptions& options) {
  CheckedSession out;
  ASSIGN_OR_RETURN(out.reader, ColiKvReader::Open(env, data_path));
  const std::string mpath = ManifestPath(data_path);
  absl::StatusOr<Manifest> m = ReadManifest(env, mpath);
  if (absl::IsNotFound(m.status())) {
    return absl::FailedPreconditionError(absl::StrCat(
        data_path, " has no manifest: it was not written by Strata; take it in with an explicit "
                   "import naming the model (strata kv import)"));
  }
  if (!m.ok()) return m.status();
  out.manifest = *std::move(m);
  const Manifest& man = out.manifest;
  if (man.dims != out.reader->dims()) {
    return absl::DataLossError(absl::StrCat(mpath, " does not belong to ", data_path,
                                            ": dimensions differ: ",
                                            DimsDiff(out.reader->dims(), man.dims)));
  }
  const int64_t nrec = out.reader->nrec();
  const int64_t covered = ChecksummedRecords(man);
  if (covered > nrec) {
    return absl::DataLossError(absl::StrCat(data_path, ": the manifest checksums ", covered,
                                            " records but the file commits only ", nrec,
                                            " (records were lost)"));
  }
  if (man.turn_watermark > nrec) {
    return absl::DataLossError(absl::StrCat(data_path, ": the manifest's turn watermark ",
                                            man.turn_watermark, " is beyond the ", nrec,
                                            " committed records (records were lost)"));
  }
  if (options.expected_fingerprint.has_value()) {
    RETURN_IF_ERROR(CheckModelIdentity(man, *options.expected_fingerprint, data_path));
  }
  if (options.verify_checksums) {
    ASSIGN_OR_RETURN(std::vector<ChecksumMismatch> bad, FindChecksumMismatches(*out.reader, man));
    if (!bad.empty()) {
      return absl::DataLossError(absl::StrFormat("%s: checksum mismatch in %s: stored %08x, computed %08x",
                                                 data_path, DescribeRange(bad.front()),
                                                 bad.front().stored, bad.front().computed));
    }
  }
  return out;
}

absl::Status ImportSession(Env* env, const std::string& data_path, const ImportOptions& options) {
  RETURN_IF_ERROR(ValidateDims(options.dims));
  ASSIGN_OR_RETURN(std::unique_ptr<ColiKvReader> reader, ColiKvReader::Open(env, data_path));
  const std::string mpath = ManifestPath(data_path);
  if (env->FileExists(mpath)) {
    return absl::AlreadyExistsError(absl::StrCat(data_path, " already has a manifest"));
  }
  if (reader->dims() != options.dims) {
    return absl::FailedPreconditionError(absl::StrCat(
        data_path, " does not match the model: ", DimsDiff(reader->dims(), options.dims)));
  }
  Manifest m;
  m.fingerprint = options.fingerprint;
  m.model_digest = options.model_digest;
  m.dims = options.dims;
  if (options.indexer_layers.empty()) {
    ASSIGN_OR_RETURN(m.indexer_layers, DefaultIndexerLayers(options.dims));
  } else {
    m.indexer_layers = options.indexer_layers;
  }
  m.chunk_records = options.chunk_records;
  m.metadata = options.metadata;
  m.turn_watermark = reader->nrec();
  RETURN_IF_ERROR(ValidateManifest(m));
  RETURN_IF_ERROR(CoverCommittedRecords(*reader, &m));
  return WriteManifest(env, mpath, m);
}

}  // namespace strata::kv
