// StageHost: what a worker runs — the engine for its assigned layer range,
// the sequences' KV caches (and, on the last stage, their samplers), one
// compute thread that runs batches in arrival order, and the link to the next
// stage (docs/service.md, "Worker").
//
// A batch arrives from an Execute stream (see worker_service.h) with a
// ResultSink to answer on. The compute thread validates it, embeds (stage 0)
// or takes the received hidden rows, runs the layers, and then either
// forwards the rows to the next stage (remembering the sink for the batch) or,
// on the last stage, samples one token per chunk that asks for it and answers
// at once. Results coming back from the next stage are passed to the sink
// that sent the batch.
//
// Metrics (worker/stage_metrics.h, docs/metrics.md §3) go to the registry of
// StageHostOptions; events (assignments, session loads, failed batches) to
// the structured log (common/log.h).
//
// Thread-safety: all public methods are thread-safe. Assign() waits for the
// batch being computed and replaces the whole state (sequences of an older
// epoch are dropped). Locks: state_mu_ (engine and sequences; held by the
// compute thread per batch) is taken before mu_ (queue, pending batches,
// statistics).
#ifndef STRATA_WORKER_STAGE_HOST_H_
#define STRATA_WORKER_STAGE_HOST_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "common/metrics.h"
#include "common/thread_pool.h"
#include "grpcpp/security/credentials.h"
#include "model/engine.h"
#include "model/sampler.h"
#include "model/v4/engine.h"
#include "model/v4/kv_state.h"
#include "strata/v1/worker.pb.h"
#include "worker/device_stage.h"
#include "worker/kv_persist.h"
#include "worker/kv_persist_v4.h"
#include "worker/stage_link.h"
#include "worker/stage_metrics.h"
#include "worker/stage_wire.h"

namespace strata::worker {

// Where a stage sends results for the batches it received on one stream.
// Thread-safety: Send must be thread-safe.
class ResultSink {
 public:
  virtual ~ResultSink() = default;
  virtual void Send(v1::StageResult result) = 0;
};

struct StageHostOptions {
  // Engine threads per stage (0: one per core).
  int threads = 0;
  // Largest TensorChunk payload sent to the next stage.
  size_t max_chunk_bytes = kDefaultMaxChunkBytes;
  // This worker's name, used in error messages.
  std::string name = "worker";
  // Test hook: sleep this long before each batch (0: never), so that tests
  // can act while a stream is running on a tiny model.
  int debug_step_delay_ms = 0;
  // Run the layers on a GPU (docs/gpu-engine.md) instead of the CPU engine.
  bool gpu = false;
  DeviceStageOptions gpu_options;
  // Channels to the next stage and the KV store (common/cluster_security.h).
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  // AssignLayers loads only model directories under this one (after
  // resolving links); empty: every directory is refused.
  std::string model_root;
  // Opens the stream to the next stage (tests pass a fake); empty: gRPC.
  StageDialer dialer;
  // Where the stage's metrics go (docs/metrics.md §3); null: a registry of
  // the host's own (metrics_registry()). REQUIRES: outlives the host.
  metrics::Registry* metrics = nullptr;
};

// INVALID_ARGUMENT unless 0 <= layer_begin < layer_end, 0 <= stage <
// num_stages, 0 <= threads <= kMaxThreads, the kv dtype is known and the epoch
// positive. (Whether the range fits the model is checked when it loads.)
absl::Status ValidateAssignment(const v1::AssignLayersRequest& req);

// OK when `model_dir` lies inside `root` once both are resolved (symbolic
// links, "..": std::filesystem::canonical); PERMISSION_DENIED naming both
// otherwise, and for an empty root; NOT_FOUND when `model_dir` does not
// exist. (docs/deploy.md, "Model root".)
absl::Status CheckModelRoot(const std::string& model_dir, const std::string& root);

class StageHost {
 public:
  explicit StageHost(StageHostOptions options);
  ~StageHost();

