// StageLink: the sending end of a Worker.Execute stream — how the coordinator
// feeds stage 0 and how each stage feeds the next one. Batches go out through
// Send(); results are delivered to a callback on the link's reader thread;
// when the stream ends (peer gone, cancelled, error) `on_broken` is called
// once with the status, naming the peer.
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

// A channel to another daemon of the cluster with InternalChannelArgs and
// the cluster's credentials (common/cluster_security.h).
std::shared_ptr<grpc::Channel> InternalChannel(const std::string& address,
                                               const std::shared_ptr<grpc::ChannelCredentials>& credentials);

class StageLink {
 public:
  using ResultFn = std::function<void(v1::StageResult&&)>;
  using BrokenFn = std::function<void(const absl::Status&)>;

  // Connects (waiting at most `connect_timeout`) and opens the stream.
  // UNAVAILABLE naming `peer_name` and the address when it cannot.
  static absl::StatusOr<std::unique_ptr<StageLink>> Open(const std::string& address,
                                                         const std::shared_ptr<grpc::ChannelCredentials>& credentials,
                                                         const std::string& peer_name,
                                                         absl::Duration connect_timeout,
                                                         ResultFn on_result, BrokenFn on_broken);
  ~StageLink();

  // Sends one batch (header and rows). UNAVAILABLE once the stream is broken.
  absl::Status Send(const v1::StageBatch& header, const float* hidden, size_t max_chunk_bytes);

  const std::string& address() const { return address_; }

 private:
  StageLink(std::string address, std::string peer_name);
  void ReadLoop(ResultFn on_result, BrokenFn on_broken);

  const std::string address_;
  const std::string peer_name_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Worker::Stub> stub_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::StageMessage, v1::StageResult>> stream_;
  std::mutex write_mu_;  // one write in flight
  bool write_failed_ = false;  // guarded by write_mu_
  std::thread reader_;
};

}  // namespace strata::worker

#endif  // STRATA_WORKER_STAGE_LINK_H_
