// The worker's metrics (docs/metrics.md §3): what one StageHost records as it
// runs batches, in a metrics::Registry the worker serves on --metrics-listen.
// Every series has a `stage` label: the pipeline stage the worker hosted when
// it did the work ("none" before its first assignment), so that a dashboard
// can sum or split stages across workers.
//
// Thread-safety: ForStage and CountError are thread-safe; the series they
// return are too (common/metrics.h). SetGauges must not run concurrently with
// itself (the host calls it under its statistics mutex).
#ifndef STRATA_WORKER_STAGE_METRICS_H_
#define STRATA_WORKER_STAGE_METRICS_H_

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "common/metrics.h"

namespace strata::worker {

// How a batch used the stage, for strata_worker_steps_total{kind}.
enum class StepKind { kPrefill, kDecode, kMixed, kFree };
// prefill: every chunk is prompt tokens; decode: none is; mixed: both;
// free: no chunk (the message only frees sequences).
const char* StepKindName(StepKind k);

class StageMetrics {
 public:
  // The series of one stage. Pointers live as long as the registry.
  struct Series {
    metrics::Histogram* batch_rows;       // tokens per computed batch
    metrics::Histogram* batch_sequences;  // sequences (chunks) per computed batch
    metrics::Counter* busy_seconds;       // time the compute thread spent on batches
    metrics::Histogram* hop_seconds;      // batch received to its result handed on
    metrics::Histogram* downstream_seconds;  // batch sent to the next stage to its result back
    metrics::Counter* steps[4];           // by StepKind
  };

  // REQUIRES: registry outlives this.
  explicit StageMetrics(metrics::Registry* registry);

  // The series of `stage` (< 0: "none"), created on first use.
  const Series* ForStage(int stage);

  // strata_worker_errors_total{stage, op, code} += 1. `op`: what failed
  // (batch, downstream, load_session, assign).
  void CountError(int stage, std::string_view op, absl::StatusCode code);

  // The gauges of `stage`; the previous stage's (after a re-assignment) go to
  // zero. `pages_free`: the GPU page pool's free pages; unset on a CPU stage,
  // which has no fixed pool (its series is then absent).
  struct Gauges {
    int64_t kv_pages_used = 0;
    std::optional<int64_t> kv_pages_free = std::nullopt;
    int64_t kv_bytes_used = 0;
    int64_t sequences = 0;
    int64_t queue_depth = 0;
    bool ready = false;
  };
  void SetGauges(int stage, const Gauges& g);
  // Only the queue depth (set as batches arrive and leave).
  void SetQueueDepth(int stage, int64_t depth);

  metrics::Registry* registry() const { return registry_; }

  // Latency bounds of the stage histograms: 0.1 ms to 60 s (finer than
  // metrics::LatencyBuckets at the low end, where decode steps are).
  static std::vector<double> StepBuckets();

 private:
  struct GaugeSet {
    metrics::Gauge* pages_used;
    metrics::Gauge* pages_free;  // null until a GPU stage sets it
    metrics::Gauge* bytes_used;
    metrics::Gauge* sequences;
    metrics::Gauge* queue_depth;
    metrics::Gauge* ready;
  };
  GaugeSet* GaugesFor(int stage);

  metrics::Registry* const registry_;
  std::mutex mu_;
  std::map<int, Series> series_;     // guarded by mu_
  std::map<int, GaugeSet> gauges_;   // guarded by mu_
  int gauge_stage_ = -2;             // the stage SetGauges last wrote; guarded by mu_
};

}  // namespace strata::worker

#endif  // STRATA_WORKER_STAGE_METRICS_H_
