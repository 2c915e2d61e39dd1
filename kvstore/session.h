// Session: one open session of the KV store — its `.coli_kv` data file, its
// manifest, and the commit state of the streams writing it.
//
// Several writers (one per pipeline stage) each own a disjoint layer range
// and append rows at consecutive positions; rows are written in place at
// their offsets as they arrive. A commit round (Commit, run by the store's
// commit threads: group commit) syncs everything written so far, then
// advances nrec to the longest prefix of positions whose every layer is
// durable, writes it and syncs again (docs/coli-kv.md, "Protocols"), then
// tells every writer's CommitListener. A token is acknowledged once nrec has
// passed it.
//
// A failed sync or nrec write fails the session: every listener gets
// OnFailed, every later call returns that status, and the store reopens the
// session from disk once its writers are gone.
//
// Thread-safety: all methods are thread-safe. Write calls for one writer must
// not overlap (each writer is one stream); different writers may write
// concurrently. Listeners are called from commit threads without any
// Session lock held.
#ifndef STRATA_KVSTORE_SESSION_H_
#define STRATA_KVSTORE_SESSION_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kvstore/coli_kv_file.h"
#include "kvstore/env.h"
#include "kvstore/manifest.h"

namespace strata::kv {

// What a new session is created with.
struct SessionSpec {
  Dims dims;
  // Slot → layer map (Manifest::indexer_layers); empty means
  // DefaultIndexerLayers(dims).
  std::vector<int32_t> indexer_layers;
  uint64_t fingerprint = 0;
  std::optional<uint64_t> model_digest;  // Manifest::model_digest
  std::map<std::string, std::string> metadata;
  // Records per checksummed chunk; 0: the store's choice
  // (StoreOptions::chunk_records, else Manifest::kDefaultChunkRecords).
  int32_t chunk_records = 0;
};

struct SessionOptions {
  // Recompute every manifest chunk checksum when the session is opened.
  bool verify_checksums = true;
};

// Receives the outcome of group commits for one writer.
class CommitListener {
 public:
  virtual ~CommitListener() = default;
  // After each commit round that synced data: the committed record count.
  virtual void OnCommitted(int64_t nrec) = 0;
  // Once, when the session failed (the writer must stop).
  virtual void OnFailed(const absl::Status& status) = 0;
};

struct LayerRange {
  int32_t begin = 0;
  int32_t end = 0;
};

// A snapshot of a session's state.
struct SessionInfo {
  std::string id;
  Version version = Version::kV2;
  int64_t nrec = 0;
  uint64_t file_bytes = 0;
  Manifest manifest;
  std::vector<LayerRange> writers;
};

class Session {
 public:
  // The data file of session `id` in `dir`: `<dir>/<id>.coli_kv`.
  static std::string DataPath(const std::string& dir, const std::string& id);

  // Creates the manifest (atomically) and then the data file (atomically,
  // empty). ALREADY_EXISTS when the data file exists; INVALID_ARGUMENT for bad
  // dims, indexer layers or metadata.
  static absl::StatusOr<std::unique_ptr<Session>> Create(Env* env, const std::string& dir,
                                                         const std::string& id,
                                                         const SessionSpec& spec);

  // Opens an existing session with OpenCheckedSession's checks and codes.
  static absl::StatusOr<std::unique_ptr<Session>> Open(Env* env, const std::string& dir,
                                                       const std::string& id,
                                                       const SessionOptions& options);

  ~Session();

  // Called (without locks held) when written data awaits a commit round;
  // set once, before any writer opens.
  void SetCommitRequester(std::function<void()> request);

  const std::string& id() const { return id_; }
  const Dims& dims() const { return dims_; }
  int64_t nrec() const;
  // OK, or the status that failed the session.
  absl::Status health() const;
  // No writer is open.
  bool idle() const;
  // Written data is not yet covered by a commit round.
  bool NeedsCommit() const;

  // FAILED_PRECONDITION when `expected` is set and the session's fingerprint
  // is not its value of the same version (CheckModelIdentity). A session
  // whose manifest records a version-1 fingerprint that matches has its
  // manifest upgraded to expected->fingerprint by the next manifest write.
  absl::Status CheckFingerprint(const std::optional<ModelIdentity>& expected);

  // Bytes of the rows of one token for layers [begin, end): the v2 rows of
  // those layers followed by the f32 keys of the indexer slots whose layer is
  // in the range. REQUIRES: 0 <= begin < end <= n_layers.
  int64_t SliceBytes(int32_t begin, int32_t end) const;

  struct WriterGrant {
    int64_t writer_id = 0;
    int64_t nrec = 0;           // committed records now
    int64_t next_position = 0;  // the first position this writer must send
    int64_t slice_bytes = 0;    // bytes per token (SliceBytes)
  };

  // Registers a writer of layers [begin, end). It continues at the smallest
  // position its layers have been written to, or restarts at `start` (which
  // must be in [nrec, that position]; rows from there on are rewritten). A
  // v1 session is upgraded to v2 first.
  //   INVALID_ARGUMENT     bad range;
  //   FAILED_PRECONDITION  another open writer has an overlapping range;
  //   OUT_OF_RANGE         bad start.
  absl::StatusOr<WriterGrant> OpenWriter(int32_t begin, int32_t end, std::optional<int64_t> start,
                                         std::shared_ptr<CommitListener> listener);

