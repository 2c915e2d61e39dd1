#include "kvstore/session.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "kvstore/crc32c.h"
#include "kvstore/session_file.h"

namespace strata::kv {
namespace {

constexpr int64_t kMaxRecords = std::numeric_limits<int32_t>::max();

}  // namespace

std::string Session::DataPath(const std::string& dir, const std::string& id) {
  return JoinPath(dir, id + ".coli_kv");
}

Session::Session(Env* env, std::string dir, std::string id, std::unique_ptr<ColiKvWriter> file,
                 Manifest manifest)
    : env_(env),
      dir_(std::move(dir)),
      id_(std::move(id)),
      data_path_(DataPath(dir_, id_)),
      manifest_path_(ManifestPath(data_path_)),
      dims_(file->dims()),
      layout_(Version::kV2, file->dims()),
      file_(std::move(file)),
      manifest_(std::move(manifest)) {
  nrec_ = file_->nrec();
  written_.assign(static_cast<size_t>(dims_.n_layers), nrec_);
  durable_ = written_;
  low_ = written_;
}

Session::~Session() = default;

absl::StatusOr<std::unique_ptr<Session>> Session::Create(Env* env, const std::string& dir,
                                                         const std::string& id,
                                                         const SessionSpec& spec) {
  RETURN_IF_ERROR(ValidateDims(spec.dims));
  Manifest m;
  m.fingerprint = spec.fingerprint;
  m.model_digest = spec.model_digest;
  m.dims = spec.dims;
  if (spec.indexer_layers.empty()) {
    ASSIGN_OR_RETURN(m.indexer_layers, DefaultIndexerLayers(spec.dims));
  } else {
    m.indexer_layers = spec.indexer_layers;
  }
  m.chunk_records = spec.chunk_records > 0 ? spec.chunk_records : Manifest::kDefaultChunkRecords;
  m.metadata = spec.metadata;
  RETURN_IF_ERROR(ValidateManifest(m));
  const std::string path = DataPath(dir, id);
  if (env->FileExists(path)) {
    return absl::AlreadyExistsError(absl::StrCat("session \"", id, "\" already exists"));
  }
  // The manifest first: a crash before the data file exists leaves an orphan
  // manifest, which the store removes when it opens.
  RETURN_IF_ERROR(WriteManifest(env, ManifestPath(path), m));
  ASSIGN_OR_RETURN(std::unique_ptr<ColiKvWriter> file,
                   ColiKvWriter::Create(env, path, Version::kV2, spec.dims));
  return std::unique_ptr<Session>(new Session(env, dir, id, std::move(file), std::move(m)));
}

absl::StatusOr<std::unique_ptr<Session>> Session::Open(Env* env, const std::string& dir,
                                                       const std::string& id,
                                                       const SessionOptions& options) {
  const std::string path = DataPath(dir, id);
  CheckOptions check;
  check.verify_checksums = options.verify_checksums;
  ASSIGN_OR_RETURN(CheckedSession checked, OpenCheckedSession(env, path, check));
  checked.reader.reset();
  ASSIGN_OR_RETURN(std::unique_ptr<ColiKvWriter> file, ColiKvWriter::Open(env, path));
  return std::unique_ptr<Session>(
      new Session(env, dir, id, std::move(file), std::move(checked.manifest)));
}

void Session::SetCommitRequester(std::function<void()> request) {
  request_commit_ = std::move(request);
}

int64_t Session::nrec() const {
  absl::MutexLock lock(&mu_);
  return nrec_;
}

absl::Status Session::health() const {
  absl::MutexLock lock(&mu_);
  return failed_;
}

bool Session::idle() const {
  absl::MutexLock lock(&mu_);
  return writers_.empty();
}

bool Session::NeedsCommit() const {
  absl::MutexLock lock(&mu_);
  return unsynced_bytes_ > 0 || commit_requested_;
}

absl::Status Session::CheckFingerprint(const std::optional<ModelIdentity>& expected) {
  if (!expected.has_value()) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckModelIdentity(manifest_, *expected, absl::StrCat("session \"", id_, "\"")));
  if (manifest_.fingerprint_version != Manifest::kCurrentFingerprintVersion) {
    fingerprint_upgrade_ = expected->fingerprint;  // recorded by the next manifest write
  }
  return absl::OkStatus();
}

