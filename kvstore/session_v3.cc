#include "kvstore/session_v3.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kvstore/coli_kv.h"

namespace strata::kv {
namespace {

constexpr int64_t kMaxTokens = std::numeric_limits<int32_t>::max();

absl::Status CheckRange(const V3Layout& L, int32_t begin, int32_t end) {
  if (begin < 0 || begin >= end || end > L.num_layers()) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer range [", begin, ", ", end, ") is not within [0, ", L.num_layers(), ")"));
  }
  return absl::OkStatus();
}

}  // namespace

V3Session::V3Session(Env* env, std::string dir, std::string id, std::unique_ptr<ColiKv3Writer> file,
                     V3Manifest manifest)
    : env_(env),
      dir_(std::move(dir)),
      id_(std::move(id)),
      data_path_(Session::DataPath(dir_, id_)),
      manifest_path_(ManifestPath(data_path_)),
      layout_(file->layout()),
      file_(std::move(file)),
      manifest_(std::move(manifest)) {
  nrec_ = file_->num_tokens();
  file_bytes_ = static_cast<uint64_t>(layout_.log_offset()) + layout_.LogBytes(nrec_);
  sent_.assign(static_cast<size_t>(layout_.num_layers()), nrec_);
}

V3Session::~V3Session() = default;

absl::StatusOr<std::unique_ptr<V3Session>> V3Session::Create(Env* env, const std::string& dir, const std::string& id,
                                                             const V3SessionSpec& spec) {
  RETURN_IF_ERROR(ValidateV3Header(spec.header));
  V3Manifest m;
  m.fingerprint = spec.fingerprint;
  m.model_digest = spec.model_digest;
  m.header_crc32c = V3HeaderCrc(spec.header);
  m.metadata = spec.metadata;
  RETURN_IF_ERROR(ValidateV3Manifest(m));
  const std::string path = Session::DataPath(dir, id);
  if (env->FileExists(path)) return absl::AlreadyExistsError(absl::StrCat("session \"", id, "\" already exists"));
  // The manifest first, as for v2: an orphan manifest is removed when the
  // store opens.
  RETURN_IF_ERROR(WriteV3Manifest(env, ManifestPath(path), m));
  ASSIGN_OR_RETURN(std::unique_ptr<ColiKv3Writer> file, ColiKv3Writer::Create(env, path, spec.header));
  return std::unique_ptr<V3Session>(new V3Session(env, dir, id, std::move(file), std::move(m)));
}

absl::StatusOr<std::unique_ptr<V3Session>> V3Session::Open(Env* env, const std::string& dir, const std::string& id) {
  const std::string path = Session::DataPath(dir, id);
  ASSIGN_OR_RETURN(std::unique_ptr<ColiKv3Writer> file, ColiKv3Writer::Open(env, path));
  absl::StatusOr<V3Manifest> m = ReadV3Manifest(env, ManifestPath(path));
  if (absl::IsNotFound(m.status())) {
    return absl::FailedPreconditionError(
        absl::StrCat("session \"", id, "\" is a v3 file without a manifest (written outside the store)"));
  }
  if (!m.ok()) return m.status();
  RETURN_IF_ERROR(CheckV3ManifestAgainst(*m, file->layout().header(), file->num_tokens()));
  return std::unique_ptr<V3Session>(new V3Session(env, dir, id, std::move(file), *std::move(m)));
}

void V3Session::SetCommitRequester(std::function<void()> request) { request_commit_ = std::move(request); }

int64_t V3Session::nrec() const {
  absl::MutexLock lock(&mu_);
  return nrec_;
}

absl::Status V3Session::health() const {
  absl::MutexLock lock(&mu_);
  return failed_;
}

bool V3Session::idle() const {
  absl::MutexLock lock(&mu_);
  return writers_.empty();
}

bool V3Session::NeedsCommit() const {
  absl::MutexLock lock(&mu_);
  return commit_requested_ && failed_.ok();
}

absl::Status V3Session::CheckFingerprint(const std::optional<ModelIdentity>& expected) {
  if (!expected.has_value()) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckModelIdentity(manifest_.fingerprint, manifest_.fingerprint_version, *expected,
                                     absl::StrCat("session \"", id_, "\"")));
  if (manifest_.fingerprint_version != Manifest::kCurrentFingerprintVersion) {
    fingerprint_upgrade_ = expected->fingerprint;
  }
  return absl::OkStatus();
}

absl::Status V3Session::UsableLocked() const {
  if (deleted_) return absl::NotFoundError(absl::StrCat("session \"", id_, "\" was deleted"));
  return failed_;
}

