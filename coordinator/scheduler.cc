#include "coordinator/scheduler.h"

#include <algorithm>
#include <chrono>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace strata::coordinator {

struct Scheduler::Request {
  uint64_t key = 0;
  RequestSpec spec;
  std::shared_ptr<GenerateSink> sink;
  std::optional<absl::Time> deadline;
  bool running = false;    // holds a sequence
  bool finished = false;   // the sink is closed; waits for its step to return
  bool failed = false;     // the stages' state of the sequence is unknown
  uint64_t seq_id = 0;
  std::vector<int> history;  // tokens the stages hold (confirmed steps)
  std::vector<int> feed;     // tokens still to send
  std::vector<int> sent;     // tokens of the step in flight
  bool feed_is_prompt = true;
  bool in_flight = false;
  bool sampling_sent = false;
  int prompt_tokens = 0, cached_tokens = 0;
  int generated = 0;
  int limit = 0;
  std::optional<int> pending;  // sampled last, not fed
  bool complete_turn = false;  // ended by stop or eos
  std::unique_ptr<StreamDecoder> decoder;
  std::unique_ptr<StopMatcher> stops;
  absl::Time t_submit, t_start, t_first, t_last;
  std::string completion;  // the text streamed, kept only with options_.log_prompts
};

namespace {

// "req-" and 128 bits from the system's random source (/dev/urandom):
// another caller cannot guess a running request's id.
std::string NewRequestId() {
  std::random_device rd;
  std::string id = "req-";
  for (int i = 0; i < 4; ++i) absl::StrAppend(&id, absl::Hex(rd(), absl::kZeroPad8));
  return id;
}

v1::StageSampling ToStage(const SamplingParams& p) {
  v1::StageSampling s;
  s.set_temperature(p.temperature);
  s.set_top_p(p.top_p);
  s.set_top_k(p.top_k);
  s.set_min_p(p.min_p);
  s.set_seed(*p.seed);
  s.set_repetition_penalty(p.repetition_penalty);
  s.set_frequency_penalty(p.frequency_penalty);
  s.set_presence_penalty(p.presence_penalty);
  s.set_logprobs(p.logprobs.value_or(-1));
  return s;
}

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

const char* ReasonName(v1::FinishReason r) {
  switch (r) {
    case v1::FINISH_REASON_STOP:
      return "stop";
    case v1::FINISH_REASON_LENGTH:
      return "length";
    case v1::FINISH_REASON_EOS:
      return "eos";
    case v1::FINISH_REASON_ABORT:
      return "abort";
    default:
      return "error";
  }
}
double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

}  // namespace

Scheduler::Scheduler(SchedulerOptions options, const ModelContext* model, Pipeline* pipeline,
                     SessionTable* sessions)
    : options_(options),
      clock_(options.clock != nullptr ? options.clock : Clock::Real()),
      model_(model),
      pipeline_(pipeline),
      sessions_(sessions) {
  thread_ = std::thread([this] { Loop(); });
}

Scheduler::~Scheduler() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
    for (auto& [k, r] : requests_) {
      if (!r->finished) r->sink->Close(absl::UnavailableError("the coordinator is shutting down"));
    }
  }
  cv_.notify_all();
  thread_.join();
}