Manifest Session::ManifestToWriteLocked() const {
  Manifest m = manifest_;
  if (fingerprint_upgrade_.has_value()) {
    m.fingerprint = *fingerprint_upgrade_;
    m.fingerprint_version = Manifest::kCurrentFingerprintVersion;
  }
  return m;
}

void Session::SetManifestLocked(Manifest m) {
  if (m.fingerprint_version == Manifest::kCurrentFingerprintVersion) fingerprint_upgrade_.reset();
  manifest_ = std::move(m);
}

std::pair<int32_t, int32_t> Session::Slots(int32_t begin, int32_t end) const {
  absl::MutexLock lock(&mu_);
  const auto& il = manifest_.indexer_layers;
  const auto b = std::lower_bound(il.begin(), il.end(), begin);
  const auto e = std::lower_bound(il.begin(), il.end(), end);
  return {static_cast<int32_t>(b - il.begin()), static_cast<int32_t>(e - il.begin())};
}

int64_t Session::SliceBytes(int32_t begin, int32_t end) const {
  const auto [sb, se] = Slots(begin, end);
  return int64_t{end - begin} * layout_.layer_bytes() + int64_t{se - sb} * layout_.indexer_bytes();
}

absl::Status Session::UsableLocked() const {
  if (deleted_) return absl::NotFoundError(absl::StrCat("session \"", id_, "\" was deleted"));
  return failed_;
}

void Session::Fail(const absl::Status& s) {
  std::vector<std::shared_ptr<CommitListener>> listeners;
  {
    absl::MutexLock lock(&mu_);
    if (!failed_.ok()) return;
    failed_ = s;
    for (auto& [id, w] : writers_) listeners.push_back(w.listener);
  }
  for (auto& l : listeners) {
    if (l) l->OnFailed(s);
  }
}

void Session::TrimTokensLocked() {
  if (inflight_writes_ > 0) return;
  const int64_t end = *std::max_element(written_.begin(), written_.end());
  const size_t keep = static_cast<size_t>(std::max<int64_t>(0, end - nrec_));
  if (pending_tokens_.size() > keep) pending_tokens_.resize(keep);
}

absl::Status Session::UpgradeLocked() {
  std::shared_ptr<ColiKvWriter> old;
  {
    absl::MutexLock lock(&mu_);
    if (file_->version() == Version::kV2) return absl::OkStatus();
    old = file_;
  }
  RETURN_IF_ERROR(UpgradeToV2(env_, data_path_));
  ASSIGN_OR_RETURN(std::unique_ptr<ColiKvWriter> fresh, ColiKvWriter::Open(env_, data_path_));
  absl::MutexLock lock(&mu_);
  file_ = std::move(fresh);  // readers holding `old` finish on the old file
  return absl::OkStatus();
}

absl::StatusOr<Session::WriterGrant> Session::OpenWriter(int32_t begin, int32_t end,
                                                         std::optional<int64_t> start,
                                                         std::shared_ptr<CommitListener> listener) {
  if (begin < 0 || begin >= end || end > dims_.n_layers) {
    return absl::InvalidArgumentError(absl::StrCat("layer range [", begin, ", ", end,
                                                   ") is not within [0, ", dims_.n_layers, ")"));
  }
  const auto [slot_begin, slot_end] = Slots(begin, end);
  absl::MutexLock commit_lock(&commit_mu_);
  auto overlap = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
    for (const auto& [id, w] : writers_) {
      if (w.begin < end && begin < w.end) {
        return absl::FailedPreconditionError(absl::StrCat(
            "layers [", w.begin, ", ", w.end, ") of session \"", id_,
            "\" are already being written by another stream; one writer per layer range"));
      }
    }
    return absl::OkStatus();
  };
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(UsableLocked());
    RETURN_IF_ERROR(overlap());
  }
  RETURN_IF_ERROR(UpgradeLocked());
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(UsableLocked());
  RETURN_IF_ERROR(overlap());
  int64_t next = *std::min_element(written_.begin() + begin, written_.begin() + end);
  if (start.has_value()) {
    if (*start < nrec_ || *start > next) {
      return absl::OutOfRangeError(absl::StrCat("start position ", *start, " must be in [", nrec_,
                                                ", ", next, "] (committed records, written rows)"));
    }
    next = *start;
  }
  for (int32_t l = begin; l < end; ++l) {
    written_[l] = next;
    durable_[l] = std::min(durable_[l], next);
    low_[l] = std::min(low_[l], next);
  }
  TrimTokensLocked();
  WriterGrant g;
  g.writer_id = next_writer_id_++;
  g.nrec = nrec_;
  g.next_position = next;
  g.slice_bytes = int64_t{end - begin} * layout_.layer_bytes() +
                  int64_t{slot_end - slot_begin} * layout_.indexer_bytes();
  Writer w;
  w.begin = begin;
  w.end = end;
  w.slot_begin = slot_begin;
  w.slot_end = slot_end;
  w.next = next;
  w.listener = std::move(listener);
  writers_.emplace(g.writer_id, std::move(w));
  return g;
}

