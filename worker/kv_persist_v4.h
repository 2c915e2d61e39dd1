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
// Dropping the appender half-closes the stream once every queued step is
// sent; the pool keeps the thread until the store has answered (or, when
// the pool goes, cancels what is still running after its drain time). A
// broken stream is not reopened: the appender reports the failure in
// status() and the session's committed count stops there.
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

 private:
  friend class V4Appenders;
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<v1::AppendRequest> queue;  // guarded by mu
    bool closing = false;                 // guarded by mu
    bool done = false;                    // guarded by mu
    int64_t committed = 0;                // guarded by mu
    absl::Status status;                  // guarded by mu
    grpc::ClientContext ctx;
  };
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

  std::shared_ptr<grpc::Channel> channel_;
  const absl::Duration drain_timeout_;
  std::mutex mu_;
  std::vector<std::pair<std::shared_ptr<V4Appender::State>, std::thread>> running_;  // guarded by mu_
};

}  // namespace strata::worker

#endif  // STRATA_WORKER_KV_PERSIST_V4_H_