absl::Status Scheduler::Submit(RequestSpec spec, std::shared_ptr<GenerateSink> sink,
                               std::optional<absl::Time> deadline) {
  std::lock_guard<std::mutex> l(mu_);
  if (stop_) return absl::UnavailableError("the coordinator is shutting down");
  if (draining_) return absl::UnavailableError("the coordinator is draining (shutting down); retry on another replica");
  if (!up_) {
    return absl::UnavailableError("the cluster is not ready: a stage is missing or its layers are loading; retry shortly");
  }
  const int64_t running = stats_.running, queued = static_cast<int64_t>(queue_.size());
  if (running >= options_.max_running && queued >= options_.max_queued) {
    return absl::ResourceExhaustedError(absl::StrCat("the coordinator is full: ", running, " requests running and ",
                                                     queued, " queued (limits ", options_.max_running, " and ",
                                                     options_.max_queued, "); retry later"));
  }
  const uint64_t key = next_request_++;
  if (spec.request_id.empty()) spec.request_id = NewRequestId();
  for (const auto& [k, r] : requests_) {
    if (r->spec.request_id == spec.request_id && r->spec.owner == spec.owner && !r->finished) {
      return absl::AlreadyExistsError(absl::StrCat("request_id '", spec.request_id, "' is already running"));
    }
  }
  auto r = std::make_unique<Request>();
  r->key = key;
  r->sink = std::move(sink);
  r->deadline = deadline;
  r->t_submit = clock_->Now();
  const int64_t ctx_len = model_->config.max_position_embeddings;
  if (!spec.session_id.empty()) {
    absl::Status st;
    const bool found = sessions_->Update(spec.session_id, !spec.continue_turn, [&](SessionEntry& s) {
      if (s.busy && !spec.session_reserved) {
        st = absl::FailedPreconditionError(absl::StrCat("session '", s.id, "' already has a request running"));
        return;
      }
      const bool resident = s.seq_id != 0 && s.epoch == epoch_;
      if (spec.continue_turn && !s.pending && spec.prompt.empty() && s.tokens.empty()) {
        st = absl::InvalidArgumentError(absl::StrCat("session '", s.id, "' has nothing to continue"));
        return;
      }
      if (resident) {
        r->seq_id = s.seq_id;
        r->history = s.tokens;
        r->cached_tokens = static_cast<int>(s.tokens.size());
        r->feed = s.unfed;
      } else {
        r->seq_id = next_seq_++;
        r->feed = s.tokens;  // recompute what the stages no longer hold
        r->feed.insert(r->feed.end(), s.unfed.begin(), s.unfed.end());
      }
      if (s.pending) r->feed.push_back(*s.pending);
      if (resident && r->feed.empty() && spec.prompt.empty()) {
        // Nothing new to feed: recompute the last token to get its logits.
        st = absl::InvalidArgumentError(absl::StrCat("session '", s.id, "' has nothing to continue"));
        return;
      }
      // A conversation starts once: a text prompt appended to a session that
      // already holds tokens drops its BOS (the tokenizer's prefix).
      const bool continues = !r->history.empty() || !r->feed.empty();
      const size_t skip = continues ? std::min<size_t>(spec.special_prefix, spec.prompt.size()) : 0;
      r->feed.insert(r->feed.end(), spec.prompt.begin() + skip, spec.prompt.end());
      if (static_cast<int64_t>(r->history.size() + r->feed.size()) >= ctx_len) {
        st = absl::InvalidArgumentError(absl::StrCat("session '", s.id, "' would hold ",
                                                     r->history.size() + r->feed.size(),
                                                     " tokens; the model's context is ", ctx_len));
        return;
      }
      s.busy = true;
      s.persist = s.persist || spec.persist;
      spec.persist = s.persist;  // every row of a persistent session goes to the store
    });
    if (!found) {
      return absl::NotFoundError(absl::StrCat("session '", spec.session_id, "' does not exist; continue_turn needs an existing session"));
    }
    if (!st.ok()) return st;
  } else {
    r->seq_id = next_seq_++;
    r->feed = spec.prompt;
  }
  r->prompt_tokens = static_cast<int>(spec.prompt.size());
  const int64_t room = ctx_len - static_cast<int64_t>(r->history.size() + r->feed.size());
  r->limit = static_cast<int>(std::min<int64_t>(spec.sampling.max_tokens.value_or(ctx_len), room));
  if (model_->tokenizer) {
    r->decoder = std::make_unique<StreamDecoder>(*model_->tokenizer, spec.skip_special_tokens);
  }
  r->stops = std::make_unique<StopMatcher>(spec.sampling.stop);
  r->spec = std::move(spec);
  {
    std::vector<log::Field> fields = {{"request_id", r->spec.request_id},
                                      {"session_id", r->spec.session_id},
                                      {"caller", r->spec.owner},
                                      {"prompt_tokens", r->prompt_tokens},
                                      {"cached_tokens", r->cached_tokens},
                                      {"max_tokens", r->limit}};
    if (options_.log_prompts) {
      fields.push_back({"prompt", model_->tokenizer ? model_->tokenizer->Decode(r->spec.prompt) : std::string()});
    }
    log::Event(log::Level::kInfo, "request_start", fields);
  }
  queue_.push_back(key);
  requests_[key] = std::move(r);
  stats_.queued = static_cast<int64_t>(queue_.size());
  PromoteLocked();
  cv_.notify_all();
  return absl::OkStatus();
}

void Scheduler::PromoteLocked() {
  while (up_ && !queue_.empty() && stats_.running < options_.max_running) {
    auto it = requests_.find(queue_.front());
    queue_.pop_front();
    if (it == requests_.end()) continue;
    Request& r = *it->second;
    r.running = true;
    r.t_start = clock_->Now();
    ++stats_.running;
  }
  stats_.queued = static_cast<int64_t>(queue_.size());
}

