#include "worker/kv_persist_v4.h"

#include <chrono>

#include "absl/strings/str_cat.h"

namespace strata::worker {
namespace {

absl::Status FromGrpc(const grpc::Status& s, const std::string& what) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), absl::StrCat(what, ": ", s.error_message()));
}

}  // namespace

constexpr size_t kMaxBufferBytes = size_t{256} << 20;

int64_t StepEnd(const v1::AppendRequest& r) { return r.rows().position() + r.rows().token_ids_size(); }

// Drops the steps the store has committed. REQUIRES: st.mu held.
void DropCommitted(V4Appender::State& st) {
  while (!st.steps.empty() && StepEnd(st.steps.front()) <= st.committed) {
    st.bytes -= st.steps.front().ByteSizeLong();
    st.steps.pop_front();
  }
}

V4Appender::~V4Appender() {
  {
    std::lock_guard<std::mutex> l(state_->mu);
    state_->closing = true;
  }
  state_->cv.notify_all();
}

void V4Appender::Append(int64_t position, std::vector<int32_t> tokens, std::string slices, std::string blocks) {
  v1::AppendRequest req;
  v1::AppendRows* rows = req.mutable_rows();
  rows->set_position(position);
  rows->mutable_token_ids()->Add(tokens.begin(), tokens.end());
  *rows->mutable_rows() = std::move(slices);
  *rows->mutable_blocks() = std::move(blocks);
  {
    std::lock_guard<std::mutex> l(state_->mu);
    if (state_->done) return;  // failed for good: status() says why
    state_->bytes += req.ByteSizeLong();
    state_->steps.push_back(std::move(req));
    if (state_->bytes > kMaxBufferBytes && state_->status.ok()) {
      state_->status = absl::ResourceExhaustedError(
          "more than 256 MiB of V4 steps are not committed by the KV store; giving up on this session's rows");
      state_->cancelled = true;
      if (state_->ctx != nullptr) state_->ctx->TryCancel();
    }
  }
  state_->cv.notify_all();
}

int64_t V4Appender::committed() const {
  std::lock_guard<std::mutex> l(state_->mu);
  return state_->committed;
}

absl::Status V4Appender::status() const {
  std::lock_guard<std::mutex> l(state_->mu);
  return state_->status;
}

V4Appenders::V4Appenders(std::shared_ptr<grpc::Channel> channel, absl::Duration drain_timeout)
    : channel_(std::move(channel)), drain_timeout_(drain_timeout) {}

V4Appenders::~V4Appenders() {
  std::vector<std::pair<std::shared_ptr<V4Appender::State>, std::thread>> running;
  {
    std::lock_guard<std::mutex> l(mu_);
    running.swap(running_);
  }
  const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoMilliseconds(drain_timeout_);
  for (auto& entry : running) {
    V4Appender::State* state = entry.first.get();  // (a lambda may not capture a structured binding)
    std::unique_lock<std::mutex> l(state->mu);
    state->closing = true;
    state->cv.notify_all();
    if (!state->cv.wait_until(l, deadline, [&] { return state->done; })) {
      state->cancelled = true;
      if (state->ctx != nullptr) state->ctx->TryCancel();
      state->cv.notify_all();
    }
  }
  for (auto& [state, thread] : running) thread.join();
}

std::unique_ptr<V4Appender> V4Appenders::Open(const V4AppenderSpec& spec) {
  auto state = std::make_shared<V4Appender::State>();
  state->committed = spec.start_position;
  state->send_from = spec.start_position;
  std::lock_guard<std::mutex> l(mu_);
  // Threads of finished streams are joined here, so the list stays short.
  for (auto it = running_.begin(); it != running_.end();) {
    bool done;
    {
      std::lock_guard<std::mutex> sl(it->first->mu);
      done = it->first->done;
    }
    if (done) {
      it->second.join();
      it = running_.erase(it);
    } else {
      ++it;
    }
  }
  running_.emplace_back(state, std::thread([this, state, spec] { Run(state, spec); }));
  return std::unique_ptr<V4Appender>(new V4Appender(state));
}

void V4Appenders::Run(std::shared_ptr<V4Appender::State> st, V4AppenderSpec spec) {
  absl::Duration backoff = absl::Milliseconds(100);
  std::optional<int64_t> start = spec.start_position;
  std::optional<std::chrono::steady_clock::time_point> give_up;
  for (;;) {
    const absl::Status s = RunStream(*st, spec, start);
    start.reset();  // a reopened stream continues where the store asks
    std::unique_lock<std::mutex> l(st->mu);
    const bool finished = s.ok() || st->cancelled || (st->closing && st->steps.empty());
    if (!s.ok()) st->status = st->status.ok() || !st->cancelled ? s : st->status;
    if (!finished && st->closing && !give_up) {
      give_up = std::chrono::steady_clock::now() + absl::ToChronoMilliseconds(drain_timeout_);
    }
    if (finished || (give_up && std::chrono::steady_clock::now() > *give_up)) {
      if (s.ok()) st->status = absl::OkStatus();
      st->done = true;
      st->cv.notify_all();
      return;
    }
    st->cv.wait_for(l, absl::ToChronoMilliseconds(backoff), [&] { return st->cancelled; });
    backoff = std::min(2 * backoff, absl::Seconds(2));
  }
}

