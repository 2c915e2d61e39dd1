#include "coordinator/generation_service.h"

#include <deque>
#include <optional>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace strata::coordinator {
namespace {

// The value of the call's `authorization` metadata; empty when absent.
absl::string_view Authorization(const grpc::CallbackServerContext* ctx) {
  const auto& md = ctx->client_metadata();
  const auto it = md.find("authorization");
  return it == md.end() ? absl::string_view() : absl::string_view(it->second.data(), it->second.size());
}

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

// One Generate stream. The scheduler holds a shared Handle (a GenerateSink)
// that forwards to the reactor until the reactor is done; responses are
// written one at a time (the next from OnWriteDone) and Finish follows the
// last queued response. A failed write ends the request as cancelled.
class GenerateReactor final : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  class Handle final : public GenerateSink {
   public:
    explicit Handle(GenerateReactor* r) : reactor_(r) {}
    void Send(v1::GenerateResponse response) override {
      std::lock_guard<std::mutex> l(mu_);
      if (reactor_) reactor_->Enqueue(std::move(response));
    }
    void Close(const absl::Status& status) override {
      std::lock_guard<std::mutex> l(mu_);
      if (reactor_) reactor_->Close(ToGrpc(status));
    }
    void Detach() {
      std::lock_guard<std::mutex> l(mu_);
      reactor_ = nullptr;
    }

   private:
    std::mutex mu_;
    GenerateReactor* reactor_;  // guarded by mu_; null once done
  };

  explicit GenerateReactor(Scheduler* scheduler) : scheduler_(scheduler), handle_(std::make_shared<Handle>(this)) {}

  std::shared_ptr<Handle> handle() { return handle_; }
  // The caller's concurrent-stream slot, released when the stream ends.
  void Hold(ApiAuth::Slot slot) { slot_.emplace(std::move(slot)); }

  // Ends the RPC at once (before it was admitted).
  void Reject(const absl::Status& s) { Close(ToGrpc(s)); }

  void OnWriteDone(bool ok) override {
    bool finish = false, start = false;
    grpc::Status status;
    {
      std::lock_guard<std::mutex> l(mu_);
      out_.pop_front();
      if (!ok) {
        out_.clear();
        if (!closed_) {
          closed_ = true;
          close_status_ = grpc::Status(grpc::StatusCode::CANCELLED, "the client stopped reading");
          client_gone_ = true;
        }
      }
      start = !out_.empty();
      if (!start && closed_ && !finished_) {
        finished_ = true;
        finish = true;
        status = close_status_;
      }
    }
    if (client_gone_) scheduler_->Cancel(handle_.get());
    if (start) StartWrite(&out_.front());
    if (finish) End(status);
  }

  void OnCancel() override { scheduler_->Cancel(handle_.get()); }

  void OnDone() override {
    handle_->Detach();
    delete this;
  }

 private:
  void Enqueue(v1::GenerateResponse r) {
    bool start = false;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (closed_) return;
      out_.push_back(std::move(r));
      start = out_.size() == 1;
    }
    if (start) StartWrite(&out_.front());
  }

  void Close(grpc::Status status) {
    bool finish = false;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (closed_) return;
      closed_ = true;
      close_status_ = std::move(status);
      if (out_.empty()) {
        finished_ = true;
        finish = true;
      }
    }
    if (finish) End(close_status_);
  }

  // The generation is over: the caller's slot goes back before the client
  // sees the status, so a caller at its limit may start the next one as soon
  // as this one has ended (called once: finished_ is set under mu_ first).
  void End(const grpc::Status& status) {
    slot_.reset();
    Finish(status);
  }

  Scheduler* const scheduler_;
  std::shared_ptr<Handle> handle_;
  std::optional<ApiAuth::Slot> slot_;
  std::mutex mu_;
  std::deque<v1::GenerateResponse> out_;  // front is being written
  bool closed_ = false;
  bool finished_ = false;
  bool client_gone_ = false;
  grpc::Status close_status_;
};

}  // namespace

GenerationService::GenerationService(const ModelContext* model, Scheduler* scheduler, Cluster* cluster,
                                     SessionManager* sessions, ApiAuth* auth)
    : model_(model),
      scheduler_(scheduler),
      cluster_(cluster),
      sessions_(sessions),
      auth_(auth),
      seeds_(std::random_device{}()) {}

