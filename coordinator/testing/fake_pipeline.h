// Fakes for the scheduler's two interfaces (coordinator/scheduler.h), for
// tests:
//
//   FakeSink      a GenerateSink that records the responses and the status it
//                 is closed with (counting closes and sends after the close);
//   FakePipeline  a Pipeline that records every batch; it can fail sends, or
//                 hold the sending thread inside Send until released.
//
// Waits use the real clock with generous deadlines and never sleep.
//
// Thread-safety: all methods may be called from any thread.
#ifndef STRATA_COORDINATOR_TESTING_FAKE_PIPELINE_H_
#define STRATA_COORDINATOR_TESTING_FAKE_PIPELINE_H_

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "coordinator/scheduler.h"

namespace strata::coordinator::testing {

inline constexpr auto kFakeWait = std::chrono::seconds(20);

class FakeSink final : public GenerateSink {
 public:
  void Send(v1::GenerateResponse response) override {
    std::lock_guard<std::mutex> l(mu_);
    if (closes_ > 0) {
      ++sends_after_close_;
      return;
    }
    responses_.push_back(std::move(response));
    cv_.notify_all();
  }
  void Close(const absl::Status& status) override {
    std::lock_guard<std::mutex> l(mu_);
    if (closes_++ == 0) status_ = status;
    cv_.notify_all();
  }

  bool WaitClosed() {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, kFakeWait, [&] { return closes_ > 0; });
  }
  bool closed() {
    std::lock_guard<std::mutex> l(mu_);
    return closes_ > 0;
  }
  int closes() {
    std::lock_guard<std::mutex> l(mu_);
    return closes_;
  }
  int sends_after_close() {
    std::lock_guard<std::mutex> l(mu_);
    return sends_after_close_;
  }
  absl::Status status() {
    std::lock_guard<std::mutex> l(mu_);
    return status_;
  }
  std::vector<int> tokens() {
    std::lock_guard<std::mutex> l(mu_);
    std::vector<int> out;
    for (const auto& r : responses_) {
      for (const auto& t : r.chunk().tokens()) out.push_back(t.id());
    }
    return out;
  }
  std::string text() {
    std::lock_guard<std::mutex> l(mu_);
    std::string out;
    for (const auto& r : responses_) out += r.chunk().text();
    return out;
  }
  int finals() {
    std::lock_guard<std::mutex> l(mu_);
    return static_cast<int>(std::count_if(responses_.begin(), responses_.end(),
                                          [](const v1::GenerateResponse& r) { return r.has_final(); }));
  }
  // The final message (the last response), or an empty one.
  v1::GenerateFinal final_msg() {
    std::lock_guard<std::mutex> l(mu_);
    return !responses_.empty() && responses_.back().has_final() ? responses_.back().final() : v1::GenerateFinal();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<v1::GenerateResponse> responses_;
  int closes_ = 0;
  int sends_after_close_ = 0;
  absl::Status status_;
};

// Records every batch. Hold() makes Send block (after recording the batch)
// until Release(): the scheduler thread then waits there while the test
// answers several batches, so that the next batches are formed from one state.
class FakePipeline final : public Pipeline {
 public:
  absl::Status Send(const v1::StageBatch& batch) override {
    std::unique_lock<std::mutex> l(mu_);
    sent_.push_back(batch);
    cv_.notify_all();
    cv_.wait(l, [&] { return !held_; });
    return fail_;
  }

  void Hold() {
    std::lock_guard<std::mutex> l(mu_);
    held_ = true;
  }
  void Release() {
    std::lock_guard<std::mutex> l(mu_);
    held_ = false;
    cv_.notify_all();
  }
  void FailSends(absl::Status s) {
    std::lock_guard<std::mutex> l(mu_);
    fail_ = std::move(s);
  }
  bool WaitUntil(const std::function<bool(const std::vector<v1::StageBatch>&)>& pred) {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, kFakeWait, [&] { return pred(sent_); });
  }
  bool WaitSent(size_t n) {
    return WaitUntil([n](const std::vector<v1::StageBatch>& s) { return s.size() >= n; });
  }
  std::vector<v1::StageBatch> sent() {
    std::lock_guard<std::mutex> l(mu_);
    return sent_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<v1::StageBatch> sent_;
  bool held_ = false;
  absl::Status fail_;
};

}  // namespace strata::coordinator::testing

#endif  // STRATA_COORDINATOR_TESTING_FAKE_PIPELINE_H_