absl::Status Session::Write(int64_t writer_id, int64_t position, std::span<const int32_t> tokens,
                            std::string_view rows) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  Writer w;
  std::shared_ptr<ColiKvWriter> file;
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(UsableLocked());
    auto it = writers_.find(writer_id);
    if (it == writers_.end()) return absl::FailedPreconditionError("unknown or closed writer");
    if (it->second.busy) return absl::FailedPreconditionError("a write of this writer is running");
    w = it->second;
    if (n == 0) return absl::InvalidArgumentError("no tokens in the write");
    if (position != w.next) {
      return absl::OutOfRangeError(absl::StrCat("position ", position,
                                                " is out of order: this writer's next position is ",
                                                w.next));
    }
    if (position > kMaxRecords - n) {
      return absl::OutOfRangeError(absl::StrCat("a session holds at most ", kMaxRecords, " tokens"));
    }
    const int64_t slice = int64_t{w.end - w.begin} * layout_.layer_bytes() +
                          int64_t{w.slot_end - w.slot_begin} * layout_.indexer_bytes();
    if (static_cast<int64_t>(rows.size()) != n * slice) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rows have ", rows.size(), " bytes; ", n, " tokens of layers [", w.begin, ", ", w.end,
          ") need ", n * slice, " (", slice, " bytes per token)"));
    }
    const int64_t base = position - nrec_;
    for (int64_t i = 0; i < n; ++i) {
      const int32_t t = tokens[static_cast<size_t>(i)];
      if (t < 0 || t >= dims_.vocab) {
        return absl::InvalidArgumentError(
            absl::StrCat("token id ", t, " at position ", position + i, " is outside [0, ",
                         dims_.vocab, ")"));
      }
      const int64_t idx = base + i;
      if (idx < static_cast<int64_t>(pending_tokens_.size()) &&
          pending_tokens_[static_cast<size_t>(idx)] != t) {
        return absl::InvalidArgumentError(absl::StrCat(
            "token id ", t, " at position ", position + i, " differs from ",
            pending_tokens_[static_cast<size_t>(idx)], " written there by another layer range"));
      }
    }
    for (int64_t i = static_cast<int64_t>(pending_tokens_.size()) - base; i < n; ++i) {
      pending_tokens_.push_back(tokens[static_cast<size_t>(i)]);
    }
    it->second.busy = true;
    ++inflight_writes_;
    file = file_;
  }

  absl::Status s;
  const int64_t slice = static_cast<int64_t>(rows.size()) / n;
  if (w.begin == 0 && w.end == dims_.n_layers && w.slot_begin == 0 && w.slot_end == dims_.nic) {
    // All layers: whole records, one write ("one staging buffer per record").
    std::string staging(static_cast<size_t>(n * layout_.record_bytes()), '\0');
    for (int64_t i = 0; i < n; ++i) {
      char* rec = staging.data() + i * layout_.record_bytes();
      StoreI32(rec, tokens[static_cast<size_t>(i)]);
      std::memcpy(rec + 4, rows.data() + i * slice, static_cast<size_t>(slice));
    }
    s = file->WriteRecords(position, staging);
  } else {
    const int64_t layer_part = int64_t{w.end - w.begin} * layout_.layer_bytes();
    for (int64_t i = 0; i < n && s.ok(); ++i) {
      const std::string_view slice_rows = rows.substr(static_cast<size_t>(i * slice),
                                                      static_cast<size_t>(slice));
      char token[4];
      StoreI32(token, tokens[static_cast<size_t>(i)]);
      s = file->WriteAt(position + i, 0, std::string_view(token, 4));
      if (s.ok()) {
        s = file->WriteAt(position + i, layout_.layer_offset(w.begin),
                          slice_rows.substr(0, static_cast<size_t>(layer_part)));
      }
      if (s.ok() && w.slot_end > w.slot_begin) {
        s = file->WriteAt(position + i, layout_.indexer_offset(w.slot_begin),
                          slice_rows.substr(static_cast<size_t>(layer_part)));
      }
    }
  }

  bool request = false;
  {
    absl::MutexLock lock(&mu_);
    --inflight_writes_;
    auto it = writers_.find(writer_id);
    if (it != writers_.end()) it->second.busy = false;
    if (!s.ok()) {
      TrimTokensLocked();
      return s;
    }
    if (it == writers_.end()) return absl::OkStatus();  // closed meanwhile: nothing to account
    it->second.next = position + n;
    for (int32_t l = w.begin; l < w.end; ++l) written_[l] = position + n;
    unsynced_bytes_ += rows.size() + 4 * static_cast<uint64_t>(n);
    request = !commit_requested_;
    commit_requested_ = true;
  }
  if (request && request_commit_) request_commit_();
  return absl::OkStatus();
}

