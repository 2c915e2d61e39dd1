#include "worker/stage_metrics.h"

#include <string>

#include "absl/status/status.h"

namespace strata::worker {
namespace {

std::string StageLabel(int stage) { return stage < 0 ? "none" : std::to_string(stage); }

}  // namespace

const char* StepKindName(StepKind k) {
  switch (k) {
    case StepKind::kPrefill:
      return "prefill";
    case StepKind::kDecode:
      return "decode";
    case StepKind::kMixed:
      return "mixed";
    case StepKind::kFree:
      return "free";
  }
  return "free";
}

std::vector<double> StageMetrics::StepBuckets() {
  std::vector<double> b = {0.0001, 0.00025, 0.0005};
  for (double v : metrics::LatencyBuckets()) b.push_back(v);
  return b;
}

StageMetrics::StageMetrics(metrics::Registry* registry) : registry_(registry) {}

const StageMetrics::Series* StageMetrics::ForStage(int stage) {
  stage = stage < 0 ? -1 : stage;
  std::lock_guard<std::mutex> l(mu_);
  auto it = series_.find(stage);
  if (it != series_.end()) return &it->second;
  metrics::Registry* r = registry_;
  const metrics::Labels labels = {{"stage", StageLabel(stage)}};
  Series s;
  s.batch_rows = r->GetHistogram("strata_worker_batch_rows", "Tokens (rows) in each batch the stage computed.",
                                 metrics::PowersOfTwo(4096), labels);
  s.batch_sequences = r->GetHistogram("strata_worker_batch_sequences",
                                      "Sequences (chunks) in each batch the stage computed.",
                                      metrics::PowersOfTwo(1024), labels);
  s.busy_seconds = r->GetCounter("strata_worker_busy_seconds_total",
                                 "Seconds the stage's compute thread spent running batches.", labels);
  s.hop_seconds = r->GetHistogram("strata_worker_hop_seconds",
                                  "Time from receiving a batch to handing its rows or result on.", StepBuckets(),
                                  labels);
  s.downstream_seconds = r->GetHistogram(
      "strata_worker_downstream_seconds",
      "Time from sending a batch to the next stage to its result coming back (the rest of the pipeline).",
      StepBuckets(), labels);
  for (StepKind k : {StepKind::kPrefill, StepKind::kDecode, StepKind::kMixed, StepKind::kFree}) {
    s.steps[static_cast<int>(k)] =
        r->GetCounter("strata_worker_steps_total", "Batches the stage ran, by kind.",
                      {{"stage", StageLabel(stage)}, {"kind", StepKindName(k)}});
  }
  return &series_.emplace(stage, s).first->second;
}

void StageMetrics::CountError(int stage, std::string_view op, absl::StatusCode code) {
  registry_
      ->GetCounter("strata_worker_errors_total", "Errors the stage answered or met, by operation and status code.",
                   {{"stage", StageLabel(stage)}, {"op", std::string(op)}, {"code", absl::StatusCodeToString(code)}})
      ->Inc();
}

StageMetrics::GaugeSet* StageMetrics::GaugesFor(int stage) {
  // REQUIRES: mu_ held.
  auto it = gauges_.find(stage);
  if (it != gauges_.end()) return &it->second;
  metrics::Registry* r = registry_;
  const metrics::Labels labels = {{"stage", StageLabel(stage)}};
  GaugeSet g;
  g.pages_used = r->GetGauge("strata_worker_kv_pages_used",
                             "64-token KV pages the stage's sequences hold, summed over its layers.", labels);
  g.pages_free = nullptr;
  g.bytes_used = r->GetGauge("strata_worker_kv_bytes_used", "Bytes of the KV rows the stage holds.", labels);
  g.sequences = r->GetGauge("strata_worker_sequences", "Sequences alive (with KV rows) on the stage.", labels);
  g.queue_depth = r->GetGauge("strata_worker_queue_depth", "Batches waiting for the stage's compute thread.", labels);
  g.ready = r->GetGauge("strata_worker_ready", "1 when the stage has its layers loaded.", labels);
  return &gauges_.emplace(stage, g).first->second;
}

void StageMetrics::SetGauges(int stage, const Gauges& v) {
  stage = stage < 0 ? -1 : stage;
  std::lock_guard<std::mutex> l(mu_);
  if (gauge_stage_ != stage && gauges_.count(gauge_stage_) > 0) {
    // A re-assignment: the old stage's numbers belong to no one now.
    GaugeSet& old = gauges_[gauge_stage_];
    for (metrics::Gauge* g : {old.pages_used, old.pages_free, old.bytes_used, old.sequences, old.queue_depth,
                              old.ready}) {
      if (g != nullptr) g->Set(0);
    }
  }
  gauge_stage_ = stage;
  GaugeSet* g = GaugesFor(stage);
  g->pages_used->Set(static_cast<double>(v.kv_pages_used));
  if (v.kv_pages_free.has_value()) {
    if (g->pages_free == nullptr) {
      g->pages_free = registry_->GetGauge("strata_worker_kv_pages_free",
                                          "Free 64-token KV pages of a GPU stage's page pool, over its layers.",
                                          {{"stage", StageLabel(stage)}});
    }
    g->pages_free->Set(static_cast<double>(*v.kv_pages_free));
  } else if (g->pages_free != nullptr) {
    g->pages_free->Set(0);
  }
  g->bytes_used->Set(static_cast<double>(v.kv_bytes_used));
  g->sequences->Set(static_cast<double>(v.sequences));
  g->queue_depth->Set(static_cast<double>(v.queue_depth));
  g->ready->Set(v.ready ? 1 : 0);
}

void StageMetrics::SetQueueDepth(int stage, int64_t depth) {
  stage = stage < 0 ? -1 : stage;
  std::lock_guard<std::mutex> l(mu_);
  GaugesFor(stage)->queue_depth->Set(static_cast<double>(depth));
}

}  // namespace strata::worker
