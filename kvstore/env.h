// Env: the small file-system interface that every byte the KV store persists
// goes through, so that tests can fail operations, crash at a chosen point and
// drop data that was not made durable (see kvstore/fault_injection_env.h).
//
// The durability model (what the protocols of docs/coli-kv.md rely on):
//   - data written with File::Write is durable once a later File::Sync on a
//     handle of the same file has returned OK;
//   - a created, renamed or deleted directory entry is durable once a later
//     Env::SyncDir of its directory has returned OK;
//   - Rename replaces the target atomically (POSIX rename(2)).
//
// Thread-safety: Env implementations are safe to call from any thread. A File
// may be used from several threads at once for Write/Read at disjoint offsets
// and for Sync (pwrite/pread/fdatasync semantics); Truncate and Close must not
// race with other calls on the same File.
#ifndef STRATA_KVSTORE_ENV_H_
#define STRATA_KVSTORE_ENV_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace strata::kv {

// An open file supporting positioned reads and writes.
class File {
 public:
  virtual ~File() = default;

  // Writes all of `data` at `offset` (extending the file if needed).
  virtual absl::Status Write(uint64_t offset, std::string_view data) = 0;

  // Reads up to `n` bytes at `offset` into `scratch`; returns the number of
  // bytes read, which is less than `n` only at the end of the file.
  // REQUIRES: scratch holds at least n bytes.
  virtual absl::StatusOr<size_t> Read(uint64_t offset, size_t n, char* scratch) = 0;

  // Makes every completed Write and Truncate of this file durable.
  virtual absl::Status Sync() = 0;

  // Sets the file's size (shrinking or extending with zeros).
  virtual absl::Status Truncate(uint64_t size) = 0;

  virtual absl::StatusOr<uint64_t> Size() = 0;

  // Releases the handle; later calls fail. The destructor closes too.
  virtual absl::Status Close() = 0;
};

// An exclusive lock on a path, held until destroyed.
class FileLock {
 public:
  virtual ~FileLock() = default;
};

enum class OpenMode {
  kRead,           // existing file, read only
  kReadWrite,      // existing file, read and write
  kCreate,         // read and write, created empty when missing
  kCreateTruncate  // read and write, created or emptied
};

class Env {
 public:
  virtual ~Env() = default;

  // NOT_FOUND when a kRead/kReadWrite file is missing.
  virtual absl::StatusOr<std::unique_ptr<File>> Open(const std::string& path, OpenMode mode) = 0;

  // fsync of the directory itself: makes its entries durable.
  virtual absl::Status SyncDir(const std::string& dir) = 0;

  // Atomically renames `from` to `to`, replacing `to` when it exists.
  virtual absl::Status Rename(const std::string& from, const std::string& to) = 0;

  // Removes a file. NOT_FOUND when it does not exist.
  virtual absl::Status Delete(const std::string& path) = 0;

  // Creates a directory (and its parents); OK when it exists.
  virtual absl::Status CreateDir(const std::string& dir) = 0;

  // Names (not paths) of the entries of `dir`, without "." and "..", sorted.
  virtual absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) = 0;

  // NOT_FOUND when missing.
  virtual absl::StatusOr<uint64_t> FileSize(const std::string& path) = 0;

  virtual bool FileExists(const std::string& path) = 0;

  // Takes an exclusive lock on `path` (creating the file when missing), so
  // that one process at a time owns a directory. FAILED_PRECONDITION when
  // another holder (in any process) has it.
  virtual absl::StatusOr<std::unique_ptr<FileLock>> LockFile(const std::string& path) = 0;

  // The process-wide POSIX implementation (never deleted).
  static Env* Default();
};

// Reads a whole file of at most `max_bytes` bytes; a larger file gives
// FAILED_PRECONDITION without allocating its size.
absl::StatusOr<std::string> ReadFileToString(Env* env, const std::string& path,
                                             uint64_t max_bytes);

// Writes `data` to `path` so that a crash leaves either the old file or the
// complete new one: write `path` + ".tmp", Sync, Rename over `path`, SyncDir.
absl::Status WriteFileAtomically(Env* env, const std::string& path, std::string_view data);

// The directory part of a path ("." when there is none).
std::string DirName(const std::string& path);
// Joins a directory and a name with one '/'.
std::string JoinPath(const std::string& dir, const std::string& name);

// Maps an errno value to a status: ENOENT NOT_FOUND, EEXIST ALREADY_EXISTS,
// ENOSPC/EDQUOT/EFBIG RESOURCE_EXHAUSTED, EACCES/EPERM/EROFS PERMISSION_DENIED,
// EINVAL INVALID_ARGUMENT, anything else INTERNAL. `what` names the operation
// and file.
absl::Status ErrnoStatus(int err, absl::string_view what);

}  // namespace strata::kv

#endif  // STRATA_KVSTORE_ENV_H_