Scheduler::Request* Scheduler::FindLocked(const GenerateSink* sink) {
  for (auto& [k, r] : requests_) {
    if (r->sink.get() == sink && !r->finished) return r.get();
  }
  return nullptr;
}

void Scheduler::Cancel(const GenerateSink* sink) {
  std::lock_guard<std::mutex> l(mu_);
  if (Request* r = FindLocked(sink)) FinishLocked(*r, v1::FINISH_REASON_ABORT, absl::CancelledError("the client went away"));
  cv_.notify_all();
}

void Scheduler::StopAdmitting() {
  std::lock_guard<std::mutex> l(mu_);
  draining_ = true;
}

bool Scheduler::Abort(const std::string& request_id, const std::string& owner) {
  std::lock_guard<std::mutex> l(mu_);
  for (auto& [k, r] : requests_) {
    if (r->spec.request_id == request_id && r->spec.owner == owner && !r->finished) {
      FinishLocked(*r, v1::FINISH_REASON_ABORT, absl::OkStatus());
      cv_.notify_all();
      return true;
    }
  }
  return false;
}

void Scheduler::FinishLocked(Request& r, v1::FinishReason reason, const absl::Status& status) {
  if (r.finished) return;
  r.finished = true;
  const absl::Time now = clock_->Now();
  if (status.ok()) {
    std::string tail;
    if (r.decoder && reason != v1::FINISH_REASON_STOP) {
      auto f = r.stops->Feed(r.decoder->Flush());
      tail = f.text;
      if (f.stopped) {
        reason = v1::FINISH_REASON_STOP;
      } else {
        tail += r.stops->Flush();
      }
    }
    if (options_.log_prompts) r.completion += tail;
    if (!tail.empty()) {
      v1::GenerateResponse c;
      c.mutable_chunk()->set_text(tail);
      r.sink->Send(std::move(c));
    }
    v1::GenerateResponse fin;
    v1::GenerateFinal* f = fin.mutable_final();
    f->set_finish_reason(reason);
    f->set_request_id(r.spec.request_id);
    f->set_seed(*r.spec.sampling.seed);
    f->set_session_id(r.spec.session_id);
    f->mutable_usage()->set_prompt_tokens(r.prompt_tokens);
    f->mutable_usage()->set_completion_tokens(r.generated);
    f->mutable_usage()->set_cached_tokens(r.cached_tokens);
    const absl::Time start = r.running ? r.t_start : now;
    f->mutable_timings()->set_queue_ms(Ms(start - r.t_submit));
    if (r.t_first != absl::Time()) {
      f->mutable_timings()->set_ttft_ms(Ms(r.t_first - r.t_submit));
      if (r.generated > 1 && r.t_last > r.t_first) {
        f->mutable_timings()->set_tokens_per_s((r.generated - 1) / absl::ToDoubleSeconds(r.t_last - r.t_first));
      }
    }
    f->mutable_timings()->set_total_ms(Ms(now - r.t_submit));
    if (!r.spec.session_id.empty()) {
      f->set_session_tokens(static_cast<int64_t>(r.history.size() + (r.in_flight ? r.sent.size() : 0)));
    }
    r.sink->Send(std::move(fin));
  }
  r.sink->Close(status);
  ++stats_.completed;
  {
    const v1::FinishReason logged = status.ok() ? reason
                                    : absl::IsCancelled(status) ? v1::FINISH_REASON_ABORT
                                                                : v1::FINISH_REASON_ERROR;
    const std::string code = absl::StatusCodeToString(status.code());
    const double ttft = r.t_first != absl::Time() ? Ms(r.t_first - r.t_submit) : -1;
    const double queue = Ms((r.running ? r.t_start : now) - r.t_submit);
    const log::Level level = status.ok() || absl::IsCancelled(status) ? log::Level::kInfo : log::Level::kWarn;
    std::vector<log::Field> fields = {{"request_id", r.spec.request_id},
                                      {"session_id", r.spec.session_id},
                                      {"caller", r.spec.owner},
                                      {"finish_reason", ReasonName(logged)},
                                      {"prompt_tokens", r.prompt_tokens},
                                      {"completion_tokens", r.generated},
                                      {"cached_tokens", r.cached_tokens},
                                      {"queue_ms", queue},
                                      {"ttft_ms", ttft},
                                      {"latency_ms", Ms(now - r.t_submit)},
                                      {"code", code},
                                      {"error", status.message()}};
    if (options_.log_prompts) fields.push_back({"completion", r.completion});
    log::Event(level, "request_finish", fields);
  }
  if (const ServingMetrics* m = options_.metrics) {
    const v1::FinishReason counted = status.ok() ? reason
                                     : absl::IsCancelled(status) ? v1::FINISH_REASON_ABORT
                                                                 : v1::FINISH_REASON_ERROR;
    m->Finished(counted)->Inc();
    m->prompt_tokens->Inc(r.prompt_tokens);
    m->e2e->Observe(Seconds(now - r.t_submit));
    if (r.running) m->queue->Observe(Seconds(r.t_start - r.t_submit));
  }
  r.complete_turn = status.ok() && (reason == v1::FINISH_REASON_STOP || reason == v1::FINISH_REASON_EOS);
  if (!r.in_flight) ReleaseLocked(r);
}

