#include "worker/kv_persist.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "grpcpp/grpcpp.h"
#include "strata/v1/kvstore.grpc.pb.h"

namespace strata::worker {
namespace {

class Core;
class AppendStream;

absl::Status FromGrpc(const grpc::Status& s, const std::string& context) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), absl::StrCat(context, ": ", s.error_message()));
}

// Codes after which reopening the stream cannot help.
bool Permanent(absl::StatusCode c) {
  return c == absl::StatusCode::kInvalidArgument || c == absl::StatusCode::kNotFound ||
         c == absl::StatusCode::kOutOfRange || c == absl::StatusCode::kDataLoss ||
         c == absl::StatusCode::kUnimplemented;
}

// The rows of consecutive tokens handed over by one Append call.
struct Entry {
  int64_t first = 0;
  std::vector<int32_t> tokens;
  std::string rows;  // tokens.size() slices
};

// One appender's state, shared by its owner handle, its current stream and
// the core's retry loop. Every field is guarded by mu_. gRPC operations are
// started without mu_ held; `starting_` counts operations being started
// outside the lock so that the stream's hold is released only after them.
class AppendState : public std::enable_shared_from_this<AppendState> {
 public:
  AppendState(std::shared_ptr<Core> core, AppenderSpec spec);

  // Owner side.
  void Append(int first, const std::vector<int>& tokens, const SequenceKv& kv);
  void Close();
  int64_t committed() const {
    std::lock_guard<std::mutex> l(mu_);
    return committed_;
  }
  absl::Status status() const {
    std::lock_guard<std::mutex> l(mu_);
    return status_;
  }

  // Core side: starts a stream when none is running and a retry is due.
  // Returns false once the state is finished (the core forgets it).
  bool Tick(absl::Time now, bool stopping);
  void CancelStream();

  // Stream side.
  void OnOpenedOrCommitted(const v1::AppendResponse& r);
  void OnWriteDone(bool ok);
  void OnReadFailed();
  void OnStreamDone(const grpc::Status& s);

 private:
  void Pump();
  // Marks the appender failed for good; returns the stream to cancel (see
  // ReserveLocked) or null.
  AppendStream* FailLocked(const absl::Status& s);
  void TrimLocked();
  bool NextMessageLocked(v1::AppendRequest* msg);
  // Creates a stream (no operation started yet) and the open message.
  AppendStream* NewStreamLocked(v1::AppendRequest* open);
  // Reserves the current stream for an operation started after mu_ is
  // released: the stream cannot be deleted until Unreserve. Null when there
  // is no stream or it may already be ending.
  AppendStream* ReserveLocked();
  void Unreserve(AppendStream* s);
  void CancelReserved(AppendStream* s);
  void Log(const std::string& what) const;

  const std::shared_ptr<Core> core_;
  const AppenderSpec spec_;
  const int64_t slice_bytes_;

  mutable std::mutex mu_;
  std::deque<Entry> buffer_;  // uncommitted rows, consecutive positions
  size_t buffered_bytes_ = 0;
  int64_t end_;               // position after the last row handed over
  int64_t committed_ = 0;
  bool first_open_ = true;
  AppendStream* stream_ = nullptr;
  bool opened_ = false, writing_ = false, writes_done_ = false, read_failed_ = false, hold_released_ = false;
  int starting_ = 0;
  int64_t sent_ = 0;          // next position to send on the current stream
  bool closing_ = false, done_ = false;
  absl::Status status_;
  int failures_ = 0;
  absl::Time retry_at_ = absl::InfinitePast();
  absl::Time close_deadline_ = absl::InfiniteFuture();
};

