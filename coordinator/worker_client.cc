#include "coordinator/worker_client.h"

#include <chrono>

#include "grpcpp/grpcpp.h"
#include "strata/v1/worker.grpc.pb.h"

namespace strata::coordinator {
namespace {

void SetDeadline(grpc::ClientContext* ctx, absl::Duration timeout) {
  ctx->set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
}

absl::Status FromGrpc(const grpc::Status& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

class GrpcWorkerClient final : public WorkerClient {
 public:
  explicit GrpcWorkerClient(std::shared_ptr<grpc::ChannelCredentials> credentials)
      : credentials_(std::move(credentials)) {}

  absl::Status AssignLayers(const std::string& address, const v1::AssignLayersRequest& req, absl::Duration timeout,
                            v1::AssignLayersResponse* resp) override {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, timeout);
    return FromGrpc(WorkerStub(address)->AssignLayers(&ctx, req, resp));
  }
  absl::Status LoadSession(const std::string& address, const v1::LoadSessionRequest& req, absl::Duration timeout,
                           v1::LoadSessionResponse* resp) override {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, timeout);
    return FromGrpc(WorkerStub(address)->LoadSession(&ctx, req, resp));
  }
  absl::Status FreeSequences(const std::string& address, const v1::FreeSequencesRequest& req,
                             absl::Duration timeout) override {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, timeout);
    v1::FreeSequencesResponse resp;
    return FromGrpc(WorkerStub(address)->FreeSequences(&ctx, req, &resp));
  }
  absl::Status Stats(const std::string& address, absl::Duration timeout, v1::WorkerStatsResponse* resp) override {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, timeout);
    return FromGrpc(WorkerStub(address)->Stats(&ctx, v1::WorkerStatsRequest(), resp));
  }
  absl::StatusOr<std::unique_ptr<worker::StageStream>> DialStage(const std::string& address,
                                                                 absl::Duration connect_timeout) override {
    return worker::DialGrpcStage(address, credentials_, connect_timeout);
  }

 private:
  std::unique_ptr<v1::Worker::Stub> WorkerStub(const std::string& address) const {
    return v1::Worker::NewStub(worker::InternalChannel(address, credentials_));
  }

  const std::shared_ptr<grpc::ChannelCredentials> credentials_;
};

}  // namespace

std::unique_ptr<WorkerClient> NewGrpcWorkerClient(std::shared_ptr<grpc::ChannelCredentials> credentials) {
  return std::make_unique<GrpcWorkerClient>(std::move(credentials));
}

}  // namespace strata::coordinator
