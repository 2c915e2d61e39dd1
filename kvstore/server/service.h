// KvStoreService: the gRPC `strata.v1.KVStore` service over a Store (callback
// API). Unary calls run inline on the gRPC callback threads (each is a few
// file operations); Append and Load are one reactor per stream
// (kvstore/server/reactors.h). Semantics: proto/strata/v1/kvstore.proto and
// docs/coli-kv.md ("The KV store service").
//
// Thread-safety: gRPC calls the methods from its threads; the service keeps
// no mutable state of its own (the Store is thread-safe).
#ifndef STRATA_KVSTORE_SERVER_SERVICE_H_
#define STRATA_KVSTORE_SERVER_SERVICE_H_

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "grpcpp/grpcpp.h"
#include "kvstore/server/kv_metrics.h"
#include "kvstore/session.h"
#include "kvstore/store.h"
#include "strata/v1/kvstore.grpc.pb.h"

namespace strata::kv {

struct ServiceOptions {
  // Default upper bound of the rows in one LoadChunk.
  int64_t load_chunk_bytes = int64_t{1} << 20;
};

class KvStoreService final : public strata::v1::KVStore::CallbackService {
 public:
  // Every RPC is counted in metrics->Rpc (and Append's and Load's bytes and
  // write latency in their series).
  // REQUIRES: store and metrics outlive the service and every RPC it started.
  KvStoreService(Store* store, ServiceOptions options, KvStoreMetrics* metrics)
      : store_(store), options_(options), metrics_(metrics) {}

  grpc::ServerUnaryReactor* CreateSession(grpc::CallbackServerContext* ctx,
                                          const strata::v1::CreateSessionRequest* req,
                                          strata::v1::SessionInfo* resp) override;
  grpc::ServerBidiReactor<strata::v1::AppendRequest, strata::v1::AppendResponse>* Append(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerUnaryReactor* Truncate(grpc::CallbackServerContext* ctx,
                                     const strata::v1::TruncateRequest* req,
                                     strata::v1::TruncateResponse* resp) override;
  grpc::ServerWriteReactor<strata::v1::LoadChunk>* Load(grpc::CallbackServerContext* ctx,
                                                        const strata::v1::LoadRequest* req) override;
  grpc::ServerUnaryReactor* Stat(grpc::CallbackServerContext* ctx,
                                 const strata::v1::StatRequest* req,
                                 strata::v1::SessionInfo* resp) override;
  grpc::ServerUnaryReactor* List(grpc::CallbackServerContext* ctx,
                                 const strata::v1::ListRequest* req,
                                 strata::v1::ListResponse* resp) override;
  grpc::ServerUnaryReactor* Delete(grpc::CallbackServerContext* ctx,
                                   const strata::v1::DeleteRequest* req,
                                   strata::v1::DeleteResponse* resp) override;
  grpc::ServerUnaryReactor* UpdateSession(grpc::CallbackServerContext* ctx,
                                          const strata::v1::UpdateSessionRequest* req,
                                          strata::v1::SessionInfo* resp) override;

 private:
  Store* const store_;
  const ServiceOptions options_;
  KvStoreMetrics* const metrics_;
};

// Logs a failed RPC (rpc_failed; not OK, NOT_FOUND, ALREADY_EXISTS or
// CANCELLED, which are answers, not failures).
void LogRpcFailure(std::string_view method, const grpc::Status& status);

// absl status → gRPC status (the codes are the same numbers).
grpc::Status ToGrpc(const absl::Status& s);

// Fills a SessionInfo message.
void FillSessionInfo(const SessionInfo& info, strata::v1::SessionInfo* out);
void FillSessionInfo(const V3SessionInfo& info, strata::v1::SessionInfo* out);
// The v3 header of a V4Layout (validated by the caller) and back.
V3Header FromProto(const strata::v1::V4Layout& l);
void ToProto(const V3Header& h, strata::v1::V4Layout* out);

}  // namespace strata::kv

#endif  // STRATA_KVSTORE_SERVER_SERVICE_H_
