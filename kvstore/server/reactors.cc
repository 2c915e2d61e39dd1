#include "kvstore/server/reactors.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "kvstore/server/service.h"
#include "kvstore/session.h"
#include "kvstore/session_v3.h"

namespace strata::kv {
namespace {

using strata::v1::AppendRequest;
using strata::v1::AppendResponse;
using strata::v1::LoadChunk;
using strata::v1::LoadRequest;

constexpr int64_t kMaxChunkBytes = int64_t{64} << 20;

// The model a request says it computes with (AppendOpen, LoadRequest): none
// when it sends no fingerprint.
template <typename Request>
std::optional<ModelIdentity> ExpectedModel(const Request& r) {
  if (!r.has_fingerprint()) return std::nullopt;
  std::optional<uint64_t> legacy;
  if (r.has_legacy_fingerprint()) legacy = r.legacy_fingerprint();
  return ModelIdentity(r.fingerprint(), legacy);
}

class AppendReactor final : public grpc::ServerBidiReactor<AppendRequest, AppendResponse> {
 public:
  AppendReactor(Store* store, KvStoreMetrics* metrics)
      : store_(store), metrics_(metrics), listener_(std::make_shared<Listener>(this)) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;  // no more reads once the status is decided
    }
    if (!ok) {  // the client half-closed (or the call is going away)
      {
        absl::MutexLock lock(&mu_);
        reads_done_ = true;
      }
      Pump();
      return;
    }
    absl::Status s = Handle();
    if (!s.ok()) {
      FinishOnce(ToGrpc(s));
      return;
    }
    StartRead(&request_);
  }

