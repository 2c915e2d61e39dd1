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
      absl::StatusOr<std::shared_ptr<Session>> s = store_->Get(o.session_id(), ExpectedModel(o));
      if (!s.ok()) return s.status();
      std::optional<int64_t> start;
      if (o.has_start_position()) start = o.start_position();
      absl::StatusOr<Session::WriterGrant> g =
          (*s)->OpenWriter(o.layer_begin(), o.layer_end(), start, listener_);
      if (!g.ok()) return g.status();
      {
        absl::MutexLock lock(&mu_);
        session_ = *s;
        writer_id_ = g->writer_id;
        opened_ = true;
        AppendResponse r;
        r.mutable_opened()->set_nrec(g->nrec);
        r.mutable_opened()->set_next_position(g->next_position);
        r.mutable_opened()->set_slice_bytes(g->slice_bytes);
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
    int64_t writer;
    {
      absl::MutexLock lock(&mu_);
      session = session_;
      writer = writer_id_;
    }
    const strata::v1::AppendRows& rows = request_.rows();
    const std::span<const int32_t> tokens(rows.token_ids().data(),
                                          static_cast<size_t>(rows.token_ids_size()));
    const auto t0 = std::chrono::steady_clock::now();
    absl::Status s = session->Write(writer, rows.position(), tokens, rows.rows());
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
      } else if (reads_done_ && session_->WriterDurable(writer_id_)) {
        const int64_t nrec = session_->nrec();
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
    int64_t writer = 0;
    {
      absl::MutexLock lock(&mu_);
      session = session_;
      writer = opened_ && !writer_closed_ ? writer_id_ : 0;
      writer_closed_ = true;
    }
    if (session && writer != 0) session->CloseWriter(writer);
  }

  Store* const store_;
  KvStoreMetrics* const metrics_;
  const std::shared_ptr<Listener> listener_;
  std::atomic<int> refs_{1};  // gRPC's, plus one per running notification
  AppendRequest request_;     // used by one read at a time

  absl::Mutex mu_;
  std::shared_ptr<Session> session_ ABSL_GUARDED_BY(mu_);
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
    absl::StatusOr<std::shared_ptr<Session>> s = store->Get(req.session_id(), ExpectedModel(req));
    if (!s.ok()) return s.status();
    session_ = *s;
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
    if (req.max_chunk_bytes() < 0) return absl::InvalidArgumentError("max_chunk_bytes < 0");
    const int64_t chunk = req.max_chunk_bytes() > 0 ? std::min(req.max_chunk_bytes(), kMaxChunkBytes)
                                                    : default_chunk_bytes;
    per_chunk_ = std::max<int64_t>(1, chunk / std::max<int64_t>(1, session_->SliceBytes(begin_, end_)));
    return absl::OkStatus();
  }

  void Next() {
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
