#include "kvstore/fault_injection_env.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"

namespace strata::kv {

// A file's contents: the live bytes, the durable bytes, and the changes made
// since the last Sync (for DropSomeUnsyncedData).
struct FaultInjectionEnv::Inode {
  struct Change {
    bool truncate = false;
    uint64_t offset = 0;  // write offset, or the new size of a truncate
    std::string data;
  };
  std::string live;
  std::string durable;
  std::vector<Change> unsynced;

  static void Apply(const Change& c, std::string* s) {
    if (c.truncate) {
      s->resize(c.offset, '\0');
      return;
    }
    if (s->size() < c.offset + c.data.size()) s->resize(c.offset + c.data.size(), '\0');
    std::memcpy(s->data() + c.offset, c.data.data(), c.data.size());
  }
};

class FaultInjectionEnv::MemFile final : public File {
 public:
  MemFile(FaultInjectionEnv* env, std::string path, std::shared_ptr<Inode> inode,
          uint64_t generation, bool writable)
      : env_(env),
        path_(std::move(path)),
        inode_(std::move(inode)),
        generation_(generation),
        writable_(writable) {}

  absl::Status Write(uint64_t offset, std::string_view data) override {
    std::lock_guard<std::mutex> lock(env_->mu_);
    if (absl::Status s = Usable(true); !s.ok()) return s;
    if (absl::Status s = env_->BeginOp(OpKind::kWrite, path_); !s.ok()) return s;
    const uint64_t end = offset + data.size();
    if (env_->space_limit_ > 0 && end > inode_->live.size()) {
      const uint64_t growth = end - inode_->live.size();
      if (env_->TotalBytes() + growth > env_->space_limit_) {
        return absl::ResourceExhaustedError(
            absl::StrCat("pwrite ", path_, ": No space left on device (injected limit)"));
      }
    }
    Inode::Change c;
    c.offset = offset;
    c.data = std::string(data);
    Inode::Apply(c, &inode_->live);
    inode_->unsynced.push_back(std::move(c));
    return absl::OkStatus();
  }

  absl::StatusOr<size_t> Read(uint64_t offset, size_t n, char* scratch) override {
    std::lock_guard<std::mutex> lock(env_->mu_);
    if (absl::Status s = Usable(false); !s.ok()) return s;
    const std::string& s = inode_->live;
    if (offset >= s.size()) return size_t{0};
    const size_t got = std::min<uint64_t>(n, s.size() - offset);
    std::memcpy(scratch, s.data() + offset, got);
    return got;
  }

  absl::Status Sync() override {
    std::lock_guard<std::mutex> lock(env_->mu_);
    if (absl::Status s = Usable(false); !s.ok()) return s;
    if (absl::Status s = env_->BeginOp(OpKind::kSync, path_); !s.ok()) return s;
    inode_->durable = inode_->live;
    inode_->unsynced.clear();
    return absl::OkStatus();
  }

  absl::Status Truncate(uint64_t size) override {
    std::lock_guard<std::mutex> lock(env_->mu_);
    if (absl::Status s = Usable(true); !s.ok()) return s;
    if (absl::Status s = env_->BeginOp(OpKind::kTruncate, path_); !s.ok()) return s;
    Inode::Change c;
    c.truncate = true;
    c.offset = size;
    Inode::Apply(c, &inode_->live);
    inode_->unsynced.push_back(std::move(c));
    return absl::OkStatus();
  }

  absl::StatusOr<uint64_t> Size() override {
    std::lock_guard<std::mutex> lock(env_->mu_);
    if (absl::Status s = Usable(false); !s.ok()) return s;
    return static_cast<uint64_t>(inode_->live.size());
  }

  absl::Status Close() override {
    std::lock_guard<std::mutex> lock(env_->mu_);
    closed_ = true;
    return absl::OkStatus();
  }