  void OnWriteDone(bool ok) override {
    std::optional<grpc::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (deferred_finish_.has_value()) {
        finish = std::move(deferred_finish_);
        deferred_finish_.reset();
      } else if (!ok && !finished_) {
        finished_ = true;
        finish = grpc::Status(grpc::StatusCode::CANCELLED, "the client stopped reading");
      }
    }
    if (finish.has_value()) {
      CloseWriter();
      Done(*finish);
      return;
    }
    Pump();
  }

  void OnCancel() override { FinishOnce(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled")); }

  void OnDone() override {
    CloseWriter();
    listener_->Detach();
    Unref();
  }

 private:
  // Forwards commit notifications while the reactor lives; holds a
  // reference across each call so that OnDone cannot delete it meanwhile.
  class Listener final : public CommitListener {
   public:
    explicit Listener(AppendReactor* r) : reactor_(r) {}
    void OnCommitted(int64_t nrec) override {
      if (AppendReactor* r = Acquire()) {
        r->HandleCommitted(nrec);
        r->Unref();
      }
    }
    void OnFailed(const absl::Status& s) override {
      if (AppendReactor* r = Acquire()) {
        r->FinishOnce(ToGrpc(s));
        r->Unref();
      }
    }
    void Detach() {
      absl::MutexLock lock(&mu_);
      reactor_ = nullptr;
    }

   private:
    AppendReactor* Acquire() {
      absl::MutexLock lock(&mu_);
      if (reactor_ != nullptr) reactor_->Ref();
      return reactor_;
    }
    absl::Mutex mu_;
    AppendReactor* reactor_ ABSL_GUARDED_BY(mu_);
  };

  void Ref() { refs_.fetch_add(1, std::memory_order_relaxed); }
  void Unref() {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

  absl::Status Handle() {
    bool opened;
    {
      absl::MutexLock lock(&mu_);
      opened = opened_;
    }
    if (!opened) {
      if (!request_.has_open()) {
        return absl::InvalidArgumentError("the first message of an Append stream must be `open`");
      }
      const strata::v1::AppendOpen& o = request_.open();
      absl::StatusOr<Store::AnySession> s = store_->GetAny(o.session_id(), ExpectedModel(o));
      if (!s.ok()) return s.status();
      std::optional<int64_t> start;
      if (o.has_start_position()) start = o.start_position();
      absl::StatusOr<Session::WriterGrant> g =
          s->v3 ? s->v3->OpenWriter(o.layer_begin(), o.layer_end(), start, listener_)
                : s->v2->OpenWriter(o.layer_begin(), o.layer_end(), start, listener_);
      if (!g.ok()) return g.status();
      {
        absl::MutexLock lock(&mu_);
        session_ = s->v2;
        v3_ = s->v3;
        writer_id_ = g->writer_id;
        opened_ = true;
        AppendResponse r;
        r.mutable_opened()->set_nrec(g->nrec);
        r.mutable_opened()->set_next_position(g->next_position);
        r.mutable_opened()->set_slice_bytes(g->slice_bytes);
        if (v3_) r.mutable_opened()->set_live_tokens(v3_->layout().live_tokens());
        pending_opened_ = std::move(r);
        sent_nrec_ = g->nrec;
      }
      Pump();
      return absl::OkStatus();
    }
    if (!request_.has_rows()) {
      return absl::InvalidArgumentError("after `open`, an Append stream carries only `rows`");
    }
    std::shared_ptr<Session> session;
    std::shared_ptr<V3Session> v3;
    int64_t writer;
    {
      absl::MutexLock lock(&mu_);
      session = session_;
      v3 = v3_;
      writer = writer_id_;
    }
    const strata::v1::AppendRows& rows = request_.rows();
    const std::span<const int32_t> tokens(rows.token_ids().data(),
                                          static_cast<size_t>(rows.token_ids_size()));
    const auto t0 = std::chrono::steady_clock::now();
    absl::Status s;
    if (v3) {
      s = v3->Write(writer, rows.position(), tokens, rows.rows(), rows.blocks());
    } else if (!rows.blocks().empty()) {
      s = absl::InvalidArgumentError("block records belong to v3 sessions only");
    } else {
      s = session->Write(writer, rows.position(), tokens, rows.rows());
    }
    metrics_->append_seconds->Observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    if (s.ok()) metrics_->bytes_appended->Inc(static_cast<double>(rows.rows().size()));
    return s;
  }

  void HandleCommitted(int64_t nrec) {
    {
      absl::MutexLock lock(&mu_);
      commit_nrec_ = std::max(commit_nrec_, nrec);
    }
    Pump();
  }

  // Starts the next write, or finishes a drained stream. gRPC is called
  // without mu_ held (a reaction may run inline).
  void Pump() {
    bool write = false;
    bool finish = false;
    grpc::Status finish_status = grpc::Status::OK;
    {
      absl::MutexLock lock(&mu_);
      if (finished_ || writing_) return;
      if (pending_opened_.has_value()) {
        response_ = std::move(*pending_opened_);
        pending_opened_.reset();
        write = true;
      } else if (opened_ && commit_nrec_ > sent_nrec_) {
        response_.Clear();
        response_.mutable_committed()->set_nrec(commit_nrec_);
        sent_nrec_ = commit_nrec_;
        write = true;
      } else if (reads_done_ && !opened_) {
        // Ended (or sent something unparsable: the callback API reports both
        // as a failed read) before `open`.
        finished_ = true;
        finish = true;
        finish_status = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                     "the Append stream ended before a valid `open` message");
      } else if (reads_done_ && (v3_ ? v3_->WriterDurable(writer_id_) : session_->WriterDurable(writer_id_))) {
        const int64_t nrec = v3_ ? v3_->nrec() : session_->nrec();
        if (nrec > sent_nrec_) {  // the last Committed before OK
          response_.Clear();
          response_.mutable_committed()->set_nrec(nrec);
          sent_nrec_ = nrec;
          write = true;
        } else {
          finished_ = true;
          finish = true;
        }
      }
      if (write) writing_ = true;
    }
    if (write) {
      StartWrite(&response_);
    } else if (finish) {
      CloseWriter();
      Done(finish_status);
    }
  }

  void FinishOnce(const grpc::Status& status) {
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      finished_ = true;
      if (writing_) {  // finish after the write in flight (OnWriteDone)
        deferred_finish_ = status;
        return;
      }
    }
    CloseWriter();
    Done(status);
  }

  // Finish, counted.
  void Done(const grpc::Status& status) {
    metrics_->Rpc("Append", status.error_code())->Inc();
    LogRpcFailure("Append", status);
    Finish(status);
  }

  // Releases the layer range before the client can see the status, so that
  // a retry does not find its own stream still holding it.
  void CloseWriter() {
    std::shared_ptr<Session> session;
    std::shared_ptr<V3Session> v3;
    int64_t writer = 0;
    {
      absl::MutexLock lock(&mu_);
      session = session_;
      v3 = v3_;
      writer = opened_ && !writer_closed_ ? writer_id_ : 0;
      writer_closed_ = true;
    }
    if (session && writer != 0) session->CloseWriter(writer);
    if (v3 && writer != 0) v3->CloseWriter(writer);
  }

  Store* const store_;
  KvStoreMetrics* const metrics_;
  const std::shared_ptr<Listener> listener_;
  std::atomic<int> refs_{1};  // gRPC's, plus one per running notification
  AppendRequest request_;     // used by one read at a time

  absl::Mutex mu_;
  std::shared_ptr<Session> session_ ABSL_GUARDED_BY(mu_);  // a v1/v2 session, or
  std::shared_ptr<V3Session> v3_ ABSL_GUARDED_BY(mu_);     // a v3 one
  int64_t writer_id_ ABSL_GUARDED_BY(mu_) = 0;
  bool opened_ ABSL_GUARDED_BY(mu_) = false;
  bool writer_closed_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<grpc::Status> deferred_finish_ ABSL_GUARDED_BY(mu_);
  std::optional<AppendResponse> pending_opened_ ABSL_GUARDED_BY(mu_);
  int64_t commit_nrec_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t sent_nrec_ ABSL_GUARDED_BY(mu_) = -1;
  AppendResponse response_;  // the write in flight (written under mu_ before StartWrite)
};