void Scheduler::SaveSessionLocked(Request& r) {
  // Everything the conversation holds: confirmed tokens, then what was never
  // fed (prompt remainder, the last sampled token).
  std::vector<int> all = r.history;
  all.insert(all.end(), r.feed.begin(), r.feed.end());
  if (r.pending) all.push_back(*r.pending);
  const bool resident = !r.failed && all.size() <= r.history.size() + 1;
  sessions_->Update(r.spec.session_id, false, [&](SessionEntry& s) {
    s.busy = false;
    s.tokens = all;
    s.pending.reset();
    if (all.size() > r.history.size()) {
      s.pending = all.back();
      s.tokens.pop_back();
    }
    s.unfed.clear();
    s.pending_stored = false;
    s.seq_id = resident ? r.seq_id : 0;
    s.epoch = epoch_;
    if (r.complete_turn) s.turn_watermark = static_cast<int64_t>(s.tokens.size());
    if (turn_listener_ && resident) {
      TurnEnd t;
      t.session_id = s.id;
      t.tokens = static_cast<int64_t>(s.tokens.size());
      t.pending = s.pending;
      t.turn_watermark = std::min<int64_t>(s.turn_watermark, t.tokens);
      t.persist = s.persist;
      turn_listener_(t);
    }
  });
}

void Scheduler::ReleaseLocked(Request& r) {
  const uint64_t key = r.key;
  if (r.running) {
    --stats_.running;
    bool keep = false;
    if (!r.spec.session_id.empty()) {
      SaveSessionLocked(r);
      auto s = sessions_->Get(r.spec.session_id);
      keep = s && s->seq_id == r.seq_id;
    }
    if (!keep) to_free_.push_back(r.seq_id);
  } else {
    queue_.erase(std::remove(queue_.begin(), queue_.end(), key), queue_.end());
    if (!r.spec.session_id.empty()) {
      sessions_->Update(r.spec.session_id, false, [](SessionEntry& s) { s.busy = false; });
    }
  }
  requests_.erase(key);
  PromoteLocked();
}

void Scheduler::HandleTokenLocked(Request& r, const v1::SampledToken& t, std::vector<Request*>* done) {
  const absl::Time now = clock_->Now();
  const int token = t.token();
  if (const ServingMetrics* m = options_.metrics) {
    if (r.t_first == absl::Time()) {
      m->ttft->Observe(Seconds(now - r.t_submit));
    } else {
      m->inter_token->Observe(Seconds(now - r.t_last));
    }
  }
  if (r.t_first == absl::Time()) r.t_first = now;
  r.t_last = now;
  r.feed_is_prompt = false;
  const TokenStop ts = CheckTokenStop(r.spec.sampling, model_->config.eos_token_ids, token, r.generated + 1);
  if (ts == TokenStop::kEos || ts == TokenStop::kStopToken) {
    r.pending = token;
    done->push_back(&r);
    FinishLocked(r, ts == TokenStop::kEos ? v1::FINISH_REASON_EOS : v1::FINISH_REASON_STOP, absl::OkStatus());
    return;
  }
  ++r.generated;
  ++stats_.generated_tokens;
  if (options_.metrics) options_.metrics->generation_tokens->Inc();
  v1::GenerateResponse resp;
  v1::GeneratedToken* g = resp.mutable_chunk()->add_tokens();
  g->set_id(token);
  if (r.spec.sampling.logprobs) {
    g->set_logprob(t.logprob());
    g->set_rank(t.rank());
    for (int i = 0; i < t.top_tokens_size() && i < t.top_logprobs_size(); ++i) {
      auto* a = g->add_top();
      a->set_token(t.top_tokens(i));
      a->set_logprob(t.top_logprobs(i));
    }
  }
  bool stopped = false;
  if (r.decoder) {
    auto f = r.stops->Feed(r.decoder->Add(token));
    resp.mutable_chunk()->set_text(f.text);
    if (options_.log_prompts) r.completion += f.text;
    stopped = f.stopped;
  }
  r.sink->Send(std::move(resp));
  r.feed = {token};
  if (stopped) {
    FinishLocked(r, v1::FINISH_REASON_STOP, absl::OkStatus());
  } else if (ts == TokenStop::kLength || r.generated >= r.limit) {
    FinishLocked(r, v1::FINISH_REASON_LENGTH, absl::OkStatus());
  }
}

