#include "coordinator/cluster.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <future>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "model/config.h"
#include "worker/stage_wire.h"

namespace strata::coordinator {

absl::StatusOr<std::unique_ptr<Cluster>> Cluster::Create(ClusterOptions options) {
  ModelLayout layout;
  if (options.synthetic_seed.has_value()) {
    ASSIGN_OR_RETURN(const ModelConfig config, LoadModelConfig(options.model_dir));
    layout = SyntheticModelLayout(config, options.kv_dtype);
  } else {
    ASSIGN_OR_RETURN(layout, ReadModelLayout(options.model_dir, options.kv_dtype));
  }
  if (options.workers < 1) return absl::InvalidArgumentError("the cluster needs at least one worker");
  return std::unique_ptr<Cluster>(new Cluster(std::move(options), std::move(layout)));
}

Cluster::Cluster(ClusterOptions options, ModelLayout layout)
    : options_(std::move(options)),
      layout_(std::move(layout)),
      client_(options_.worker_client ? options_.worker_client : NewGrpcWorkerClient(options_.credentials)),
      clock_(options_.clock != nullptr ? options_.clock : Clock::Real()) {}

Cluster::~Cluster() { Stop(); }

void Cluster::Stop() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::unique_ptr<worker::StageLink> link;
  {
    std::lock_guard<std::mutex> l(link_mu_);
    link = std::move(link_);
  }
  link.reset();  // joins the reader
}

void Cluster::Start(Scheduler* scheduler, std::function<void(bool)> on_ready) {
  scheduler_ = scheduler;
  on_ready_ = std::move(on_ready);
  thread_ = std::thread([this] { Loop(); });
}

absl::Status ValidateRegistration(const v1::RegisterRequest& req) {
  auto printable = [](std::string_view s) {
    return std::all_of(s.begin(), s.end(), [](char c) { return c > ' ' && c < 127; });
  };
  const std::string& a = req.address();
  const size_t colon = a.rfind(':');
  int port = 0;
  if (a.empty() || a.size() > 255 || !printable(a) || colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(a.substr(colon + 1), &port) || port < 1 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("address '", absl::CHexEscape(a.substr(0, 64)), "' is not HOST:PORT (port 1..65535)"));
  }
  if (req.name().size() > 64 || !printable(req.name())) {
    return absl::InvalidArgumentError(absl::StrCat("worker name '", absl::CHexEscape(req.name().substr(0, 64)),
                                                   "' must be up to 64 printable characters without spaces"));
  }
  return absl::OkStatus();
}

v1::RegisterResponse Cluster::Register(const v1::RegisterRequest& req) {
  std::unique_lock<std::mutex> l(mu_);
  WorkerInfo w;
  w.id = absl::StrCat("worker-", next_worker_++);
  w.name = req.name().empty() ? req.address() : req.name();
  w.address = req.address();
  for (const auto& d : req.devices()) {
    w.free_bytes += static_cast<uint64_t>(std::max<int64_t>(0, d.free_bytes()));
    w.kv_pool_bytes += static_cast<uint64_t>(std::max<int64_t>(0, d.kv_pool_bytes()));
  }
  w.last_heartbeat = clock_->Now();
  // A worker that registers again at the same address replaces its old entry.
  // It restarted: when the old entry is a stage, the pipeline lost its layers.
  std::string down;
  for (auto it = workers_.begin(); it != workers_.end();) {
    if (it->second.address == w.address) {
      for (size_t s = 0; placed_ && !stop_ && s < stage_ids_.size(); ++s) {
        if (stage_ids_[s] == it->first) {
          down = absl::StrCat("stage ", s, " (", it->second.name, " at ", it->second.address,
                              ") registered again: it restarted and lost its layers");
        }
      }
      it->second.alive = false;
      it = workers_.erase(it);
    } else {
      ++it;
    }
  }
  log::Info("worker_register", {{"worker", w.name}, {"worker_id", w.id}, {"address", w.address}});
  workers_[w.id] = w;
  v1::RegisterResponse resp;
  resp.set_worker_id(w.id);
  resp.set_heartbeat_interval_ms(static_cast<int>(absl::ToInt64Milliseconds(options_.heartbeat_interval)));
  cv_.notify_all();
  const int64_t epoch = epoch_;
  l.unlock();
  if (!down.empty()) PipelineDown(epoch, absl::UnavailableError(down));
  return resp;
}

