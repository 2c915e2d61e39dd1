// FaultInjectionEnv: an in-memory Env for tests that knows, for every file,
// which bytes are durable, and can fail operations, crash, and lose power
// (docs/coli-kv.md, "Testing").
//
// What is durable follows Env's model (kvstore/env.h):
//   - file contents: the state as of the last successful Sync of that file;
//   - directory entries (create, rename, delete): the state as of the last
//     successful SyncDir of their directory. A file created and synced but
//     whose directory was never synced disappears at power loss; a rename not
//     followed by SyncDir is undone.
//   - CreateDir is durable at once (the tests' directories exist beforehand).
//
// Faults:
//   (a) AddFault: the matching operations fail with a chosen status (for
//       example RESOURCE_EXHAUSTED for a full disk) without changing state;
//       SetSpaceLimit makes every write that would grow the total size of the
//       files beyond a limit fail with RESOURCE_EXHAUSTED.
//   (b) CrashAtOperation(n): the mutating operation with index n (counted
//       from construction or the last Reboot, see operation_count) and every
//       operation after it fail with INTERNAL, as if the process had died
//       just before it.
//   (c) DropUnsyncedData: power loss. Every file's contents go back to their
//       durable state and every directory to its durable entries.
//       DropSomeUnsyncedData is the harsher variant where each unsynced write
//       or truncate independently may or may not have reached the disk, a
//       write may also have reached it torn (each kSectorBytes-aligned
//       sector of it on its own: a disk writes a sector atomically, nothing
//       larger), and a random prefix of each directory's unsynced entry
//       changes did.
//   Both drops "reboot" the Env: the crash is cleared, the operation counter
//   restarts at 0, and handles opened before fail from then on.
//
// Mutating operations (counted, and the only crash points): Open with kCreate
// or kCreateTruncate, Write, Sync, Truncate, Rename, Delete, SyncDir,
// CreateDir. Reads, ListDir, FileSize and FileExists are not counted.
//
// Thread-safety: all methods, and the Files it returns, are thread-safe (one
// internal mutex).
#ifndef STRATA_KVSTORE_FAULT_INJECTION_ENV_H_
#define STRATA_KVSTORE_FAULT_INJECTION_ENV_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "kvstore/env.h"

namespace strata::kv {

class FaultInjectionEnv final : public Env {
 public:
  enum class OpKind { kCreate, kWrite, kSync, kTruncate, kRename, kDelete, kSyncDir, kCreateDir };

  // The unit a disk writes atomically, aligned to file offsets.
  static constexpr uint64_t kSectorBytes = 512;

  // One injected failure rule.
  struct Fault {
    OpKind op = OpKind::kWrite;
    // Matches when the operation's path (for Rename: either path) contains
    // this string; empty matches every path.
    std::string path_contains;
    // Number of matching operations let through before failing.
    int64_t skip = 0;
    // Number of failures; -1 fails forever.
    int64_t times = 1;
    absl::Status error = absl::ResourceExhaustedError("injected: no space left on device");
  };

  FaultInjectionEnv();
  ~FaultInjectionEnv() override;

  // Env.
  absl::StatusOr<std::unique_ptr<File>> Open(const std::string& path, OpenMode mode) override;
  absl::Status SyncDir(const std::string& dir) override;
  absl::Status Rename(const std::string& from, const std::string& to) override;
  absl::Status Delete(const std::string& path) override;
  absl::Status CreateDir(const std::string& dir) override;
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) override;
  absl::StatusOr<uint64_t> FileSize(const std::string& path) override;
  bool FileExists(const std::string& path) override;
  // Locks are kept in memory only (no file is created) and survive reboots.
  absl::StatusOr<std::unique_ptr<FileLock>> LockFile(const std::string& path) override;

  // (a) Failures.
  void AddFault(Fault fault);
  void ClearFaults();
  // Total bytes of all files; 0 means unlimited.
  void SetSpaceLimit(uint64_t bytes);

  // (b) Crash. n < 0 disarms.
  void CrashAtOperation(int64_t n);
  bool crashed() const;
  // Mutating operations performed since construction or the last reboot.
  int64_t operation_count() const;

  // (c) Power loss (each also reboots, see above).
  void DropUnsyncedData();
  void DropSomeUnsyncedData(uint64_t seed);

 private:
  class MemFile;
  struct Inode;
  // One change of a directory that reaches the disk whole: a create or
  // delete (one entry) or a rename within the directory (two entries).
  struct DirChange {
    // (full path, inode); a null inode removes the entry.
    std::vector<std::pair<std::string, std::shared_ptr<Inode>>> entries;
  };

  // Counts the operation and applies crash and fault rules.
  // REQUIRES: mu_ held.
  absl::Status BeginOp(OpKind op, const std::string& path, const std::string& path2 = "");
  absl::Status CheckAlive() const;
  void SetEntry(const std::string& path, std::shared_ptr<Inode> inode);
  uint64_t TotalBytes() const;
  void Reboot();

  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<Inode>> live_;     // GUARDED_BY(mu_)
  std::map<std::string, std::shared_ptr<Inode>> durable_;  // GUARDED_BY(mu_)
  std::map<std::string, std::vector<DirChange>> pending_dir_changes_;  // GUARDED_BY(mu_)
  std::set<std::string> dirs_;                             // GUARDED_BY(mu_)
  std::vector<Fault> faults_;                              // GUARDED_BY(mu_)
  uint64_t space_limit_ = 0;                               // GUARDED_BY(mu_)
  int64_t crash_at_ = -1;                                  // GUARDED_BY(mu_)
  int64_t op_count_ = 0;                                   // GUARDED_BY(mu_)
  bool crashed_ = false;                                   // GUARDED_BY(mu_)
  uint64_t generation_ = 0;                                // GUARDED_BY(mu_)
  std::set<std::string> locks_;                            // GUARDED_BY(mu_)
};

}  // namespace strata::kv

#endif  // STRATA_KVSTORE_FAULT_INJECTION_ENV_H_
