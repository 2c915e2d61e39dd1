// SessionTable: the coordinator's view of conversations (docs/service.md,
// "Sessions"). A session has the token ids its KV holds (every stage has the
// rows of all of them while it is resident), the token sampled last but not
// yet fed (a turn ends before feeding it), the complete-turn watermark, and
// whether a request is using it.
//
// Thread-safety: all methods are thread-safe (one internal mutex). Callers
// that need a consistent read-modify-write use Update().
#ifndef STRATA_COORDINATOR_SESSIONS_H_
#define STRATA_COORDINATOR_SESSIONS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace strata::coordinator {

struct SessionEntry {
  std::string id;
  uint64_t seq_id = 0;         // resident sequence on the stages; 0: not resident
  int64_t epoch = 0;           // pipeline epoch the resident sequence belongs to
  std::vector<int> tokens;     // ids whose rows the KV holds, in order
  // Ids of the conversation after `tokens` whose rows the stages do not hold
  // (a session loaded from the KV store with fewer records than the
  // coordinator knew); fed before `pending` by the next request.
  std::vector<int> unfed;
  std::optional<int> pending;  // sampled last, not yet fed
  // The pending token is the last record of the KV store (a session loaded
  // after its turn was cut off: the stages recompute that token's rows).
  bool pending_stored = false;
  int64_t turn_watermark = 0;  // tokens of complete turns
  bool busy = false;           // a request is generating on it
  bool persist = false;        // rows are appended to the KV store
  int64_t stored = 0;          // tokens known to be in the KV store
};

class SessionTable {
 public:
  std::optional<SessionEntry> Get(const std::string& id);
  // Runs fn on the entry (created when `create` and absent). Returns false
  // when the entry is absent and not created.
  bool Update(const std::string& id, bool create, const std::function<void(SessionEntry&)>& fn);
  bool Erase(const std::string& id);
  std::vector<SessionEntry> List(const std::string& prefix);
  // Marks every session not resident (the pipeline was re-placed).
  void DropResidency();
  int64_t resident();

 private:
  std::mutex mu_;
  std::map<std::string, SessionEntry> sessions_;  // guarded by mu_
};

}  // namespace strata::coordinator

#endif  // STRATA_COORDINATOR_SESSIONS_H_
