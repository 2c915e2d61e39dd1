// V3Session: one open DeepSeek-V4 session of the KV store — its `.coli_kv`
// v3 file (kvstore/coli_kv3_file.h), its v3 manifest (kvstore/manifest_v3.h)
// and the streams writing it (docs/coli-kv.md, "V4 sessions in the KV
// store").
//
// Several writers (one per pipeline stage) each own a disjoint layer range.
// After each step a writer sends the positions of the step with their token
// ids, its layers' parts of the token records of the positions that are live
// at the step's end, and its layers' block records closed by the step. A v3
// token record holds every layer and is written once, so the parts wait in
// memory until every layer range has sent the positions up to a common
// point; a commit round (Commit, run by the store's commit threads: group
// commit) then seals the records of that point and appends them with the
// file's own protocol (records, sync, commit record, sync), and tells every
// writer's CommitListener. A token is acknowledged once the commit passed
// it. Stages run the same batches, so their steps end at the same positions
// and a commit point is a step end of every range.
//
// A failed append fails the session: every listener gets OnFailed, every
// later call returns that status, and the store reopens it from disk once
// its writers are gone.
//
// Thread-safety: all methods are thread-safe. Write calls for one writer must
// not overlap; listeners are called from commit threads without any
// V3Session lock held.
#ifndef STRATA_KVSTORE_SESSION_V3_H_
#define STRATA_KVSTORE_SESSION_V3_H_

#include <cstdint>
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
#include "kvstore/coli_kv3_file.h"
#include "kvstore/env.h"
#include "kvstore/manifest_v3.h"
#include "kvstore/session.h"

namespace strata::kv {

struct V3SessionSpec {
  V3Header header;
  uint64_t fingerprint = 0;
  std::optional<uint64_t> model_digest;
  std::map<std::string, std::string> metadata;
};

struct V3SessionInfo {
  std::string id;
  V3Header header;
  int64_t nrec = 0;  // committed tokens T
  uint64_t file_bytes = 0;
  V3Manifest manifest;
  std::vector<LayerRange> writers;
};

// The committed state of a layer range, as a stage loads it.
struct V3RangeState {
  int64_t nrec = 0;                // T
  int64_t first = 0;               // first live position: T − min(T, N)
  std::vector<int32_t> tokens;     // token ids of [first, T)
  std::string slices;              // the range's parts of those token records
  std::string blocks;              // the range's block records, in log order
};

class V3Session {
 public:
  // Creates the manifest (atomically) and then the data file (atomically,
  // empty). ALREADY_EXISTS when the data file exists; INVALID_ARGUMENT for a
  // bad header or metadata.
  static absl::StatusOr<std::unique_ptr<V3Session>> Create(Env* env, const std::string& dir, const std::string& id,
                                                           const V3SessionSpec& spec);
  // Opens an existing v3 session: the data file's errors (NOT_FOUND,
  // DATA_LOSS); FAILED_PRECONDITION without a manifest; DATA_LOSS for a
  // manifest of another file or a watermark beyond T.
  static absl::StatusOr<std::unique_ptr<V3Session>> Open(Env* env, const std::string& dir, const std::string& id);

  ~V3Session();

  void SetCommitRequester(std::function<void()> request);

  const std::string& id() const { return id_; }
  const V3Header& header() const { return layout_.header(); }
  const V3Layout& layout() const { return layout_; }
  int64_t nrec() const;
  absl::Status health() const;
  bool idle() const;
  bool NeedsCommit() const;

  // As Session::CheckFingerprint.
  absl::Status CheckFingerprint(const std::optional<ModelIdentity>& expected);

  // Registers a writer of layers [begin, end). It continues at the smallest
  // position its layers have been sent to, or restarts at `start` (in
  // [nrec, that position]; parts from there on are dropped and sent again).
  // grant.slice_bytes: bytes of the range's part of one token record.
  //   INVALID_ARGUMENT bad range; FAILED_PRECONDITION an overlapping writer;
  //   OUT_OF_RANGE bad start.
  absl::StatusOr<Session::WriterGrant> OpenWriter(int32_t begin, int32_t end, std::optional<int64_t> start,
                                                  std::shared_ptr<CommitListener> listener);