void Scheduler::OnResult(v1::StageResult&& res) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = in_flight_.find(res.batch_id());
  if (it == in_flight_.end()) return;  // from before a pipeline reset
  std::vector<uint64_t> keys = std::move(it->second);
  in_flight_.erase(it);
  std::map<uint64_t, const v1::SampledToken*> by_seq;
  for (const auto& t : res.tokens()) by_seq[t.seq_id()] = &t;
  const absl::Status err =
      res.code() == 0 ? absl::OkStatus()
                      : absl::Status(static_cast<absl::StatusCode>(res.code()),
                                     absl::StrCat("stage ", res.failed_stage(), ": ", res.error()));
  std::vector<Request*> done;
  for (uint64_t key : keys) {
    auto rit = requests_.find(key);
    if (rit == requests_.end()) continue;
    Request& r = *rit->second;
    r.in_flight = false;
    if (!err.ok()) {
      r.failed = true;
      r.feed.insert(r.feed.begin(), r.sent.begin(), r.sent.end());
      r.sent.clear();
      if (!r.finished) {
        FinishLocked(r, v1::FINISH_REASON_ERROR, err);
      } else {
        ReleaseLocked(r);
      }
      continue;
    }
    r.history.insert(r.history.end(), r.sent.begin(), r.sent.end());
    r.sent.clear();
    if (r.finished) {
      // Finished (abort, deadline) while the step was in flight.
      auto t = by_seq.find(r.seq_id);
      if (t != by_seq.end()) r.pending = t->second->token();
      ReleaseLocked(r);
      continue;
    }
    auto t = by_seq.find(r.seq_id);
    if (t != by_seq.end()) HandleTokenLocked(r, *t->second, &done);
  }
  cv_.notify_all();
}

uint64_t Scheduler::NewSeqId() {
  std::lock_guard<std::mutex> l(mu_);
  return next_seq_++;
}

void Scheduler::SetTurnListener(std::function<void(const TurnEnd&)> listener) {
  std::lock_guard<std::mutex> l(mu_);
  turn_listener_ = std::move(listener);
}

void Scheduler::FreeSequence(uint64_t seq_id) {
  std::lock_guard<std::mutex> l(mu_);
  to_free_.push_back(seq_id);
  cv_.notify_all();
}

void Scheduler::OnPipelineDown(const absl::Status& status) {
  std::lock_guard<std::mutex> l(mu_);
  up_ = false;
  in_flight_.clear();
  to_free_.clear();
  sessions_->DropResidency();
  std::vector<uint64_t> keys;
  for (auto& [k, r] : requests_) keys.push_back(k);
  for (uint64_t k : keys) {
    auto it = requests_.find(k);
    if (it == requests_.end()) continue;
    Request& r = *it->second;
    r.failed = true;
    r.feed.insert(r.feed.begin(), r.sent.begin(), r.sent.end());
    r.sent.clear();
    const bool was_in_flight = r.in_flight;
    r.in_flight = false;
    if (!r.finished) {
      FinishLocked(r, v1::FINISH_REASON_ERROR, status);
    } else if (was_in_flight) {
      ReleaseLocked(r);
    }
  }
  to_free_.clear();
  cv_.notify_all();
}

void Scheduler::OnPipelineUp(int num_stages, int64_t epoch) {
  std::lock_guard<std::mutex> l(mu_);
  up_ = true;
  num_stages_ = std::max(1, num_stages);
  epoch_ = epoch;
  to_free_.clear();
  in_flight_.clear();
  PromoteLocked();
  cv_.notify_all();
}

