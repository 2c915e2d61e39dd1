#include "coordinator/serving_metrics.h"

namespace strata::coordinator {
namespace {

constexpr const char* kReasons[6] = {"error", "stop", "length", "eos", "abort", "error"};

}  // namespace

ServingMetrics::ServingMetrics(metrics::Registry* r)
    : registry(r),
      ttft(r->GetHistogram("strata_time_to_first_token_seconds",
                           "Time from admission to the first generated token.", metrics::LatencyBuckets())),
      inter_token(r->GetHistogram("strata_inter_token_latency_seconds",
                                  "Time between two consecutive tokens of one request.", metrics::LatencyBuckets())),
      e2e(r->GetHistogram("strata_request_duration_seconds", "Time from admission to the end of a request.",
                          metrics::LatencyBuckets())),
      queue(r->GetHistogram("strata_request_queue_seconds", "Time a request waited for a running slot.",
                            metrics::LatencyBuckets())),
      prompt_tokens(r->GetCounter("strata_prompt_tokens_total", "Prompt tokens of the requests that ended.")),
      generation_tokens(r->GetCounter("strata_generation_tokens_total", "Tokens generated.")),
      batch_tokens(r->GetHistogram("strata_batch_tokens", "Tokens in each micro-batch sent to stage 0.",
                                   metrics::PowersOfTwo(4096))),
      batch_sequences(r->GetHistogram("strata_batch_sequences", "Sequences in each micro-batch sent to stage 0.",
                                      metrics::PowersOfTwo(1024))) {
  for (int i = 0; i < 6; ++i) {
    finished_[i] = r->GetCounter("strata_requests_total", "Requests that ended, by finish reason.",
                                 {{"finish_reason", kReasons[i]}});
  }
}

metrics::Counter* ServingMetrics::Finished(v1::FinishReason reason) const {
  const int i = static_cast<int>(reason);
  return finished_[i >= 0 && i < 6 ? i : 0];
}

}  // namespace strata::coordinator