  // Loads the layers and resets every sequence. INVALID_ARGUMENT for a
  // request ValidateAssignment refuses or a range the model cannot be cut at;
  // NOT_FOUND / INVALID_ARGUMENT from loading.
  absl::Status Assign(const v1::AssignLayersRequest& request, v1::AssignLayersResponse* response);

  // Queues a batch; its result (or error) goes to `sink`.
  void Submit(Batch batch, std::shared_ptr<ResultSink> sink);

  // Creates sequence `seq_id` from a stored session's rows (records
  // [0, request.tokens()) of this stage's layers, read from the KV store
  // without recomputation) and, with persist, an appender that continues the
  // session at request.append_from(). Blocks while loading; the compute
  // thread keeps running meanwhile.
  //   INVALID_ARGUMENT  bad counts or session id;
  //   FAILED_PRECONDITION no layers or no KV store;
  //   ABORTED           the epoch differs (or changed during the load);
  //   the KV store's codes (NOT_FOUND, OUT_OF_RANGE, UNAVAILABLE, ...).
  absl::Status LoadSession(const v1::LoadSessionRequest& request, v1::LoadSessionResponse* response);

  // Drops sequences (or all). Returns how many were dropped.
  int64_t Free(const std::vector<uint64_t>& ids, bool all);

  v1::WorkerStatsResponse Stats();
  int64_t epoch();
  bool ready();
  // The registry holding the stage's series (options.metrics or the host's own).
  metrics::Registry* metrics_registry() const { return metrics_.registry(); }

 private:
  struct Seq {
    // The cache (CPU), or on a GPU stage the host mirror of the rows for the
    // KV store (null until the sequence persists).
    std::unique_ptr<SequenceKv> kv;
    std::unique_ptr<DeviceSequence> dev;  // GPU stage: the cache
    std::unique_ptr<v4::V4Sequence> v4;   // deepseek_v4 stage: the carried state
    std::unique_ptr<V4Appender> v4persist;  // its steps to the KV store
    std::unique_ptr<Sampler> sampler;
    int logprobs = -1;
    std::unique_ptr<KvAppender> persist;  // rows to the KV store
  };
  // A sequence whose rows go to the KV store gets an appender on its first
  // persisted chunk.
  absl::Status PersistLocked(const v1::StageChunk& chunk, const std::vector<int>& tokens, Seq& seq);
  struct Work {
    Batch batch;
    std::shared_ptr<ResultSink> sink;
    std::chrono::steady_clock::time_point received;  // Submit
  };
  // A batch sent downstream, waiting for its result.
  struct Pending {
    std::shared_ptr<ResultSink> sink;
    std::chrono::steady_clock::time_point sent;
    const StageMetrics::Series* series;
  };
  absl::Status AssignImpl(const v1::AssignLayersRequest& request, v1::AssignLayersResponse* response);
  absl::Status LoadSessionImpl(const v1::LoadSessionRequest& request, v1::LoadSessionResponse* response);
  // The stage the metrics name: the assigned one, -1 before the first
  // assignment. REQUIRES: mu_ held.
  int MetricsStageLocked() const { return epoch_ > 0 ? static_cast<int>(stats_.stage()) : -1; }
  int MetricsStage();

