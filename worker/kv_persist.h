// The worker's side of session persistence (docs/service.md, "Persistence"):
// a KvStoreClient talks to strata-kvstore (proto/strata/v1/kvstore.proto);
// a KvAppender streams one sequence's rows of this stage's layer range to it
// in the background, and Load reads a stored session's rows back into a
// fresh SequenceKv without recomputation.
//
// Appending: one Append stream per (session, layer range). The compute thread
// hands over each step's rows (Append copies them out of the cache: it never
// blocks on the network); a callback reactor keeps one write in flight and
// reads AppendOpened / Committed{nrec}. Rows stay buffered until the store
// reports them committed, so a stream that breaks (the store restarted, a
// previous writer of the same layers is still draining) is reopened with
// backoff and the rows the store no longer has are sent again. Dropping the
// KvAppender half-closes the stream once every buffered row is sent; the
// stream then lives on until the store has made the rows durable.
//
// Thread-safety: KvStoreClient is thread-safe. A KvAppender is fed by one
// thread (the stage's compute thread); committed() and status() may be read
// from any thread.
#ifndef STRATA_WORKER_KV_PERSIST_H_
#define STRATA_WORKER_KV_PERSIST_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/security/credentials.h"
#include "model/kv_cache.h"
#include "worker/kv_rows.h"

namespace strata::worker {

struct KvStoreClientOptions {
  std::string address;  // host:port of strata-kvstore
  // The channel's credentials (common/cluster_security.h).
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  // Rows per AppendRows message are limited to about this many bytes.
  size_t max_message_bytes = size_t{1} << 20;
  // An appender whose uncommitted rows exceed this fails (the store is not
  // keeping up or is gone) instead of growing without bound.
  size_t max_buffer_bytes = size_t{256} << 20;
  // Reopening a broken stream: the delay doubles from min to max.
  absl::Duration retry_min = absl::Milliseconds(100);
  absl::Duration retry_max = absl::Seconds(2);
  // A dropped appender that still cannot deliver its rows after this long
  // gives up (the rows are lost; the session's nrec stops before them).
  absl::Duration drain_timeout = absl::Seconds(60);
  // Deadline of a whole Load.
  absl::Duration load_timeout = absl::Seconds(300);
};

// The model identity sent with every append and load (docs/coli-kv.md,
// "Model fingerprint"): the current fingerprint (0: not checked) and the
// version-1 one that sessions saved before version 2 record (0: none).
struct KvModelId {
  uint64_t fingerprint = 0;
  uint64_t legacy_fingerprint = 0;
};

struct AppenderSpec {
  std::string session_id;
  KvModelId model;
  SliceLayout layout;
  // The first position this appender will be handed (the sequence's length
  // when it was created). Rows below `skip_below` are never sent.
  int64_t first_position = 0;
  int64_t skip_below = 0;
  // Open the first stream at this position (AppendOpen.start_position: rows
  // from there on are rewritten). Unset: continue where the store's rows of
  // these layers end, skipping the rows it already has.
  std::optional<int64_t> start_position;
};

class KvAppender {
 public:
  virtual ~KvAppender() = default;  // half-closes in the background
  // Queues the rows of tokens [first, first + tokens.size()) of `kv`.
  // REQUIRES: first is the position after the previous call's rows (or
  // spec.first_position for the first call).
  virtual void Append(int first, const std::vector<int>& tokens, const SequenceKv& kv) = 0;
  // Records the store reported committed on this appender's stream.
  virtual int64_t committed() const = 0;
  // OK while rows are being delivered; the reason otherwise (the appender
  // keeps retrying transient failures and reports the last one here).
  virtual absl::Status status() const = 0;
};

class KvStoreClient {
 public:
  // Never contacts the store (that happens per call). INVALID_ARGUMENT for an
  // empty address.
  static absl::StatusOr<std::unique_ptr<KvStoreClient>> Connect(const KvStoreClientOptions& options);
  // Cancels the streams still open and waits for them to end.
  virtual ~KvStoreClient() = default;

  virtual const std::string& address() const = 0;

  virtual std::unique_ptr<KvAppender> OpenAppender(const AppenderSpec& spec) = 0;

  // Reads committed records [0, count) of the layout's layers of a session
  // into `kv` (which must be empty and hold exactly the layout's layers) and
  // their token ids into `tokens`. Errors carry the store's code (NOT_FOUND,
  // FAILED_PRECONDITION for another model's fingerprint, OUT_OF_RANGE beyond
  // the committed records, UNAVAILABLE, ...) with the session id.
  virtual absl::Status Load(const std::string& session_id, const KvModelId& model, const SliceLayout& layout,
                            int64_t count, SequenceKv* kv, std::vector<int>* tokens) = 0;

  // Rows acknowledged as committed over all appenders since the start.
  virtual int64_t rows_committed() const = 0;
};

}  // namespace strata::worker

#endif  // STRATA_WORKER_KV_PERSIST_H_
