// Scheduler: continuous batching over the pipeline (docs/service.md,
// "Scheduling").
//
// Requests are admitted (up to max_running running and max_queued waiting;
// beyond that RESOURCE_EXHAUSTED) and each gets a sequence: an id the stages
// key their KV cache by. The scheduler thread forms micro-batches from the
// sequences that have no step in flight — prefill chunks of at most
// prefill_chunk tokens mixed with one-token decode steps, at most
// batch_tokens tokens per batch — and keeps up to one batch per stage in
// flight, each holding about 1/S of the ready sequences, so all S stages work
// at once. A sequence has at most one step in flight. When a batch's result
// comes back, each sampled token is checked against the stopping rules,
// detokenised and streamed; finished sequences are freed on every stage by
// an in-band free in the next batch (sessions keep theirs resident).
//
// Failures: a batch that fails ends its requests with the batch's status; a
// broken pipeline (OnPipelineDown) ends every running request with
// UNAVAILABLE naming the stage, and forgets which sequences are resident.
//
// Thread-safety: every public method is thread-safe. One mutex (mu_) guards
// all state; sinks are called with it held (they only queue). The scheduler
// thread sends batches without holding it.
#ifndef STRATA_COORDINATOR_SCHEDULER_H_
#define STRATA_COORDINATOR_SCHEDULER_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
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
#include "common/clock.h"
#include "coordinator/request.h"
#include "coordinator/serving_metrics.h"
#include "coordinator/sessions.h"
#include "model/stop_matcher.h"
#include "model/tokenizer.h"
#include "strata/v1/generation.pb.h"
#include "strata/v1/worker.pb.h"

namespace strata::coordinator {

// Where a request's responses go. Thread-safe; Send after Close is dropped.
class GenerateSink {
 public:
  virtual ~GenerateSink() = default;
  virtual void Send(v1::GenerateResponse response) = 0;
  // Ends the stream (after the queued responses). The first call wins.
  virtual void Close(const absl::Status& status) = 0;
};

// What the scheduler needs from the cluster.
class Pipeline {
 public:
  virtual ~Pipeline() = default;
  // Sends a batch to stage 0 (results arrive through Scheduler::OnResult).
  virtual absl::Status Send(const v1::StageBatch& batch) = 0;
};

struct SchedulerOptions {
  int max_running = 64;     // sequences generating at once
  int max_queued = 256;     // requests waiting for a running slot
  int prefill_chunk = 256;  // most prompt tokens of one sequence per step
  int batch_tokens = 1024;  // most tokens per micro-batch
  // Time for deadlines and the final message's timings (tests pass a fake);
  // null: Clock::Real(). REQUIRES: outlives the scheduler.
  Clock* clock = nullptr;
  // Where requests' latencies and counts are recorded (docs/metrics.md §2);
  // null: nowhere. REQUIRES: outlives the scheduler.
  const ServingMetrics* metrics = nullptr;
  // The request_start and request_finish log lines (docs/logging.md) carry
  // the prompt and the completion as text (--log-prompts). Off: counts and
  // ids only; prompts and completions are never logged.
  bool log_prompts = false;
};

// What the scheduler reports when a session's turn ends (for the KV store's
// turn watermark and the pending token, coordinator/session_manager.h).
struct TurnEnd {
  std::string session_id;
  int64_t tokens = 0;          // tokens whose rows the stages hold
  std::optional<int> pending;  // sampled last, not fed: position `tokens`
  int64_t turn_watermark = 0;
  bool persist = false;
};

struct SchedulerStats {
  int64_t running = 0, queued = 0, completed = 0, generated_tokens = 0, resident_sessions = 0;
  int64_t batches_in_flight = 0;
};

class Scheduler {
 public:
  // REQUIRES: model, pipeline and sessions outlive the scheduler.
  Scheduler(SchedulerOptions options, const ModelContext* model, Pipeline* pipeline, SessionTable* sessions);
  ~Scheduler();

  // Admits a request. RESOURCE_EXHAUSTED when full, UNAVAILABLE when the
  // pipeline is not ready, FAILED_PRECONDITION / NOT_FOUND for session
  // conflicts. On success the sink is closed exactly once later.
  absl::Status Submit(RequestSpec spec, std::shared_ptr<GenerateSink> sink, std::optional<absl::Time> deadline);
  // The client went away: drop the request without a final message.
  void Cancel(const GenerateSink* sink);
  // Draining (SIGTERM): from now on Submit answers UNAVAILABLE; the requests
  // admitted already run to their end.
  void StopAdmitting();
  // Ends a request of `owner` with finish_reason abort. False when that owner
  // has no such request running (another owner's request is not touched).
  bool Abort(const std::string& request_id, const std::string& owner = "");

  // Frees a sequence on every stage (in-band, with the next batch).
  void FreeSequence(uint64_t seq_id);
  // A sequence id no request uses (for sessions loaded onto the stages).
  uint64_t NewSeqId();
  // Called (with the scheduler's lock held: it must only queue) whenever a
  // request on a session ends. REQUIRES: set before the first Submit.
  void SetTurnListener(std::function<void(const TurnEnd&)> listener);

  void OnResult(v1::StageResult&& result);
  void OnPipelineDown(const absl::Status& status);
  void OnPipelineUp(int num_stages, int64_t epoch);

  SchedulerStats Stats();

 private:
  struct Request;
  struct Seq;

  void Loop();
  // Builds up to the free batch slots' worth of batches (under mu_).
  std::vector<v1::StageBatch> FormBatchesLocked();
  void HandleTokenLocked(Request& r, const v1::SampledToken& t, std::vector<Request*>* done);
  void FinishLocked(Request& r, v1::FinishReason reason, const absl::Status& status);
  void ReleaseLocked(Request& r);
  void SaveSessionLocked(Request& r);
  void CheckDeadlinesLocked();
  void PromoteLocked();
  Request* FindLocked(const GenerateSink* sink);

  const SchedulerOptions options_;
  Clock* const clock_;
  const ModelContext* const model_;
  Pipeline* const pipeline_;
  SessionTable* const sessions_;

  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool draining_ = false;
  bool up_ = false;
  int num_stages_ = 1;
  int64_t epoch_ = 0;
  uint64_t next_seq_ = 1;
  uint64_t next_batch_ = 1;
  uint64_t next_request_ = 1;
  std::map<uint64_t, std::unique_ptr<Request>> requests_;  // by key
  std::deque<uint64_t> queue_;                             // waiting request keys
  std::map<uint64_t, std::vector<uint64_t>> in_flight_;    // batch id -> request keys
  std::vector<uint64_t> to_free_;                          // sequences to free in-band
  SchedulerStats stats_;
  std::function<void(const TurnEnd&)> turn_listener_;
  std::thread thread_;
};

}  // namespace strata::coordinator

#endif  // STRATA_COORDINATOR_SCHEDULER_H_