// The shared part of a client: the stub, the appenders alive, the retry
// thread, and the counters.
class Core : public std::enable_shared_from_this<Core> {
 public:
  explicit Core(KvStoreClientOptions options) : options_(std::move(options)) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    channel_ = grpc::CreateCustomChannel(options_.address, options_.credentials, args);
    stub_ = v1::KVStore::NewStub(channel_);
  }

  void Start() {
    thread_ = std::thread([self = shared_from_this()] { self->Loop(); });
  }

  // Waits up to `drain` for the appenders to deliver their rows, then
  // cancels every stream and waits (at most 5 s) for them to end.
  void Shutdown(absl::Duration drain) {
    std::vector<std::shared_ptr<AppendState>> states;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait_for(l, absl::ToChronoMilliseconds(drain), [&] { return states_.empty(); });
      stop_ = true;
      states.assign(states_.begin(), states_.end());
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    for (auto& s : states) s->CancelStream();
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait_for(l, std::chrono::seconds(5), [&] { return live_streams_ == 0; });
    states_.clear();  // the states hold the core: break the cycle
    // The channel is released here, on the caller's thread: the last
    // reference to a channel must never be dropped on a gRPC callback thread
    // (the core may outlive this call inside a stream's OnDone; grpc 1.51
    // then tears down its callback queue from one of that queue's own
    // threads). Streams that did not end in time keep it alive for good.
    stub_.reset();
    if (live_streams_ == 0) {
      channel_.reset();
    } else {
      new std::shared_ptr<grpc::Channel>(std::move(channel_));  // deliberately never freed
    }
  }

  void Add(std::shared_ptr<AppendState> s) {
    {
      std::lock_guard<std::mutex> l(mu_);
      states_.insert(std::move(s));
    }
    cv_.notify_all();
  }
  void Wake() { cv_.notify_all(); }
  bool stopping() {
    std::lock_guard<std::mutex> l(mu_);
    return stop_;
  }
  void StreamStarted() {
    std::lock_guard<std::mutex> l(mu_);
    ++live_streams_;
  }
  void StreamEnded() {
    {
      std::lock_guard<std::mutex> l(mu_);
      --live_streams_;
    }
    cv_.notify_all();
  }

  const KvStoreClientOptions& options() const { return options_; }
  v1::KVStore::Stub* stub() { return stub_.get(); }
  std::atomic<int64_t> rows_committed{0};

 private:
  void Loop() {
    std::unique_lock<std::mutex> l(mu_);
    while (!stop_) {
      cv_.wait_for(l, std::chrono::milliseconds(50));
      if (stop_) break;
      std::vector<std::shared_ptr<AppendState>> states(states_.begin(), states_.end());
      l.unlock();
      const absl::Time now = absl::Now();
      std::vector<std::shared_ptr<AppendState>> finished;
      for (auto& s : states) {
        if (!s->Tick(now, false)) finished.push_back(s);
      }
      l.lock();
      for (auto& s : finished) states_.erase(s);
      if (!finished.empty()) cv_.notify_all();
    }
  }

  const KvStoreClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::KVStore::Stub> stub_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  int live_streams_ = 0;
  std::set<std::shared_ptr<AppendState>> states_;
  std::thread thread_;
};

// One Append stream (callback API). A read is outstanding from the start
// until the stream ends; writes come from the state, one at a time. The
// reactor holds itself (AddHold) until its read has failed and no write is
// being started, so OnDone never races a StartWrite.
class AppendStream final : public grpc::ClientBidiReactor<v1::AppendRequest, v1::AppendResponse> {
 public:
  AppendStream(std::shared_ptr<AppendState> state, std::shared_ptr<Core> core)
      : state_(std::move(state)), core_(std::move(core)) {
    core_->StreamStarted();
    core_->stub()->async()->Append(&ctx_, this);
    AddHold();
  }
  // Sends `open` and starts reading. Called once, without the state's lock
  // (reactions may run inline).
  void Start(v1::AppendRequest open) {
    out_ = std::move(open);
    StartRead(&in_);
    StartWrite(&out_);
    StartCall();
  }

  void Write(v1::AppendRequest msg) {
    out_ = std::move(msg);
    StartWrite(&out_);
  }
  void Close() { StartWritesDone(); }
  void Release() { RemoveHold(); }
  void Cancel() { ctx_.TryCancel(); }