absl::StatusOr<std::string> GenerationService::Caller(const grpc::CallbackServerContext* ctx) {
  return Authorize(Authorization(ctx));
}

absl::StatusOr<std::string> GenerationService::Authorize(absl::string_view authorization) {
  absl::StatusOr<std::string> caller = auth_->Authenticate(authorization);
  if (!caller.ok()) return caller.status();
  if (absl::Status st = auth_->Admit(*caller); !st.ok()) return st;
  return caller;
}

GenerationService::~GenerationService() { Drain(); }

void GenerationService::Drain() {
  for (int i = 0; i < 500 && helpers_.load() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

void GenerationService::Detach(std::function<void()> fn) {
  ++helpers_;
  std::thread([this, fn = std::move(fn)] {
    fn();
    --helpers_;
  }).detach();
}

grpc::ServerWriteReactor<v1::GenerateResponse>* GenerationService::Generate(grpc::CallbackServerContext* ctx,
                                                                          const v1::GenerateRequest* req) {
  auto* reactor = new GenerateReactor(scheduler_);
  absl::StatusOr<std::string> caller = auth_->Authenticate(Authorization(ctx));
  if (!caller.ok()) {
    reactor->Reject(caller.status());
    return reactor;
  }
  absl::StatusOr<ApiAuth::Slot> slot = auth_->AdmitStream(*caller);
  if (!slot.ok()) {
    reactor->Reject(slot.status());
    return reactor;
  }
  reactor->Hold(std::move(*slot));
  std::optional<absl::Time> deadline;
  const auto d = ctx->deadline();
  if (d < std::chrono::system_clock::now() + std::chrono::hours(24 * 365)) deadline = absl::FromChrono(d);
  Start(*caller, *req, reactor->handle(), deadline);
  return reactor;
}

void GenerationService::Start(const std::string& caller, const v1::GenerateRequest& req,
                              std::shared_ptr<GenerateSink> sink, std::optional<absl::Time> deadline) {
  uint64_t seed;
  {
    std::lock_guard<std::mutex> l(seed_mu_);
    seed = seeds_() >> 1;
  }
  // Requests refused before admission (the scheduler logs the admitted ones).
  auto rejected = [caller, request_id = req.request_id(), session_id = req.session_id()](const absl::Status& st) {
    log::Info("request_rejected", {{"request_id", request_id}, {"session_id", session_id}, {"caller", caller},
                                   {"code", absl::StatusCodeToString(st.code())}, {"error", st.message()}});
  };
  absl::StatusOr<RequestSpec> spec = ParseRequest(req, *model_, seed);
  if (!spec.ok()) {
    rejected(spec.status());
    sink->Close(spec.status());
    return;
  }
  spec->owner = caller;
  if (!sessions_->persistent()) spec->persist = false;
  if (sessions_->NeedsPrepare(*spec)) {
    // A stored session is loaded onto the stages (or created) first.
    Detach([this, sink, spec = std::move(*spec), deadline, rejected]() mutable {
      absl::Status st = sessions_->Prepare(&spec);
      if (st.ok()) st = Submit(std::move(spec), sink, deadline);
      if (!st.ok()) {
        rejected(st);
        sink->Close(st);
      }
    });
    return;
  }
  sessions_->ReserveResident(&*spec);
  if (absl::Status st = Submit(std::move(*spec), sink, deadline); !st.ok()) {
    rejected(st);
    sink->Close(st);
  }
}

absl::Status GenerationService::Submit(RequestSpec spec, std::shared_ptr<GenerateSink> sink,
                                       std::optional<absl::Time> deadline) {
  const bool reserved = spec.session_reserved;
  const std::string id = spec.session_id;
  absl::Status st = scheduler_->Submit(std::move(spec), std::move(sink), deadline);
  if (!st.ok() && reserved) sessions_->Release(id);  // the reservation did not pass to the scheduler
  return st;
}

grpc::ServerUnaryReactor* GenerationService::Abort(grpc::CallbackServerContext* ctx, const v1::AbortRequest* req,
                                                   v1::AbortResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  absl::StatusOr<std::string> caller = Caller(ctx);
  if (!caller.ok()) {
    reactor->Finish(ToGrpc(caller.status()));
    return reactor;
  }
  if (req->request_id().empty()) {
    reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "request_id is empty"));
    return reactor;
  }
  resp->set_found(scheduler_->Abort(req->request_id(), *caller));
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* GenerationService::SaveSession(grpc::CallbackServerContext* ctx,
                                                         const v1::SaveSessionRequest* req, v1::SessionState* resp) {
  auto* reactor = ctx->DefaultReactor();
  if (absl::StatusOr<std::string> caller = Caller(ctx); !caller.ok()) {
    reactor->Finish(ToGrpc(caller.status()));
    return reactor;
  }
  absl::Time deadline = absl::InfiniteFuture();
  if (ctx->deadline() < std::chrono::system_clock::now() + std::chrono::hours(24 * 365)) {
    deadline = absl::FromChrono(ctx->deadline());
  }
  Detach([this, reactor, req, resp, deadline] {
    absl::StatusOr<v1::SessionState> s = sessions_->Save(req->session_id(), deadline);
    if (s.ok()) *resp = std::move(*s);
    reactor->Finish(ToGrpc(s.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* GenerationService::ResumeSession(grpc::CallbackServerContext* ctx,
                                                           const v1::ResumeSessionRequest* req,
                                                           v1::SessionState* resp) {
  auto* reactor = ctx->DefaultReactor();
  if (absl::StatusOr<std::string> caller = Caller(ctx); !caller.ok()) {
    reactor->Finish(ToGrpc(caller.status()));
    return reactor;
  }
  Detach([this, reactor, req, resp] {
    absl::StatusOr<v1::SessionState> s = sessions_->Resume(req->session_id());
    if (s.ok()) *resp = std::move(*s);
    reactor->Finish(ToGrpc(s.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* GenerationService::ListSessions(grpc::CallbackServerContext* ctx,
                                                          const v1::ListSessionsRequest* req,
                                                          v1::ListSessionsResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  if (absl::StatusOr<std::string> caller = Caller(ctx); !caller.ok()) {
    reactor->Finish(ToGrpc(caller.status()));
    return reactor;
  }
  Detach([this, reactor, req, resp] {
    absl::StatusOr<std::vector<v1::SessionState>> list = sessions_->List(req->prefix());
    if (list.ok()) {
      for (auto& s : *list) *resp->add_sessions() = std::move(s);
    }
    reactor->Finish(ToGrpc(list.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* GenerationService::DeleteSession(grpc::CallbackServerContext* ctx,
                                                           const v1::DeleteSessionRequest* req,
                                                           v1::DeleteSessionResponse*) {
  auto* reactor = ctx->DefaultReactor();
  if (absl::StatusOr<std::string> caller = Caller(ctx); !caller.ok()) {
    reactor->Finish(ToGrpc(caller.status()));
    return reactor;
  }
  Detach([this, reactor, req] { reactor->Finish(ToGrpc(sessions_->Delete(req->session_id()))); });
  return reactor;
}

grpc::ServerUnaryReactor* GenerationService::Stats(grpc::CallbackServerContext* ctx, const v1::StatsRequest*,
                                                   v1::StatsResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  if (absl::StatusOr<std::string> caller = Caller(ctx); !caller.ok()) {
    reactor->Finish(ToGrpc(caller.status()));
    return reactor;
  }
  // Asking the workers takes a round trip each: off the gRPC thread.
  Detach([this, reactor, resp] {
    SchedulerStats s = scheduler_->Stats();
    resp->set_ready(cluster_->ready());
    resp->set_epoch(cluster_->epoch());
    resp->set_active_requests(s.running);
    resp->set_queued_requests(s.queued);
    resp->set_completed_requests(s.completed);
    resp->set_generated_tokens(s.generated_tokens);
    resp->set_resident_sessions(s.resident_sessions);
    resp->set_model(model_->model_dir);
    for (auto& st : cluster_->StageStats()) *resp->add_stages() = std::move(st);
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::Register(grpc::CallbackServerContext* ctx,
                                                       const v1::RegisterRequest* req, v1::RegisterResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  if (absl::Status st = ValidateRegistration(*req); !st.ok()) {
    reactor->Finish(ToGrpc(st));
    return reactor;
  }
  *resp = cluster_->Register(*req);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::Heartbeat(grpc::CallbackServerContext* ctx,
                                                        const v1::HeartbeatRequest* req, v1::HeartbeatResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  *resp = cluster_->Heartbeat(*req);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace strata::coordinator