void V3Session::Fail(const absl::Status& s) {
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

int64_t V3Session::CommittableLocked() const { return *std::min_element(sent_.begin(), sent_.end()); }

absl::StatusOr<Session::WriterGrant> V3Session::OpenWriter(int32_t begin, int32_t end, std::optional<int64_t> start,
                                                           std::shared_ptr<CommitListener> listener) {
  RETURN_IF_ERROR(CheckRange(layout_, begin, end));
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(UsableLocked());
  for (const auto& [wid, w] : writers_) {
    if (w.begin < end && begin < w.end) {
      return absl::FailedPreconditionError(absl::StrCat("layers [", w.begin, ", ", w.end, ") of session \"", id_,
                                                        "\" are already being written by another stream; one "
                                                        "writer per layer range"));
    }
  }
  int64_t next = *std::min_element(sent_.begin() + begin, sent_.begin() + end);
  if (start.has_value()) {
    if (*start < nrec_ || *start > next) {
      return absl::OutOfRangeError(absl::StrCat("start position ", *start, " must be in [", nrec_, ", ", next,
                                                "] (committed tokens, sent positions)"));
    }
    next = *start;
  }
  // Whatever the range sent from `next` on is sent again.
  for (int32_t l = begin; l < end; ++l) sent_[static_cast<size_t>(l)] = next;
  for (auto it = pending_.lower_bound(next); it != pending_.end(); ++it) {
    for (int32_t l = begin; l < end; ++l) it->second.have[static_cast<size_t>(l)] = false;
  }
  const int64_t reach = *std::max_element(sent_.begin(), sent_.end());
  pending_.erase(pending_.lower_bound(reach), pending_.end());
  for (auto it = blocks_.begin(); it != blocks_.end();) {
    const auto [l, b] = it->first;
    const bool resent = l >= begin && l < end && (int64_t{b} + 1) * layout_.header().layers[l].rate > next;
    it = resent ? blocks_.erase(it) : std::next(it);
  }
  Session::WriterGrant g;
  g.writer_id = next_writer_id_++;
  g.nrec = nrec_;
  g.next_position = next;
  g.slice_bytes = layout_.slice_bytes(begin, end);
  Writer w;
  w.begin = begin;
  w.end = end;
  w.next = next;
  w.listener = std::move(listener);
  writers_.emplace(g.writer_id, std::move(w));
  return g;
}

absl::Status V3Session::Write(int64_t writer_id, int64_t position, std::span<const int32_t> tokens,
                              std::string_view slices, std::string_view blocks) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  bool request = false;
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(UsableLocked());
    auto it = writers_.find(writer_id);
    if (it == writers_.end()) return absl::FailedPreconditionError("unknown or closed writer");
    Writer& w = it->second;
    if (n == 0) return absl::InvalidArgumentError("no tokens in the write");
    if (position != w.next) {
      return absl::OutOfRangeError(
          absl::StrCat("position ", position, " is out of order: this writer's next position is ", w.next));
    }
    if (position > kMaxTokens - n) {
      return absl::OutOfRangeError(absl::StrCat("a session holds at most ", kMaxTokens, " tokens"));
    }
    const int64_t end = position + n, live = std::min<int64_t>(n, layout_.live_tokens());
    const int64_t sb = layout_.slice_bytes(w.begin, w.end);
    if (static_cast<int64_t>(slices.size()) != live * sb) {
      return absl::InvalidArgumentError(absl::StrCat("a step of ", n, " tokens of layers [", w.begin, ", ", w.end,
                                                     ") carries the parts of its last ", live, " tokens (", live * sb,
                                                     " bytes); got ", slices.size()));
    }
    for (int64_t i = 0; i < n; ++i) {
      const int32_t t = tokens[static_cast<size_t>(i)];
      if (t < 0 || t >= layout_.header().vocab) {
        return absl::InvalidArgumentError(absl::StrCat("token id ", t, " at position ", position + i,
                                                       " is outside [0, ", layout_.header().vocab, ")"));
      }
      auto p = pending_.find(position + i);
      if (p != pending_.end() && p->second.token != t) {
        return absl::InvalidArgumentError(absl::StrCat("token id ", t, " at position ", position + i, " differs from ",
                                                       p->second.token, " sent there by another layer range"));
      }
    }
    std::vector<std::pair<std::pair<int, int32_t>, std::string_view>> closed;
    size_t at = 0;
    for (const auto& [l, b] : layout_.Closes(position, end)) {
      if (l < w.begin || l >= w.end) continue;
      const size_t bb = static_cast<size_t>(layout_.block_bytes(l));
      if (blocks.size() < at + bb || !V3RecordSealed(blocks.data() + at, layout_.block_bytes(l)) ||
          LoadI32(blocks.data() + at) != l || LoadI32(blocks.data() + at + 4) != b) {
        return absl::InvalidArgumentError(absl::StrCat("the step's block records are not those of its closes: ",
                                                       "expected layer ", l, " block ", b, " at byte ", at));
      }
      closed.push_back({{l, b}, blocks.substr(at, bb)});
      at += bb;
    }
    if (at != blocks.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the step's block records take ", at, " bytes; got ", blocks.size()));
    }
    const int64_t rel = layout_.slice_offset(w.begin) - layout_.slice_offset(0);
    const size_t parts = static_cast<size_t>(layout_.slice_bytes(0, layout_.num_layers()));
    for (int64_t p = position; p < end; ++p) {
      Pending& pe = pending_[p];
      if (pe.have.empty()) {
        pe.token = tokens[static_cast<size_t>(p - position)];
        pe.have.assign(static_cast<size_t>(layout_.num_layers()), false);
      }
      if (p < end - live) continue;
      if (pe.parts.empty()) pe.parts.assign(parts, '\0');
      std::memcpy(pe.parts.data() + rel, slices.data() + (p - (end - live)) * sb, static_cast<size_t>(sb));
      for (int32_t l = w.begin; l < w.end; ++l) pe.have[static_cast<size_t>(l)] = true;
    }
    for (auto& [key, rec] : closed) blocks_[key] = std::string(rec);
    for (int32_t l = w.begin; l < w.end; ++l) sent_[static_cast<size_t>(l)] = end;
    w.next = end;
    if (CommittableLocked() > nrec_ && !commit_requested_) {
      commit_requested_ = true;
      request = true;
    }
  }
  if (request && request_commit_) request_commit_();
  return absl::OkStatus();
}

