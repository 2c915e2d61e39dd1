// The worker's side of DeepSeek-V4 session persistence (docs/coli-kv.md, "V4
// sessions in the KV store"; docs/service.md, "DeepSeek-V4"): a V4Appender
// streams one sequence's steps for this stage's layer range to the KV store,
// one AppendRows per step (its token ids, the range's token-record parts of
// the step's live positions and its closed blocks, model/v4/kv_state.h); a
// V4Appenders pool runs their streams; LoadV4Range reads a session's
// committed state of a layer range back.
//
// Each appender's stream runs on a thread of its own (a synchronous gRPC
// bidirectional stream, with a second thread reading Committed messages):
// Append only queues, so the compute thread never waits for the network.
// Steps stay buffered until the store reports them committed, so a stream
// that breaks (the store restarted, lost what it held in memory) is reopened
// with backoff (0.1 s doubling to 2 s) and the steps from the position the
// store asks for (AppendOpened.next_position, a step boundary) are sent
// again. Dropping the appender half-closes the stream once every buffered
// step is sent; the pool keeps the thread until the store has answered (a
// dropped appender retries for at most the drain time; when the pool goes,
// what still runs after its drain time is cancelled). More than 256 MiB of
// uncommitted steps fail the appender (status() says why).
//
// Thread-safety: V4Appenders is thread-safe; a V4Appender is fed by one
// thread, committed() and status() may be read from any.
#ifndef STRATA_WORKER_KV_PERSIST_V4_H_
#define STRATA_WORKER_KV_PERSIST_V4_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "strata/v1/kvstore.grpc.pb.h"
#include "worker/kv_persist.h"

namespace strata::worker {

struct V4AppenderSpec {
  std::string session_id;
  KvModelId model;
  int layer_begin = 0, layer_end = 0;
  // AppendOpen.start_position: the sequence's length when the appender is
  // created (the store's committed count after a load).
  int64_t start_position = 0;
};

class V4Appenders;

class V4Appender {
 public:
  ~V4Appender();  // half-closes after the queued steps; never blocks
  // Queues one step: tokens at [position, position + tokens.size()).
  void Append(int64_t position, std::vector<int32_t> tokens, std::string slices, std::string blocks);
  int64_t committed() const;
  absl::Status status() const;

  // Shared by the appender and its stream thread (internal to V4Appenders).
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    // Steps not yet committed, in position order, and the position from
    // which they still have to be sent on the current stream.
    std::deque<v1::AppendRequest> steps;  // guarded by mu
    size_t bytes = 0;                     // guarded by mu: of `steps`
    int64_t send_from = 0;                // guarded by mu
    bool closing = false;                 // guarded by mu
    bool cancelled = false;               // guarded by mu: the pool is going
    bool done = false;                    // guarded by mu
    int64_t committed = 0;                // guarded by mu
    absl::Status status;                  // guarded by mu
    grpc::ClientContext* ctx = nullptr;   // guarded by mu: the current stream's
    bool stream_ended = false;            // guarded by mu: its reader saw the end
  };

 private:
  friend class V4Appenders;
  explicit V4Appender(std::shared_ptr<State> state) : state_(std::move(state)) {}
  std::shared_ptr<State> state_;
};

class V4Appenders {
 public:
  V4Appenders(std::shared_ptr<grpc::Channel> channel, absl::Duration drain_timeout = absl::Seconds(3));
  // Waits up to the drain time for the streams still running, then cancels
  // them and joins their threads.
  ~V4Appenders();

  std::unique_ptr<V4Appender> Open(const V4AppenderSpec& spec);

  // The committed state of layers [begin, end) of a session (the store's
  // Load of a v3 session): T, the live token ids, the range's token-record
  // parts and block records. Errors carry the store's code and the session.
  struct Loaded {
    int64_t tokens = 0;
    std::vector<int> live_ids;
    std::string slices, blocks;
  };
  absl::Status Load(const std::string& session_id, const KvModelId& model, int begin, int end,
                    absl::Duration timeout, Loaded* out);

 private:
  void Run(std::shared_ptr<V4Appender::State> state, V4AppenderSpec spec);
  // One stream: open (at `start` when set), send, read commits. OK when the
  // appender closed with everything committed; the stream's failure else.
  absl::Status RunStream(V4Appender::State& st, const V4AppenderSpec& spec, std::optional<int64_t> start);

  std::shared_ptr<grpc::Channel> channel_;
  const absl::Duration drain_timeout_;
  std::mutex mu_;
  std::vector<std::pair<std::shared_ptr<V4Appender::State>, std::thread>> running_;  // guarded by mu_
};

}  // namespace strata::worker

#endif  // STRATA_WORKER_KV_PERSIST_V4_H_