  void ComputeLoop();
  void RunBatch(Work& w);
  // Runs a batch on this stage; fills `result` on the last stage.
  absl::Status Compute(Batch& batch, v1::StageResult* result);
  void Fail(const std::shared_ptr<ResultSink>& sink, uint64_t batch_id, const absl::Status& s, int stage);
  void OnDownstreamResult(v1::StageResult&& r);
  void OnDownstreamBroken(uint64_t link_generation, const absl::Status& s);
  absl::Status EnsureLinkLocked();
  int64_t FreeLocked(const std::vector<uint64_t>& ids, bool all);
  void UpdateStatsLocked();
  // The loaded stage, CPU or GPU (REQUIRES: state_mu_ held, loaded()).
  bool loaded() const { return engine_ || device_ || v4_; }
  const ModelConfig& config() const { return device_ ? device_->config() : v4_ ? v4_view_ : engine_->config(); }
  bool first_stage() const {
    return device_ ? device_->first_stage() : v4_ ? v4_->first_stage() : engine_->first_stage();
  }
  bool last_stage() const { return device_ ? device_->last_stage() : v4_ ? v4_->last_stage() : engine_->last_stage(); }
  uint64_t weight_bytes() const {
    return device_ ? device_->weight_bytes() : v4_ ? v4_->weight_bytes() : engine_->weight_bytes();
  }
  static int64_t Tokens(const Seq& s) {
    return s.dev ? s.dev->num_tokens() : s.v4 ? s.v4->num_tokens() : s.kv->num_tokens();
  }
  // Loads a deepseek_v4 stage (CPU, f32 state) for `req` into *engine.
  absl::Status LoadV4(const v1::AssignLayersRequest& req, const ModelConfig& view,
                      std::unique_ptr<v4::V4Engine>* engine) const;
  // Runs the layers of a deepseek_v4 stage on a batch (embedding first on
  // stage 0); the rows are stream_width() wide.
  // PersistLocked / LoadSession of a deepseek_v4 sequence: each step's
  // parts of this stage's layers to the KV store, and the stored state of
  // those layers back (docs/coli-kv.md, "V4 sessions in the KV store").
  absl::Status PersistV4Locked(const v1::StageChunk& c, const std::vector<int>& tokens, Seq& seq);
  absl::Status LoadV4Session(const v1::LoadSessionRequest& req, v1::LoadSessionResponse* resp);
  absl::Status RunV4Locked(const v1::StageBatch& h, const std::vector<std::vector<int>>& chunk_tokens,
                           const std::vector<int>& all_tokens, std::vector<float>* hidden);
  // An empty host cache of this stage's layers in the KV store's form.
  std::unique_ptr<SequenceKv> NewMirror() const;
  // The model identity of request_ for the KV store. REQUIRES: state_mu_ held.
  KvModelId ModelId() const {
    return KvModelId{request_.model_fingerprint(), request_.model_legacy_fingerprint()};
  }

  const StageHostOptions options_;
  std::unique_ptr<metrics::Registry> own_metrics_;  // when options_.metrics is null
  StageMetrics metrics_;

  std::mutex state_mu_;  // engine_, seqs_, request_, link_
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<DeviceStage> device_;  // instead of engine_ on a GPU stage
  std::unique_ptr<v4::V4Engine> v4_;     // instead of engine_ for deepseek_v4
  ModelConfig v4_view_;                  // its serving view (model/config.h)
  std::unique_ptr<kv::V3Layout> v4_layout_;  // its state's v3 layout (f32 rows)
  // V4 appenders and loads; kept across assignments to the same KV store.
  std::shared_ptr<V4Appenders> v4_store_;
  std::string v4_store_address_;
  std::map<uint64_t, Seq> seqs_;
  v1::AssignLayersRequest request_;
  std::unique_ptr<StageLink> link_;
  uint64_t link_generation_ = 0;
  // Kept across assignments with the same address, so that the appenders of
  // dropped sequences finish delivering their rows.
  std::shared_ptr<KvStoreClient> kvstore_;
  SliceLayout layout_;  // this stage's KV store slice

  std::mutex mu_;  // below
  std::condition_variable cv_;
  std::deque<Work> queue_;
  bool stop_ = false;
  std::map<uint64_t, Pending> pending_;  // batches sent downstream
  v1::WorkerStatsResponse stats_;
  int64_t epoch_ = 0;
  uint64_t broken_generation_ = ~uint64_t{0};  // link generation that broke
  bool ready_ = false;

  std::thread compute_;
};

}  // namespace strata::worker

#endif  // STRATA_WORKER_STAGE_HOST_H_