absl::Status V4Appenders::RunStream(V4Appender::State& st, const V4AppenderSpec& spec,
                                    std::optional<int64_t> start) {
  const std::string what = absl::StrCat("appending to session '", spec.session_id, "'");
  grpc::ClientContext ctx;
  {
    std::lock_guard<std::mutex> l(st.mu);
    if (st.cancelled) return absl::CancelledError(what);
    st.ctx = &ctx;
  }
  struct Unset {
    V4Appender::State& st;
    ~Unset() {
      std::lock_guard<std::mutex> l(st.mu);
      st.ctx = nullptr;
    }
  } unset{st};
  auto stub = v1::KVStore::NewStub(channel_);
  auto stream = stub->Append(&ctx);
  v1::AppendRequest open;
  v1::AppendOpen* o = open.mutable_open();
  o->set_session_id(spec.session_id);
  o->set_layer_begin(spec.layer_begin);
  o->set_layer_end(spec.layer_end);
  if (start) o->set_start_position(*start);
  if (spec.model.fingerprint != 0) o->set_fingerprint(spec.model.fingerprint);
  if (spec.model.legacy_fingerprint != 0) o->set_legacy_fingerprint(spec.model.legacy_fingerprint);
  v1::AppendResponse opened;
  if (!stream->Write(open) || !stream->Read(&opened) || !opened.has_opened()) {
    const grpc::Status s = stream->Finish();
    return s.ok() ? absl::UnavailableError(absl::StrCat(what, ": the stream ended before it opened"))
                  : FromGrpc(s, what);
  }
  {
    std::lock_guard<std::mutex> l(st.mu);
    st.committed = std::max(st.committed, opened.opened().nrec());
    DropCommitted(st);
    // The store has every step before next_position (a step boundary): send
    // from there.
    st.send_from = opened.opened().next_position();
    if (!st.steps.empty() && st.steps.front().rows().position() > st.send_from) {
      return absl::DataLossError(absl::StrCat(what, ": the store asks for position ", st.send_from,
                                              ", before the first step this stage still holds"));
    }
  }
  {
    std::lock_guard<std::mutex> l(st.mu);
    st.stream_ended = false;
  }
  std::thread reader([&] {
    v1::AppendResponse r;
    while (stream->Read(&r)) {
      if (!r.has_committed()) continue;
      std::lock_guard<std::mutex> l(st.mu);
      st.committed = std::max(st.committed, r.committed().nrec());
      DropCommitted(st);
      st.cv.notify_all();
    }
    std::lock_guard<std::mutex> l(st.mu);
    st.stream_ended = true;  // wakes the writer: a broken stream is reopened
    st.cv.notify_all();
  });
  bool broken = false;
  for (;;) {
    v1::AppendRequest next;
    {
      std::unique_lock<std::mutex> l(st.mu);
      auto unsent = [&] {
        for (const auto& r : st.steps) {
          if (r.rows().position() >= st.send_from) return &r;
        }
        return static_cast<const v1::AppendRequest*>(nullptr);
      };
      st.cv.wait(l, [&] { return st.closing || st.cancelled || st.stream_ended || unsent() != nullptr; });
      if (st.stream_ended) {
        broken = true;
        break;
      }
      const v1::AppendRequest* r = unsent();
      if (st.cancelled || r == nullptr) break;  // closing, everything sent
      next = *r;
      st.send_from = StepEnd(next);
    }
    if (!stream->Write(next)) {
      broken = true;  // the stream ended: Finish says why
      break;
    }
  }
  if (!broken) stream->WritesDone();
  reader.join();
  const grpc::Status s = stream->Finish();
  std::lock_guard<std::mutex> l(st.mu);
  if (s.ok() && st.closing && st.steps.empty()) return absl::OkStatus();
  if (s.ok()) return absl::UnavailableError(absl::StrCat(what, ": the store ended the stream early"));
  return FromGrpc(s, what);
}

absl::Status V4Appenders::Load(const std::string& session_id, const KvModelId& model, int begin, int end,
                               absl::Duration timeout, Loaded* out) {
  auto stub = v1::KVStore::NewStub(channel_);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
  v1::LoadRequest req;
  req.set_session_id(session_id);
  req.set_layer_begin(begin);
  req.set_layer_end(end);
  if (model.fingerprint != 0) req.set_fingerprint(model.fingerprint);
  if (model.legacy_fingerprint != 0) req.set_legacy_fingerprint(model.legacy_fingerprint);
  auto reader = stub->Load(&ctx, req);
  *out = Loaded();
  v1::LoadChunk chunk;
  while (reader->Read(&chunk)) {
    out->tokens = chunk.nrec();
    out->live_ids.insert(out->live_ids.end(), chunk.token_ids().begin(), chunk.token_ids().end());
    out->slices += chunk.rows();
    out->blocks += chunk.blocks();
  }
  return FromGrpc(reader->Finish(), absl::StrCat("loading session '", session_id, "'"));
}

}  // namespace strata::worker