void Scheduler::CheckDeadlinesLocked() {
  const absl::Time now = clock_->Now();
  std::vector<Request*> expired;
  for (auto& [k, r] : requests_) {
    if (!r->finished && r->deadline && now >= *r->deadline) expired.push_back(r.get());
  }
  for (Request* r : expired) {
    FinishLocked(*r, v1::FINISH_REASON_ERROR,
                 absl::DeadlineExceededError(absl::StrCat("the deadline passed after ", r->generated,
                                                          " generated tokens")));
  }
}

std::vector<v1::StageBatch> Scheduler::FormBatchesLocked() {
  std::vector<v1::StageBatch> out;
  if (!up_) return out;
  std::vector<Request*> ready;
  for (auto& [k, r] : requests_) {
    if (r->running && !r->finished && !r->in_flight && !r->feed.empty()) ready.push_back(r.get());
  }
  int slots = num_stages_ - static_cast<int>(in_flight_.size());
  size_t next = 0;
  while (slots > 0 && next < ready.size()) {
    const size_t remaining = ready.size() - next;
    const size_t per_batch = (remaining + slots - 1) / slots;
    v1::StageBatch b;
    b.set_epoch(epoch_);
    b.set_batch_id(next_batch_++);
    int tokens = 0;
    std::vector<uint64_t> keys;
    for (size_t taken = 0; next < ready.size() && taken < per_batch && tokens < options_.batch_tokens; ++taken) {
      Request& r = *ready[next++];
      const int n = std::min<int>({static_cast<int>(r.feed.size()), options_.prefill_chunk,
                                   options_.batch_tokens - tokens});
      v1::StageChunk* c = b.add_chunks();
      c->set_seq_id(r.seq_id);
      c->set_start(static_cast<int>(r.history.size()));
      c->mutable_tokens()->Add(r.feed.begin(), r.feed.begin() + n);
      c->set_sample(n == static_cast<int>(r.feed.size()));
      c->set_prompt(r.feed_is_prompt);
      if (!r.sampling_sent) {
        *c->mutable_sampling() = ToStage(r.spec.sampling);
        r.sampling_sent = true;
      }
      c->set_session_id(r.spec.session_id);
      c->set_persist(r.spec.persist);
      r.sent.assign(r.feed.begin(), r.feed.begin() + n);
      r.feed.erase(r.feed.begin(), r.feed.begin() + n);
      r.in_flight = true;
      tokens += n;
      keys.push_back(r.key);
    }
    b.set_total_rows(tokens);
    if (const ServingMetrics* m = options_.metrics) {
      m->batch_tokens->Observe(tokens);
      m->batch_sequences->Observe(static_cast<double>(keys.size()));
    }
    in_flight_[b.batch_id()] = std::move(keys);
    out.push_back(std::move(b));
    --slots;
  }
  if (!to_free_.empty()) {
    if (out.empty()) {
      v1::StageBatch b;  // free-only: batch id 0, no answer expected
      b.set_epoch(epoch_);
      out.push_back(std::move(b));
    }
    out.front().mutable_free_seq_ids()->Add(to_free_.begin(), to_free_.end());
    to_free_.clear();
  }
  stats_.batches_in_flight = static_cast<int64_t>(in_flight_.size());
  return out;
}

void Scheduler::Loop() {
  std::unique_lock<std::mutex> l(mu_);
  while (!stop_) {
    CheckDeadlinesLocked();
    std::vector<v1::StageBatch> batches = FormBatchesLocked();
    if (batches.empty()) {
      cv_.wait_for(l, std::chrono::milliseconds(50));
      continue;
    }
    l.unlock();
    std::vector<std::pair<uint64_t, absl::Status>> failed;
    for (const auto& b : batches) {
      absl::Status st = pipeline_->Send(b);
      if (!st.ok()) failed.emplace_back(b.batch_id(), st);
    }
    l.lock();
    for (auto& [id, st] : failed) {
      if (id == 0) continue;
      v1::StageResult r;
      r.set_batch_id(id);
      r.set_code(static_cast<int>(absl::StatusCode::kUnavailable));
      r.set_error(std::string(st.message()));
      l.unlock();
      OnResult(std::move(r));
      l.lock();
    }
  }
}

SchedulerStats Scheduler::Stats() {
  std::lock_guard<std::mutex> l(mu_);
  SchedulerStats s = stats_;
  s.queued = static_cast<int64_t>(queue_.size());
  s.resident_sessions = sessions_->resident();
  return s;
}

}  // namespace strata::coordinator
