// SessionManager: sessions that outlive the processes serving them
// (docs/service.md, "Persistence"). It joins the coordinator's SessionTable
// with the KV store (coordinator/kv_client.h) and the stages:
//
//   - Prepare (before a Generate with a session id is submitted) creates a
//     new persistent session in the store, or makes a stored, non-resident
//     one resident: every stage loads the session's rows for its layers
//     from the store (Worker.LoadSession) — no recomputation — and the
//     coordinator learns the session's token ids. Works after a worker
//     failure, a whole-cluster restart and under another placement.
//   - Save waits until every token the stages hold is committed in the store
//     and writes the complete-turn watermark and the pending token to the
//     manifest; a background finaliser does the same after every turn.
//   - Resume, List and Delete go through the store.
//
// Without a store (no --kvstore) sessions live in the coordinator's memory
// only and these calls keep the in-memory behaviour.
//
// The pending token (sampled last, not fed) is kept in the session's
// manifest metadata as "strata.pending" = "POSITION:TOKEN"; it is used only
// when POSITION equals the stored record count. Otherwise (a turn cut off by
// a crash) the last stored token is fed again: the stages load one record
// fewer and recompute the last token's rows (bit-identical; the stages do not
// send them again) to sample the continuation.
//
// Thread-safety: all public methods are thread-safe; they block on RPCs and
// must not run on a gRPC callback thread. OnTurnEnd only queues.
#ifndef STRATA_COORDINATOR_SESSION_MANAGER_H_
#define STRATA_COORDINATOR_SESSION_MANAGER_H_

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/cluster.h"
#include "coordinator/kv_client.h"
#include "coordinator/request.h"
#include "coordinator/scheduler.h"
#include "coordinator/sessions.h"
#include "strata/v1/generation.pb.h"

namespace strata::coordinator {

struct SessionManagerOptions {
  // Save waits at most this long for the stages' rows to be committed.
  absl::Duration save_timeout = absl::Seconds(60);
  // Truncate and delete wait this long for append streams still draining.
  absl::Duration writers_wait = absl::Seconds(10);
  // Deadline of each stage's LoadSession.
  absl::Duration load_timeout = absl::Seconds(300);
  // A turn's watermark is dropped when its rows are not committed by then.
  absl::Duration finalize_timeout = absl::Seconds(120);
};

inline constexpr char kPendingKey[] = "strata.pending";

class SessionManager {
 public:
  // `store` may be null (no persistence). REQUIRES: the other pointers
  // outlive the manager.
  SessionManager(SessionManagerOptions options, SessionTable* sessions, Scheduler* scheduler, Cluster* cluster,
                 std::unique_ptr<KvSessionClient> store);
  ~SessionManager();

  bool persistent() const { return store_ != nullptr; }

  // True when Prepare(spec) may call the store (so it must run off the
  // gRPC threads); false when it returns at once.
  bool NeedsPrepare(const RequestSpec& spec);

  // Readies the session of `spec` for Submit (see the top of this file).
  // When it returns OK with spec->session_reserved set, the session is marked
  // busy for this request: Submit takes it over; if Submit fails the caller
  // calls Release. Errors: FAILED_PRECONDITION (a request is running on the
  // session, another model's session), NOT_FOUND (continue_turn of an
  // unknown session), UNAVAILABLE (store or stage unreachable), DATA_LOSS.
  absl::Status Prepare(RequestSpec* spec);
  // For a request that needs no Prepare: marks a resident persistent
  // session busy (spec->session_reserved) so that a Delete cannot remove it,
  // and the store's copy, between now and Submit. The caller calls Release if
  // Submit then fails.
  void ReserveResident(RequestSpec* spec);
  void Release(const std::string& session_id);

  absl::StatusOr<v1::SessionState> Save(const std::string& id, absl::Time deadline);
  absl::StatusOr<v1::SessionState> Resume(const std::string& id);
  absl::StatusOr<std::vector<v1::SessionState>> List(const std::string& prefix);
  absl::Status Delete(const std::string& id);

  // From the scheduler (its lock held): queue the turn's watermark.
  void OnTurnEnd(const TurnEnd& turn);

 private:
  enum class Outcome { kReady, kReserved };
  // Reserves and, when needed, restores session `id` (see Prepare).
  // REQUIRES: a store.
  absl::StatusOr<Outcome> Acquire(const std::string& id, bool create, bool must_exist);
  // Loads a stored session onto every stage. REQUIRES: reserved.
  // Logs session_load (docs/logging.md) around LoadOntoStagesImpl.
  absl::Status LoadOntoStages(const std::string& id, const std::optional<SessionEntry>& memory,
                              const v1::SessionInfo& info);
  absl::Status LoadOntoStagesImpl(const std::string& id, const std::optional<SessionEntry>& memory,
                                  const v1::SessionInfo& info, int64_t* loaded);
  absl::StatusOr<v1::SessionState> SaveImpl(const std::string& id, absl::Time deadline);
  absl::Status DeleteImpl(const std::string& id);
  void FreeOnStages(uint64_t seq_id, const std::vector<Cluster::StageView>& stages);
  // Writes the watermark and pending token once `turn.tokens` are committed;
  // returns false while they are not.
  absl::StatusOr<bool> Finalize(const TurnEnd& turn);
  void FinalizerLoop();
  v1::SessionState StateOf(const SessionEntry& s) const;

  const SessionManagerOptions options_;
  SessionTable* const sessions_;
  Scheduler* const scheduler_;
  Cluster* const cluster_;
  const std::unique_ptr<KvSessionClient> store_;

  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  struct Queued {
    TurnEnd turn;
    absl::Time since;
  };
  std::map<std::string, Queued> finalize_;  // guarded by mu_: latest turn per session
  std::thread finalizer_;
};

}  // namespace strata::coordinator

#endif  // STRATA_COORDINATOR_SESSION_MANAGER_H_
