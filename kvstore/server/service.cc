#include "kvstore/server/service.h"

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "kvstore/server/reactors.h"

namespace strata::kv {
namespace {

using strata::v1::KvDims;

// Runs `fn` (returning an absl::Status), finishes the unary RPC with it and
// counts it under `method`.
template <typename Fn>
grpc::ServerUnaryReactor* RunUnary(grpc::CallbackServerContext* ctx, KvStoreMetrics* metrics, const char* method,
                                   Fn&& fn) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  absl::Status s;
  try {
    s = fn();
  } catch (const std::exception& e) {  // never let a bad request take the server down
    s = absl::InternalError(absl::StrCat("unexpected exception: ", e.what()));
  }
  const grpc::Status status = ToGrpc(s);
  metrics->Rpc(method, status.error_code())->Inc();
  LogRpcFailure(method, status);
  reactor->Finish(status);
  return reactor;
}

Dims FromProto(const KvDims& d) {
  return Dims{d.n_layers(), d.kv_lora(), d.qk_rope(), d.index_hd(), d.nic(), d.vocab()};
}

void ToProto(const Dims& d, KvDims* out) {
  out->set_n_layers(d.n_layers);
  out->set_kv_lora(d.kv_lora);
  out->set_qk_rope(d.qk_rope);
  out->set_index_hd(d.index_hd);
  out->set_nic(d.nic);
  out->set_vocab(d.vocab);
}

}  // namespace

void LogRpcFailure(std::string_view method, const grpc::Status& status) {
  switch (status.error_code()) {
    case grpc::StatusCode::OK:
    case grpc::StatusCode::NOT_FOUND:       // a lookup's answer
    case grpc::StatusCode::ALREADY_EXISTS:  // a create's answer
    case grpc::StatusCode::CANCELLED:       // the client went away
      return;
    default:
      log::Warn("rpc_failed", {{"method", method},
                               {"code", absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code()))},
                               {"error", status.error_message()}});
  }
}

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

void FillSessionInfo(const SessionInfo& info, strata::v1::SessionInfo* out) {
  out->set_session_id(info.id);
  ToProto(info.manifest.dims, out->mutable_dims());
  for (int32_t l : info.manifest.indexer_layers) out->add_indexer_layers(l);
  out->set_fingerprint(info.manifest.fingerprint);
  out->set_fingerprint_version(info.manifest.fingerprint_version);
  out->set_nrec(info.nrec);
  out->set_turn_watermark(info.manifest.turn_watermark);
  for (const auto& [k, v] : info.manifest.metadata) (*out->mutable_metadata())[k] = v;
  out->set_format_version(info.version == Version::kV1 ? 1 : 2);
  out->set_file_bytes(info.file_bytes);
  for (const LayerRange& r : info.writers) {
    strata::v1::LayerRange* w = out->add_writers();
    w->set_begin(r.begin);
    w->set_end(r.end);
  }
}

V3Header FromProto(const strata::v1::V4Layout& l) {
  V3Header h;
  h.head_dim = l.head_dim();
  h.rope_dim = l.rope_dim();
  h.index_hd = l.index_hd();
  h.window = l.window();
  h.vocab = l.vocab();
  h.row_format = static_cast<V3RowFormat>(l.row_format());
  for (int i = 0; i < l.layer_kinds_size(); ++i) {
    h.layers.push_back({static_cast<V3Kind>(l.layer_kinds(i)), i < l.layer_rates_size() ? l.layer_rates(i) : -1});
  }
  return h;
}

void ToProto(const V3Header& h, strata::v1::V4Layout* out) {
  out->set_head_dim(h.head_dim);
  out->set_rope_dim(h.rope_dim);
  out->set_index_hd(h.index_hd);
  out->set_window(h.window);
  out->set_vocab(h.vocab);
  out->set_row_format(static_cast<int32_t>(h.row_format));
  for (const V3Layer& l : h.layers) {
    out->add_layer_kinds(static_cast<int32_t>(l.kind));
    out->add_layer_rates(l.rate);
  }
}