v1::HeartbeatResponse Cluster::Heartbeat(const v1::HeartbeatRequest& req) {
  std::lock_guard<std::mutex> l(mu_);
  v1::HeartbeatResponse resp;
  auto it = workers_.find(req.worker_id());
  if (it == workers_.end() || !it->second.alive) {
    resp.set_known(false);
    return resp;
  }
  it->second.last_heartbeat = clock_->Now();
  resp.set_known(true);
  return resp;
}

absl::Status Cluster::Send(const v1::StageBatch& batch) {
  std::lock_guard<std::mutex> l(link_mu_);
  if (!link_) return absl::UnavailableError("the pipeline is down");
  return link_->Send(batch, nullptr, worker::kDefaultMaxChunkBytes);
}

bool Cluster::ready() {
  std::lock_guard<std::mutex> l(mu_);
  return placed_;
}

int64_t Cluster::epoch() {
  std::lock_guard<std::mutex> l(mu_);
  return epoch_;
}

std::vector<Cluster::StageView> Cluster::stages() {
  std::lock_guard<std::mutex> l(mu_);
  return placed_ ? stages_ : std::vector<StageView>{};
}

std::pair<int64_t, std::vector<Cluster::StageView>> Cluster::placement() {
  std::lock_guard<std::mutex> l(mu_);
  if (!placed_) return {epoch_, {}};
  return {epoch_, stages_};
}

std::vector<WorkerInfo> Cluster::workers() {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<WorkerInfo> out;
  for (const auto& [id, w] : workers_) out.push_back(w);
  return out;
}

void Cluster::PipelineDown(int64_t epoch, const absl::Status& status) {
  std::unique_ptr<worker::StageLink> dead;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (epoch != epoch_ || !placed_) return;
    placed_ = false;
    cv_.notify_all();
  }
  log::Error("pipeline_down", {{"epoch", epoch}, {"code", absl::StatusCodeToString(status.code())},
                               {"error", status.message()}});
  if (on_ready_) on_ready_(false);
  scheduler_->OnPipelineDown(status);
  // The link is destroyed by the control thread (this may run on its reader).
}

