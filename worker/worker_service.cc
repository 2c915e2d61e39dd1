#include "worker/worker_service.h"

#include <deque>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "worker/stage_wire.h"

namespace strata::worker {

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

namespace {

// One Execute stream. Reads are always outstanding until the upstream
// half-closes or the stream fails; results are queued and written one at a
// time. The reactor finishes once reading has ended and the queue is empty
// (or at once on a failed write or a bad message), and deletes itself in
// OnDone. The Sink outlives it: results for a finished stream are dropped.
class ExecuteReactor final : public grpc::ServerBidiReactor<v1::StageMessage, v1::StageResult> {
 public:
  class Sink final : public ResultSink {
   public:
    explicit Sink(ExecuteReactor* r) : reactor_(r) {}
    void Send(v1::StageResult result) override {
      std::lock_guard<std::mutex> l(mu_);
      if (reactor_ == nullptr) return;
      reactor_->Enqueue(std::move(result));
    }
    void Detach() {
      std::lock_guard<std::mutex> l(mu_);
      reactor_ = nullptr;
    }

   private:
    std::mutex mu_;
    ExecuteReactor* reactor_;  // guarded by mu_; null once the reactor is done
  };

  explicit ExecuteReactor(StageHost* host) : host_(host), sink_(std::make_shared<Sink>(this)) {
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      MaybeFinish(grpc::Status::OK, /*reading_ended=*/true);
      return;
    }
    auto r = assembler_.Add(std::move(in_));
    in_.Clear();
    if (!r.ok()) {
      MaybeFinish(ToGrpc(r.status()), true, /*now=*/true);
      return;
    }
    if (r->has_value()) host_->Submit(std::move(**r), sink_);
    StartRead(&in_);
  }

  void OnWriteDone(bool ok) override {
    bool start = false;
    {
      std::lock_guard<std::mutex> l(mu_);
      out_.pop_front();
      if (!ok) {
        write_failed_ = true;
        out_.clear();
      }
      start = !out_.empty() && !finish_called_;
    }
    if (!ok) {
      MaybeFinish(grpc::Status(grpc::StatusCode::CANCELLED, "the upstream went away"), false, true);
      return;
    }
    if (start) {
      StartWrite(&out_.front());
    } else {
      MaybeFinish(grpc::Status::OK, false);
    }
  }

  void OnCancel() override {}

  void OnDone() override {
    sink_->Detach();
    delete this;
  }

 private:
  // Called with sink_->mu_ held (from Sink::Send): appends and starts a write
  // when none is in flight.
  void Enqueue(v1::StageResult result) {
    bool start = false;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (finish_called_ || write_failed_) return;
      out_.push_back(std::move(result));
      start = out_.size() == 1;
    }
    if (start) StartWrite(&out_.front());
  }

  void MaybeFinish(grpc::Status status, bool reading_ended, bool now = false) {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (reading_ended) reading_ended_ = true;
      if (finish_called_) return;
      if (!now && !(reading_ended_ && out_.empty())) return;
      if (now && !out_.empty() && !write_failed_) {
        // A write is in flight: finish from OnWriteDone.
        pending_status_ = status;
        reading_ended_ = true;
        out_.resize(1);
        return;
      }
      if (!pending_status_.ok()) status = pending_status_;
      finish_called_ = true;
    }
    Finish(status);
  }

  StageHost* const host_;
  std::shared_ptr<Sink> sink_;
  BatchAssembler assembler_;  // reader only
  v1::StageMessage in_;       // reader only

  std::mutex mu_;
  std::deque<v1::StageResult> out_;  // front is being written
  bool reading_ended_ = false;
  bool finish_called_ = false;
  bool write_failed_ = false;
  grpc::Status pending_status_;
};

}  // namespace

WorkerService::WorkerService(StageHost* host, std::function<void(bool)> on_ready_change)
    : host_(host), on_ready_change_(std::move(on_ready_change)) {}

grpc::ServerUnaryReactor* WorkerService::AssignLayers(grpc::CallbackServerContext* ctx,
                                                      const v1::AssignLayersRequest* req,
                                                      v1::AssignLayersResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  if (on_ready_change_) on_ready_change_(false);
  // Loading weights takes a while: do it off the gRPC thread.
  std::thread([this, reactor, req, resp] {
    absl::Status st = host_->Assign(*req, resp);
    if (on_ready_change_) on_ready_change_(host_->ready());
    reactor->Finish(ToGrpc(st));
  }).detach();
  return reactor;
}

grpc::ServerBidiReactor<v1::StageMessage, v1::StageResult>* WorkerService::Execute(grpc::CallbackServerContext*) {
  return new ExecuteReactor(host_);
}

grpc::ServerUnaryReactor* WorkerService::LoadSession(grpc::CallbackServerContext* ctx,
                                                     const v1::LoadSessionRequest* req,
                                                     v1::LoadSessionResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  std::thread([this, reactor, req, resp] { reactor->Finish(ToGrpc(host_->LoadSession(*req, resp))); }).detach();
  return reactor;
}

grpc::ServerUnaryReactor* WorkerService::FreeSequences(grpc::CallbackServerContext* ctx,
                                                       const v1::FreeSequencesRequest* req,
                                                       v1::FreeSequencesResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  std::vector<uint64_t> ids(req->seq_ids().begin(), req->seq_ids().end());
  resp->set_freed(host_->Free(ids, req->all()));
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* WorkerService::Stats(grpc::CallbackServerContext* ctx, const v1::WorkerStatsRequest*,
                                               v1::WorkerStatsResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  *resp = host_->Stats();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace strata::worker