bool V3Session::WriterDurable(int64_t writer_id) const {
  absl::MutexLock lock(&mu_);
  auto it = writers_.find(writer_id);
  if (it == writers_.end()) return true;
  const Writer& w = it->second;
  if (nrec_ >= w.next) return true;
  if (writers_.size() > 1) return false;
  for (int32_t l = 0; l < layout_.num_layers(); ++l) {
    if ((l < w.begin || l >= w.end) && sent_[static_cast<size_t>(l)] < w.next) return true;
  }
  return false;
}

void V3Session::CloseWriter(int64_t writer_id) {
  std::vector<std::shared_ptr<CommitListener>> listeners;
  int64_t nrec;
  {
    absl::MutexLock lock(&mu_);
    if (writers_.erase(writer_id) == 0) return;
    for (auto& [id, w] : writers_) listeners.push_back(w.listener);
    nrec = nrec_;
  }
  for (auto& l : listeners) {
    if (l) l->OnCommitted(nrec);
  }
}

absl::StatusOr<int64_t> V3Session::Commit() {
  absl::MutexLock commit_lock(&commit_mu_);
  int64_t t0, t1;
  std::vector<std::string> recs;
  std::string blocks;
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(UsableLocked());
    commit_requested_ = false;
    t0 = nrec_;
    t1 = CommittableLocked();
    if (t1 <= t0) return t0;
    // Every part of the records and every block of the commit point must be
    // there; when the ranges' steps do not end at the same positions they
    // are not yet, and the round waits for the next write.
    for (int64_t p = std::max(t0, layout_.first_live(t1)); p < t1; ++p) {
      auto it = pending_.find(p);
      if (it == pending_.end() || it->second.parts.empty() ||
          std::find(it->second.have.begin(), it->second.have.end(), false) != it->second.have.end()) {
        return t0;
      }
      recs.push_back(SealV3TokenRecord(layout_, p, it->second.token, it->second.parts));
    }
    for (const auto& key : layout_.Closes(t0, t1)) {
      auto it = blocks_.find(key);
      if (it == blocks_.end()) return t0;
      blocks += it->second;
    }
  }
  if (absl::Status s = file_->Append(t1, recs, blocks); !s.ok()) {
    Fail(s);
    return s;
  }
  std::vector<std::shared_ptr<CommitListener>> listeners;
  bool again = false;
  {
    absl::MutexLock lock(&mu_);
    nrec_ = t1;
    file_bytes_ = static_cast<uint64_t>(layout_.log_offset()) + layout_.LogBytes(t1);
    pending_.erase(pending_.begin(), pending_.lower_bound(t1));
    for (auto it = blocks_.begin(); it != blocks_.end();) {
      const auto [l, b] = it->first;
      it = (int64_t{b} + 1) * layout_.header().layers[l].rate <= t1 ? blocks_.erase(it) : std::next(it);
    }
    for (auto& [id, w] : writers_) listeners.push_back(w.listener);
    if (CommittableLocked() > nrec_ && !commit_requested_) {
      commit_requested_ = true;
      again = true;
    }
  }
  for (auto& l : listeners) {
    if (l) l->OnCommitted(t1);
  }
  if (again && request_commit_) request_commit_();
  return t1;
}