absl::Status Cluster::PlaceAndAssign() {
  std::vector<WorkerInfo> alive;
  int64_t epoch;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (const auto& [id, w] : workers_) {
      if (w.alive) alive.push_back(w);
    }
    const int need = options_.min_workers > 0 ? options_.min_workers : options_.workers;
    const int cuts = static_cast<int>(std::count(layout_.can_cut_before.begin(), layout_.can_cut_before.end(), true));
    if (static_cast<int>(alive.size()) < std::min(need, cuts)) {
      return absl::UnavailableError(absl::StrCat(alive.size(), " of ", need, " workers alive"));
    }
    epoch = ++epoch_;
  }
  std::sort(alive.begin(), alive.end(), [](const WorkerInfo& a, const WorkerInfo& b) {
    return a.name != b.name ? a.name < b.name : a.address < b.address;
  });
  if (static_cast<int>(alive.size()) > options_.workers) alive.resize(options_.workers);
  std::vector<WorkerSlot> slots;
  for (const auto& w : alive) slots.push_back({w.name, w.free_bytes, w.kv_pool_bytes});
  absl::StatusOr<Plan> plan = options_.placement_override.empty()
                                  ? PlanBalanced(layout_, slots, options_.placement)
                                  : PlanOverride(layout_, slots, options_.placement, options_.placement_override);
  if (!plan.ok()) return plan.status();
  const int S = static_cast<int>(plan->stages.size());
  std::vector<std::future<std::pair<int, absl::Status>>> calls;
  for (int s = 0; s < S; ++s) {
    const StageAssignment& a = plan->stages[s];
    v1::AssignLayersRequest req;
    req.set_epoch(epoch);
    req.set_model_dir(options_.model_dir);
    req.set_layer_begin(a.layer_begin);
    req.set_layer_end(a.layer_end);
    req.set_stage(s);
    req.set_num_stages(S);
    if (s + 1 < S) req.set_next_address(alive[plan->stages[s + 1].worker].address);
    req.set_kv_dtype(options_.kv_dtype == KvDtype::kF32 ? v1::KV_DTYPE_F32 : v1::KV_DTYPE_FP8);
    req.set_kvstore_address(options_.kvstore_address);
    req.set_model_fingerprint(options_.model_fingerprint);
    req.set_model_legacy_fingerprint(options_.model_legacy_fingerprint);
    req.set_synthetic_weights(options_.synthetic_seed.has_value());
    req.set_synthetic_seed(options_.synthetic_seed.value_or(0));
    req.set_threads(options_.worker_threads);
    const std::string address = alive[a.worker].address;
    calls.push_back(std::async(std::launch::async, [this, req, address, s] {
      v1::AssignLayersResponse resp;
      return std::make_pair(s, client_->AssignLayers(address, req, absl::Seconds(300), &resp));
    }));
  }
  absl::Status failure;
  for (auto& f : calls) {
    auto [s, st] = f.get();
    if (st.ok()) continue;
    const WorkerInfo& w = alive[plan->stages[s].worker];
    if (st.code() == absl::StatusCode::kUnavailable || st.code() == absl::StatusCode::kDeadlineExceeded) {
      std::lock_guard<std::mutex> l(mu_);
      auto it = workers_.find(w.id);
      if (it != workers_.end()) it->second.alive = false;
    }
    failure = absl::UnavailableError(absl::StrCat("AssignLayers to stage ", s, " (", w.name, " at ", w.address,
                                                  ") failed: ", st.message()));
  }
  if (!failure.ok()) return failure;
  auto link = worker::StageLink::Open(
      alive[plan->stages[0].worker].address, absl::StrCat("stage 0 (", alive[plan->stages[0].worker].name, ")"),
      absl::Seconds(3), [this, epoch](v1::StageResult&& r) {
        if (r.code() == static_cast<int>(absl::StatusCode::kUnavailable)) {
          // A stage lost its successor: the whole pipeline must be re-formed.
          const std::string msg = absl::StrCat("stage ", r.failed_stage(), " is unavailable: ", r.error());
          scheduler_->OnResult(std::move(r));
          PipelineDown(epoch, absl::UnavailableError(msg));
          return;
        }
        scheduler_->OnResult(std::move(r));
      },
      [this, epoch](const absl::Status& st) { PipelineDown(epoch, st); },
      [this](const std::string& address, absl::Duration timeout) { return client_->DialStage(address, timeout); });
  if (!link.ok()) return link.status();
  {
    std::lock_guard<std::mutex> l(link_mu_);
    link_ = std::move(*link);
  }
  std::vector<std::string> stage_workers;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (epoch != epoch_) return absl::AbortedError("re-placed meanwhile");
    for (const auto& a : plan->stages) {
      auto it = workers_.find(alive[a.worker].id);
      if (it == workers_.end() || !it->second.alive) {
        return absl::UnavailableError(absl::StrCat(alive[a.worker].name, " at ", alive[a.worker].address,
                                                   " went down or registered again while its layers were assigned"));
      }
    }
    stages_.clear();
    stage_ids_.clear();
    for (const auto& a : plan->stages) {
      stages_.push_back({alive[a.worker].name, alive[a.worker].address, a.layer_begin, a.layer_end});
      stage_workers.push_back(alive[a.worker].name);
      stage_ids_.push_back(alive[a.worker].id);
    }
    placed_ = true;
  }
  log::Info("placed", {{"epoch", epoch}, {"stages", S}, {"workers", absl::StrJoin(stage_workers, ",")}});
  for (size_t i = 0; i < plan->stages.size(); ++i) {
    const auto& a = plan->stages[i];
    log::Info("stage_placed", {{"epoch", epoch}, {"stage", i}, {"worker", stage_workers[i]},
                               {"layer_begin", a.layer_begin}, {"layer_end", a.layer_end},
                               {"weight_bytes", a.weight_bytes}, {"kv_budget_bytes", a.kv_bytes}});
  }
  for (const auto& n : plan->notes) log::Info("placement_note", {{"epoch", epoch}, {"note", n}});
  scheduler_->OnPipelineUp(S, epoch);
  if (on_ready_) on_ready_(true);
  return absl::OkStatus();
}