bool Session::WriterDurable(int64_t writer_id) const {
  absl::MutexLock lock(&mu_);
  auto it = writers_.find(writer_id);
  if (it == writers_.end()) return false;
  for (int32_t l = it->second.begin; l < it->second.end; ++l) {
    if (durable_[l] < it->second.next) return false;
  }
  return true;
}

void Session::CloseWriter(int64_t writer_id) {
  bool request = false;
  {
    absl::MutexLock lock(&mu_);
    writers_.erase(writer_id);
    // The last writer is gone: a commit round covers the records after the
    // last complete chunk with the tail checksum (CatchUpManifest).
    if (writers_.empty() && failed_.ok() && !deleted_ && ChecksummedRecords(manifest_) < nrec_ &&
        !commit_requested_) {
      commit_requested_ = true;
      request = true;
    }
  }
  if (request && request_commit_) request_commit_();
}

absl::StatusOr<int64_t> Session::Commit() {
  absl::MutexLock commit_lock(&commit_mu_);
  std::vector<int64_t> snapshot;
  uint64_t bytes;
  std::shared_ptr<ColiKvWriter> file;
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(UsableLocked());
    commit_requested_ = false;
    snapshot = written_;
    low_ = written_;
    bytes = unsynced_bytes_;
    unsynced_bytes_ = 0;
    file = file_;
  }
  if (bytes > 0) {
    if (absl::Status s = file->Sync(); !s.ok()) {
      Fail(s);
      return s;
    }
  }
  int64_t target;
  int64_t old_nrec;
  {
    absl::MutexLock lock(&mu_);
    for (size_t l = 0; l < durable_.size(); ++l) {
      durable_[l] = std::max(durable_[l], std::min(snapshot[l], low_[l]));
    }
    old_nrec = nrec_;
    target = *std::min_element(durable_.begin(), durable_.end());
  }
  if (target > old_nrec) {
    if (absl::Status s = file->Commit(target); !s.ok()) {
      Fail(s);
      return s;
    }
    absl::MutexLock lock(&mu_);
    for (int64_t i = old_nrec; i < target && !pending_tokens_.empty(); ++i) pending_tokens_.pop_front();
    nrec_ = target;
  }
  CatchUpManifest();
  std::vector<std::shared_ptr<CommitListener>> listeners;
  int64_t nrec;
  {
    absl::MutexLock lock(&mu_);
    nrec = nrec_;
    if (bytes > 0 || target > old_nrec) {
      for (auto& [id, w] : writers_) listeners.push_back(w.listener);
    }
  }
  for (auto& l : listeners) {
    if (l) l->OnCommitted(nrec);
  }
  return nrec;
}

absl::Status Session::CoverManifest(const ColiKvWriter& file, int64_t nrec, Manifest* m) const {
  if (file.version() != Version::kV2) {
    return absl::FailedPreconditionError("checksums are kept up to date for v2 files only");
  }
  // Checksums cover the v2 bytes as stored; read them back from the file.
  return CoverRecords(
      nrec,
      [&](int64_t first, int64_t count, std::string* out) -> absl::Status {
        out->resize(static_cast<size_t>(count * layout_.record_bytes()));
        ASSIGN_OR_RETURN(size_t got, file.ReadAt(static_cast<uint64_t>(layout_.file_offset(first)),
                                                 out->size(), out->data()));
        if (got != out->size()) return absl::DataLossError(absl::StrCat(data_path_, ": short read"));
        return absl::OkStatus();
      },
      m);
}