  void OnWriteDone(bool ok) override { state_->OnWriteDone(ok); }
  void OnReadDone(bool ok) override {
    if (!ok) {
      state_->OnReadFailed();
      return;
    }
    state_->OnOpenedOrCommitted(in_);
    StartRead(&in_);
  }
  void OnDone(const grpc::Status& s) override {
    state_->OnStreamDone(s);
    std::shared_ptr<Core> core = core_;  // may hold the last reference
    delete this;
    core->StreamEnded();
  }

 private:
  std::shared_ptr<AppendState> state_;
  const std::shared_ptr<Core> core_;
  grpc::ClientContext ctx_;
  v1::AppendRequest out_;
  v1::AppendResponse in_;
};

AppendState::AppendState(std::shared_ptr<Core> core, AppenderSpec spec)
    : core_(std::move(core)), spec_(std::move(spec)), slice_bytes_(spec_.layout.slice_bytes()),
      end_(spec_.first_position) {}

void AppendState::Log(const std::string& what) const {
  log::Warn("kv_append", {{"kvstore", core_->options().address}, {"session_id", spec_.session_id},
                          {"layer_begin", spec_.layout.layer_begin}, {"layer_end", spec_.layout.layer_end},
                          {"message", what}});
}

AppendStream* AppendState::FailLocked(const absl::Status& s) {
  if (!done_) {
    status_ = s;
    done_ = true;
    buffer_.clear();
    buffered_bytes_ = 0;
    // NOT_FOUND: the session was deleted (its sequence is being freed too).
    Log(absl::StrCat("persistence stopped", absl::IsNotFound(s) ? " (the session is gone from the store)" : "", ": ",
                     s.ToString()));
  }
  return ReserveLocked();
}

AppendStream* AppendState::ReserveLocked() {
  if (stream_ == nullptr || hold_released_) return nullptr;
  ++starting_;
  return stream_;
}

void AppendState::Unreserve(AppendStream* s) {
  if (s == nullptr) return;
  bool release = false;
  {
    std::lock_guard<std::mutex> l(mu_);
    --starting_;
    if (starting_ == 0 && read_failed_ && !hold_released_) release = hold_released_ = true;
  }
  if (release) s->Release();
}

void AppendState::CancelReserved(AppendStream* s) {
  if (s == nullptr) return;
  s->Cancel();
  Unreserve(s);
}

AppendStream* AppendState::NewStreamLocked(v1::AppendRequest* open) {
  v1::AppendOpen* o = open->mutable_open();
  o->set_session_id(spec_.session_id);
  o->set_layer_begin(spec_.layout.layer_begin);
  o->set_layer_end(spec_.layout.layer_end);
  if (spec_.model.fingerprint != 0) o->set_fingerprint(spec_.model.fingerprint);
  if (spec_.model.legacy_fingerprint != 0) o->set_legacy_fingerprint(spec_.model.legacy_fingerprint);
  if (first_open_ && spec_.start_position) o->set_start_position(*spec_.start_position);
  opened_ = writes_done_ = read_failed_ = hold_released_ = false;
  writing_ = true;  // the open message
  starting_ = 1;    // Start() below
  stream_ = new AppendStream(shared_from_this(), core_);
  return stream_;
}

bool AppendState::Tick(absl::Time now, bool) {
  AppendStream* start = nullptr;
  AppendStream* cancel = nullptr;
  v1::AppendRequest open;
  bool keep = true;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!done_ && closing_ && now > close_deadline_) {
      cancel = FailLocked(absl::DeadlineExceededError(
          absl::StrCat("rows from position ", buffer_.empty() ? end_ : buffer_.front().first,
                       " could not be delivered before the drain timeout")));
    }
    if (done_) {
      keep = stream_ != nullptr;
    } else if (stream_ == nullptr && now >= retry_at_) {
      start = NewStreamLocked(&open);
    }
  }
  CancelReserved(cancel);
  if (start != nullptr) {
    start->Start(std::move(open));
    Unreserve(start);
  }
  return keep;
}

