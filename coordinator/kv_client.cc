#include "coordinator/kv_client.h"

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "grpcpp/grpcpp.h"

namespace strata::coordinator {

KvSessionShape ShapeOf(const ModelConfig& config, uint64_t fingerprint, uint64_t legacy_fingerprint) {
  KvSessionShape s;
  s.fingerprint = fingerprint;
  s.legacy_fingerprint = legacy_fingerprint;
  s.dims.set_n_layers(config.num_layers);
  s.dims.set_kv_lora(config.kv_lora_rank);
  s.dims.set_qk_rope(config.qk_rope_head_dim);
  for (int l = 0; l < config.num_layers; ++l) {
    if (config.indexer_slot(l) >= 0) s.indexer_layers.push_back(l);
  }
  const bool keys = config.has_dsa && !s.indexer_layers.empty();
  s.dims.set_index_hd(keys ? config.index_head_dim : 0);
  s.dims.set_nic(keys ? static_cast<int>(s.indexer_layers.size()) : 0);
  if (!keys) s.indexer_layers.clear();
  s.dims.set_vocab(config.vocab_size);
  return s;
}

KvSessionClient::KvSessionClient(std::string address, KvSessionShape shape,
                                 std::shared_ptr<grpc::ChannelCredentials> credentials, absl::Duration timeout)
    : address_(std::move(address)), shape_(std::move(shape)), timeout_(timeout) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  stub_ = v1::KVStore::NewStub(grpc::CreateCustomChannel(address_, std::move(credentials), args));
}

void KvSessionClient::SetDeadline(grpc::ClientContext* ctx) const {
  ctx->set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout_));
}

absl::Status KvSessionClient::Error(const grpc::Status& s, const std::string& what) const {
  auto code = static_cast<absl::StatusCode>(s.error_code());
  if (code == absl::StatusCode::kDeadlineExceeded) code = absl::StatusCode::kUnavailable;
  return absl::Status(code, absl::StrCat(what, " (KV store at ", address_, "): ", s.error_message()));
}

absl::StatusOr<v1::SessionInfo> KvSessionClient::Create(const std::string& id) {
  v1::CreateSessionRequest req;
  req.set_session_id(id);
  if (shape_.v4.has_value()) {
    *req.mutable_v4() = *shape_.v4;
  } else {
    *req.mutable_dims() = shape_.dims;
    for (int32_t l : shape_.indexer_layers) req.add_indexer_layers(l);
  }
  req.set_fingerprint(shape_.fingerprint);
  if (shape_.model_digest.has_value()) req.set_model_digest(*shape_.model_digest);
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::SessionInfo info;
  grpc::Status s = stub_->CreateSession(&ctx, req, &info);
  if (!s.ok()) return Error(s, absl::StrCat("creating session '", id, "'"));
  return info;
}

absl::StatusOr<v1::SessionInfo> KvSessionClient::Stat(const std::string& id) {
  v1::StatRequest req;
  req.set_session_id(id);
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::SessionInfo info;
  grpc::Status s = stub_->Stat(&ctx, req, &info);
  if (!s.ok()) return Error(s, absl::StrCat("session '", id, "'"));
  return info;
}

absl::StatusOr<v1::SessionInfo> KvSessionClient::Update(const std::string& id, std::optional<int64_t> watermark,
                                                        const std::map<std::string, std::string>& set,
                                                        const std::vector<std::string>& remove) {
  v1::UpdateSessionRequest req;
  req.set_session_id(id);
  if (watermark) req.set_turn_watermark(*watermark);
  for (const auto& [k, v] : set) (*req.mutable_set_metadata())[k] = v;
  for (const auto& k : remove) req.add_remove_metadata(k);
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::SessionInfo info;
  grpc::Status s = stub_->UpdateSession(&ctx, req, &info);
  if (!s.ok()) return Error(s, absl::StrCat("updating session '", id, "'"));
  return info;
}

