// FakeWorkerClient: a WorkerClient (coordinator/worker_client.h) for tests.
// It records every call; AssignLayers answers OK unless told otherwise per
// address; LoadSession runs a handler the test sets; Execute streams are fake
// streams on a FakeStageNetwork (worker/testing/fake_stage_stream.h), one
// peer per dial, so a test sees the batches sent to stage 0 and answers them.
//
// Thread-safety: all methods may be called from any thread.
#ifndef STRATA_COORDINATOR_TESTING_FAKE_WORKER_CLIENT_H_
#define STRATA_COORDINATOR_TESTING_FAKE_WORKER_CLIENT_H_

#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "coordinator/worker_client.h"
#include "worker/testing/fake_stage_stream.h"

namespace strata::coordinator::testing {

class FakeWorkerClient final : public WorkerClient {
 public:
  using LoadFn = std::function<absl::Status(const std::string& address, const v1::LoadSessionRequest& req,
                                            v1::LoadSessionResponse* resp)>;
  template <typename Req>
  struct Call {
    std::string address;
    Req req;
  };

  absl::Status AssignLayers(const std::string& address, const v1::AssignLayersRequest& req, absl::Duration,
                            v1::AssignLayersResponse* resp) override {
    std::function<void(const std::string&)> hook;
    {
      std::lock_guard<std::mutex> l(mu_);
      hook = assign_hook_;
    }
    if (hook) hook(address);
    std::lock_guard<std::mutex> l(mu_);
    assigns_.push_back({address, req});
    cv_.notify_all();
    auto it = assign_status_.find(address);
    if (it != assign_status_.end() && !it->second.ok()) return it->second;
    resp->set_weight_bytes(1);
    return absl::OkStatus();
  }
  absl::Status LoadSession(const std::string& address, const v1::LoadSessionRequest& req, absl::Duration,
                           v1::LoadSessionResponse* resp) override {
    LoadFn fn;
    {
      std::lock_guard<std::mutex> l(mu_);
      loads_.push_back({address, req});
      fn = load_;
    }
    if (!fn) return absl::UnimplementedError("no LoadSession handler");
    return fn(address, req, resp);
  }
  absl::Status FreeSequences(const std::string& address, const v1::FreeSequencesRequest& req,
                             absl::Duration) override {
    std::lock_guard<std::mutex> l(mu_);
    frees_.push_back({address, req});
    return absl::OkStatus();
  }
  absl::Status Stats(const std::string& address, absl::Duration, v1::WorkerStatsResponse* resp) override {
    std::lock_guard<std::mutex> l(mu_);
    auto it = stats_.find(address);
    if (it == stats_.end()) return absl::UnavailableError("no answer");
    *resp = it->second;
    return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<worker::StageStream>> DialStage(const std::string& address,
                                                                 absl::Duration connect_timeout) override {
    return dialer_(address, connect_timeout);
  }

  // --- the test's side ---

  void SetAssignStatus(const std::string& address, absl::Status status) {
    std::lock_guard<std::mutex> l(mu_);
    assign_status_[address] = std::move(status);
  }
  // Runs at the start of every AssignLayers call (on the caller's thread).
  void SetAssignHook(std::function<void(const std::string& address)> hook) {
    std::lock_guard<std::mutex> l(mu_);
    assign_hook_ = std::move(hook);
  }
  void SetLoad(LoadFn fn) {
    std::lock_guard<std::mutex> l(mu_);
    load_ = std::move(fn);
  }
  void SetStats(const std::string& address, v1::WorkerStatsResponse stats) {
    std::lock_guard<std::mutex> l(mu_);
    stats_[address] = std::move(stats);
  }
  std::vector<Call<v1::AssignLayersRequest>> assigns() {
    std::lock_guard<std::mutex> l(mu_);
    return assigns_;
  }
  // Waits until `n` AssignLayers calls were made in all.
  bool WaitAssigns(size_t n) {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, worker::testing::kFakeWait, [&] { return assigns_.size() >= n; });
  }
  std::vector<Call<v1::LoadSessionRequest>> loads() {
    std::lock_guard<std::mutex> l(mu_);
    return loads_;
  }
  std::vector<Call<v1::FreeSequencesRequest>> frees() {
    std::lock_guard<std::mutex> l(mu_);
    return frees_;
  }
  worker::testing::FakeStageNetwork& network() { return network_; }

 private:
  worker::testing::FakeStageNetwork network_;
  const worker::StageDialer dialer_ = network_.Dialer();
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, absl::Status> assign_status_;
  std::map<std::string, v1::WorkerStatsResponse> stats_;
  LoadFn load_;
  std::function<void(const std::string&)> assign_hook_;
  std::vector<Call<v1::AssignLayersRequest>> assigns_;
  std::vector<Call<v1::LoadSessionRequest>> loads_;
  std::vector<Call<v1::FreeSequencesRequest>> frees_;
};

}  // namespace strata::coordinator::testing

#endif  // STRATA_COORDINATOR_TESTING_FAKE_WORKER_CLIENT_H_
