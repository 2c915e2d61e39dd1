// Fakes for the transport under a StageLink (worker/stage_link.h), for tests:
//
//   FakeStagePeer     the far end of one Execute stream: records what the
//                     link wrote, replies with results, ends the stream with a
//                     status, or makes writes fail;
//   FakeStageStream   the StageStream a link owns, talking to a peer;
//   FakeStageNetwork  a StageDialer that opens a fake stream per dial and
//                     keeps its peer, by address, or refuses an address.
//
// Waits use the real clock with generous deadlines (they return false when
// the deadline passes) and never sleep.
//
// Thread-safety: all methods may be called from any thread.
#ifndef STRATA_WORKER_TESTING_FAKE_STAGE_STREAM_H_
#define STRATA_WORKER_TESTING_FAKE_STAGE_STREAM_H_

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/stage_link.h"
#include "worker/stage_wire.h"

namespace strata::worker::testing {

inline constexpr auto kFakeWait = std::chrono::seconds(20);

class FakeStagePeer {
 public:
  // --- the test's side ---

  std::vector<v1::StageMessage> written() {
    std::lock_guard<std::mutex> l(mu_);
    return written_;
  }
  bool WaitWritten(size_t n) {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, kFakeWait, [&] { return written_.size() >= n; });
  }
  // The batches the written messages frame (BatchAssembler's error when they
  // do not), complete ones only.
  absl::StatusOr<std::vector<Batch>> Batches() {
    BatchAssembler a;
    std::vector<Batch> out;
    for (v1::StageMessage& m : written()) {
      absl::StatusOr<std::optional<Batch>> b = a.Add(std::move(m));
      if (!b.ok()) return b.status();
      if (b->has_value()) out.push_back(std::move(**b));
    }
    return out;
  }
  // Waits until `n` complete batches were written.
  bool WaitBatches(size_t n) {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, kFakeWait, [&] { return CompleteLocked() >= n; });
  }
  // Queues a result for the link's reader.
  void Reply(v1::StageResult result) {
    std::lock_guard<std::mutex> l(mu_);
    results_.push_back(std::move(result));
    cv_.notify_all();
  }
  // Ends the stream from this side: the reader gets the queued results, then
  // the end, and Finish() returns `status` (OK: closed cleanly).
  void End(absl::Status status) {
    std::lock_guard<std::mutex> l(mu_);
    if (ended_) return;
    ended_ = true;
    final_ = std::move(status);
    cv_.notify_all();
  }
  // Every later Write fails (a broken connection).
  void BreakWrites() {
    std::lock_guard<std::mutex> l(mu_);
    writes_broken_ = true;
  }
  bool cancelled() {
    std::lock_guard<std::mutex> l(mu_);
    return cancelled_;
  }
  bool WaitCancelled() {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, kFakeWait, [&] { return cancelled_; });
  }
  int write_attempts() {
    std::lock_guard<std::mutex> l(mu_);
    return write_attempts_;
  }

  // --- the stream's side (FakeStageStream) ---

  bool Write(const v1::StageMessage& msg) {
    {
      std::lock_guard<std::mutex> l(mu_);
      ++write_attempts_;
      if (writes_broken_ || ended_ || cancelled_) return false;
      written_.push_back(msg);
      cv_.notify_all();
    }
    std::this_thread::yield();  // like a network write: lets another writer in, if the caller allows one
    return true;
  }
  bool Read(v1::StageResult* result) {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return cancelled_ || ended_ || !results_.empty(); });
    if (cancelled_ || results_.empty()) return false;
    *result = std::move(results_.front());
    results_.pop_front();
    return true;
  }
  absl::Status Finish() {
    std::lock_guard<std::mutex> l(mu_);
    return ended_ ? final_ : absl::CancelledError("cancelled by the client");
  }
  void Cancel() {
    std::lock_guard<std::mutex> l(mu_);
    cancelled_ = true;
    cv_.notify_all();
  }

 private:
  size_t CompleteLocked() {
    size_t done = 0;
    int64_t rows_left = 0;  // floats still expected for the current batch
    for (const auto& m : written_) {
      if (m.has_batch()) {
        rows_left = static_cast<int64_t>(m.batch().total_rows()) * m.batch().hidden_size();
        if (rows_left == 0) ++done;
      } else if (m.has_hidden() && rows_left > 0) {
        rows_left -= static_cast<int64_t>(m.hidden().data().size() / sizeof(float));
        if (rows_left <= 0) ++done;
      }
    }
    return done;
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<v1::StageMessage> written_;
  std::deque<v1::StageResult> results_;
  bool ended_ = false;
  absl::Status final_;
  bool writes_broken_ = false;
  bool cancelled_ = false;
  int write_attempts_ = 0;
};

class FakeStageStream final : public StageStream {
 public:
  explicit FakeStageStream(std::shared_ptr<FakeStagePeer> peer) : peer_(std::move(peer)) {}
  bool Write(const v1::StageMessage& msg) override { return peer_->Write(msg); }
  bool Read(v1::StageResult* result) override { return peer_->Read(result); }
  absl::Status Finish() override { return peer_->Finish(); }
  void Cancel() override { peer_->Cancel(); }

 private:
  std::shared_ptr<FakeStagePeer> peer_;
};

class FakeStageNetwork {
 public:
  // REQUIRES: the network outlives every use of the dialer.
  StageDialer Dialer() {
    return [this](const std::string& address, absl::Duration) -> absl::StatusOr<std::unique_ptr<StageStream>> {
      std::lock_guard<std::mutex> l(mu_);
      ++dials_[address];
      cv_.notify_all();
      if (refused_.count(address)) return absl::UnavailableError("is not reachable");
      auto peer = std::make_shared<FakeStagePeer>();
      peers_[address].push_back(peer);
      return std::make_unique<FakeStageStream>(peer);
    };
  }
  void Refuse(const std::string& address, bool refuse = true) {
    std::lock_guard<std::mutex> l(mu_);
    if (refuse) {
      refused_[address] = true;
    } else {
      refused_.erase(address);
    }
  }
  int dials(const std::string& address) {
    std::lock_guard<std::mutex> l(mu_);
    return dials_.count(address) ? dials_[address] : 0;
  }
  // The `index`-th stream opened to `address` (waits for it; null after the
  // deadline).
  std::shared_ptr<FakeStagePeer> WaitPeer(const std::string& address, size_t index = 0) {
    std::unique_lock<std::mutex> l(mu_);
    if (!cv_.wait_for(l, kFakeWait, [&] { return peers_[address].size() > index; })) return nullptr;
    return peers_[address][index];
  }
  size_t streams(const std::string& address) {
    std::lock_guard<std::mutex> l(mu_);
    return peers_[address].size();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, bool> refused_;
  std::map<std::string, int> dials_;
  std::map<std::string, std::vector<std::shared_ptr<FakeStagePeer>>> peers_;
};

}  // namespace strata::worker::testing

#endif  // STRATA_WORKER_TESTING_FAKE_STAGE_STREAM_H_