void Cluster::Loop() {
  absl::Time next_attempt = absl::InfinitePast();
  std::string last_placement_error;  // printed once until it changes
  for (;;) {
    bool need_place = false;
    std::unique_ptr<worker::StageLink> dead_link;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait_for(l, std::chrono::milliseconds(100));
      if (stop_) return;
      const absl::Time now = clock_->Now();
      std::string down;
      for (auto& [id, w] : workers_) {
        if (w.alive && now - w.last_heartbeat > options_.down_after) {
          w.alive = false;
          log::Warn("worker_down", {{"worker", w.name}, {"worker_id", id}, {"address", w.address},
                                    {"reason", "no heartbeat for " + absl::FormatDuration(options_.down_after)}});
          if (placed_) {
            for (size_t s = 0; s < stage_ids_.size(); ++s) {
              if (stage_ids_[s] == id) {
                down = absl::StrCat("stage ", s, " (", w.name, " at ", w.address, ") is down: no heartbeat for ",
                                    absl::FormatDuration(options_.down_after));
              }
            }
          }
        }
      }
      if (!down.empty()) {
        const int64_t e = epoch_;
        l.unlock();
        PipelineDown(e, absl::UnavailableError(down));
        l.lock();
      }
      need_place = !placed_ && now >= next_attempt;
    }
    if (!need_place) continue;
    {
      std::lock_guard<std::mutex> l(link_mu_);
      dead_link = std::move(link_);
    }
    dead_link.reset();
    absl::Status st = PlaceAndAssign();
    if (!st.ok()) {
      next_attempt = clock_->Now() + absl::Milliseconds(500);
      // Retried every half second: a failure is printed when it first
      // appears (or changes), not on every retry.
      const bool report =
          st.code() != absl::StatusCode::kUnavailable || st.message().find("AssignLayers") != std::string::npos;
      if (report && st.message() != last_placement_error) {
        log::Warn("placement_failed", {{"code", absl::StatusCodeToString(st.code())}, {"error", st.message()},
                                       {"retry_s", 0.5}});
      }
      last_placement_error = std::string(st.message());
    } else {
      last_placement_error.clear();
    }
  }
}

std::vector<v1::StageStats> Cluster::StageStats() {
  std::vector<StageView> st = stages();
  std::vector<std::future<v1::StageStats>> calls;
  for (size_t i = 0; i < st.size(); ++i) {
    calls.push_back(std::async(std::launch::async, [this, i, v = st[i]] {
      v1::StageStats s;
      s.set_stage(static_cast<int>(i));
      s.set_worker(v.worker);
      s.set_address(v.address);
      s.set_layer_begin(v.layer_begin);
      s.set_layer_end(v.layer_end);
      v1::WorkerStatsResponse r;
      if (client_->Stats(v.address, absl::Seconds(1), &r).ok()) {
        s.set_up(true);
        s.set_sequences(r.sequences());
        s.set_kv_pages(r.kv_pages());
        s.set_kv_bytes(r.kv_bytes());
        s.set_queue_depth(r.queue_depth());
        s.set_batches(r.batches());
      }
      return s;
    }));
  }
  std::vector<v1::StageStats> out;
  for (auto& c : calls) out.push_back(c.get());
  return out;
}

}  // namespace strata::coordinator
