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

namespace {

class GrpcStageStream final : public StageStream {
 public:
  explicit GrpcStageStream(std::shared_ptr<grpc::Channel> channel)
      : channel_(std::move(channel)), stub_(v1::Worker::NewStub(channel_)) {}

  bool Open() {
    stream_ = stub_->Execute(&ctx_);
    return stream_ != nullptr;
  }
  bool Write(const v1::StageMessage& msg) override { return stream_->Write(msg); }
  bool Read(v1::StageResult* result) override { return stream_->Read(result); }
  absl::Status Finish() override {
    grpc::Status st = stream_->Finish();
    return absl::Status(static_cast<absl::StatusCode>(st.error_code()), st.error_message());
  }
  void Cancel() override { ctx_.TryCancel(); }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Worker::Stub> stub_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::StageMessage, v1::StageResult>> stream_;
};

}  // namespace

std::shared_ptr<grpc::Channel> InternalChannel(const std::string& address,
                                               const std::shared_ptr<grpc::ChannelCredentials>& credentials) {
  return grpc::CreateCustomChannel(address, credentials, InternalChannelArgs());
}

absl::StatusOr<std::unique_ptr<StageStream>> DialGrpcStage(const std::string& address,
                                                           const std::shared_ptr<grpc::ChannelCredentials>& credentials,
                                                           absl::Duration connect_timeout) {
  auto channel = InternalChannel(address, credentials);
  if (!channel->WaitForConnected(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(connect_timeout))) {
    return absl::UnavailableError("is not reachable");
  }
  auto stream = std::make_unique<GrpcStageStream>(std::move(channel));
  if (!stream->Open()) return absl::UnavailableError("did not open a stage stream");
  return stream;
}

StageDialer GrpcStageDialer(std::shared_ptr<grpc::ChannelCredentials> credentials) {
  return [credentials = std::move(credentials)](const std::string& address, absl::Duration connect_timeout) {
    return DialGrpcStage(address, credentials, connect_timeout);
  };
}

StageLink::StageLink(std::string address, std::string peer_name)
    : address_(std::move(address)), peer_name_(std::move(peer_name)) {}

absl::StatusOr<std::unique_ptr<StageLink>> StageLink::Open(const std::string& address,
                                                           const std::string& peer_name,
                                                           absl::Duration connect_timeout,
                                                           ResultFn on_result, BrokenFn on_broken,
                                                           const StageDialer& dial) {
  absl::StatusOr<std::unique_ptr<StageStream>> stream = dial(address, connect_timeout);
  if (!stream.ok()) {
    return absl::UnavailableError(absl::StrCat(peer_name, " at ", address, " ", stream.status().message()));
  }
  return Start(address, peer_name, std::move(*stream), std::move(on_result), std::move(on_broken));
}

std::unique_ptr<StageLink> StageLink::Start(const std::string& address, const std::string& peer_name,
                                            std::unique_ptr<StageStream> stream, ResultFn on_result,
                                            BrokenFn on_broken) {
  std::unique_ptr<StageLink> link(new StageLink(address, peer_name));
  link->stream_ = std::move(stream);
  StageLink* raw = link.get();
  link->reader_ = std::thread([raw, on_result = std::move(on_result), on_broken = std::move(on_broken)]() mutable {
    raw->ReadLoop(std::move(on_result), std::move(on_broken));
  });
  return link;
}

StageLink::~StageLink() {
  stream_->Cancel();
  if (reader_.joinable()) reader_.join();
}

void StageLink::ReadLoop(ResultFn on_result, BrokenFn on_broken) {
  v1::StageResult r;
  while (stream_->Read(&r)) {
    on_result(std::move(r));
    r.Clear();
  }
  const absl::Status st = stream_->Finish();
  absl::Status s;
  if (st.code() == absl::StatusCode::kCancelled || st.code() == absl::StatusCode::kUnavailable || st.ok()) {
    s = absl::UnavailableError(absl::StrCat(peer_name_, " at ", address_, " is unreachable (",
                                            st.ok() ? "stream closed" : st.message(), ")"));
  } else {
    s = absl::Status(st.code(), absl::StrCat(peer_name_, " at ", address_, ": ", st.message()));
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
