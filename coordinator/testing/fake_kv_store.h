// FakeKvStore: an in-memory KV store for tests of the coordinator's session
// bookkeeping — a KvSessionClient (coordinator/kv_client.h) whose store calls
// are overridden. Sessions hold committed token ids (one per record), a turn
// watermark and metadata; any call can be made to fail; Stat calls and
// Updates are counted per session and can be waited for. CheckCompatible is
// the real one (fingerprint and dimensions against the client's shape).
//
// Thread-safety: all methods may be called from any thread.
#ifndef STRATA_COORDINATOR_TESTING_FAKE_KV_STORE_H_
#define STRATA_COORDINATOR_TESTING_FAKE_KV_STORE_H_

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/kv_client.h"

namespace strata::coordinator::testing {

inline constexpr auto kStoreWait = std::chrono::seconds(20);

class FakeKvStore final : public KvSessionClient {
 public:
  // `address` only names the store in messages; the base class's channel is
  // never used.
  FakeKvStore(std::string address, KvSessionShape shape) : KvSessionClient(std::move(address), std::move(shape)) {}

  absl::StatusOr<v1::SessionInfo> Create(const std::string& id) override {
    std::lock_guard<std::mutex> l(mu_);
    ++creates_;
    if (auto f = FailureLocked("Create"); !f.ok()) return f;
    if (sessions_.count(id)) return absl::AlreadyExistsError(id);
    Stored& s = sessions_[id];
    s.fingerprint = shape().fingerprint;
    return InfoLocked(id);
  }
  absl::StatusOr<v1::SessionInfo> Stat(const std::string& id) override {
    std::lock_guard<std::mutex> l(mu_);
    absl::StatusOr<v1::SessionInfo> out = absl::NotFoundError(absl::StrCat("session '", id, "' not found"));
    if (auto f = FailureLocked("Stat"); !f.ok()) {
      out = f;
    } else if (sessions_.count(id)) {
      out = InfoLocked(id);
    }
    ++stats_[id];  // counted after the answer was made
    cv_.notify_all();
    return out;
  }
  absl::StatusOr<v1::SessionInfo> Update(const std::string& id, std::optional<int64_t> watermark,
                                         const std::map<std::string, std::string>& set,
                                         const std::vector<std::string>& remove) override {
    std::lock_guard<std::mutex> l(mu_);
    if (auto f = FailureLocked("Update"); !f.ok()) return f;
    if (!sessions_.count(id)) return absl::NotFoundError(id);
    Stored& s = sessions_[id];
    ++s.updates;
    if (watermark) s.watermark = *watermark;
    for (const auto& [k, v] : set) s.metadata[k] = v;
    for (const auto& k : remove) s.metadata.erase(k);
    cv_.notify_all();
    return InfoLocked(id);
  }
  absl::Status Truncate(const std::string& id, int64_t nrec, absl::Duration) override {
    std::lock_guard<std::mutex> l(mu_);
    truncates_.emplace_back(id, nrec);
    if (auto f = FailureLocked("Truncate"); !f.ok()) return f;
    if (!sessions_.count(id)) return absl::NotFoundError(id);
    auto& t = sessions_[id].tokens;
    if (static_cast<int64_t>(t.size()) > nrec) t.resize(nrec);
    return absl::OkStatus();
  }
  absl::Status Delete(const std::string& id, absl::Duration) override {
    std::lock_guard<std::mutex> l(mu_);
    if (auto f = FailureLocked("Delete"); !f.ok()) return f;
    if (sessions_.erase(id) == 0) return absl::NotFoundError(id);
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<v1::SessionSummary>> List(const std::string& prefix) override {
    std::lock_guard<std::mutex> l(mu_);
    if (auto f = FailureLocked("List"); !f.ok()) return f;
    std::vector<v1::SessionSummary> out;
    for (const auto& [id, s] : sessions_) {
      if (id.rfind(prefix, 0) != 0) continue;
      v1::SessionSummary x;
      x.set_session_id(id);
      x.set_nrec(static_cast<int64_t>(s.tokens.size()));
      x.set_problem(s.problem);
      out.push_back(x);
    }
    return out;
  }
  absl::StatusOr<std::vector<int>> TokenIds(const std::string& id, int64_t begin, int64_t end) override {
    std::lock_guard<std::mutex> l(mu_);
    if (!sessions_.count(id)) return absl::NotFoundError(id);
    const auto& t = sessions_[id].tokens;
    if (begin < 0 || end > static_cast<int64_t>(t.size())) return absl::OutOfRangeError("records");
    return std::vector<int>(t.begin() + begin, t.begin() + end);
  }

  // --- the test's side ---

  // Stores a session (another model's when `fingerprint` differs from the
  // client's shape).
  void Put(const std::string& id, std::vector<int> tokens, int64_t watermark = 0,
           std::map<std::string, std::string> metadata = {}, std::optional<uint64_t> fingerprint = std::nullopt) {
    std::lock_guard<std::mutex> l(mu_);
    Stored& s = sessions_[id];
    s.tokens = std::move(tokens);
    s.watermark = watermark;
    s.metadata = std::move(metadata);
    s.fingerprint = fingerprint.value_or(shape().fingerprint);
  }
  // Rows of more tokens committed (by the workers' appenders).
  void Commit(const std::string& id, const std::vector<int>& tokens) {
    std::lock_guard<std::mutex> l(mu_);
    auto& t = sessions_[id].tokens;
    t.insert(t.end(), tokens.begin(), tokens.end());
  }
  void SetProblem(const std::string& id, std::string problem) {
    std::lock_guard<std::mutex> l(mu_);
    sessions_[id].problem = std::move(problem);
  }
  void Fail(const std::string& method, absl::Status status) {
    std::lock_guard<std::mutex> l(mu_);
    failures_[method] = std::move(status);
  }
  bool Has(const std::string& id) {
    std::lock_guard<std::mutex> l(mu_);
    return sessions_.count(id) > 0;
  }
  std::vector<int> Tokens(const std::string& id) {
    std::lock_guard<std::mutex> l(mu_);
    return sessions_[id].tokens;
  }
  int64_t Watermark(const std::string& id) {
    std::lock_guard<std::mutex> l(mu_);
    return sessions_[id].watermark;
  }
  std::map<std::string, std::string> Metadata(const std::string& id) {
    std::lock_guard<std::mutex> l(mu_);
    return sessions_[id].metadata;
  }
  int Updates(const std::string& id) {
    std::lock_guard<std::mutex> l(mu_);
    return sessions_.count(id) ? sessions_[id].updates : 0;
  }
  int creates() {
    std::lock_guard<std::mutex> l(mu_);
    return creates_;
  }
  std::vector<std::pair<std::string, int64_t>> truncates() {
    std::lock_guard<std::mutex> l(mu_);
    return truncates_;
  }
  bool WaitStats(const std::string& id, int n) {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, kStoreWait, [&] { return stats_[id] >= n; });
  }
  bool WaitUpdates(const std::string& id, int n) {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, kStoreWait, [&] { return sessions_.count(id) && sessions_[id].updates >= n; });
  }

 private:
  struct Stored {
    std::vector<int> tokens;  // committed records
    int64_t watermark = 0;
    std::map<std::string, std::string> metadata;
    uint64_t fingerprint = 0;
    std::string problem;
    int updates = 0;
  };
  absl::Status FailureLocked(const std::string& method) {
    auto it = failures_.find(method);
    return it == failures_.end() ? absl::OkStatus() : it->second;
  }
  v1::SessionInfo InfoLocked(const std::string& id) {
    const Stored& s = sessions_[id];
    v1::SessionInfo info;
    info.set_session_id(id);
    *info.mutable_dims() = shape().dims;
    info.set_fingerprint(s.fingerprint);
    info.set_nrec(static_cast<int64_t>(s.tokens.size()));
    info.set_turn_watermark(s.watermark);
    for (const auto& [k, v] : s.metadata) (*info.mutable_metadata())[k] = v;
    return info;
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Stored> sessions_;
  std::map<std::string, absl::Status> failures_;
  std::map<std::string, int> stats_;
  std::vector<std::pair<std::string, int64_t>> truncates_;
  int creates_ = 0;
};

}  // namespace strata::coordinator::testing

#endif  // STRATA_COORDINATOR_TESTING_FAKE_KV_STORE_H_
