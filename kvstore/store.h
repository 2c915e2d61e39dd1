// Store: the directory of sessions behind the `strata-kvstore` service. It
// validates session ids, creates, opens (lazily, cached), lists and deletes
// sessions, and runs the group-commit threads that call Session::Commit for
// every session with written data (docs/coli-kv.md, "The KV store"). A
// session is a v1/v2 file (Session) or a v3 file holding DeepSeek-V4 state
// (V3Session); the data file's magic says which.
//
// One process owns a directory at a time (a LOCK file). At open, leftovers
// of interrupted operations are removed: temporary `*.tmp` files and
// manifests whose data file is gone (an interrupted create or delete).
//
// Thread-safety: all methods are thread-safe.
#ifndef STRATA_KVSTORE_STORE_H_
#define STRATA_KVSTORE_STORE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kvstore/env.h"
#include "kvstore/session.h"
#include "kvstore/session_v3.h"

namespace strata::kv {

struct StoreOptions {
  // The directory holding the session files; created when missing.
  std::string dir;
  // Threads running group commits (each commit round of a session syncs its
  // file twice; several sessions commit in parallel). 0: none — the owner
  // calls CommitAll (deterministic tests).
  int commit_threads = 4;
  // Open sessions without writers or readers beyond this count are closed
  // (their file handles released); they reopen on the next access.
  size_t max_open_sessions = 256;
  // Recompute every manifest checksum when a session is opened.
  bool verify_checksums_on_open = true;
  // Records per checksummed chunk for new sessions.
  int32_t chunk_records = Manifest::kDefaultChunkRecords;
};

// One row of List.
struct SessionSummary {
  std::string id;
  int64_t nrec = 0;       // committed records per the header (0 when unreadable)
  uint64_t file_bytes = 0;
  absl::Status problem;   // why the header could not be read, if it could not
};

class Store {
 public:
  // Session ids: 1 to 128 characters of [A-Za-z0-9._-], starting with a
  // letter or digit (no path separators, no "..", no hidden files).
  static constexpr size_t kMaxSessionIdBytes = 128;
  // INVALID_ARGUMENT saying what is wrong.
  static absl::Status ValidateSessionId(std::string_view id);

  // FAILED_PRECONDITION when another process holds the directory.
  static absl::StatusOr<std::unique_ptr<Store>> Open(Env* env, const StoreOptions& options);

  // Stops the commit threads after a last commit round of every session.
  ~Store();

  // ALREADY_EXISTS, INVALID_ARGUMENT (id, dims, indexer layers, metadata).
  absl::StatusOr<std::shared_ptr<Session>> Create(const std::string& id, const SessionSpec& spec);

  // Opens (or returns the cached) session. NOT_FOUND when it does not
  // exist; FAILED_PRECONDITION for another model's fingerprint (when
  // `expected_fingerprint` is set) or a file without manifest; DATA_LOSS for
  // a damaged session; INVALID_ARGUMENT for a bad id.
  absl::StatusOr<std::shared_ptr<Session>> Get(const std::string& id,
                                               const std::optional<ModelIdentity>& expected_fingerprint = {});

  // A v3 (DeepSeek-V4) session; the codes of Create.
  absl::StatusOr<std::shared_ptr<V3Session>> CreateV3(const std::string& id, const V3SessionSpec& spec);

  // Either kind of session: exactly one member is set.
  struct AnySession {
    std::shared_ptr<Session> v2;
    std::shared_ptr<V3Session> v3;
  };
  // Opens (or returns the cached) session of either kind, with Get's codes.
  // (Get itself answers FAILED_PRECONDITION for a v3 session.)
  absl::StatusOr<AnySession> GetAny(const std::string& id,
                                    const std::optional<ModelIdentity>& expected_fingerprint = {});

  // Deletes a session's files (also a damaged session's). NOT_FOUND when
  // there is no such session; FAILED_PRECONDITION while writers are open.
  absl::Status Delete(const std::string& id);

  // Sessions whose id starts with `prefix` and sorts after `after`, at most
  // `limit` (0: no limit), in id order. *more tells whether others follow.
  absl::StatusOr<std::vector<SessionSummary>> List(const std::string& prefix,
                                                   const std::string& after, size_t limit,
                                                   bool* more);

  // Runs commit rounds until no session has uncommitted data (tests).
  void CommitAll();

  // Sessions open now (cached, with or without writers), for metrics.
  size_t OpenSessions();
  // Sessions stored in the directory (data files with a valid id), counted
  // from one directory listing without opening any.
  absl::StatusOr<size_t> StoredSessions();

  const StoreOptions& options() const { return options_; }

 private:
  Store(Env* env, StoreOptions options, std::unique_ptr<FileLock> lock);
  void Enqueue(std::function<void()> commit);
  void CommitLoop();
  void Attach(const std::shared_ptr<Session>& s);
  void AttachV3(const std::shared_ptr<V3Session>& s);
  void EvictIdleLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Env* const env_;
  const StoreOptions options_;
  std::unique_ptr<FileLock> lock_;

  // Guards the session cache. Held while a session is created, opened or
  // deleted (so that an id is never open twice), never during appends,
  // commits or loads.
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Session>> sessions_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<V3Session>> v3_sessions_ ABSL_GUARDED_BY(mu_);

  absl::Mutex queue_mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(queue_mu_);  // commit rounds
  bool stop_ ABSL_GUARDED_BY(queue_mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace strata::kv

#endif  // STRATA_KVSTORE_STORE_H_
