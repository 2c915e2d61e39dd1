#include "worker/stage_link.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "worker/stage_wire.h"

namespace strata::worker {

grpc::ChannelArguments InternalChannelArgs() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(8 << 20);
  args.SetMaxSendMessageSize(8 << 20);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 1000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 2000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // A distinct channel per link, so that a broken link never shares a
  // subchannel with its replacement.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return args;
}

std::shared_ptr<grpc::Channel> InternalChannel(const std::string& address,
                                               const std::shared_ptr<grpc::ChannelCredentials>& credentials) {
  return grpc::CreateCustomChannel(address, credentials, InternalChannelArgs());
}

StageLink::StageLink(std::string address, std::string peer_name)
    : address_(std::move(address)), peer_name_(std::move(peer_name)) {}

absl::StatusOr<std::unique_ptr<StageLink>> StageLink::Open(const std::string& address,
                                                           const std::shared_ptr<grpc::ChannelCredentials>& credentials,
                                                           const std::string& peer_name,
                                                           absl::Duration connect_timeout,
                                                           ResultFn on_result, BrokenFn on_broken) {
  std::unique_ptr<StageLink> link(new StageLink(address, peer_name));
  link->channel_ = InternalChannel(address, credentials);
  if (!link->channel_->WaitForConnected(std::chrono::system_clock::now() +
                                        absl::ToChronoMilliseconds(connect_timeout))) {
    return absl::UnavailableError(absl::StrCat(peer_name, " at ", address, " is not reachable"));
  }
  link->stub_ = v1::Worker::NewStub(link->channel_);
  link->stream_ = link->stub_->Execute(&link->ctx_);
  if (link->stream_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot open a stage stream to ", peer_name, " at ", address));
  }
  StageLink* raw = link.get();
  link->reader_ = std::thread([raw, on_result = std::move(on_result), on_broken = std::move(on_broken)]() mutable {
    raw->ReadLoop(std::move(on_result), std::move(on_broken));
  });
  return link;
}

StageLink::~StageLink() {
  ctx_.TryCancel();
  if (reader_.joinable()) reader_.join();
}

void StageLink::ReadLoop(ResultFn on_result, BrokenFn on_broken) {
  v1::StageResult r;
  while (stream_->Read(&r)) {
    on_result(std::move(r));
    r.Clear();
  }
  grpc::Status st = stream_->Finish();
  absl::Status s = st.ok() ? absl::UnavailableError("stream closed")
                           : absl::Status(static_cast<absl::StatusCode>(st.error_code()), st.error_message());
  if (st.error_code() == grpc::StatusCode::CANCELLED || st.error_code() == grpc::StatusCode::UNAVAILABLE ||
      st.ok()) {
    s = absl::UnavailableError(absl::StrCat(peer_name_, " at ", address_, " is unreachable (",
                                            st.ok() ? "stream closed" : st.error_message(), ")"));
  } else {
    s = absl::Status(s.code(), absl::StrCat(peer_name_, " at ", address_, ": ", st.error_message()));
  }
  on_broken(s);
}

absl::Status StageLink::Send(const v1::StageBatch& header, const float* hidden, size_t max_chunk_bytes) {
  std::vector<v1::StageMessage> msgs = EncodeBatch(header, hidden, max_chunk_bytes);
  std::lock_guard<std::mutex> lock(write_mu_);
  if (write_failed_) return absl::UnavailableError(absl::StrCat(peer_name_, " at ", address_, " is unreachable"));
  for (const auto& m : msgs) {
    if (!stream_->Write(m)) {
      write_failed_ = true;
      return absl::UnavailableError(absl::StrCat(peer_name_, " at ", address_, " is unreachable"));
    }
  }
  return absl::OkStatus();
}

}  // namespace strata::worker