class LoadReactor final : public grpc::ServerWriteReactor<LoadChunk> {
 public:
  LoadReactor(Store* store, KvStoreMetrics* metrics, const LoadRequest& req, int64_t default_chunk_bytes)
      : metrics_(metrics) {
    if (absl::Status s = Init(store, req, default_chunk_bytes); !s.ok()) {
      Done(ToGrpc(s));
      return;
    }
    Next();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Done(grpc::Status(grpc::StatusCode::CANCELLED, "the client stopped reading"));
      return;
    }
    Next();
  }

  void OnDone() override { delete this; }

 private:
  absl::Status Init(Store* store, const LoadRequest& req, int64_t default_chunk_bytes) {
    absl::StatusOr<Store::AnySession> s = store->GetAny(req.session_id(), ExpectedModel(req));
    if (!s.ok()) return s.status();
    if (req.max_chunk_bytes() < 0) return absl::InvalidArgumentError("max_chunk_bytes < 0");
    if (s->v3) return InitV3(*s->v3, req, default_chunk_bytes);
    session_ = s->v2;
    begin_ = req.layer_begin();
    end_ = req.layer_end();
    if (begin_ == 0 && end_ == 0) end_ = session_->dims().n_layers;
    if (begin_ < 0 || begin_ >= end_ || end_ > session_->dims().n_layers) {
      return absl::InvalidArgumentError(absl::StrCat("layer range [", begin_, ", ", end_,
                                                     ") is not within [0, ",
                                                     session_->dims().n_layers, ")"));
    }
    nrec_ = session_->nrec();
    pos_ = req.position_begin();
    stop_ = req.position_end() == 0 ? nrec_ : req.position_end();
    if (pos_ < 0 || stop_ < pos_ || stop_ > nrec_) {
      return absl::OutOfRangeError(absl::StrCat("tokens [", pos_, ", ", stop_,
                                                ") are not within the ", nrec_,
                                                " committed records"));
    }
    const int64_t chunk = req.max_chunk_bytes() > 0 ? std::min(req.max_chunk_bytes(), kMaxChunkBytes)
                                                    : default_chunk_bytes;
    per_chunk_ = std::max<int64_t>(1, chunk / std::max<int64_t>(1, session_->SliceBytes(begin_, end_)));
    return absl::OkStatus();
  }

  // A v3 session loads whole (docs/coli-kv.md, "V4 sessions in the KV
  // store"): the live token parts, then the block records.
  absl::Status InitV3(const V3Session& v3, const LoadRequest& req, int64_t default_chunk_bytes) {
    const V3Layout& L = v3.layout();
    begin_ = req.layer_begin();
    end_ = req.layer_end();
    if (begin_ == 0 && end_ == 0) end_ = L.num_layers();
    const int64_t nrec = v3.nrec();
    if (req.position_begin() != 0 || (req.position_end() != 0 && req.position_end() != nrec)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "a v3 (DeepSeek-V4) session loads whole, at its ", nrec, " committed tokens; asked for tokens [",
          req.position_begin(), ", ", req.position_end(), ")"));
    }
    v3_ = std::make_unique<V3RangeState>();
    if (absl::Status st = v3.Read(begin_, end_, v3_.get()); !st.ok()) return st;
    chunk_bytes_ = req.max_chunk_bytes() > 0 ? std::min(req.max_chunk_bytes(), kMaxChunkBytes) : default_chunk_bytes;
    slice_ = L.slice_bytes(begin_, end_);
    per_chunk_ = std::max<int64_t>(1, chunk_bytes_ / std::max<int64_t>(1, slice_));
    pos_ = v3_->first;
    stop_ = v3_->nrec;
    nrec_ = v3_->nrec;
    for (const auto& [l, b] : L.Closes(0, nrec_)) {
      if (l >= begin_ && l < end_) block_sizes_.push_back(L.block_bytes(l));
    }
    return absl::OkStatus();
  }

  void NextV3() {
    chunk_.Clear();
    chunk_.set_nrec(nrec_);
    if (pos_ < stop_ || !sent_any_) {
      const int64_t k = std::min(per_chunk_, stop_ - pos_);
      chunk_.set_position(pos_);
      const size_t i = static_cast<size_t>(pos_ - v3_->first);
      chunk_.mutable_token_ids()->Add(v3_->tokens.begin() + i, v3_->tokens.begin() + i + k);
      chunk_.set_rows(v3_->slices.substr(i * slice_, k * slice_));
      pos_ += k;
    } else if (block_next_ < block_sizes_.size()) {
      const size_t from = block_at_;
      do {
        block_at_ += static_cast<size_t>(block_sizes_[block_next_++]);
      } while (block_next_ < block_sizes_.size() &&
               static_cast<int64_t>(block_at_ - from) + block_sizes_[block_next_] <= chunk_bytes_);
      chunk_.set_position(stop_);
      chunk_.set_blocks(v3_->blocks.substr(from, block_at_ - from));
    } else {
      Finish(grpc::Status::OK);
      return;
    }
    sent_any_ = true;
    StartWrite(&chunk_);
  }

  void Next() {
    if (v3_) {
      NextV3();
      return;
    }
    if (pos_ >= stop_) {
      Done(grpc::Status::OK);
      return;
    }
    const int64_t k = std::min(per_chunk_, stop_ - pos_);
    std::vector<int32_t> tokens;
    chunk_.Clear();
    absl::Status s = session_->Read(pos_, k, begin_, end_, &tokens, chunk_.mutable_rows());
    if (!s.ok()) {
      Done(ToGrpc(s));
      return;
    }
    metrics_->bytes_read->Inc(static_cast<double>(chunk_.rows().size()));
    chunk_.set_position(pos_);
    chunk_.mutable_token_ids()->Add(tokens.begin(), tokens.end());
    chunk_.set_nrec(nrec_);
    pos_ += k;
    StartWrite(&chunk_);
  }

  // Finish, counted.
  void Done(const grpc::Status& status) {
    metrics_->Rpc("Load", status.error_code())->Inc();
    LogRpcFailure("Load", status);
    Finish(status);
  }

  KvStoreMetrics* const metrics_;
  std::shared_ptr<Session> session_;
  std::unique_ptr<V3RangeState> v3_;  // a v3 session's state, read whole
  int64_t slice_ = 0, chunk_bytes_ = 0;
  std::vector<int64_t> block_sizes_;
  size_t block_next_ = 0, block_at_ = 0;
  bool sent_any_ = false;
  int32_t begin_ = 0, end_ = 0;
  int64_t nrec_ = 0, pos_ = 0, stop_ = 0, per_chunk_ = 1;
  LoadChunk chunk_;
};

}  // namespace

grpc::ServerBidiReactor<AppendRequest, AppendResponse>* NewAppendReactor(Store* store, KvStoreMetrics* metrics) {
  return new AppendReactor(store, metrics);
}

grpc::ServerWriteReactor<LoadChunk>* NewLoadReactor(Store* store, KvStoreMetrics* metrics, const LoadRequest& req,
                                                    int64_t default_chunk_bytes) {
  return new LoadReactor(store, metrics, req, default_chunk_bytes);
}

}  // namespace strata::kv
