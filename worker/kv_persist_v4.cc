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
    state_->queue.push_back(std::move(req));
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
  for (auto& [state, thread] : running) {
    std::unique_lock<std::mutex> l(state->mu);
    state->closing = true;
    state->cv.notify_all();
    if (!state->cv.wait_until(l, deadline, [&] { return state->done; })) state->ctx.TryCancel();
  }
  for (auto& [state, thread] : running) thread.join();
}

std::unique_ptr<V4Appender> V4Appenders::Open(const V4AppenderSpec& spec) {
  auto state = std::make_shared<V4Appender::State>();
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
  auto finish = [&](const absl::Status& s) {
    std::lock_guard<std::mutex> l(st->mu);
    if (st->status.ok()) st->status = s;
    st->done = true;
    st->cv.notify_all();
  };
  auto stub = v1::KVStore::NewStub(channel_);
  auto stream = stub->Append(&st->ctx);
  v1::AppendRequest open;
  v1::AppendOpen* o = open.mutable_open();
  o->set_session_id(spec.session_id);
  o->set_layer_begin(spec.layer_begin);
  o->set_layer_end(spec.layer_end);
  o->set_start_position(spec.start_position);
  if (spec.model.fingerprint != 0) o->set_fingerprint(spec.model.fingerprint);
  if (spec.model.legacy_fingerprint != 0) o->set_legacy_fingerprint(spec.model.legacy_fingerprint);
  v1::AppendResponse opened;
  if (!stream->Write(open) || !stream->Read(&opened) || !opened.has_opened()) {
    finish(FromGrpc(stream->Finish(), absl::StrCat("appending to session '", spec.session_id, "'")));
    return;
  }
  {
    std::lock_guard<std::mutex> l(st->mu);
    st->committed = opened.opened().nrec();
  }
  std::thread reader([&] {
    v1::AppendResponse r;
    while (stream->Read(&r)) {
      if (!r.has_committed()) continue;
      std::lock_guard<std::mutex> l(st->mu);
      st->committed = std::max(st->committed, r.committed().nrec());
    }
  });
  for (;;) {
    v1::AppendRequest next;
    {
      std::unique_lock<std::mutex> l(st->mu);
      st->cv.wait(l, [&] { return st->closing || !st->queue.empty(); });
      if (st->queue.empty()) break;  // closing, everything sent
      next = std::move(st->queue.front());
      st->queue.pop_front();
    }
    if (!stream->Write(next)) break;  // the stream ended: Finish says why
  }
  stream->WritesDone();
  reader.join();
  finish(FromGrpc(stream->Finish(), absl::StrCat("appending to session '", spec.session_id, "'")));
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
