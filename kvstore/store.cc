#include "kvstore/store.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kvstore/coli_kv3_file.h"
#include "kvstore/coli_kv_file.h"

namespace strata::kv {
namespace {

constexpr absl::string_view kDataSuffix = ".coli_kv";
constexpr absl::string_view kManifestSuffix = ".coli_kv.manifest";
constexpr char kLockName[] = "LOCK";

bool IsIdChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-';
}

}  // namespace

absl::Status Store::ValidateSessionId(std::string_view id) {
  if (id.empty()) return absl::InvalidArgumentError("session id is empty");
  if (id.size() > kMaxSessionIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("session id has ", id.size(), " bytes; at most ", kMaxSessionIdBytes));
  }
  for (char c : id) {
    if (!IsIdChar(c)) {
      return absl::InvalidArgumentError(
          "session id may hold only letters, digits, '.', '_' and '-'");
    }
  }
  if (id.front() == '.' || id.front() == '_' || id.front() == '-') {
    return absl::InvalidArgumentError("session id must start with a letter or a digit");
  }
  return absl::OkStatus();
}

Store::Store(Env* env, StoreOptions options, std::unique_ptr<FileLock> lock)
    : env_(env), options_(std::move(options)), lock_(std::move(lock)) {
  for (int i = 0; i < options_.commit_threads; ++i) {
    threads_.emplace_back([this] { CommitLoop(); });
  }
}

absl::StatusOr<std::unique_ptr<Store>> Store::Open(Env* env, const StoreOptions& options) {
  if (options.dir.empty()) return absl::InvalidArgumentError("the store needs a directory");
  RETURN_IF_ERROR(env->CreateDir(options.dir));
  ASSIGN_OR_RETURN(std::unique_ptr<FileLock> lock, env->LockFile(JoinPath(options.dir, kLockName)));
  ASSIGN_OR_RETURN(std::vector<std::string> names, env->ListDir(options.dir));
  bool removed = false;
  for (const std::string& name : names) {
    const std::string path = JoinPath(options.dir, name);
    bool stale = absl::EndsWith(name, ".tmp");
    if (absl::EndsWith(name, kManifestSuffix)) {
      const std::string data = path.substr(0, path.size() - (kManifestSuffix.size() - kDataSuffix.size()));
      stale = !env->FileExists(data);
    }
    if (stale) {
      RETURN_IF_ERROR(env->Delete(path));
      removed = true;
    }
  }
  if (removed) RETURN_IF_ERROR(env->SyncDir(options.dir));
  return std::unique_ptr<Store>(new Store(env, options, std::move(lock)));
}

Store::~Store() {
  {
    absl::MutexLock lock(&queue_mu_);
    stop_ = true;
  }
  for (std::thread& t : threads_) t.join();
  CommitAll();
}

void Store::Enqueue(std::function<void()> commit) {
  if (threads_.empty()) return;  // the owner runs CommitAll
  absl::MutexLock lock(&queue_mu_);
  queue_.push_back(std::move(commit));
}

void Store::CommitLoop() {
  while (true) {
    std::function<void()> next;
    {
      absl::MutexLock lock(&queue_mu_);
      queue_mu_.Await(absl::Condition(
          +[](Store* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->queue_mu_) {
            return s->stop_ || !s->queue_.empty();
          },
          this));
      if (queue_.empty()) return;  // stopping
      next = std::move(queue_.front());
      queue_.pop_front();
    }
    next();
  }
}

void Store::CommitAll() {
  std::vector<std::shared_ptr<Session>> all;
  std::vector<std::shared_ptr<V3Session>> all_v3;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, s] : sessions_) all.push_back(s);
    for (auto& [id, s] : v3_sessions_) all_v3.push_back(s);
  }
  for (auto& s : all) {
    while (s->NeedsCommit() && s->health().ok()) {
      if (!s->Commit().ok()) break;
    }
  }
  for (auto& s : all_v3) {
    while (s->NeedsCommit()) {
      if (!s->Commit().ok()) break;
    }
  }
}

void Store::Attach(const std::shared_ptr<Session>& s) {
  std::weak_ptr<Session> weak = s;
  s->SetCommitRequester([this, weak] {
    Enqueue([weak] {
      if (std::shared_ptr<Session> s = weak.lock()) (void)s->Commit();  // failures go to the writers
    });
  });
}

void Store::AttachV3(const std::shared_ptr<V3Session>& s) {
  std::weak_ptr<V3Session> weak = s;
  s->SetCommitRequester([this, weak] {
    Enqueue([weak] {
      if (std::shared_ptr<V3Session> s = weak.lock()) (void)s->Commit();
    });
  });
}

