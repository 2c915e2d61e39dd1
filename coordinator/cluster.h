// Cluster: membership, placement and the pipeline (docs/service.md,
// "Membership" and "Placement").
//
// Workers Register (address, name, devices) and Heartbeat; a worker silent
// for `down_after` is declared down. A control thread keeps the pipeline in
// shape: when no placement is active and enough workers are alive it plans
// (balanced, or the manual override), bumps the epoch, sends AssignLayers to
// every stage (each stage learns its successor's address), opens the Execute
// stream to stage 0 and tells the scheduler the pipeline is up. When a placed
// worker goes down or registers again (it restarted), the stream to stage 0
// breaks, or a stage reports that its successor is unreachable, the pipeline
// is declared down with UNAVAILABLE naming the stage, and re-placed as soon
// as enough workers are alive again (a replacement registered, or the rest
// suffice).
//
// Thread-safety: all public methods are thread-safe (mu_ guards the
// membership table and the placement; link_mu_ the stage-0 link).
#ifndef STRATA_COORDINATOR_CLUSTER_H_
#define STRATA_COORDINATOR_CLUSTER_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "grpcpp/security/credentials.h"
#include "common/clock.h"
#include "coordinator/placement.h"
#include "coordinator/scheduler.h"
#include "coordinator/worker_client.h"
#include "strata/v1/generation.pb.h"
#include "strata/v1/worker.grpc.pb.h"
#include "worker/stage_link.h"

namespace strata::coordinator {

struct ClusterOptions {
  std::string model_dir;
  // Workers to place the model over; placement waits until this many are
  // alive (fewer when the model has fewer allowed cut points).
  int workers = 1;
  // Place over fewer workers when only this many are alive (0: = workers).
  int min_workers = 0;
  std::string placement_override;  // e.g. "0-30:w0,31-60:w1"; empty: balanced
  KvDtype kv_dtype = KvDtype::kFp8;
  std::string kvstore_address;     // empty: no session persistence
  uint64_t model_fingerprint = 0;         // sent to the workers for the KV store
  uint64_t model_legacy_fingerprint = 0;  // version 1 (docs/coli-kv.md, "Model fingerprint")
  // Weights generated on the GPU workers from this seed (placement from
  // config.json alone): --synthetic-weights.
  std::optional<uint64_t> synthetic_seed;
  PlacementOptions placement;
  int worker_threads = 0;          // engine threads per worker (0: the worker's default)
  absl::Duration heartbeat_interval = absl::Milliseconds(500);
  absl::Duration down_after = absl::Seconds(3);
  // Channels to the other daemons of the cluster (common/cluster_security.h).
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  // How the cluster reaches its workers (tests pass a fake); null: gRPC.
  std::shared_ptr<WorkerClient> worker_client;
  // Time for heartbeats and placement retries (tests pass a fake); null:
  // Clock::Real(). REQUIRES: outlives the cluster.
  Clock* clock = nullptr;
};

struct WorkerInfo {
  std::string id, name, address;
  uint64_t free_bytes = 0;
  uint64_t kv_pool_bytes = 0;  // a fixed KV reservation (GPU workers), else 0
  absl::Time last_heartbeat;
  bool alive = true;
};

// INVALID_ARGUMENT unless the address is HOST:PORT (no spaces or control
// characters, port 1..65535) and the name, when given, is up to 64 printable
// characters without spaces: both go to logs and placement overrides.
absl::Status ValidateRegistration(const v1::RegisterRequest& req);

class Cluster : public Pipeline {
 public:
  // REQUIRES: options.model_dir holds a loadable model (its layout is read
  // here: NOT_FOUND / INVALID_ARGUMENT otherwise).
  static absl::StatusOr<std::unique_ptr<Cluster>> Create(ClusterOptions options);
  ~Cluster() override;

  // Starts the control thread. REQUIRES: called once, before any RPC.
  // `on_ready` is told whenever readiness changes.
  void Start(Scheduler* scheduler, std::function<void(bool)> on_ready);

  // Stops the control thread and closes the stream to stage 0 (its reader
  // may still report the pipeline down to the scheduler while this runs;
  // never afterwards). Idempotent; the destructor calls it. Call it before
  // destroying the scheduler.
  void Stop();

  // REQUIRES: ValidateRegistration(req) is OK.
  v1::RegisterResponse Register(const v1::RegisterRequest& req);
  v1::HeartbeatResponse Heartbeat(const v1::HeartbeatRequest& req);

  absl::Status Send(const v1::StageBatch& batch) override;

  bool ready();
  int64_t epoch();
  // Per-stage statistics (asks every placed worker; a worker that does not
  // answer within a second is reported down).
  std::vector<v1::StageStats> StageStats();
  // The placed stages: worker addresses and layer ranges.
  struct StageView {
    std::string worker, address;
    int layer_begin = 0, layer_end = 0;
  };
  std::vector<StageView> stages();
  // The epoch and its stages in one consistent read (no stages: not placed).
  std::pair<int64_t, std::vector<StageView>> placement();
  std::vector<WorkerInfo> workers();
  // The client the cluster reaches its workers with (for the session manager).
  WorkerClient* worker_client() const { return client_.get(); }

 private:
  explicit Cluster(ClusterOptions options, ModelLayout layout);
  void Loop();
  // Declares the pipeline down (once per epoch).
  void PipelineDown(int64_t epoch, const absl::Status& status);
  absl::Status PlaceAndAssign();

  const ClusterOptions options_;
  const ModelLayout layout_;
  const std::shared_ptr<WorkerClient> client_;
  Clock* const clock_;
  Scheduler* scheduler_ = nullptr;
  std::function<void(bool)> on_ready_;

  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::map<std::string, WorkerInfo> workers_;  // by id
  uint64_t next_worker_ = 1;
  int64_t epoch_ = 0;
  bool placed_ = false;
  std::vector<StageView> stages_;
  std::vector<std::string> stage_ids_;  // worker ids of the stages

  std::mutex link_mu_;
  std::unique_ptr<worker::StageLink> link_;  // guarded by link_mu_
  std::thread thread_;
};

}  // namespace strata::coordinator

#endif  // STRATA_COORDINATOR_CLUSTER_H_
