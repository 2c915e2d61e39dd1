// WorkerClient: the coordinator's calls to its workers' strata.v1.Worker
// service (docs/protocol.md) — AssignLayers, LoadSession, FreeSequences,
// Stats, and the Execute stream to stage 0. NewGrpcWorkerClient() is the
// real one; tests hand the cluster a fake instead.
//
// Every call names the worker's address and a deadline; an error keeps the
// worker's (or the transport's) status code and message.
//
// Thread-safety: implementations are thread-safe.
#ifndef STRATA_COORDINATOR_WORKER_CLIENT_H_
#define STRATA_COORDINATOR_WORKER_CLIENT_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/security/credentials.h"
#include "strata/v1/worker.pb.h"
#include "worker/stage_link.h"

namespace strata::coordinator {

class WorkerClient {
 public:
  virtual ~WorkerClient() = default;
  virtual absl::Status AssignLayers(const std::string& address, const v1::AssignLayersRequest& req,
                                    absl::Duration timeout, v1::AssignLayersResponse* resp) = 0;
  virtual absl::Status LoadSession(const std::string& address, const v1::LoadSessionRequest& req,
                                   absl::Duration timeout, v1::LoadSessionResponse* resp) = 0;
  virtual absl::Status FreeSequences(const std::string& address, const v1::FreeSequencesRequest& req,
                                     absl::Duration timeout) = 0;
  virtual absl::Status Stats(const std::string& address, absl::Duration timeout, v1::WorkerStatsResponse* resp) = 0;
  // Opens an Execute stream (a worker::StageDialer).
  virtual absl::StatusOr<std::unique_ptr<worker::StageStream>> DialStage(const std::string& address,
                                                                         absl::Duration connect_timeout) = 0;
};

// gRPC, one channel per call with worker::InternalChannelArgs() and the
// cluster's credentials (common/cluster_security.h).
std::unique_ptr<WorkerClient> NewGrpcWorkerClient(std::shared_ptr<grpc::ChannelCredentials> credentials);

}  // namespace strata::coordinator

#endif  // STRATA_COORDINATOR_WORKER_CLIENT_H_
