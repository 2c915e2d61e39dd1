#include "coordinator/session_manager.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <future>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace strata::coordinator {
namespace {

// "POSITION:TOKEN" -> (position, token).
std::optional<std::pair<int64_t, int>> ParsePending(const v1::SessionInfo& info) {
  auto it = info.metadata().find(kPendingKey);
  if (it == info.metadata().end()) return std::nullopt;
  std::vector<std::string> parts = absl::StrSplit(it->second, ':');
  int64_t pos = 0;
  int token = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &pos) || !absl::SimpleAtoi(parts[1], &token) || token < 0 ||
      token >= (info.format_version() == 3 ? info.v4().vocab() : info.dims().vocab())) {
    return std::nullopt;
  }
  return std::make_pair(pos, token);
}

}  // namespace

SessionManager::SessionManager(SessionManagerOptions options, SessionTable* sessions, Scheduler* scheduler,
                               Cluster* cluster, std::unique_ptr<KvSessionClient> store)
    : options_(options), sessions_(sessions), scheduler_(scheduler), cluster_(cluster), store_(std::move(store)) {
  if (store_) finalizer_ = std::thread([this] { FinalizerLoop(); });
}

SessionManager::~SessionManager() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (finalizer_.joinable()) finalizer_.join();
}

v1::SessionState SessionManager::StateOf(const SessionEntry& s) const {
  v1::SessionState out;
  out.set_session_id(s.id);
  out.set_tokens(static_cast<int64_t>(s.tokens.size() + s.unfed.size() + (s.pending_stored ? 1 : 0)));
  out.set_turn_watermark(s.turn_watermark);
  out.set_resident(s.seq_id != 0 && s.epoch == cluster_->epoch());
  out.set_persistent(s.persist && store_ != nullptr);
  return out;
}

void SessionManager::Release(const std::string& id) {
  sessions_->Update(id, false, [](SessionEntry& s) { s.busy = false; });
}

bool SessionManager::NeedsPrepare(const RequestSpec& spec) {
  if (!store_ || spec.session_id.empty()) return false;
  auto s = sessions_->Get(spec.session_id);
  if (!s) return true;
  const bool resident = s->seq_id != 0 && s->epoch == cluster_->epoch();
  return !s->busy && !resident && s->persist;
}

void SessionManager::ReserveResident(RequestSpec* spec) {
  spec->session_reserved = false;
  if (!store_ || spec->session_id.empty() || !spec->persist) return;
  const int64_t epoch = cluster_->epoch();
  sessions_->Update(spec->session_id, false, [&](SessionEntry& s) {
    if (!s.busy && s.persist && s.seq_id != 0 && s.epoch == epoch) {
      s.busy = true;
      spec->session_reserved = true;
    }
  });
}