  // One step of the writer: tokens at [position, position + n); `slices`
  // holds the range's parts of the token records of the last min(n, N)
  // positions; `blocks` the sealed block records of the range's layers that
  // close in (position, position + n], in log order.
  //   OUT_OF_RANGE position not the writer's next, or past 2^31 − 1;
  //   INVALID_ARGUMENT no tokens, wrong sizes, a token id outside the vocab
  //   or differing from another range's, a block record that is not sealed
  //   or not the one the log order puts there;
  //   FAILED_PRECONDITION unknown or busy writer; the failure status.
  absl::Status Write(int64_t writer_id, int64_t position, std::span<const int32_t> tokens, std::string_view slices,
                     std::string_view blocks);

  // Everything the writer sent is committed, or no other writer is open and
  // another range has not sent that far (nothing more can arrive to complete
  // the records: they wait in memory, unacknowledged).
  bool WriterDurable(int64_t writer_id) const;
  // Unregisters a writer (what it sent still commits once the other ranges
  // catch up) and wakes the others' listeners with OnCommitted(nrec), since
  // WriterDurable may have changed for them.
  void CloseWriter(int64_t writer_id);

  // One group-commit round; returns nrec.
  absl::StatusOr<int64_t> Commit();

  // A v3 file keeps no earlier state: n == nrec drops the parts waiting
  // beyond it (FAILED_PRECONDITION while writers are open); anything else is
  // FAILED_PRECONDITION (delete the session and prefill again).
  absl::Status Truncate(int64_t n);

  // As Session::Update.
  absl::Status Update(std::optional<int64_t> turn_watermark, const std::map<std::string, std::string>& set,
                      const std::vector<std::string>& remove);

  // The committed state of layers [begin, end). INVALID_ARGUMENT bad range;
  // the reader's DATA_LOSS.
  absl::Status Read(int32_t begin, int32_t end, V3RangeState* out) const;

  V3SessionInfo Info() const;
  absl::Status DeleteFiles();

 private:
  struct Writer {
    int32_t begin = 0, end = 0;
    int64_t next = 0;
    bool busy = false;
    std::shared_ptr<CommitListener> listener;
  };
  // A position waiting for its commit: the token id and the parts received.
  struct Pending {
    int32_t token = 0;
    std::string parts;            // slice_bytes(0, L), zero until sent
    std::vector<bool> have;       // per layer
  };

  V3Session(Env* env, std::string dir, std::string id, std::unique_ptr<ColiKv3Writer> file, V3Manifest manifest);
  void Fail(const absl::Status& s) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status UsableLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t CommittableLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status WriteManifestLocked(const V3Manifest& m) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Env* const env_;
  const std::string dir_;
  const std::string id_;
  const std::string data_path_;
  const std::string manifest_path_;
  const V3Layout layout_;

  // Serialises Commit, Update, Truncate and DeleteFiles; taken before mu_.
  mutable absl::Mutex commit_mu_;
  mutable absl::Mutex mu_ ABSL_ACQUIRED_AFTER(commit_mu_);

  std::function<void()> request_commit_;
  std::unique_ptr<ColiKv3Writer> file_ ABSL_GUARDED_BY(commit_mu_);
  V3Manifest manifest_ ABSL_GUARDED_BY(mu_);
  std::optional<uint64_t> fingerprint_upgrade_ ABSL_GUARDED_BY(mu_);
  int64_t nrec_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t file_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<int64_t> sent_ ABSL_GUARDED_BY(mu_);  // per layer: positions below have been sent
  std::map<int64_t, Pending> pending_ ABSL_GUARDED_BY(mu_);                 // positions >= nrec_
  std::map<std::pair<int, int32_t>, std::string> blocks_ ABSL_GUARDED_BY(mu_);  // (layer, block)
  std::map<int64_t, Writer> writers_ ABSL_GUARDED_BY(mu_);
  int64_t next_writer_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool commit_requested_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status failed_ ABSL_GUARDED_BY(mu_);
  bool deleted_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace strata::kv

#endif  // STRATA_KVSTORE_SESSION_V3_H_