void AppendState::CancelStream() {
  AppendStream* s;
  {
    std::lock_guard<std::mutex> l(mu_);
    done_ = true;
    s = ReserveLocked();
  }
  CancelReserved(s);
}

void AppendState::TrimLocked() {
  while (!buffer_.empty()) {
    Entry& e = buffer_.front();
    const int64_t n = static_cast<int64_t>(e.tokens.size());
    if (e.first + n <= committed_) {
      buffered_bytes_ -= e.rows.size();
      buffer_.pop_front();
      continue;
    }
    if (e.first < committed_) {
      const int64_t drop = committed_ - e.first;
      e.tokens.erase(e.tokens.begin(), e.tokens.begin() + drop);
      e.rows.erase(0, static_cast<size_t>(drop * slice_bytes_));
      buffered_bytes_ -= static_cast<size_t>(drop * slice_bytes_);
      e.first = committed_;
    }
    break;
  }
}

bool AppendState::NextMessageLocked(v1::AppendRequest* msg) {
  if (sent_ >= end_) return false;
  v1::AppendRows* rows = msg->mutable_rows();
  rows->set_position(sent_);
  const size_t limit = std::max<size_t>(core_->options().max_message_bytes, static_cast<size_t>(slice_bytes_));
  int64_t pos = sent_;
  for (const Entry& e : buffer_) {
    const int64_t n = static_cast<int64_t>(e.tokens.size());
    if (e.first + n <= pos) continue;
    if (e.first > pos) break;  // cannot happen: entries are consecutive
    for (int64_t i = pos - e.first; i < n; ++i) {
      if (rows->rows().size() + static_cast<size_t>(slice_bytes_) > limit && rows->token_ids_size() > 0) break;
      rows->add_token_ids(e.tokens[static_cast<size_t>(i)]);
      rows->mutable_rows()->append(e.rows, static_cast<size_t>(i * slice_bytes_), static_cast<size_t>(slice_bytes_));
      ++pos;
    }
    if (rows->rows().size() + static_cast<size_t>(slice_bytes_) > limit) break;
  }
  if (pos == sent_) return false;
  sent_ = pos;
  return true;
}

void AppendState::Pump() {
  v1::AppendRequest msg;
  AppendStream* s = nullptr;
  bool write = false, close = false;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stream_ == nullptr || !opened_ || writing_ || writes_done_ || read_failed_ || done_) return;
    if (NextMessageLocked(&msg)) {
      write = true;
      writing_ = true;
    } else if (closing_ && sent_ >= end_) {
      close = true;
      writes_done_ = true;
    } else {
      return;
    }
    s = ReserveLocked();
  }
  if (s == nullptr) return;
  if (write) s->Write(std::move(msg));
  if (close) s->Close();
  Unreserve(s);
}

void AppendState::Append(int first, const std::vector<int>& tokens, const SequenceKv& kv) {
  if (tokens.empty()) return;
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t from = std::max<int64_t>(first, spec_.skip_below);
  Entry e;
  if (from < first + n) {
    e.first = from;
    e.tokens.assign(tokens.begin() + (from - first), tokens.end());
    EncodeSlices(spec_.layout, kv, static_cast<int>(from), static_cast<int>(first + n - from), &e.rows);
  }
  AppendStream* cancel = nullptr;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (done_) return;
    if (first != end_) {
      cancel = FailLocked(absl::FailedPreconditionError(
          absl::StrCat("rows of position ", first, " were handed over, expected position ", end_)));
    }
  }
  if (cancel != nullptr) {
    CancelReserved(cancel);
    return;
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    if (done_) return;
    end_ = first + n;
    if (!e.tokens.empty()) {
      buffered_bytes_ += e.rows.size();
      buffer_.push_back(std::move(e));
    }
    if (buffered_bytes_ > core_->options().max_buffer_bytes) {
      cancel = FailLocked(absl::ResourceExhaustedError(absl::StrCat(
          buffered_bytes_, " bytes of rows are not yet committed (limit ", core_->options().max_buffer_bytes,
          "): the KV store is not keeping up or is unreachable")));
    }
  }
  if (cancel != nullptr) {
    CancelReserved(cancel);
    return;
  }
  Pump();
}

