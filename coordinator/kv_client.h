// KvSessionClient: the coordinator's synchronous client of strata-kvstore
// (proto/strata/v1/kvstore.proto) for session bookkeeping — create, stat,
// watermark and metadata updates, truncate, delete, list, and reading token
// ids. The rows themselves travel between the workers and the store
// (worker/kv_persist.h), never through the coordinator.
//
// Every call has a deadline; errors keep the store's status code and name
// the store's address and the session.
//
// The store calls are virtual so that tests can substitute an in-memory store
// (coordinator/session_manager_test.cc); CheckCompatible is not.
//
// Thread-safety: all methods are thread-safe (one gRPC stub).
#ifndef STRATA_COORDINATOR_KV_CLIENT_H_
#define STRATA_COORDINATOR_KV_CLIENT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/security/credentials.h"
#include "model/config.h"
#include "strata/v1/kvstore.grpc.pb.h"

namespace strata::coordinator {

// What a session of this model looks like in the store.
struct KvSessionShape {
  v1::KvDims dims;
  std::vector<int32_t> indexer_layers;
  uint64_t fingerprint = 0;         // the current version
  uint64_t legacy_fingerprint = 0;  // version 1, for sessions saved before version 2
  std::optional<uint64_t> model_digest;  // recorded in new sessions when computed
  // A deepseek_v4 model: its sessions are v3 files of this layout (dims and
  // indexer_layers unused; docs/coli-kv.md, "V4 sessions in the KV store").
  std::optional<v1::V4Layout> v4;
};

// Dimensions and indexer slot map of `config` (docs/coli-kv.md, "Records").
KvSessionShape ShapeOf(const ModelConfig& config, uint64_t fingerprint, uint64_t legacy_fingerprint);

class KvSessionClient {
 public:
  KvSessionClient(std::string address, KvSessionShape shape,
                  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials(),
                  absl::Duration timeout = absl::Seconds(10));
  virtual ~KvSessionClient() = default;

  const std::string& address() const { return address_; }
  const KvSessionShape& shape() const { return shape_; }

  // ALREADY_EXISTS when the session exists.
  virtual absl::StatusOr<v1::SessionInfo> Create(const std::string& id);
  // NOT_FOUND when there is no such session.
  virtual absl::StatusOr<v1::SessionInfo> Stat(const std::string& id);
  virtual absl::StatusOr<v1::SessionInfo> Update(const std::string& id, std::optional<int64_t> turn_watermark,
                                                 const std::map<std::string, std::string>& set,
                                                 const std::vector<std::string>& remove);
  // Retries while append streams are still open (FAILED_PRECONDITION) until
  // `wait` has passed.
  virtual absl::Status Truncate(const std::string& id, int64_t nrec, absl::Duration wait);
  virtual absl::Status Delete(const std::string& id, absl::Duration wait);
  // Every session whose id starts with `prefix` (all pages).
  virtual absl::StatusOr<std::vector<v1::SessionSummary>> List(const std::string& prefix);
  // Token ids of committed records [begin, end).
  virtual absl::StatusOr<std::vector<int>> TokenIds(const std::string& id, int64_t begin, int64_t end);

  // FAILED_PRECONDITION when a stored session was written for another model
  // (fingerprint or dimensions differ).
  absl::Status CheckCompatible(const v1::SessionInfo& info) const;

 private:
  absl::Status Error(const grpc::Status& s, const std::string& what) const;
  void SetDeadline(grpc::ClientContext* ctx) const;

  const std::string address_;
  const KvSessionShape shape_;
  const absl::Duration timeout_;
  std::unique_ptr<v1::KVStore::Stub> stub_;
};

}  // namespace strata::coordinator

#endif  // STRATA_COORDINATOR_KV_CLIENT_H_