void Session::CatchUpManifest() {
  Manifest m;
  std::shared_ptr<ColiKvWriter> file;
  int64_t nrec;
  bool idle;
  bool upgrade;
  {
    absl::MutexLock lock(&mu_);
    m = ManifestToWriteLocked();
    file = file_;
    nrec = nrec_;
    idle = writers_.empty();
    upgrade = fingerprint_upgrade_.has_value();
  }
  // A chunk completed, or the writers are gone and records after the last
  // complete chunk are not yet covered or the fingerprint awaits its upgrade.
  const bool chunk_done = nrec / m.chunk_records > static_cast<int64_t>(m.chunk_crc32c.size());
  const bool idle_work = idle && (ChecksummedRecords(m) < nrec || upgrade);
  if (!chunk_done && !idle_work) return;
  // A failure (read or replacement) is retried at the next commit: the
  // records are committed either way, the manifest only lags.
  if (!CoverManifest(*file, nrec, &m).ok()) return;
  if (!WriteManifest(env_, manifest_path_, m).ok()) return;
  absl::MutexLock lock(&mu_);
  SetManifestLocked(std::move(m));
}

absl::Status Session::Truncate(int64_t n) {
  absl::MutexLock commit_lock(&commit_mu_);
  Manifest m;
  std::shared_ptr<ColiKvWriter> file;
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(UsableLocked());
    if (!writers_.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "session \"", id_, "\" has ", writers_.size(), " open append streams; close them first"));
    }
    if (n < 0 || n > nrec_) {
      return absl::OutOfRangeError(absl::StrCat("cannot truncate to ", n, " records: ", nrec_,
                                                " are committed"));
    }
    m = ManifestToWriteLocked();
    file = file_;
  }
  const size_t chunks = static_cast<size_t>(n / m.chunk_records);
  if (m.chunk_crc32c.size() > chunks) m.chunk_crc32c.resize(chunks);
  m.tail_records = 0;
  m.tail_crc32c = 0;
  if (file->version() == Version::kV2) RETURN_IF_ERROR(CoverManifest(*file, n, &m));
  m.turn_watermark = std::min(m.turn_watermark, n);
  bool manifest_changed;
  {
    absl::MutexLock lock(&mu_);
    manifest_changed = !(m == manifest_);
  }
  if (manifest_changed) {
    RETURN_IF_ERROR(WriteManifest(env_, manifest_path_, m));
    absl::MutexLock lock(&mu_);
    SetManifestLocked(m);
  }
  if (absl::Status s = file->Truncate(n); !s.ok()) {
    Fail(s);
    return s;
  }
  absl::MutexLock lock(&mu_);
  nrec_ = n;
  std::fill(written_.begin(), written_.end(), n);
  durable_ = written_;
  low_ = written_;
  pending_tokens_.clear();
  ++generation_;
  return absl::OkStatus();
}

absl::Status Session::Update(std::optional<int64_t> turn_watermark,
                             const std::map<std::string, std::string>& set,
                             const std::vector<std::string>& remove) {
  absl::MutexLock commit_lock(&commit_mu_);
  Manifest m;
  std::shared_ptr<ColiKvWriter> file;
  int64_t nrec;
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(UsableLocked());
    if (turn_watermark.has_value() && (*turn_watermark < 0 || *turn_watermark > nrec_)) {
      return absl::OutOfRangeError(absl::StrCat("turn watermark ", *turn_watermark,
                                                " must be in [0, ", nrec_, "] (committed records)"));
    }
    m = ManifestToWriteLocked();
    file = file_;
    nrec = nrec_;
  }
  // The manifest is replaced anyway: bring its checksums up to nrec (a turn
  // shorter than a chunk is covered when it ends).
  if (file->version() == Version::kV2) RETURN_IF_ERROR(CoverManifest(*file, nrec, &m));
  if (turn_watermark.has_value()) m.turn_watermark = *turn_watermark;
  for (const auto& [k, v] : set) m.metadata[k] = v;
  for (const std::string& k : remove) m.metadata.erase(k);
  RETURN_IF_ERROR(ValidateManifest(m));
  RETURN_IF_ERROR(WriteManifest(env_, manifest_path_, m));
  absl::MutexLock lock(&mu_);
  SetManifestLocked(std::move(m));
  return absl::OkStatus();
}