void AppendState::Close() {
  {
    std::lock_guard<std::mutex> l(mu_);
    closing_ = true;
    close_deadline_ = absl::Now() + core_->options().drain_timeout;
    if (stream_ == nullptr && (buffer_.empty() || end_ <= committed_)) done_ = true;
  }
  Pump();
  core_->Wake();
}

void AppendState::OnOpenedOrCommitted(const v1::AppendResponse& r) {
  int64_t newly = 0;
  AppendStream* cancel = nullptr;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (r.has_opened()) {
      const v1::AppendOpened& o = r.opened();
      opened_ = true;
      first_open_ = false;
      if (o.slice_bytes() != slice_bytes_) {
        cancel = FailLocked(absl::FailedPreconditionError(absl::StrCat(
            "the store's session has ", o.slice_bytes(), " bytes per token for these layers, this stage ",
            slice_bytes_, ": the session was created for another model shape")));
      } else {
        if (o.nrec() > committed_) {
          newly = o.nrec() - committed_;
          committed_ = o.nrec();
        }
        TrimLocked();
        sent_ = std::max<int64_t>(o.next_position(), spec_.skip_below);
        const int64_t lowest = buffer_.empty() ? end_ : buffer_.front().first;
        if (sent_ < lowest) {
          cancel = FailLocked(absl::DataLossError(absl::StrCat("the store needs rows from position ", sent_,
                                                      " but this stage holds rows only from ", lowest,
                                                      " (the session was not persisted from its start)")));
        } else {
          if (failures_ > 0) Log(absl::StrCat("stream reopened at position ", sent_));
          failures_ = 0;
          status_ = absl::OkStatus();
        }
      }
    } else if (r.has_committed()) {
      if (r.committed().nrec() > committed_) {
        newly = r.committed().nrec() - committed_;
        committed_ = r.committed().nrec();
      }
      TrimLocked();
    }
  }
  core_->rows_committed += newly;
  CancelReserved(cancel);
  Pump();
}

void AppendState::OnWriteDone(bool ok) {
  {
    std::lock_guard<std::mutex> l(mu_);
    writing_ = false;
    if (!ok) return;  // the stream is ending; the failed read follows
  }
  Pump();
}

void AppendState::OnReadFailed() {
  AppendStream* s = nullptr;
  {
    std::lock_guard<std::mutex> l(mu_);
    read_failed_ = true;
    if (starting_ == 0 && !hold_released_) {
      hold_released_ = true;
      s = stream_;
    }
  }
  if (s != nullptr) s->Release();
}

void AppendState::OnStreamDone(const grpc::Status& gs) {
  {
    std::lock_guard<std::mutex> l(mu_);
    stream_ = nullptr;
    const bool drained = sent_ >= end_ && writes_done_;
    opened_ = writing_ = writes_done_ = false;
    if (done_) return;
    if (closing_ && ((gs.ok() && drained) || buffer_.empty())) {
      done_ = true;  // every row is durable in the store
      return;
    }
    absl::Status s = gs.ok() ? absl::UnavailableError("the store ended the append stream early")
                             : FromGrpc(gs, "append stream");
    if (Permanent(s.code())) {
      FailLocked(s);  // no stream to cancel any more
      return;
    }
    status_ = s;
    if (failures_ == 0) Log(absl::StrCat("append stream broke, retrying: ", s.ToString()));
    ++failures_;
    absl::Duration delay = core_->options().retry_min * (1 << std::min(failures_ - 1, 10));
    retry_at_ = absl::Now() + std::min(delay, core_->options().retry_max);
  }
  core_->Wake();
}

class AppenderHandle final : public KvAppender {
 public:
  explicit AppenderHandle(std::shared_ptr<AppendState> s) : state_(std::move(s)) {}
  ~AppenderHandle() override { state_->Close(); }
  void Append(int first, const std::vector<int>& tokens, const SequenceKv& kv) override {
    state_->Append(first, tokens, kv);
  }
  int64_t committed() const override { return state_->committed(); }
  absl::Status status() const override { return state_->status(); }