void FillSessionInfo(const V3SessionInfo& info, strata::v1::SessionInfo* out) {
  out->set_session_id(info.id);
  ToProto(info.header, out->mutable_v4());
  out->set_fingerprint(info.manifest.fingerprint);
  out->set_fingerprint_version(info.manifest.fingerprint_version);
  out->set_nrec(info.nrec);
  out->set_turn_watermark(info.manifest.turn_watermark);
  for (const auto& [k, v] : info.manifest.metadata) (*out->mutable_metadata())[k] = v;
  out->set_format_version(3);
  out->set_file_bytes(info.file_bytes);
  for (const LayerRange& r : info.writers) {
    strata::v1::LayerRange* w = out->add_writers();
    w->set_begin(r.begin);
    w->set_end(r.end);
  }
}

grpc::ServerUnaryReactor* KvStoreService::CreateSession(grpc::CallbackServerContext* ctx,
                                                        const strata::v1::CreateSessionRequest* req,
                                                        strata::v1::SessionInfo* resp) {
  return RunUnary(ctx, metrics_, "CreateSession", [&]() -> absl::Status {
    if (req->has_v4()) {
      if (req->has_dims() || req->indexer_layers_size() > 0) {
        return absl::InvalidArgumentError("a V4 session (v4 set) has no dims or indexer_layers");
      }
      const strata::v1::V4Layout& l = req->v4();
      if (l.layer_kinds_size() != l.layer_rates_size()) {
        return absl::InvalidArgumentError("v4.layer_kinds and v4.layer_rates differ in length");
      }
      for (int i = 0; i < l.layer_kinds_size(); ++i) {
        if (l.layer_kinds(i) < 0 || l.layer_kinds(i) > 2) return absl::InvalidArgumentError("unknown layer kind");
      }
      if (l.row_format() < 0 || l.row_format() > 1) return absl::InvalidArgumentError("unknown row format");
      V3SessionSpec spec;
      spec.header = FromProto(l);
      spec.fingerprint = req->fingerprint();
      if (req->has_model_digest()) spec.model_digest = req->model_digest();
      spec.metadata.insert(req->metadata().begin(), req->metadata().end());
      absl::StatusOr<std::shared_ptr<V3Session>> s = store_->CreateV3(req->session_id(), spec);
      if (!s.ok()) return s.status();
      log::Info("session_create", {{"session_id", req->session_id()}, {"layers", l.layer_kinds_size()}});
      FillSessionInfo((*s)->Info(), resp);
      return absl::OkStatus();
    }
    SessionSpec spec;
    spec.dims = FromProto(req->dims());
    spec.indexer_layers.assign(req->indexer_layers().begin(), req->indexer_layers().end());
    spec.fingerprint = req->fingerprint();
    if (req->has_model_digest()) spec.model_digest = req->model_digest();
    spec.metadata.insert(req->metadata().begin(), req->metadata().end());
    absl::StatusOr<std::shared_ptr<Session>> s = store_->Create(req->session_id(), spec);
    if (!s.ok()) return s.status();
    log::Info("session_create", {{"session_id", req->session_id()}, {"layers", spec.dims.n_layers}});
    FillSessionInfo((*s)->Info(), resp);
    return absl::OkStatus();
  });
}

grpc::ServerBidiReactor<strata::v1::AppendRequest, strata::v1::AppendResponse>*
KvStoreService::Append(grpc::CallbackServerContext* ctx) {
  return NewAppendReactor(store_, metrics_);
}