 private:
  // REQUIRES: env_->mu_ held.
  absl::Status Usable(bool write) const {
    if (closed_) return absl::FailedPreconditionError(absl::StrCat(path_, ": file is closed"));
    if (generation_ != env_->generation_) {
      return absl::InternalError(absl::StrCat(path_, ": handle opened before a simulated reboot"));
    }
    if (absl::Status s = env_->CheckAlive(); !s.ok()) return s;
    if (write && !writable_) {
      return absl::PermissionDeniedError(absl::StrCat(path_, ": opened read-only"));
    }
    return absl::OkStatus();
  }

  FaultInjectionEnv* const env_;
  const std::string path_;
  const std::shared_ptr<Inode> inode_;
  const uint64_t generation_;
  const bool writable_;
  bool closed_ = false;
};

FaultInjectionEnv::FaultInjectionEnv() { dirs_.insert("."); }
FaultInjectionEnv::~FaultInjectionEnv() = default;

absl::Status FaultInjectionEnv::CheckAlive() const {
  if (crashed_) return absl::InternalError("simulated crash: the file system is gone");
  return absl::OkStatus();
}

absl::Status FaultInjectionEnv::BeginOp(OpKind op, const std::string& path,
                                        const std::string& path2) {
  if (absl::Status s = CheckAlive(); !s.ok()) return s;
  const int64_t index = op_count_++;
  if (crash_at_ >= 0 && index >= crash_at_) {
    crashed_ = true;
    return absl::InternalError(absl::StrCat("simulated crash at operation ", index));
  }
  for (Fault& f : faults_) {
    if (f.op != op || f.times == 0) continue;
    const bool match = f.path_contains.empty() ||
                       path.find(f.path_contains) != std::string::npos ||
                       (!path2.empty() && path2.find(f.path_contains) != std::string::npos);
    if (!match) continue;
    if (f.skip > 0) {
      --f.skip;
      continue;
    }
    if (f.times > 0) --f.times;
    return f.error;
  }
  return absl::OkStatus();
}

void FaultInjectionEnv::SetEntry(const std::string& path, std::shared_ptr<Inode> inode) {
  if (inode) {
    live_[path] = inode;
  } else {
    live_.erase(path);
  }
  DirChange change;
  change.entries.emplace_back(path, std::move(inode));
  pending_dir_changes_[DirName(path)].push_back(std::move(change));
}

uint64_t FaultInjectionEnv::TotalBytes() const {
  std::set<const Inode*> seen;
  uint64_t total = 0;
  for (const auto& [name, inode] : live_) {
    if (seen.insert(inode.get()).second) total += inode->live.size();
  }
  return total;
}

absl::StatusOr<std::unique_ptr<File>> FaultInjectionEnv::Open(const std::string& path,
                                                              OpenMode mode) {
  std::lock_guard<std::mutex> lock(mu_);
  if (absl::Status s = CheckAlive(); !s.ok()) return s;
  const bool create = mode == OpenMode::kCreate || mode == OpenMode::kCreateTruncate;
  if (create) {
    if (absl::Status s = BeginOp(OpKind::kCreate, path); !s.ok()) return s;
  }
  if (dirs_.count(path) > 0) return absl::FailedPreconditionError(path + " is a directory");
  auto it = live_.find(path);
  std::shared_ptr<Inode> inode;
  if (it != live_.end()) {
    inode = it->second;
    if (mode == OpenMode::kCreateTruncate) {
      Inode::Change c;
      c.truncate = true;
      c.offset = 0;
      Inode::Apply(c, &inode->live);
      inode->unsynced.push_back(std::move(c));
    }
  } else {
    if (!create) return absl::NotFoundError(absl::StrCat("open ", path, ": No such file"));
    if (dirs_.count(DirName(path)) == 0) {
      return absl::NotFoundError(absl::StrCat("open ", path, ": No such directory"));
    }
    inode = std::make_shared<Inode>();
    SetEntry(path, inode);
  }
  return std::unique_ptr<File>(
      new MemFile(this, path, std::move(inode), generation_, mode != OpenMode::kRead));
}

absl::Status FaultInjectionEnv::SyncDir(const std::string& dir) {
  std::lock_guard<std::mutex> lock(mu_);
  if (absl::Status s = BeginOp(OpKind::kSyncDir, dir); !s.ok()) return s;
  if (dirs_.count(dir) == 0) return absl::NotFoundError("open directory " + dir);
  for (auto it = durable_.begin(); it != durable_.end();) {
    if (DirName(it->first) == dir) {
      it = durable_.erase(it);
    } else {
      ++it;
    }
  }
  for (const auto& [name, inode] : live_) {
    if (DirName(name) == dir) durable_[name] = inode;
  }
  pending_dir_changes_.erase(dir);
  return absl::OkStatus();
}

absl::Status FaultInjectionEnv::Rename(const std::string& from, const std::string& to) {
  std::lock_guard<std::mutex> lock(mu_);
  if (absl::Status s = BeginOp(OpKind::kRename, from, to); !s.ok()) return s;
  auto it = live_.find(from);
  if (it == live_.end()) return absl::NotFoundError(absl::StrCat("rename ", from, ": No such file"));
  if (dirs_.count(DirName(to)) == 0) return absl::NotFoundError("rename target directory missing");
  std::shared_ptr<Inode> inode = it->second;
  live_.erase(it);
  live_[to] = inode;
  // A rename reaches the disk as one change: both entries or neither.
  DirChange add;
  add.entries.emplace_back(to, inode);
  DirChange remove;
  remove.entries.emplace_back(from, nullptr);
  if (DirName(from) == DirName(to)) {
    add.entries.push_back(std::move(remove.entries.front()));
  } else {
    pending_dir_changes_[DirName(from)].push_back(std::move(remove));
  }
  pending_dir_changes_[DirName(to)].push_back(std::move(add));
  return absl::OkStatus();
}

absl::Status FaultInjectionEnv::Delete(const std::string& path) {
  std::lock_guard<std::mutex> lock(mu_);
  if (absl::Status s = BeginOp(OpKind::kDelete, path); !s.ok()) return s;
  if (live_.count(path) == 0) return absl::NotFoundError(absl::StrCat("unlink ", path, ": No such file"));
  SetEntry(path, nullptr);
  return absl::OkStatus();
}

absl::Status FaultInjectionEnv::CreateDir(const std::string& dir) {
  std::lock_guard<std::mutex> lock(mu_);
  if (absl::Status s = BeginOp(OpKind::kCreateDir, dir); !s.ok()) return s;
  if (live_.count(dir) > 0) return absl::FailedPreconditionError(dir + " exists and is not a directory");
  std::string d = dir;
  while (!d.empty() && d != "." && d != "/") {
    dirs_.insert(d);
    d = DirName(d);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> FaultInjectionEnv::ListDir(const std::string& dir) {
  std::lock_guard<std::mutex> lock(mu_);
  if (absl::Status s = CheckAlive(); !s.ok()) return s;
  if (dirs_.count(dir) == 0) return absl::NotFoundError("opendir " + dir + ": No such directory");
  std::vector<std::string> names;
  for (const auto& [name, inode] : live_) {
    if (DirName(name) == dir) names.push_back(name.substr(name.rfind('/') + 1));
  }
  for (const std::string& d : dirs_) {
    if (d != dir && DirName(d) == dir) names.push_back(d.substr(d.rfind('/') + 1));
  }
  std::sort(names.begin(), names.end());
  return names;
}

absl::StatusOr<uint64_t> FaultInjectionEnv::FileSize(const std::string& path) {
  std::lock_guard<std::mutex> lock(mu_);
  if (absl::Status s = CheckAlive(); !s.ok()) return s;
  auto it = live_.find(path);
  if (it == live_.end()) return absl::NotFoundError("stat " + path + ": No such file");
  return static_cast<uint64_t>(it->second->live.size());
}

bool FaultInjectionEnv::FileExists(const std::string& path) {
  std::lock_guard<std::mutex> lock(mu_);
  return live_.count(path) > 0 || dirs_.count(path) > 0;
}

absl::StatusOr<std::unique_ptr<FileLock>> FaultInjectionEnv::LockFile(const std::string& path) {
  class MemLock final : public FileLock {
   public:
    MemLock(FaultInjectionEnv* env, std::string path) : env_(env), path_(std::move(path)) {}
    ~MemLock() override {
      std::lock_guard<std::mutex> lock(env_->mu_);
      env_->locks_.erase(path_);
    }

   private:
    FaultInjectionEnv* const env_;
    const std::string path_;
  };
  std::lock_guard<std::mutex> lock(mu_);
  if (absl::Status s = CheckAlive(); !s.ok()) return s;
  if (!locks_.insert(path).second) {
    return absl::FailedPreconditionError(path + " is locked by another holder");
  }
  return std::unique_ptr<FileLock>(new MemLock(this, path));
}

void FaultInjectionEnv::AddFault(Fault fault) {
  std::lock_guard<std::mutex> lock(mu_);
  faults_.push_back(std::move(fault));
}

void FaultInjectionEnv::ClearFaults() {
  std::lock_guard<std::mutex> lock(mu_);
  faults_.clear();
}

void FaultInjectionEnv::SetSpaceLimit(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  space_limit_ = bytes;
}

void FaultInjectionEnv::CrashAtOperation(int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  crash_at_ = n;
}

bool FaultInjectionEnv::crashed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return crashed_;
}

int64_t FaultInjectionEnv::operation_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return op_count_;
}

void FaultInjectionEnv::Reboot() {
  crashed_ = false;
  crash_at_ = -1;
  op_count_ = 0;
  ++generation_;
  pending_dir_changes_.clear();
  live_ = durable_;
}

void FaultInjectionEnv::DropUnsyncedData() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [name, inode] : durable_) {
    inode->live = inode->durable;
    inode->unsynced.clear();
  }
  Reboot();
}

