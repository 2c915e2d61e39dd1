// WorkerService: the strata.v1.Worker gRPC service (callback API) in front of
// a StageHost (docs/protocol.md, "Worker"). Each Execute stream is one
// ExecuteReactor: it reads messages, assembles batches and submits them; the
// results are written back one at a time (one write in flight).
//
// Thread-safety: gRPC calls the service from its threads; the StageHost is
// thread-safe. Readiness is published on the health service under
// "strata.v1.Worker" (NOT_SERVING until layers are loaded).
#ifndef STRATA_WORKER_WORKER_SERVICE_H_
#define STRATA_WORKER_WORKER_SERVICE_H_

#include <functional>
#include <memory>

#include "grpcpp/grpcpp.h"
#include "strata/v1/worker.grpc.pb.h"
#include "worker/stage_host.h"

namespace strata::worker {

class WorkerService final : public v1::Worker::CallbackService {
 public:
  // REQUIRES: `host` outlives the service. `on_ready_change` (may be empty)
  // is called after each AssignLayers with whether layers are loaded.
  WorkerService(StageHost* host, std::function<void(bool)> on_ready_change);

  grpc::ServerUnaryReactor* AssignLayers(grpc::CallbackServerContext* ctx, const v1::AssignLayersRequest* req,
                                         v1::AssignLayersResponse* resp) override;
  grpc::ServerBidiReactor<v1::StageMessage, v1::StageResult>* Execute(grpc::CallbackServerContext* ctx) override;
  grpc::ServerUnaryReactor* LoadSession(grpc::CallbackServerContext* ctx, const v1::LoadSessionRequest* req,
                                        v1::LoadSessionResponse* resp) override;
  grpc::ServerUnaryReactor* FreeSequences(grpc::CallbackServerContext* ctx, const v1::FreeSequencesRequest* req,
                                          v1::FreeSequencesResponse* resp) override;
  grpc::ServerUnaryReactor* Stats(grpc::CallbackServerContext* ctx, const v1::WorkerStatsRequest* req,
                                  v1::WorkerStatsResponse* resp) override;

 private:
  StageHost* const host_;
  std::function<void(bool)> on_ready_change_;
};

// absl::Status -> grpc::Status (same code, same message).
grpc::Status ToGrpc(const absl::Status& s);

}  // namespace strata::worker

#endif  // STRATA_WORKER_WORKER_SERVICE_H_