void Store::EvictIdleLocked() {
  for (auto it = v3_sessions_.begin(); it != v3_sessions_.end() && v3_sessions_.size() > options_.max_open_sessions;) {
    if (it->second.use_count() == 1 && it->second->idle() && !it->second->NeedsCommit()) {
      it = v3_sessions_.erase(it);
    } else {
      ++it;
    }
  }
  if (sessions_.size() <= options_.max_open_sessions) return;
  for (auto it = sessions_.begin(); it != sessions_.end() && sessions_.size() > options_.max_open_sessions;) {
    if (it->second.use_count() == 1 && it->second->idle() && !it->second->NeedsCommit()) {
      it = sessions_.erase(it);
    } else {
      ++it;
    }
  }
}

absl::StatusOr<std::shared_ptr<Session>> Store::Create(const std::string& id,
                                                       const SessionSpec& spec) {
  RETURN_IF_ERROR(ValidateSessionId(id));
  // Held across the file operations: creation is rare and quick, and it keeps
  // a concurrent Get or Delete of the same id from racing it.
  absl::MutexLock lock(&mu_);
  if (sessions_.count(id) > 0 || v3_sessions_.count(id) > 0) {
    return absl::AlreadyExistsError(absl::StrCat("session \"", id, "\" already exists"));
  }
  SessionSpec s = spec;
  if (s.chunk_records <= 0) s.chunk_records = options_.chunk_records;
  ASSIGN_OR_RETURN(std::unique_ptr<Session> created, Session::Create(env_, options_.dir, id, s));
  std::shared_ptr<Session> session = std::move(created);
  Attach(session);
  EvictIdleLocked();
  sessions_[id] = session;
  return session;
}