  // Writes the rows of tokens at [position, position + tokens.size()) in
  // place. `rows` holds tokens.size() slices (SliceBytes) back to back.
  //   OUT_OF_RANGE         position is not the writer's next position, or past
  //                        2^31 - 1 records;
  //   INVALID_ARGUMENT     no tokens, rows of the wrong size, a token id
  //                        outside [0, vocab), or a token id that differs from
  //                        the one another layer range wrote at that position;
  //   FAILED_PRECONDITION  unknown writer or a write already running for it;
  //   RESOURCE_EXHAUSTED   the disk or quota is full (nothing is advanced);
  //   the session's failure status once it failed.
  absl::Status Write(int64_t writer_id, int64_t position, std::span<const int32_t> tokens,
                     std::string_view rows);

  // Every row the writer wrote has been synced.
  bool WriterDurable(int64_t writer_id) const;

  // Unregisters a writer; its written rows still commit once the other layer
  // ranges catch up. After it returns its listener is not called again.
  void CloseWriter(int64_t writer_id);

  // One group-commit round; returns nrec. Called by the store's commit
  // threads (and by tests).
  absl::StatusOr<int64_t> Commit();

  // Drops every record from n on (manifest first, then the data file).
  // FAILED_PRECONDITION while writers are open; OUT_OF_RANGE unless
  // 0 <= n <= nrec.
  absl::Status Truncate(int64_t n);

  // Sets the turn watermark (OUT_OF_RANGE beyond nrec) and metadata (set,
  // then remove keys) and replaces the manifest. INVALID_ARGUMENT when the
  // metadata breaks the manifest's limits.
  absl::Status Update(std::optional<int64_t> turn_watermark,
                      const std::map<std::string, std::string>& set,
                      const std::vector<std::string>& remove);

  // Reads committed records [first, first + count), sanitised, as token ids
  // and slices of layers [begin, end) (layout of SliceBytes).
  //   INVALID_ARGUMENT bad layer range; OUT_OF_RANGE beyond nrec;
  //   ABORTED the session was truncated or deleted during the read.
  absl::Status Read(int64_t first, int64_t count, int32_t begin, int32_t end,
                    std::vector<int32_t>* tokens, std::string* rows) const;

  SessionInfo Info() const;

  // Deletes the data file and then the manifest, syncing the directory
  // after each. FAILED_PRECONDITION while writers are open. The session is
  // unusable afterwards.
  absl::Status DeleteFiles();

 private:
  struct Writer {
    int32_t begin = 0, end = 0;           // layers
    int32_t slot_begin = 0, slot_end = 0;  // indexer slots
    int64_t next = 0;
    bool busy = false;
    std::shared_ptr<CommitListener> listener;
  };

  Session(Env* env, std::string dir, std::string id, std::unique_ptr<ColiKvWriter> file,
          Manifest manifest);

  void Fail(const absl::Status& s) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status UsableLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TrimTokensLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status UpgradeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(commit_mu_);
  // Brings the manifest's checksums up to nrec when a chunk completed or,
  // with no writer left, when records after the last chunk are uncovered.
  void CatchUpManifest() ABSL_EXCLUSIVE_LOCKS_REQUIRED(commit_mu_);
  // The manifest a write replaces manifest_ with (a pending fingerprint
  // upgrade applied), and the bookkeeping once it is written.
  Manifest ManifestToWriteLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetManifestLocked(Manifest m) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // CoverRecords over the first nrec records of `file` (a v2 file).
  absl::Status CoverManifest(const ColiKvWriter& file, int64_t nrec, Manifest* m) const;
  std::pair<int32_t, int32_t> Slots(int32_t begin, int32_t end) const;

  Env* const env_;
  const std::string dir_;
  const std::string id_;
  const std::string data_path_;
  const std::string manifest_path_;
  const Dims dims_;
  const RecordLayout layout_;  // v2: what writers write

  // Serialises the slow file-level operations: Commit, Truncate, Update,
  // the v1 upgrade and DeleteFiles. Taken before mu_.
  absl::Mutex commit_mu_;
  mutable absl::Mutex mu_ ABSL_ACQUIRED_AFTER(commit_mu_);

  std::function<void()> request_commit_;
  std::shared_ptr<ColiKvWriter> file_ ABSL_GUARDED_BY(mu_);
  Manifest manifest_ ABSL_GUARDED_BY(mu_);
  // The current-version fingerprint a version-1 manifest is upgraded to.
  std::optional<uint64_t> fingerprint_upgrade_ ABSL_GUARDED_BY(mu_);
  int64_t nrec_ ABSL_GUARDED_BY(mu_);
  // Per layer: positions below written_ have rows written (the write
  // returned); below durable_ also synced. low_[l] is the lowest written_[l]
  // since the current commit round's snapshot (a restarted writer lowers it).
  std::vector<int64_t> written_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> durable_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> low_ ABSL_GUARDED_BY(mu_);
  // Token ids of positions [nrec_, nrec_ + size) as written by any writer.
  std::deque<int32_t> pending_tokens_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, Writer> writers_ ABSL_GUARDED_BY(mu_);
  int64_t next_writer_id_ ABSL_GUARDED_BY(mu_) = 1;
  int inflight_writes_ ABSL_GUARDED_BY(mu_) = 0;
  bool commit_requested_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t unsynced_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status failed_ ABSL_GUARDED_BY(mu_);
  bool deleted_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;  // bumped by Truncate and DeleteFiles
};

}  // namespace strata::kv

#endif  // STRATA_KVSTORE_SESSION_H_