void FaultInjectionEnv::DropSomeUnsyncedData(uint64_t seed) {
  std::lock_guard<std::mutex> lock(mu_);
  std::mt19937_64 rng(seed);
  // Directories: a random prefix of each one's unsynced changes (a rename's
  // two halves stay together).
  for (auto& [dir, changes] : pending_dir_changes_) {
    const size_t keep = std::uniform_int_distribution<size_t>(0, changes.size())(rng);
    for (size_t i = 0; i < keep; ++i) {
      for (const auto& [name, inode] : changes[i].entries) {
        if (inode) {
          durable_[name] = inode;
        } else {
          durable_.erase(name);
        }
      }
    }
  }
  // Contents: each unsynced change, in order, lost, kept whole, or (a write
  // only) torn: each of its sectors kept or lost on its own.
  std::set<Inode*> done;
  for (auto& [name, inode] : durable_) {
    if (!done.insert(inode.get()).second) continue;
    std::string s = inode->durable;
    for (const Inode::Change& c : inode->unsynced) {
      const uint64_t fate = rng() % 3;
      if (fate == 0) continue;
      if (fate == 1 || c.truncate) {
        Inode::Apply(c, &s);
        continue;
      }
      for (uint64_t at = c.offset; at < c.offset + c.data.size();) {
        const uint64_t end = std::min<uint64_t>((at / kSectorBytes + 1) * kSectorBytes, c.offset + c.data.size());
        if (rng() & 1) {
          Inode::Change piece;
          piece.offset = at;
          piece.data = c.data.substr(at - c.offset, end - at);
          Inode::Apply(piece, &s);
        }
        at = end;
      }
    }
    inode->durable = s;
    inode->live = std::move(s);
    inode->unsynced.clear();
  }
  Reboot();
}

}  // namespace strata::kv