absl::Status Session::Read(int64_t first, int64_t count, int32_t begin, int32_t end,
                           std::vector<int32_t>* tokens, std::string* rows) const {
  if (begin < 0 || begin >= end || end > dims_.n_layers) {
    return absl::InvalidArgumentError(absl::StrCat("layer range [", begin, ", ", end,
                                                   ") is not within [0, ", dims_.n_layers, ")"));
  }
  const auto [slot_begin, slot_end] = Slots(begin, end);
  std::shared_ptr<ColiKvWriter> file;
  uint64_t generation;
  {
    absl::MutexLock lock(&mu_);
    if (deleted_) return absl::NotFoundError(absl::StrCat("session \"", id_, "\" was deleted"));
    if (first < 0 || count < 0 || first > nrec_ || count > nrec_ - first) {
      return absl::OutOfRangeError(absl::StrCat("records [", first, ", ", first + count,
                                                ") are not within the ", nrec_,
                                                " committed records"));
    }
    file = file_;
    generation = generation_;
  }
  const RecordLayout& stored = file->layout();
  const int64_t rb = stored.record_bytes();
  std::string raw(static_cast<size_t>(count * rb), '\0');
  ASSIGN_OR_RETURN(size_t got, file->ReadAt(static_cast<uint64_t>(stored.file_offset(first)),
                                            raw.size(), raw.data()));
  {
    absl::MutexLock lock(&mu_);
    if (generation != generation_ || deleted_ || got != raw.size()) {
      return absl::AbortedError(
          absl::StrCat("session \"", id_, "\" was truncated or deleted during the read; retry"));
    }
  }
  const int64_t layer_part = int64_t{end - begin} * layout_.layer_bytes();
  const int64_t slot_part = int64_t{slot_end - slot_begin} * layout_.indexer_bytes();
  tokens->resize(static_cast<size_t>(count));
  rows->resize(static_cast<size_t>(count * (layer_part + slot_part)));
  std::string v2(static_cast<size_t>(layout_.record_bytes()), '\0');
  for (int64_t i = 0; i < count; ++i) {
    const char* src = raw.data() + i * rb;
    if (stored.version() == Version::kV1) {
      QuantizeV1Record(dims_, src, v2.data());
    } else {
      std::memcpy(v2.data(), src, v2.size());
    }
    SanitizeV2Record(layout_, v2.data(), nullptr);
    (*tokens)[static_cast<size_t>(i)] = LoadI32(v2.data());
    char* out = rows->data() + i * (layer_part + slot_part);
    std::memcpy(out, v2.data() + layout_.layer_offset(begin), static_cast<size_t>(layer_part));
    if (slot_part > 0) {
      std::memcpy(out + layer_part, v2.data() + layout_.indexer_offset(slot_begin),
                  static_cast<size_t>(slot_part));
    }
  }
  return absl::OkStatus();
}

SessionInfo Session::Info() const {
  SessionInfo info;
  std::shared_ptr<ColiKvWriter> file;
  {
    absl::MutexLock lock(&mu_);
    info.id = id_;
    info.nrec = nrec_;
    info.manifest = manifest_;
    for (const auto& [id, w] : writers_) info.writers.push_back(LayerRange{w.begin, w.end});
    file = file_;
  }
  info.version = file->version();
  info.file_bytes = static_cast<uint64_t>(file->layout().file_offset(info.nrec));
  if (absl::StatusOr<uint64_t> size = env_->FileSize(data_path_); size.ok()) info.file_bytes = *size;
  return info;
}

absl::Status Session::DeleteFiles() {
  absl::MutexLock commit_lock(&commit_mu_);
  std::shared_ptr<ColiKvWriter> file;
  {
    absl::MutexLock lock(&mu_);
    if (deleted_) return absl::NotFoundError(absl::StrCat("session \"", id_, "\" was deleted"));
    if (!writers_.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "session \"", id_, "\" has ", writers_.size(), " open append streams; close them first"));
    }
    deleted_ = true;
    ++generation_;
    file = file_;
  }
  (void)file->Close();
  // Data file first: a crash in between leaves an orphan manifest, which
  // the store removes when it opens.
  RETURN_IF_ERROR(env_->Delete(data_path_));
  RETURN_IF_ERROR(env_->SyncDir(dir_));
  if (absl::Status s = env_->Delete(manifest_path_); !s.ok() && !absl::IsNotFound(s)) return s;
  return env_->SyncDir(dir_);
}

}  // namespace strata::kv
