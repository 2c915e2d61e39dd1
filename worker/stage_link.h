// StageLink: the sending end of a Worker.Execute stream — how the coordinator
// feeds stage 0 and how each stage feeds the next one. Batches go out through
// Send(); results are delivered to a callback on the link's reader thread;
// when the stream ends (peer gone, cancelled, error) `on_broken` is called
// once with the status, naming the peer.
//
// The stream itself is a StageStream: gRPC in production (DialGrpcStage),
// a fake in tests (worker/testing/fake_stage_stream.h).
//
// Thread-safety: Send() may be called from any thread (writes are serialised:
// one write in flight). Callbacks run on the reader thread and must not call
// the destructor. The destructor cancels the stream and joins the reader.
#ifndef STRATA_WORKER_STAGE_LINK_H_
#define STRATA_WORKER_STAGE_LINK_H_

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "strata/v1/worker.grpc.pb.h"

namespace strata::worker {

// Channel arguments every Strata-internal channel uses (message limits,
// keepalive so a dead peer is noticed within seconds).
grpc::ChannelArguments InternalChannelArgs();

// One open Worker.Execute stream, from the sending side.
// Thread-safety: Write is called by one thread at a time and Read / Finish by
// another (the link's reader); Cancel may be called from any thread at any
// time.
class StageStream {
 public:
  virtual ~StageStream() = default;
  // Sends one message; false once the stream is broken.
  virtual bool Write(const v1::StageMessage& msg) = 0;
  // Blocks for the next result; false once the stream has ended.
  virtual bool Read(v1::StageResult* result) = 0;
  // After Read returned false: how the stream ended (OK: the peer closed it).
  virtual absl::Status Finish() = 0;
  // Ends the stream from this side: a blocked Read returns false.
  virtual void Cancel() = 0;
};

// Connects to `address` (waiting at most `connect_timeout`) and opens an
// Execute stream. Errors are UNAVAILABLE with a message that completes
// "<peer> at <address> ..." (e.g. "is not reachable").
using StageDialer = std::function<absl::StatusOr<std::unique_ptr<StageStream>>(const std::string& address,
                                                                              absl::Duration connect_timeout)>;

// A channel to another daemon of the cluster with InternalChannelArgs and
// the cluster's credentials (common/cluster_security.h).
std::shared_ptr<grpc::Channel> InternalChannel(const std::string& address,
                                               const std::shared_ptr<grpc::ChannelCredentials>& credentials);

// The gRPC dialer: a channel with InternalChannelArgs and `credentials` (the
// cluster's, common/cluster_security.h) per stream.
absl::StatusOr<std::unique_ptr<StageStream>> DialGrpcStage(const std::string& address,
                                                           const std::shared_ptr<grpc::ChannelCredentials>& credentials,
                                                           absl::Duration connect_timeout);
StageDialer GrpcStageDialer(std::shared_ptr<grpc::ChannelCredentials> credentials);

class StageLink {
 public:
  using ResultFn = std::function<void(v1::StageResult&&)>;
  using BrokenFn = std::function<void(const absl::Status&)>;

  // Connects through `dial` (GrpcStageDialer with the cluster's
  // credentials, or a test's fake), waiting at most `connect_timeout`, and
  // starts reading. UNAVAILABLE naming `peer_name` and the address when it
  // cannot.
  static absl::StatusOr<std::unique_ptr<StageLink>> Open(const std::string& address,
                                                         const std::string& peer_name,
                                                         absl::Duration connect_timeout,
                                                         ResultFn on_result, BrokenFn on_broken,
                                                         const StageDialer& dial);
  // Starts a link on an open stream.
  static std::unique_ptr<StageLink> Start(const std::string& address, const std::string& peer_name,
                                          std::unique_ptr<StageStream> stream, ResultFn on_result,
                                          BrokenFn on_broken);
  ~StageLink();

  // Sends one batch (header and rows). UNAVAILABLE once the stream is broken.
  absl::Status Send(const v1::StageBatch& header, const float* hidden, size_t max_chunk_bytes);

  const std::string& address() const { return address_; }

 private:
  StageLink(std::string address, std::string peer_name);
  void ReadLoop(ResultFn on_result, BrokenFn on_broken);

  const std::string address_;
  const std::string peer_name_;
  std::unique_ptr<StageStream> stream_;
  std::mutex write_mu_;  // one write in flight
  bool write_failed_ = false;  // guarded by write_mu_
  std::thread reader_;
};

}  // namespace strata::worker

#endif  // STRATA_WORKER_STAGE_LINK_H_