absl::StatusOr<std::shared_ptr<V3Session>> Store::CreateV3(const std::string& id, const V3SessionSpec& spec) {
  RETURN_IF_ERROR(ValidateSessionId(id));
  absl::MutexLock lock(&mu_);
  if (sessions_.count(id) > 0 || v3_sessions_.count(id) > 0) {
    return absl::AlreadyExistsError(absl::StrCat("session \"", id, "\" already exists"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<V3Session> created, V3Session::Create(env_, options_.dir, id, spec));
  std::shared_ptr<V3Session> session = std::move(created);
  AttachV3(session);
  EvictIdleLocked();
  v3_sessions_[id] = session;
  return session;
}

absl::StatusOr<Store::AnySession> Store::GetAny(const std::string& id,
                                                const std::optional<ModelIdentity>& expected_fingerprint) {
  RETURN_IF_ERROR(ValidateSessionId(id));
  std::shared_ptr<V3Session> v3;
  {
    absl::MutexLock lock(&mu_);
    auto it = v3_sessions_.find(id);
    if (it != v3_sessions_.end()) {
      const absl::Status health = it->second->health();
      if (health.ok()) {
        v3 = it->second;
      } else if (it->second.use_count() == 1 && it->second->idle()) {
        v3_sessions_.erase(it);  // failed and unused: reopen from what is on disk
      } else {
        return health;
      }
    }
    if (!v3 && sessions_.count(id) == 0) {
      // Not open: the data file's magic says which kind it is.
      const std::string path = Session::DataPath(options_.dir, id);
      if (!env_->FileExists(path)) return absl::NotFoundError(absl::StrCat("no session \"", id, "\""));
      char magic[8] = {};
      ASSIGN_OR_RETURN(std::unique_ptr<File> f, env_->Open(path, OpenMode::kRead));
      ASSIGN_OR_RETURN(size_t got, f->Read(0, sizeof(magic), magic));
      if (got == sizeof(magic) && std::string_view(magic, 8) == kMagicV3) {
        ASSIGN_OR_RETURN(std::unique_ptr<V3Session> opened, V3Session::Open(env_, options_.dir, id));
        v3 = std::move(opened);
        AttachV3(v3);
        EvictIdleLocked();
        v3_sessions_[id] = v3;
      }
    }
  }
  AnySession any;
  if (v3) {
    RETURN_IF_ERROR(v3->CheckFingerprint(expected_fingerprint));
    any.v3 = std::move(v3);
    return any;
  }
  ASSIGN_OR_RETURN(any.v2, Get(id, expected_fingerprint));
  return any;
}

absl::StatusOr<std::shared_ptr<Session>> Store::Get(const std::string& id,
                                                    const std::optional<ModelIdentity>& expected_fingerprint) {
  RETURN_IF_ERROR(ValidateSessionId(id));
  std::shared_ptr<Session> session;
  {
    absl::MutexLock lock(&mu_);
    if (v3_sessions_.count(id) > 0) {
      return absl::FailedPreconditionError(absl::StrCat("session \"", id, "\" is a v3 (DeepSeek-V4) session"));
    }
    auto it = sessions_.find(id);
    if (it != sessions_.end()) {
      const absl::Status health = it->second->health();
      if (health.ok()) {
        session = it->second;
      } else if (it->second.use_count() == 1 && it->second->idle()) {
        sessions_.erase(it);  // failed and unused: reopen from what is on disk
      } else {
        return health;
      }
    }
    if (!session) {
      const std::string path = Session::DataPath(options_.dir, id);
      if (!env_->FileExists(path)) {
        return absl::NotFoundError(absl::StrCat("no session \"", id, "\""));
      }
      SessionOptions so;
      so.verify_checksums = options_.verify_checksums_on_open;
      ASSIGN_OR_RETURN(std::unique_ptr<Session> opened, Session::Open(env_, options_.dir, id, so));
      session = std::move(opened);
      Attach(session);
      EvictIdleLocked();
      sessions_[id] = session;
    }
  }
  RETURN_IF_ERROR(session->CheckFingerprint(expected_fingerprint));
  return session;
}

absl::Status Store::Delete(const std::string& id) {
  RETURN_IF_ERROR(ValidateSessionId(id));
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it != sessions_.end()) {
    RETURN_IF_ERROR(it->second->DeleteFiles());
    sessions_.erase(it);
    return absl::OkStatus();
  }
  auto it3 = v3_sessions_.find(id);
  if (it3 != v3_sessions_.end()) {
    RETURN_IF_ERROR(it3->second->DeleteFiles());
    v3_sessions_.erase(it3);
    return absl::OkStatus();
  }
  // Not open (perhaps because it cannot be opened): delete the files as they are.
  const std::string path = Session::DataPath(options_.dir, id);
  const std::string mpath = ManifestPath(path);
  const bool data = env_->FileExists(path), manifest = env_->FileExists(mpath);
  if (!data && !manifest) return absl::NotFoundError(absl::StrCat("no session \"", id, "\""));
  if (data) {
    RETURN_IF_ERROR(env_->Delete(path));
    RETURN_IF_ERROR(env_->SyncDir(options_.dir));
  }
  if (manifest) {
    RETURN_IF_ERROR(env_->Delete(mpath));
    RETURN_IF_ERROR(env_->SyncDir(options_.dir));
  }
  return absl::OkStatus();
}

size_t Store::OpenSessions() {
  absl::MutexLock l(&mu_);
  return sessions_.size();
}

absl::StatusOr<size_t> Store::StoredSessions() {
  ASSIGN_OR_RETURN(std::vector<std::string> names, env_->ListDir(options_.dir));
  size_t n = 0;
  for (const std::string& name : names) {
    if (absl::EndsWith(name, kDataSuffix) &&
        ValidateSessionId(std::string_view(name).substr(0, name.size() - kDataSuffix.size())).ok()) {
      ++n;
    }
  }
  return n;
}

absl::StatusOr<std::vector<SessionSummary>> Store::List(const std::string& prefix,
                                                        const std::string& after, size_t limit,
                                                        bool* more) {
  ASSIGN_OR_RETURN(std::vector<std::string> names, env_->ListDir(options_.dir));
  std::vector<std::string> ids;
  for (const std::string& name : names) {
    if (!absl::EndsWith(name, kDataSuffix)) continue;
    std::string id = name.substr(0, name.size() - kDataSuffix.size());
    if (!ValidateSessionId(id).ok() || !absl::StartsWith(id, prefix)) continue;
    if (!after.empty() && id <= after) continue;
    ids.push_back(std::move(id));
  }
  std::sort(ids.begin(), ids.end());
  *more = limit > 0 && ids.size() > limit;
  if (*more) ids.resize(limit);
  std::vector<SessionSummary> out;
  for (const std::string& id : ids) {
    SessionSummary s;
    s.id = id;
    const std::string path = Session::DataPath(options_.dir, id);
    absl::StatusOr<std::unique_ptr<ColiKvReader>> r = ColiKvReader::Open(env_, path);
    if (r.ok()) {
      s.nrec = (*r)->nrec();
      s.file_bytes = (*r)->file_size();
      if (!env_->FileExists(ManifestPath(path))) {
        s.problem = absl::FailedPreconditionError("no manifest: import it first");
      }
    } else if (absl::StatusOr<std::unique_ptr<ColiKv3Reader>> r3 = ColiKv3Reader::Open(env_, path); r3.ok()) {
      s.nrec = (*r3)->num_tokens();
      s.file_bytes = (*r3)->file_size();
      if (!env_->FileExists(ManifestPath(path))) {
        s.problem = absl::FailedPreconditionError("a v3 file without a manifest (written outside the store)");
      }
    } else {
      s.problem = r.status();
    }
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace strata::kv