 private:
  std::shared_ptr<AppendState> state_;
};

class ClientImpl final : public KvStoreClient {
 public:
  explicit ClientImpl(KvStoreClientOptions options) : core_(std::make_shared<Core>(std::move(options))) {
    core_->Start();
  }
  ~ClientImpl() override { core_->Shutdown(absl::Seconds(3)); }

  const std::string& address() const override { return core_->options().address; }

  std::unique_ptr<KvAppender> OpenAppender(const AppenderSpec& spec) override {
    auto state = std::make_shared<AppendState>(core_, spec);
    if (!core_->stopping()) {
      state->Tick(absl::Now(), false);  // opens the first stream now
      core_->Add(state);
    }
    return std::make_unique<AppenderHandle>(std::move(state));
  }

  absl::Status Load(const std::string& session_id, const KvModelId& model, const SliceLayout& layout, int64_t count,
                    SequenceKv* kv, std::vector<int>* tokens) override;

  int64_t rows_committed() const override { return core_->rows_committed.load(); }

 private:
  std::shared_ptr<Core> core_;
};

absl::Status ClientImpl::Load(const std::string& session_id, const KvModelId& model, const SliceLayout& layout,
                              int64_t count, SequenceKv* kv, std::vector<int>* tokens) {
  tokens->clear();
  if (count <= 0) return absl::OkStatus();
  const std::string what = absl::StrCat("loading session '", session_id, "' layers [", layout.layer_begin, ", ",
                                        layout.layer_end, ") from the KV store at ", address());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(core_->options().load_timeout));
  v1::LoadRequest req;
  req.set_session_id(session_id);
  req.set_layer_begin(layout.layer_begin);
  req.set_layer_end(layout.layer_end);
  req.set_position_begin(0);
  req.set_position_end(count);
  if (model.fingerprint != 0) req.set_fingerprint(model.fingerprint);
  if (model.legacy_fingerprint != 0) req.set_legacy_fingerprint(model.legacy_fingerprint);
  auto reader = core_->stub()->Load(&ctx, req);
  v1::LoadChunk chunk;
  const int64_t slice = layout.slice_bytes();
  absl::Status bad;
  while (bad.ok() && reader->Read(&chunk)) {
    const int64_t n = chunk.token_ids_size();
    if (chunk.position() != static_cast<int64_t>(tokens->size()) ||
        static_cast<int64_t>(chunk.rows().size()) != n * slice || n == 0) {
      bad = absl::DataLossError(absl::StrCat(what, ": a chunk at position ", chunk.position(), " with ", n,
                                             " tokens and ", chunk.rows().size(), " bytes does not follow position ",
                                             tokens->size(), " with ", slice, " bytes per token"));
      break;
    }
    for (int64_t i = 0; i < n && bad.ok(); ++i) {
      absl::Status st = DecodeSlice(layout, chunk.rows().data() + i * slice, kv);
      if (!st.ok()) {
        bad = absl::DataLossError(absl::StrCat(what, ": token ", tokens->size(), ": ", st.message()));
        break;
      }
      kv->Commit(1);
      tokens->push_back(chunk.token_ids(static_cast<int>(i)));
    }
  }
  if (!bad.ok()) {
    ctx.TryCancel();
    reader->Finish();
    return bad;
  }
  grpc::Status st = reader->Finish();
  if (!st.ok()) return FromGrpc(st, what);
  if (static_cast<int64_t>(tokens->size()) != count) {
    return absl::DataLossError(absl::StrCat(what, ": got ", tokens->size(), " of ", count, " records"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<KvStoreClient>> KvStoreClient::Connect(const KvStoreClientOptions& options) {
  if (options.address.empty()) return absl::InvalidArgumentError("the KV store address is empty");
  return std::unique_ptr<KvStoreClient>(new ClientImpl(options));
}

}  // namespace strata::worker