absl::Status KvSessionClient::Truncate(const std::string& id, int64_t nrec, absl::Duration wait) {
  const absl::Time until = absl::Now() + wait;
  for (;;) {
    v1::TruncateRequest req;
    req.set_session_id(id);
    req.set_nrec(nrec);
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    v1::TruncateResponse resp;
    grpc::Status s = stub_->Truncate(&ctx, req, &resp);
    if (s.ok()) return absl::OkStatus();
    if (s.error_code() != grpc::StatusCode::FAILED_PRECONDITION || absl::Now() > until) {
      return Error(s, absl::StrCat("truncating session '", id, "' to ", nrec, " records"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

absl::Status KvSessionClient::Delete(const std::string& id, absl::Duration wait) {
  const absl::Time until = absl::Now() + wait;
  for (;;) {
    v1::DeleteRequest req;
    req.set_session_id(id);
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    v1::DeleteResponse resp;
    grpc::Status s = stub_->Delete(&ctx, req, &resp);
    if (s.ok()) return absl::OkStatus();
    if (s.error_code() != grpc::StatusCode::FAILED_PRECONDITION || absl::Now() > until) {
      return Error(s, absl::StrCat("deleting session '", id, "'"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

absl::StatusOr<std::vector<v1::SessionSummary>> KvSessionClient::List(const std::string& prefix) {
  std::vector<v1::SessionSummary> out;
  std::string token;
  do {
    v1::ListRequest req;
    req.set_prefix(prefix);
    req.set_page_size(1000);
    req.set_page_token(token);
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    v1::ListResponse resp;
    grpc::Status s = stub_->List(&ctx, req, &resp);
    if (!s.ok()) return Error(s, "listing sessions");
    for (auto& x : *resp.mutable_sessions()) out.push_back(std::move(x));
    token = resp.next_page_token();
  } while (!token.empty());
  return out;
}

absl::StatusOr<std::vector<int>> KvSessionClient::TokenIds(const std::string& id, int64_t begin, int64_t end) {
  std::vector<int> ids;
  if (end <= begin) return ids;
  v1::LoadRequest req;
  req.set_session_id(id);
  req.set_layer_begin(0);
  req.set_layer_end(1);
  req.set_position_begin(begin);
  req.set_position_end(end);
  req.set_fingerprint(shape_.fingerprint);
  req.set_legacy_fingerprint(shape_.legacy_fingerprint);
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  auto reader = stub_->Load(&ctx, req);
  v1::LoadChunk chunk;
  while (reader->Read(&chunk)) ids.insert(ids.end(), chunk.token_ids().begin(), chunk.token_ids().end());
  grpc::Status s = reader->Finish();
  if (!s.ok()) return Error(s, absl::StrCat("reading the token ids of session '", id, "'"));
  if (static_cast<int64_t>(ids.size()) != end - begin) {
    return absl::DataLossError(absl::StrCat("session '", id, "': ", ids.size(), " token ids for records [", begin,
                                            ", ", end, ")"));
  }
  return ids;
}

absl::Status KvSessionClient::CheckCompatible(const v1::SessionInfo& info) const {
  // Sessions saved before fingerprint version 2 record the version-1 value.
  const uint64_t ours = info.fingerprint_version() == 1 ? shape_.legacy_fingerprint : shape_.fingerprint;
  if (info.fingerprint() != ours) {
    return absl::FailedPreconditionError(
        absl::StrFormat("session '%s' was stored with model fingerprint %016x (version %d); this cluster serves "
                        "%016x (another checkpoint): use a cluster with that model or delete the session",
                        info.session_id(), info.fingerprint(), info.fingerprint_version(), ours));
  }
  if (shape_.v4.has_value() || info.format_version() == 3) {
    if (!shape_.v4.has_value() || info.format_version() != 3 ||
        info.v4().SerializeAsString() != shape_.v4->SerializeAsString()) {
      return absl::FailedPreconditionError(absl::StrCat("session '", info.session_id(),
                                                        "' has another layout than this model's: ",
                                                        info.v4().ShortDebugString(), " vs ",
                                                        shape_.v4 ? shape_.v4->ShortDebugString() : "(not V4)"));
    }
    return absl::OkStatus();
  }
  const v1::KvDims& a = info.dims();
  const v1::KvDims& b = shape_.dims;
  if (a.n_layers() != b.n_layers() || a.kv_lora() != b.kv_lora() || a.qk_rope() != b.qk_rope() ||
      a.index_hd() != b.index_hd() || a.nic() != b.nic() || a.vocab() != b.vocab()) {
    return absl::FailedPreconditionError(absl::StrCat("session '", info.session_id(),
                                                      "' has other dimensions than this model: ",
                                                      a.ShortDebugString(), " vs ", b.ShortDebugString()));
  }
  return absl::OkStatus();
}

}  // namespace strata::coordinator
