// The coordinator's gRPC services (callback API; docs/protocol.md):
//   strata.v1.Generation  — Generate (one GenerateReactor per stream), Abort,
//                           sessions, Stats: the public port, every call
//                           authenticated and limited by ApiAuth;
//   strata.v1.Coordinator — Register / Heartbeat for workers: the internal
//                           port only (docs/deploy.md, "Ports").
//
// Thread-safety: gRPC calls these from its threads; the Scheduler, Cluster
// and SessionTable they use are thread-safe.
#ifndef STRATA_COORDINATOR_GENERATION_SERVICE_H_
#define STRATA_COORDINATOR_GENERATION_SERVICE_H_

#include <atomic>
#include <functional>
#include <memory>
#include <random>

#include "coordinator/api_auth.h"
#include "coordinator/cluster.h"
#include "coordinator/request.h"
#include "coordinator/scheduler.h"
#include "coordinator/session_manager.h"
#include "coordinator/sessions.h"
#include "grpcpp/grpcpp.h"
#include "strata/v1/generation.grpc.pb.h"
#include "strata/v1/worker.grpc.pb.h"

namespace strata::coordinator {

class GenerationService final : public v1::Generation::CallbackService {
 public:
  // REQUIRES: every pointer outlives the service.
  GenerationService(const ModelContext* model, Scheduler* scheduler, Cluster* cluster, SessionManager* sessions,
                    ApiAuth* auth);
  // Waits (a few seconds at most) for calls still running on helper threads.
  ~GenerationService() override;
  // The same wait, for shutting down before the scheduler and the cluster go.
  void Drain();

  // Starts one generation for `caller` (authenticated, and holding its
  // stream slot): validates `req` (ParseRequest), loads or creates its
  // session when it needs one, and submits it to the scheduler. Everything
  // that follows reaches `sink`: chunks, the final message and exactly one
  // Close — also for a rejection (INVALID_ARGUMENT, RESOURCE_EXHAUSTED, ...),
  // which may come before Start returns. The gRPC Generate and the HTTP
  // gateway (coordinator/http) both start generations here, so the same
  // request and seed give the same tokens on either.
  void Start(const std::string& caller, const v1::GenerateRequest& req, std::shared_ptr<GenerateSink> sink,
             std::optional<absl::Time> deadline);
  // The caller of an `authorization` value (empty when absent), counted
  // against its request rate: UNAUTHENTICATED or RESOURCE_EXHAUSTED.
  absl::StatusOr<std::string> Authorize(absl::string_view authorization);
  ApiAuth* auth() const { return auth_; }
  Scheduler* scheduler() const { return scheduler_; }
  Cluster* cluster() const { return cluster_; }
  const ModelContext* model() const { return model_; }

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(grpc::CallbackServerContext* ctx,
                                                           const v1::GenerateRequest* req) override;
  grpc::ServerUnaryReactor* Abort(grpc::CallbackServerContext* ctx, const v1::AbortRequest* req,
                                  v1::AbortResponse* resp) override;
  grpc::ServerUnaryReactor* SaveSession(grpc::CallbackServerContext* ctx, const v1::SaveSessionRequest* req,
                                        v1::SessionState* resp) override;
  grpc::ServerUnaryReactor* ResumeSession(grpc::CallbackServerContext* ctx, const v1::ResumeSessionRequest* req,
                                          v1::SessionState* resp) override;
  grpc::ServerUnaryReactor* ListSessions(grpc::CallbackServerContext* ctx, const v1::ListSessionsRequest* req,
                                         v1::ListSessionsResponse* resp) override;
  grpc::ServerUnaryReactor* DeleteSession(grpc::CallbackServerContext* ctx, const v1::DeleteSessionRequest* req,
                                          v1::DeleteSessionResponse* resp) override;
  grpc::ServerUnaryReactor* Stats(grpc::CallbackServerContext* ctx, const v1::StatsRequest* req,
                                  v1::StatsResponse* resp) override;

 private:
  // The authenticated caller of ctx, admitted against its request rate;
  // UNAUTHENTICATED or RESOURCE_EXHAUSTED otherwise.
  absl::StatusOr<std::string> Caller(const grpc::CallbackServerContext* ctx);
  // Runs fn on a helper thread (calls that block on the KV store or the
  // stages must not hold a gRPC callback thread).
  void Detach(std::function<void()> fn);
  // scheduler_->Submit; a session reservation it does not take over is
  // released.
  absl::Status Submit(RequestSpec spec, std::shared_ptr<GenerateSink> sink, std::optional<absl::Time> deadline);

  const ModelContext* const model_;
  Scheduler* const scheduler_;
  Cluster* const cluster_;
  SessionManager* const sessions_;
  ApiAuth* const auth_;
  std::atomic<int> helpers_{0};
  std::mutex seed_mu_;
  std::mt19937_64 seeds_;  // guarded by seed_mu_
};

class CoordinatorService final : public v1::Coordinator::CallbackService {
 public:
  explicit CoordinatorService(Cluster* cluster) : cluster_(cluster) {}
  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* ctx, const v1::RegisterRequest* req,
                                     v1::RegisterResponse* resp) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx, const v1::HeartbeatRequest* req,
                                      v1::HeartbeatResponse* resp) override;

 private:
  Cluster* const cluster_;
};

}  // namespace strata::coordinator

#endif  // STRATA_COORDINATOR_GENERATION_SERVICE_H_