absl::Status V3Session::Truncate(int64_t n) {
  absl::MutexLock commit_lock(&commit_mu_);
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(UsableLocked());
  if (!writers_.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("session \"", id_, "\" has ", writers_.size(), " open append streams; close them first"));
  }
  if (n != nrec_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "session \"", id_, "\" is a v3 (DeepSeek-V4) session, which keeps only its state at the ", nrec_,
        " committed tokens: it cannot go back to ", n, " (delete it and prefill again)"));
  }
  pending_.clear();
  blocks_.clear();
  sent_.assign(sent_.size(), nrec_);
  commit_requested_ = false;
  return absl::OkStatus();
}

absl::Status V3Session::WriteManifestLocked(const V3Manifest& m) {
  RETURN_IF_ERROR(ValidateV3Manifest(m));
  return WriteV3Manifest(env_, manifest_path_, m);
}

absl::Status V3Session::Update(std::optional<int64_t> turn_watermark, const std::map<std::string, std::string>& set,
                               const std::vector<std::string>& remove) {
  absl::MutexLock commit_lock(&commit_mu_);
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(UsableLocked());
  if (turn_watermark.has_value() && (*turn_watermark < 0 || *turn_watermark > nrec_)) {
    return absl::OutOfRangeError(
        absl::StrCat("turn watermark ", *turn_watermark, " must be in [0, ", nrec_, "] (committed tokens)"));
  }
  V3Manifest m = manifest_;
  if (fingerprint_upgrade_.has_value()) {
    m.fingerprint = *fingerprint_upgrade_;
    m.fingerprint_version = Manifest::kCurrentFingerprintVersion;
  }
  if (turn_watermark.has_value()) m.turn_watermark = *turn_watermark;
  for (const auto& [k, v] : set) m.metadata[k] = v;
  for (const std::string& k : remove) m.metadata.erase(k);
  // Written under mu_: manifest replacements are rare (a turn's end).
  RETURN_IF_ERROR(WriteManifestLocked(m));
  manifest_ = std::move(m);
  fingerprint_upgrade_.reset();
  return absl::OkStatus();
}

absl::Status V3Session::Read(int32_t begin, int32_t end, V3RangeState* out) const {
  RETURN_IF_ERROR(CheckRange(layout_, begin, end));
  // Under commit_mu_: no append runs while the committed state is read.
  absl::MutexLock commit_lock(&commit_mu_);
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(UsableLocked());
  }
  ASSIGN_OR_RETURN(std::unique_ptr<ColiKv3Reader> r, ColiKv3Reader::Open(env_, data_path_));
  *out = V3RangeState();
  out->nrec = r->num_tokens();
  out->first = r->first_live();
  const int64_t off = layout_.slice_offset(begin), sb = layout_.slice_bytes(begin, end);
  std::string rec;
  for (int64_t p = out->first; p < out->nrec; ++p) {
    RETURN_IF_ERROR(r->ReadTokenRecord(p, &rec));
    out->tokens.push_back(LoadI32(rec.data() + 4));
    out->slices.append(rec, static_cast<size_t>(off), static_cast<size_t>(sb));
  }
  std::string log;
  RETURN_IF_ERROR(r->ReadBlockLog(&log));
  size_t at = 0;
  for (const auto& [l, b] : layout_.Closes(0, out->nrec)) {
    const size_t bb = static_cast<size_t>(layout_.block_bytes(l));
    if (l >= begin && l < end) out->blocks.append(log, at, bb);
    at += bb;
  }
  return absl::OkStatus();
}

V3SessionInfo V3Session::Info() const {
  absl::MutexLock lock(&mu_);
  V3SessionInfo info;
  info.id = id_;
  info.header = layout_.header();
  info.nrec = nrec_;
  info.file_bytes = file_bytes_;
  info.manifest = manifest_;
  for (const auto& [id, w] : writers_) info.writers.push_back(LayerRange{w.begin, w.end});
  return info;
}

absl::Status V3Session::DeleteFiles() {
  absl::MutexLock commit_lock(&commit_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (deleted_) return absl::NotFoundError(absl::StrCat("session \"", id_, "\" was deleted"));
    if (!writers_.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("session \"", id_, "\" has ", writers_.size(), " open append streams; close them first"));
    }
    deleted_ = true;
  }
  (void)file_->Close();
  RETURN_IF_ERROR(env_->Delete(data_path_));
  RETURN_IF_ERROR(env_->SyncDir(dir_));
  if (absl::Status s = env_->Delete(manifest_path_); !s.ok() && !absl::IsNotFound(s)) return s;
  return env_->SyncDir(dir_);
}

}  // namespace strata::kv