grpc::ServerUnaryReactor* KvStoreService::Truncate(grpc::CallbackServerContext* ctx,
                                                   const strata::v1::TruncateRequest* req,
                                                   strata::v1::TruncateResponse* resp) {
  return RunUnary(ctx, metrics_, "Truncate", [&]() -> absl::Status {
    absl::StatusOr<Store::AnySession> s = store_->GetAny(req->session_id());
    if (!s.ok()) return s.status();
    if (s->v3) {
      if (absl::Status t = s->v3->Truncate(req->nrec()); !t.ok()) return t;
      resp->set_nrec(s->v3->nrec());
    } else {
      if (absl::Status t = s->v2->Truncate(req->nrec()); !t.ok()) return t;
      resp->set_nrec(s->v2->nrec());
    }
    log::Info("session_truncate", {{"session_id", req->session_id()}, {"records", req->nrec()}});
    return absl::OkStatus();
  });
}

grpc::ServerWriteReactor<strata::v1::LoadChunk>* KvStoreService::Load(
    grpc::CallbackServerContext* ctx, const strata::v1::LoadRequest* req) {
  return NewLoadReactor(store_, metrics_, *req, options_.load_chunk_bytes);
}

grpc::ServerUnaryReactor* KvStoreService::Stat(grpc::CallbackServerContext* ctx,
                                               const strata::v1::StatRequest* req,
                                               strata::v1::SessionInfo* resp) {
  return RunUnary(ctx, metrics_, "Stat", [&]() -> absl::Status {
    absl::StatusOr<Store::AnySession> s = store_->GetAny(req->session_id());
    if (!s.ok()) return s.status();
    if (s->v3) {
      FillSessionInfo(s->v3->Info(), resp);
    } else {
      FillSessionInfo(s->v2->Info(), resp);
    }
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KvStoreService::List(grpc::CallbackServerContext* ctx,
                                               const strata::v1::ListRequest* req,
                                               strata::v1::ListResponse* resp) {
  return RunUnary(ctx, metrics_, "List", [&]() -> absl::Status {
    if (req->page_size() < 0) return absl::InvalidArgumentError("page_size must be >= 0");
    bool more = false;
    absl::StatusOr<std::vector<SessionSummary>> list =
        store_->List(req->prefix(), req->page_token(), static_cast<size_t>(req->page_size()), &more);
    if (!list.ok()) return list.status();
    for (const SessionSummary& s : *list) {
      strata::v1::SessionSummary* out = resp->add_sessions();
      out->set_session_id(s.id);
      out->set_nrec(s.nrec);
      out->set_file_bytes(s.file_bytes);
      if (!s.problem.ok()) out->set_problem(s.problem.ToString());
    }
    if (more && !list->empty()) resp->set_next_page_token(list->back().id);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KvStoreService::Delete(grpc::CallbackServerContext* ctx,
                                                 const strata::v1::DeleteRequest* req,
                                                 strata::v1::DeleteResponse* resp) {
  return RunUnary(ctx, metrics_, "Delete", [&]() {
    absl::Status s = store_->Delete(req->session_id());
    if (s.ok()) log::Info("session_delete", {{"session_id", req->session_id()}});
    return s;
  });
}

grpc::ServerUnaryReactor* KvStoreService::UpdateSession(
    grpc::CallbackServerContext* ctx, const strata::v1::UpdateSessionRequest* req,
    strata::v1::SessionInfo* resp) {
  return RunUnary(ctx, metrics_, "UpdateSession", [&]() -> absl::Status {
    absl::StatusOr<Store::AnySession> s = store_->GetAny(req->session_id());
    if (!s.ok()) return s.status();
    std::optional<int64_t> watermark;
    if (req->has_turn_watermark()) watermark = req->turn_watermark();
    std::map<std::string, std::string> set(req->set_metadata().begin(), req->set_metadata().end());
    std::vector<std::string> remove(req->remove_metadata().begin(), req->remove_metadata().end());
    if (s->v3) {
      if (absl::Status u = s->v3->Update(watermark, set, remove); !u.ok()) return u;
      FillSessionInfo(s->v3->Info(), resp);
      return absl::OkStatus();
    }
    if (absl::Status u = s->v2->Update(watermark, set, remove); !u.ok()) return u;
    FillSessionInfo(s->v2->Info(), resp);
    return absl::OkStatus();
  });
}

}  // namespace strata::kv