absl::Status SessionManager::Prepare(RequestSpec* spec) {
  spec->session_reserved = false;
  if (!store_ || spec->session_id.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(Outcome o, Acquire(spec->session_id, spec->persist, spec->continue_turn));
  spec->session_reserved = o == Outcome::kReserved;
  return absl::OkStatus();
}

absl::StatusOr<SessionManager::Outcome> SessionManager::Acquire(const std::string& id, bool create,
                                                                bool must_exist) {
  std::optional<SessionEntry> memory;  // the coordinator's copy, when it has one
  bool reserved = false;
  // A session this coordinator does not know gets an empty entry, reserved,
  // before the store is asked: a Delete, Resume or Generate
  // of the same id arriving meanwhile finds it busy instead of deleting or
  // creating the store's copy under this request. The entry is erased again
  // when the request does not start.
  bool placeholder = false;
  absl::Status conflict;
  const int64_t epoch = cluster_->epoch();
  sessions_->Update(id, /*create=*/true, [&](SessionEntry& s) {
    if (s.busy) {
      conflict = absl::FailedPreconditionError(absl::StrCat("session '", id, "' already has a request running"));
      return;
    }
    placeholder = s.tokens.empty() && s.unfed.empty() && !s.pending && s.seq_id == 0;
    if (placeholder) {
      s.busy = true;
      s.persist = create;
      reserved = true;
      return;
    }
    memory = s;
    if (!(s.seq_id != 0 && s.epoch == epoch) && s.persist) {
      s.busy = true;
      reserved = true;
    }
  });
  RETURN_IF_ERROR(conflict);
  const bool exists = memory.has_value();
  if (exists && !reserved) return Outcome::kReady;  // resident, or kept in memory only
  auto release = [&] {
    if (placeholder) {
      sessions_->Erase(id);
    } else if (reserved) {
      Release(id);
    }
    reserved = placeholder = false;
  };
  absl::StatusOr<v1::SessionInfo> info = store_->Stat(id);
  if (!info.ok()) {
    if (info.status().code() != absl::StatusCode::kNotFound) {
      release();
      return info.status();
    }
    if (!exists && must_exist) {
      release();
      return absl::NotFoundError(absl::StrCat("session '", id, "' does not exist (neither in this coordinator nor in ",
                                              "the KV store at ", store_->address(), ")"));
    }
    if (!exists && !create) {
      release();  // a request that does not persist: Submit makes its entry
      return Outcome::kReady;
    }
    // New, or known here but not stored: its rows are (re)computed and
    // persisted from position 0. The reservation passes to Submit.
    absl::StatusOr<v1::SessionInfo> c = store_->Create(id);
    if (!c.ok() && c.status().code() != absl::StatusCode::kAlreadyExists) {
      release();
      return c.status();
    }
    return Outcome::kReserved;
  }
  if (absl::Status st = store_->CheckCompatible(*info); !st.ok()) {
    release();
    return st;
  }
  if (!exists) {
    sessions_->Update(id, false, [&](SessionEntry& s) {
      s.persist = true;
      s.turn_watermark = info->turn_watermark();
    });
  }
  if (info->nrec() == 0) return Outcome::kReserved;
  if (absl::Status st = LoadOntoStages(id, memory, *info); !st.ok()) {
    release();
    return st;
  }
  return Outcome::kReserved;
}

absl::Status SessionManager::LoadOntoStages(const std::string& id, const std::optional<SessionEntry>& memory,
                                            const v1::SessionInfo& info) {
  const absl::Time t0 = absl::Now();
  int64_t loaded = 0;
  absl::Status st = LoadOntoStagesImpl(id, memory, info, &loaded);
  if (st.ok()) {
    log::Info("session_load", {{"session_id", id}, {"tokens", loaded}, {"stored_tokens", info.nrec()},
                               {"ms", absl::ToDoubleMilliseconds(absl::Now() - t0)}});
  } else {
    log::Warn("session_load_failed", {{"session_id", id}, {"code", absl::StatusCodeToString(st.code())},
                                      {"error", st.message()}});
  }
  return st;
}

absl::Status SessionManager::LoadOntoStagesImpl(const std::string& id, const std::optional<SessionEntry>& memory,
                                                const v1::SessionInfo& info, int64_t* loaded) {
  const int64_t nrec = info.nrec();
  std::vector<int> all;  // the conversation as the coordinator knows it
  std::optional<int> pending;
  int64_t load = 0, keep = nrec;
  // A V4 session (a v3 file) keeps only its state at nrec: it loads whole,
  // never one record fewer (docs/service.md, "DeepSeek-V4").
  const bool v3 = info.format_version() == 3;
  if (v3) {
    load = nrec;
    if (memory) {
      all = memory->tokens;
      all.insert(all.end(), memory->unfed.begin(), memory->unfed.end());
      pending = memory->pending;
      if (static_cast<int64_t>(all.size()) < nrec) {
        return absl::FailedPreconditionError(absl::StrCat(
            "session '", id, "': the KV store holds ", nrec, " tokens of this V4 session, more than the ", all.size(),
            " this coordinator knows, and a V4 session cannot be rewound; delete it and start over"));
      }
    } else if (auto p = ParsePending(info); p && p->first == nrec) {
      pending = p->second;
    } else if (nrec > 0) {
      std::fprintf(stderr, "strata-coordinator: session '%s': its last turn was cut off; a V4 session keeps no "
                   "logits after its last token, so it continues with the next prompt\n", id.c_str());
    }
    if (nrec == 0) return absl::OkStatus();
  } else if (memory) {
    all = memory->tokens;
    all.insert(all.end(), memory->unfed.begin(), memory->unfed.end());
    pending = memory->pending;
    load = std::min<int64_t>(nrec, static_cast<int64_t>(all.size()));
    if (load == 0) return absl::OkStatus();  // nothing stored that the coordinator knows: recompute
    if (nrec > load) {
      log::Warn("session_records_dropped", {{"session_id", id}, {"stored_tokens", nrec}, {"known_tokens", load},
                                            {"reason", "the KV store holds records this coordinator does not know"}});
    }
    keep = load;
  } else if (auto p = ParsePending(info); p && p->first == nrec) {
    load = nrec;
    pending = p->second;
  } else {
    // The last turn was cut off (or never finished): feed the last stored
    // token again to get the logits after it.
    ASSIGN_OR_RETURN(std::vector<int> last, store_->TokenIds(id, nrec - 1, nrec));
    pending = last[0];
    load = nrec - 1;
  }
  // Drop rows past the committed records (a stage's uncommitted tail) so
  // that every stage continues from the same position.
  if (absl::Status st = store_->Truncate(id, keep, options_.writers_wait); !st.ok()) {
    if (st.code() != absl::StatusCode::kFailedPrecondition) return st;
    log::Warn("session_truncate_skipped", {{"session_id", id}, {"error", st.message()}, {"reason", "loading anyway"}});
  }
  auto [epoch, stages] = cluster_->placement();
  if (stages.empty()) {
    return absl::UnavailableError(
        "the cluster is not ready: a stage is missing or its layers are loading; retry shortly");
  }
  const uint64_t seq = scheduler_->NewSeqId();
  WorkerClient* const workers = cluster_->worker_client();
  std::vector<std::future<std::pair<absl::Status, v1::LoadSessionResponse>>> calls;
  for (const auto& stage : stages) {
    v1::LoadSessionRequest req;
    req.set_epoch(epoch);
    req.set_seq_id(seq);
    req.set_session_id(id);
    req.set_tokens(load);
    req.set_persist(true);
    req.set_append_from(keep);
    const std::string address = stage.address;
    const absl::Duration timeout = options_.load_timeout;
    calls.push_back(std::async(std::launch::async, [workers, req, address, timeout] {
      v1::LoadSessionResponse resp;
      absl::Status st = workers->LoadSession(address, req, timeout, &resp);
      return std::make_pair(st, resp);
    }));
  }
  absl::Status failure;
  std::vector<int> ids;
  for (size_t i = 0; i < calls.size(); ++i) {
    auto [st, resp] = calls[i].get();
    if (!st.ok() && failure.ok()) {
      auto code = st.code();
      // A stage re-assigned meanwhile (ABORTED) or too slow: the client may retry.
      if (code == absl::StatusCode::kDeadlineExceeded || code == absl::StatusCode::kAborted) {
        code = absl::StatusCode::kUnavailable;
      }
      failure = absl::Status(code, absl::StrCat("loading session '", id, "' on stage ", i, " (", stages[i].worker,
                                                " at ", stages[i].address, "): ", st.message()));
    }
    if (i == 0) ids.assign(resp.token_ids().begin(), resp.token_ids().end());
  }
  if (failure.ok() && v3) {
    // Stage 0 answers with the ids of the live positions only (the last
    // min(nrec, N)); the coordinator keeps what it knows and marks the rest.
    if (static_cast<int64_t>(ids.size()) > load ||
        (memory && !std::equal(ids.begin(), ids.end(), all.begin() + (load - static_cast<int64_t>(ids.size()))))) {
      failure = absl::FailedPreconditionError(absl::StrCat(
          "session '", id, "' in the KV store holds other tokens than this coordinator's copy; delete it"));
    } else if (!memory) {
      std::vector<int> known(static_cast<size_t>(load - static_cast<int64_t>(ids.size())), 0);
      known.insert(known.end(), ids.begin(), ids.end());
      ids = std::move(known);
    } else {
      ids.assign(all.begin(), all.begin() + load);
    }
  }
  if (failure.ok() && static_cast<int64_t>(ids.size()) != load) {
    failure = absl::DataLossError(absl::StrCat("session '", id, "': stage 0 loaded ", ids.size(), " of ", load,
                                               " records"));
  }
  if (failure.ok() && memory && !std::equal(ids.begin(), ids.end(), all.begin())) {
    failure = absl::FailedPreconditionError(absl::StrCat(
        "session '", id,
        "' in the KV store holds other tokens than this coordinator's copy; delete it and start over"));
  }
  if (!failure.ok()) {
    FreeOnStages(seq, stages);
    return failure;
  }
  // (epoch copied: clang 14 cannot capture a structured binding)
  sessions_->Update(id, true, [&, epoch = epoch](SessionEntry& s) {
    s.seq_id = seq;
    s.epoch = epoch;
    if (memory) {
      s.tokens.assign(all.begin(), all.begin() + load);
      s.unfed.assign(all.begin() + load, all.end());
    } else {
      s.tokens = ids;
      s.unfed.clear();
      s.turn_watermark = std::min<int64_t>(info.turn_watermark(), load);
    }
    s.pending = pending;
    s.pending_stored = load < keep;
    s.persist = true;
  });
  *loaded = load;
  return absl::OkStatus();
}

void SessionManager::FreeOnStages(uint64_t seq_id, const std::vector<Cluster::StageView>& stages) {
  for (const auto& stage : stages) {
    v1::FreeSequencesRequest req;
    req.add_seq_ids(seq_id);
    // Best effort: a new epoch forgets it anyway.
    cluster_->worker_client()->FreeSequences(stage.address, req, absl::Seconds(2)).IgnoreError();
  }
}

absl::StatusOr<v1::SessionState> SessionManager::Save(const std::string& id, absl::Time deadline) {
  const absl::Time t0 = absl::Now();
  absl::StatusOr<v1::SessionState> st = SaveImpl(id, deadline);
  if (st.ok()) {
    log::Info("session_save", {{"session_id", id}, {"tokens", st->tokens()}, {"persistent", st->persistent()},
                               {"ms", absl::ToDoubleMilliseconds(absl::Now() - t0)}});
  } else {
    log::Warn("session_save_failed", {{"session_id", id}, {"code", absl::StatusCodeToString(st.status().code())},
                                      {"error", st.status().message()}});
  }
  return st;
}

absl::StatusOr<v1::SessionState> SessionManager::SaveImpl(const std::string& id, absl::Time deadline) {
  RETURN_IF_ERROR(ValidateSessionId(id));
  std::optional<SessionEntry> memory = sessions_->Get(id);
  if (!store_) {
    if (!memory) return absl::NotFoundError(absl::StrCat("session '", id, "' does not exist"));
    return StateOf(*memory);
  }
  if (memory && !memory->persist) {
    return absl::FailedPreconditionError(absl::StrCat(
        "session '", id, "' was started with persist=false: its rows are not in the KV store; start a new session"));
  }
  deadline = std::min(deadline, absl::Now() + options_.save_timeout);
  const bool resident = memory && memory->seq_id != 0 && memory->epoch == cluster_->epoch();
  // Tokens whose rows the stages hold (the pending token's rows are stored
  // too when it was the store's last record).
  const int64_t target =
      resident ? static_cast<int64_t>(memory->tokens.size()) + (memory->pending_stored ? 1 : 0) : 0;
  v1::SessionInfo info;
  for (;;) {
    absl::StatusOr<v1::SessionInfo> st = store_->Stat(id);
    if (!st.ok()) {
      if (st.status().code() == absl::StatusCode::kNotFound && !memory) {
        return absl::NotFoundError(absl::StrCat("session '", id, "' does not exist"));
      }
      return st.status();
    }
    info = *st;
    if (info.nrec() >= target) break;
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "session '", id, "': ", info.nrec(), " of ", target,
          " tokens are committed in the KV store; the workers could not deliver the rest in time (see their logs)"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  v1::SessionState out;
  if (resident) {
    TurnEnd t;
    t.session_id = id;
    t.tokens = target;
    if (!memory->pending_stored) t.pending = memory->pending;
    t.turn_watermark = std::min<int64_t>(memory->turn_watermark, target);
    t.persist = true;
    ASSIGN_OR_RETURN(bool done, Finalize(t));
    (void)done;  // nrec >= target: written
    out = StateOf(*memory);
    out.set_tokens(target);
  } else if (memory) {
    out = StateOf(*memory);
    out.set_tokens(info.nrec());
  } else {
    out.set_session_id(id);
    out.set_tokens(info.nrec());
    out.set_turn_watermark(info.turn_watermark());
  }
  out.set_persistent(true);
  return out;
}

absl::StatusOr<v1::SessionState> SessionManager::Resume(const std::string& id) {
  RETURN_IF_ERROR(ValidateSessionId(id));
  if (store_) {
    ASSIGN_OR_RETURN(Outcome o, Acquire(id, /*create=*/false, /*must_exist=*/true));
    if (o == Outcome::kReserved) Release(id);
  }
  std::optional<SessionEntry> s = sessions_->Get(id);
  if (!s) return absl::NotFoundError(absl::StrCat("session '", id, "' does not exist"));
  return StateOf(*s);
}

absl::StatusOr<std::vector<v1::SessionState>> SessionManager::List(const std::string& prefix) {
  std::map<std::string, v1::SessionState> out;
  for (const SessionEntry& s : sessions_->List(prefix)) out[s.id] = StateOf(s);
  if (store_) {
    ASSIGN_OR_RETURN(std::vector<v1::SessionSummary> stored, store_->List(prefix));
    for (const auto& summary : stored) {
      if (out.count(summary.session_id())) continue;
      v1::SessionState st;
      st.set_session_id(summary.session_id());
      st.set_tokens(summary.nrec());
      st.set_persistent(true);
      if (summary.problem().empty()) {
        absl::StatusOr<v1::SessionInfo> info = store_->Stat(summary.session_id());
        if (info.ok()) st.set_turn_watermark(info->turn_watermark());
      }
      out[summary.session_id()] = st;
    }
  }
  std::vector<v1::SessionState> list;
  for (auto& [id, st] : out) list.push_back(std::move(st));
  return list;
}

absl::Status SessionManager::Delete(const std::string& id) {
  absl::Status st = DeleteImpl(id);
  if (st.ok()) {
    log::Info("session_delete", {{"session_id", id}});
  } else {
    log::Warn("session_delete_failed", {{"session_id", id}, {"code", absl::StatusCodeToString(st.code())},
                                        {"error", st.message()}});
  }
  return st;
}

absl::Status SessionManager::DeleteImpl(const std::string& id) {
  RETURN_IF_ERROR(ValidateSessionId(id));
  absl::Status busy;
  uint64_t seq = 0;
  const bool known = sessions_->Update(id, false, [&](SessionEntry& s) {
    if (s.busy) {
      busy = absl::FailedPreconditionError(absl::StrCat("session '", id, "' has a request running; abort it first"));
      return;
    }
    s.busy = true;  // no request may start on it while it is being deleted
    seq = s.seq_id;
  });
  RETURN_IF_ERROR(busy);
  if (seq != 0) scheduler_->FreeSequence(seq);
  {
    std::lock_guard<std::mutex> l(mu_);
    finalize_.erase(id);
  }
  absl::Status st = absl::OkStatus();
  if (store_) {
    // The stages close their append streams once the free reaches them.
    st = store_->Delete(id, options_.writers_wait);
    if (st.code() == absl::StatusCode::kNotFound) {
      st = known ? absl::OkStatus() : absl::NotFoundError(absl::StrCat("session '", id, "' does not exist"));
    }
  } else if (!known) {
    st = absl::NotFoundError(absl::StrCat("session '", id, "' does not exist"));
  }
  if (known) {
    if (st.ok()) {
      sessions_->Erase(id);
    } else {
      // Its sequence was freed above: the next request reloads or
      // recomputes the rows instead of feeding a sequence the stages dropped.
      sessions_->Update(id, false, [](SessionEntry& s) {
        s.busy = false;
        s.seq_id = 0;
      });
    }
  }
  return st;
}

void SessionManager::OnTurnEnd(const TurnEnd& turn) {
  if (!store_ || !turn.persist) return;
  {
    std::lock_guard<std::mutex> l(mu_);
    finalize_[turn.session_id] = Queued{turn, absl::Now()};
  }
  cv_.notify_all();
}

absl::StatusOr<bool> SessionManager::Finalize(const TurnEnd& turn) {
  ASSIGN_OR_RETURN(v1::SessionInfo info, store_->Stat(turn.session_id));
  if (info.nrec() < turn.tokens) return false;
  std::map<std::string, std::string> set;
  std::vector<std::string> remove;
  if (turn.pending) {
    set[kPendingKey] = absl::StrCat(turn.tokens, ":", *turn.pending);
  } else if (info.metadata().count(kPendingKey)) {
    remove.push_back(kPendingKey);
  }
  std::optional<int64_t> watermark;
  if (turn.turn_watermark > info.turn_watermark()) watermark = turn.turn_watermark;
  auto it = info.metadata().find(kPendingKey);
  const bool same_pending = turn.pending && it != info.metadata().end() && it->second == set[kPendingKey];
  if (!watermark && remove.empty() && same_pending) return true;
  RETURN_IF_ERROR(store_->Update(turn.session_id, watermark, set, remove).status());
  return true;
}

void SessionManager::FinalizerLoop() {
  std::unique_lock<std::mutex> l(mu_);
  while (!stop_) {
    cv_.wait_for(l, std::chrono::milliseconds(20));
    if (stop_) break;
    std::map<std::string, Queued> work = finalize_;
    l.unlock();
    std::vector<std::pair<std::string, absl::Time>> finished;
    for (const auto& [id, q] : work) {
      absl::StatusOr<bool> done = Finalize(q.turn);
      const bool expired = absl::Now() - q.since > options_.finalize_timeout;
      if ((done.ok() && *done) || (!done.ok() && done.status().code() == absl::StatusCode::kNotFound) || expired) {
        if (expired && !(done.ok() && *done)) {
          const std::string why =
              done.ok() ? "its rows were not committed in time" : std::string(done.status().message());
          log::Warn("session_watermark_not_written", {{"session_id", id}, {"error", why}});
        }
        finished.emplace_back(id, q.since);
      }
    }
    l.lock();
    for (const auto& [id, since] : finished) {
      auto it = finalize_.find(id);
      if (it != finalize_.end() && it->second.since == since) finalize_.erase(it);
    }
  }
}

}  // namespace strata::coordinator
