// The coordinator's request metrics (docs/metrics.md §2): what the scheduler
// records as requests run, registered once in a metrics::Registry.
//
// Thread-safety: the series are thread-safe (common/metrics.h); the struct
// itself is immutable after construction.
#ifndef STRATA_COORDINATOR_SERVING_METRICS_H_
#define STRATA_COORDINATOR_SERVING_METRICS_H_

#include <string>

#include "common/metrics.h"
#include "strata/v1/generation.pb.h"

namespace strata::coordinator {

struct ServingMetrics {
  // REQUIRES: registry outlives this.
  explicit ServingMetrics(metrics::Registry* registry);

  // strata_requests_total{finish_reason}: the counter of one finish reason
  // (stop, length, eos, abort, error).
  metrics::Counter* Finished(v1::FinishReason reason) const;

  metrics::Registry* const registry;
  metrics::Histogram* const ttft;           // submit to first token, s
  metrics::Histogram* const inter_token;    // between two tokens of a request, s
  metrics::Histogram* const e2e;            // submit to the end, s
  metrics::Histogram* const queue;          // submit to running, s
  metrics::Counter* const prompt_tokens;    // prompt tokens of requests that ended
  metrics::Counter* const generation_tokens;
  metrics::Histogram* const batch_tokens;     // tokens per micro-batch sent
  metrics::Histogram* const batch_sequences;  // sequences per micro-batch sent

 private:
  metrics::Counter* finished_[6];  // by v1::FinishReason
};

}  // namespace strata::coordinator

#endif  // STRATA_COORDINATOR_SERVING_METRICS_H_
