#include "worker/stage_host.h"

#include <algorithm>
#include <filesystem>

#include <chrono>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace strata::worker {
namespace {

constexpr int kPageTokens = 64;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

StepKind KindOf(const v1::StageBatch& h) {
  if (h.chunks_size() == 0) return StepKind::kFree;
  bool prompt = false, other = false;
  for (const auto& c : h.chunks()) (c.prompt() ? prompt : other) = true;
  return prompt && other ? StepKind::kMixed : prompt ? StepKind::kPrefill : StepKind::kDecode;
}

SamplingParams FromProto(const v1::StageSampling& s) {
  SamplingParams p;
  p.temperature = s.temperature();
  p.top_p = s.top_p();
  p.top_k = s.top_k();
  p.min_p = s.min_p();
  p.seed = s.seed();
  p.repetition_penalty = s.repetition_penalty();
  p.frequency_penalty = s.frequency_penalty();
  p.presence_penalty = s.presence_penalty();
  if (s.logprobs() >= 0) p.logprobs = s.logprobs();
  return p;
}

}  // namespace

StageHost::StageHost(StageHostOptions options)
    : options_(std::move(options)),
      own_metrics_(options_.metrics == nullptr ? std::make_unique<metrics::Registry>() : nullptr),
      metrics_(options_.metrics != nullptr ? options_.metrics : own_metrics_.get()) {
  metrics_.SetGauges(-1, {});
  compute_ = std::thread([this] { ComputeLoop(); });
}

StageHost::~StageHost() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  compute_.join();
  std::shared_ptr<KvStoreClient> kvstore;
  std::shared_ptr<V4Appenders> v4_store;
  {
    std::lock_guard<std::mutex> s(state_mu_);
    link_.reset();
    seqs_.clear();  // appenders half-close; the client below lets them drain briefly
    kvstore = std::move(kvstore_);
    v4_store = std::move(v4_store_);
  }
}

absl::Status ValidateAssignment(const v1::AssignLayersRequest& req) {
  if (req.layer_begin() < 0 || req.layer_end() <= req.layer_begin()) {
    return absl::InvalidArgumentError(absl::StrCat("layer range [", req.layer_begin(), ", ", req.layer_end(),
                                                   ") is empty or negative"));
  }
  if (req.num_stages() < 1 || req.stage() < 0 || req.stage() >= req.num_stages()) {
    return absl::InvalidArgumentError(
        absl::StrCat("stage ", req.stage(), " of ", req.num_stages(), ": need 0 <= stage < num_stages"));
  }
  if (req.threads() < 0 || req.threads() > kMaxThreads) {
    return absl::InvalidArgumentError(
        absl::StrCat("threads must be in [0, ", kMaxThreads, "] (0: the worker's own), got ", req.threads()));
  }
  if (!v1::KvDtype_IsValid(req.kv_dtype())) {
    return absl::InvalidArgumentError(absl::StrCat("unknown kv dtype ", req.kv_dtype()));
  }
  if (req.epoch() < 1) return absl::InvalidArgumentError(absl::StrCat("epoch must be positive, got ", req.epoch()));
  return absl::OkStatus();
}

absl::Status CheckModelRoot(const std::string& model_dir, const std::string& root) {
  namespace fs = std::filesystem;
  if (root.empty()) {
    return absl::PermissionDeniedError(absl::StrCat("this worker loads no model: it was started without --model-root ",
                                                    "(refusing '", model_dir, "')"));
  }
  std::error_code ec;
  const fs::path dir = fs::canonical(model_dir, ec);
  if (ec) return absl::NotFoundError(absl::StrCat("model directory '", model_dir, "': ", ec.message()));
  const fs::path base = fs::canonical(root, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("--model-root '", root, "': ", ec.message()));
  auto d = dir.begin();
  for (auto b = base.begin(); b != base.end(); ++b, ++d) {
    if (d == dir.end() || *d != *b) {
      return absl::PermissionDeniedError(absl::StrCat("model directory '", model_dir, "' (", dir.string(),
                                                      ") is outside this worker's --model-root '", base.string(),
                                                      "'"));
    }
  }
  return absl::OkStatus();
}

int StageHost::MetricsStage() {
  std::lock_guard<std::mutex> l(mu_);
  return MetricsStageLocked();
}

absl::Status StageHost::Assign(const v1::AssignLayersRequest& req, v1::AssignLayersResponse* resp) {
  absl::Status st = AssignImpl(req, resp);
  if (st.ok()) {
    log::Info("assign", {{"worker", options_.name}, {"stage", req.stage()}, {"stages", req.num_stages()},
                         {"layer_begin", req.layer_begin()}, {"layer_end", req.layer_end()}, {"epoch", req.epoch()},
                         {"load_ms", resp->load_ms()}});
  } else {
    metrics_.CountError(MetricsStage(), "assign", st.code());
    log::Error("assign_failed", {{"worker", options_.name}, {"stage", req.stage()}, {"epoch", req.epoch()},
                                 {"code", absl::StatusCodeToString(st.code())}, {"error", st.message()}});
  }
  return st;
}

absl::Status StageHost::AssignImpl(const v1::AssignLayersRequest& req, v1::AssignLayersResponse* resp) {
  RETURN_IF_ERROR(ValidateAssignment(req));
  RETURN_IF_ERROR(CheckModelRoot(req.model_dir(), options_.model_root));
  const auto t0 = std::chrono::steady_clock::now();
  EngineOptions eo;
  eo.kv_dtype = req.kv_dtype() == v1::KV_DTYPE_F32 ? KvDtype::kF32 : KvDtype::kFp8;
  eo.num_threads = req.threads() > 0 ? req.threads() : options_.threads;
  eo.layer_begin = req.layer_begin();
  eo.layer_end = req.layer_end();
  {
    std::lock_guard<std::mutex> l(mu_);
    ready_ = false;
  }
  if (req.synthetic_weights() && !options_.gpu) {
    return absl::FailedPreconditionError(absl::StrCat(
        options_.name, " runs on the CPU; synthetic weights are generated on a GPU: start the workers with "
                       "--device gpu"));
  }
  if (options_.gpu && req.kv_dtype() == v1::KV_DTYPE_F32) {
    return absl::InvalidArgumentError(absl::StrCat(options_.name, " runs its layers on a GPU, which keeps the KV "
                                                   "cache in fp8; assign it with kv dtype fp8"));
  }
  std::unique_ptr<Engine> engine;
  std::unique_ptr<DeviceStage> device;
  std::unique_ptr<v4::V4Engine> v4;
  ASSIGN_OR_RETURN(const ModelConfig view, LoadModelConfig(req.model_dir()));
  const bool is_v4 = view.family == ModelFamily::kDeepseekV4;
  {
    // Reuse the loaded engine when only the epoch or the neighbours changed.
    std::lock_guard<std::mutex> s(state_mu_);
    if (loaded() && request_.model_dir() == req.model_dir() && request_.layer_begin() == req.layer_begin() &&
        request_.layer_end() == req.layer_end() && request_.kv_dtype() == req.kv_dtype() &&
        request_.synthetic_weights() == req.synthetic_weights() &&
        request_.synthetic_seed() == req.synthetic_seed()) {
      engine = std::move(engine_);
      if (device_) seqs_.clear();  // device sequences go before their engine
      device = std::move(device_);
      v4 = std::move(v4_);
    }
  }
  if (is_v4) {
    if (!v4) RETURN_IF_ERROR(LoadV4(req, view, &v4));
  } else if (options_.gpu && !device) {
    {
      // The old stage's sequences and pages go before a new one is loaded.
      std::lock_guard<std::mutex> s(state_mu_);
      seqs_.clear();
      device_.reset();
    }
    DeviceStageOptions dso = options_.gpu_options;
    if (req.synthetic_weights()) dso.synthetic_seed = req.synthetic_seed();
    ASSIGN_OR_RETURN(device, DeviceStage::Create(req.model_dir(), req.layer_begin(), req.layer_end(), dso));
  } else if (!options_.gpu && !engine) {
    ASSIGN_OR_RETURN(engine, Engine::Load(req.model_dir(), eo));
  }
  std::unique_ptr<StageLink> old_link;
  std::deque<Work> dropped;
  std::map<uint64_t, Pending> orphaned;
  std::shared_ptr<KvStoreClient> old_kvstore;
  std::shared_ptr<V4Appenders> old_v4_store;
  std::map<uint64_t, Seq> old_seqs;
  {
    std::lock_guard<std::mutex> s(state_mu_);
    old_seqs.swap(seqs_);
    engine_ = std::move(engine);
    device_ = std::move(device);
    v4_ = std::move(v4);
    v4_view_ = view;
    v4_layout_.reset();
    if (v4_) v4_layout_ = std::make_unique<kv::V3Layout>(v4::V4KvHeader(v4_->config(), kv::V3RowFormat::kF32));
    if (v4_store_ && v4_store_address_ != req.kvstore_address()) old_v4_store = std::move(v4_store_);
    if (v4_ && !v4_store_ && !req.kvstore_address().empty()) {
      v4_store_ = std::make_shared<V4Appenders>(grpc::CreateChannel(req.kvstore_address(), options_.credentials));
      v4_store_address_ = req.kvstore_address();
    }
    request_ = req;
    old_link = std::move(link_);
    ++link_generation_;
    layout_ = MakeSliceLayout(config(), req.layer_begin(), req.layer_end());
    if (kvstore_ && kvstore_->address() != req.kvstore_address()) old_kvstore = std::move(kvstore_);
    if (!kvstore_ && !req.kvstore_address().empty()) {
      KvStoreClientOptions ko;
      ko.address = req.kvstore_address();
      ko.credentials = options_.credentials;
      auto c = KvStoreClient::Connect(ko);
      if (c.ok()) kvstore_ = std::move(*c);
    }
    std::lock_guard<std::mutex> l(mu_);
    dropped.swap(queue_);
    orphaned.swap(pending_);
    epoch_ = req.epoch();
    ready_ = true;
    resp->set_weight_bytes(static_cast<int64_t>(weight_bytes()));
    UpdateStatsLocked();
  }
  old_link.reset();
  old_seqs.clear();     // their appenders drain in the background
  old_kvstore.reset();  // waits briefly for its appenders
  old_v4_store.reset();
  for (auto& w : dropped) Fail(w.sink, w.batch.header.batch_id(), absl::AbortedError("the stage was re-assigned"), req.stage());
  for (auto& [id, p] : orphaned) Fail(p.sink, id, absl::AbortedError("the stage was re-assigned"), req.stage());
  resp->set_load_ms(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  return absl::OkStatus();
}

void StageHost::Submit(Batch batch, std::shared_ptr<ResultSink> sink) {
  {
    std::lock_guard<std::mutex> l(mu_);
    queue_.push_back({std::move(batch), std::move(sink), Clock::now()});
    stats_.set_queue_depth(static_cast<int64_t>(queue_.size()));
    metrics_.SetQueueDepth(MetricsStageLocked(), stats_.queue_depth());
  }
  cv_.notify_one();
}

void StageHost::ComputeLoop() {
  for (;;) {
    Work w;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      w = std::move(queue_.front());
      queue_.pop_front();
      stats_.set_queue_depth(static_cast<int64_t>(queue_.size()));
      metrics_.SetQueueDepth(MetricsStageLocked(), stats_.queue_depth());
    }
    RunBatch(w);
  }
}

void StageHost::Fail(const std::shared_ptr<ResultSink>& sink, uint64_t batch_id, const absl::Status& s,
                     int stage) {
  if (batch_id == 0) return;  // a free-only message expects no answer
  v1::StageResult r;
  r.set_batch_id(batch_id);
  r.set_code(static_cast<int>(s.code()));
  r.set_error(std::string(s.message()));
  r.set_failed_stage(stage);
  sink->Send(std::move(r));
}

void StageHost::RunBatch(Work& w) {
  if (options_.debug_step_delay_ms > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(options_.debug_step_delay_ms));
  }
  std::unique_lock<std::mutex> s(state_mu_);
  const Clock::time_point t0 = Clock::now();
  const int stage = request_.stage();
  const uint64_t id = w.batch.header.batch_id();
  if (!loaded()) {
    metrics_.CountError(-1, "batch", absl::StatusCode::kFailedPrecondition);
    Fail(w.sink, id, absl::FailedPreconditionError(absl::StrCat(options_.name, " has no layers assigned")), stage);
    return;
  }
  const StageMetrics::Series* m = metrics_.ForStage(stage);
  if (w.batch.header.epoch() != request_.epoch()) {
    metrics_.CountError(stage, "batch", absl::StatusCode::kAborted);
    Fail(w.sink, id, absl::AbortedError(absl::StrCat("batch of epoch ", w.batch.header.epoch(), " reached stage ",
                                                     stage, " of epoch ", request_.epoch())), stage);
    return;
  }
  const StepKind kind = KindOf(w.batch.header);
  const int rows = w.batch.header.total_rows(), chunks = w.batch.header.chunks_size();
  std::vector<uint64_t> frees(w.batch.header.free_seq_ids().begin(), w.batch.header.free_seq_ids().end());
  if (!frees.empty()) FreeLocked(frees, false);
  v1::StageResult result;
  result.set_batch_id(id);
  if (chunks > 0) {
    if (absl::Status st = Compute(w.batch, &result); !st.ok()) {
      m->busy_seconds->Inc(Seconds(Clock::now() - t0));
      metrics_.CountError(stage, "batch", st.code());
      log::Warn("batch_failed", {{"worker", options_.name}, {"stage", stage}, {"batch_id", id},
                                 {"code", absl::StatusCodeToString(st.code())}, {"error", st.message()}});
      Fail(w.sink, id, st, stage);
      // The rows after this stage will never arrive: forget the batch's
      // sequences here so that a retry starts from a known state.
      std::vector<uint64_t> ids;
      for (const auto& c : w.batch.header.chunks()) ids.push_back(c.seq_id());
      FreeLocked(ids, false);
      return;
    }
  }
  m->busy_seconds->Inc(Seconds(Clock::now() - t0));
  m->steps[static_cast<int>(kind)]->Inc();
  if (chunks > 0) {
    m->batch_rows->Observe(rows);
    m->batch_sequences->Observe(chunks);
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    stats_.set_batches(stats_.batches() + 1);
    UpdateStatsLocked();
  }
  if (last_stage()) {
    if (id != 0) w.sink->Send(std::move(result));
    m->hop_seconds->Observe(Seconds(Clock::now() - w.received));
    return;
  }
  if (absl::Status st = EnsureLinkLocked(); !st.ok()) {
    metrics_.CountError(stage, "downstream", st.code());
    log::Warn("downstream_unreachable", {{"worker", options_.name}, {"stage", stage}, {"batch_id", id},
                                         {"code", absl::StatusCodeToString(st.code())}, {"error", st.message()}});
    Fail(w.sink, id, st, stage + 1);
    return;
  }
  v1::StageBatch header = std::move(w.batch.header);
  header.set_hidden_size(header.chunks_size() > 0 ? config().stream_width() : 0);
  if (id != 0) {
    std::lock_guard<std::mutex> l(mu_);
    pending_[id] = Pending{w.sink, Clock::now(), m};
  }
  if (absl::Status st = link_->Send(header, w.batch.hidden.data(), options_.max_chunk_bytes); !st.ok()) {
    metrics_.CountError(stage, "downstream", st.code());
    std::shared_ptr<ResultSink> sink;
    {
      std::lock_guard<std::mutex> l(mu_);
      auto it = pending_.find(id);
      if (it != pending_.end()) {
        sink = it->second.sink;
        pending_.erase(it);
      }
    }
    if (sink) Fail(sink, id, st, stage + 1);
    return;
  }
  m->hop_seconds->Observe(Seconds(Clock::now() - w.received));
}

absl::Status StageHost::Compute(Batch& batch, v1::StageResult* result) {
  const ModelConfig& cfg = config();
  const int H = cfg.stream_width();  // floats per row on the wire
  const v1::StageBatch& h = batch.header;
  std::vector<int> all_tokens;
  std::vector<std::vector<int>> chunk_tokens(h.chunks_size());
  int rows = 0;
  for (int i = 0; i < h.chunks_size(); ++i) {
    const v1::StageChunk& c = h.chunks(i);
    if (c.tokens_size() == 0) return absl::InvalidArgumentError(absl::StrCat("sequence ", c.seq_id(), " has an empty chunk"));
    auto it = seqs_.find(c.seq_id());
    if (it == seqs_.end()) {
      if (c.start() != 0) {
        return absl::FailedPreconditionError(absl::StrCat("sequence ", c.seq_id(), " is unknown on stage ",
                                                          request_.stage(), " but the chunk starts at ", c.start()));
      }
      Seq fresh;
      if (device_) {
        ASSIGN_OR_RETURN(fresh.dev, device_->NewSequence());
      } else if (v4_) {
        fresh.v4 = v4_->NewSequence();
      } else {
        fresh.kv = engine_->NewSequence();
      }
      it = seqs_.emplace(c.seq_id(), std::move(fresh)).first;
    }
    Seq& seq = it->second;
    if (Tokens(seq) != c.start()) {
      return absl::FailedPreconditionError(absl::StrCat("sequence ", c.seq_id(), " holds ", Tokens(seq),
                                                        " tokens on stage ", request_.stage(),
                                                        " but the chunk starts at ", c.start()));
    }
    if (c.start() + c.tokens_size() > cfg.max_position_embeddings) {
      return absl::OutOfRangeError(absl::StrCat("sequence ", c.seq_id(), " would exceed the context of ",
                                                cfg.max_position_embeddings, " tokens"));
    }
    chunk_tokens[i].assign(c.tokens().begin(), c.tokens().end());
    all_tokens.insert(all_tokens.end(), c.tokens().begin(), c.tokens().end());
    rows += c.tokens_size();
  }
  if (rows != h.total_rows()) {
    return absl::InvalidArgumentError(absl::StrCat("batch ", h.batch_id(), " says ", h.total_rows(),
                                                   " rows but its chunks hold ", rows, " tokens"));
  }
  const bool first = first_stage();
  if (!first && (h.hidden_size() != H || batch.hidden.size() != static_cast<size_t>(rows) * H)) {
    return absl::InvalidArgumentError(absl::StrCat("batch ", h.batch_id(), " carries rows of ", h.hidden_size(),
                                                   " floats; this model's hidden size is ", H,
                                                   cfg.hidden_streams > 1
                                                       ? absl::StrCat(" (", cfg.hidden_streams, " streams of ",
                                                                      cfg.hidden_size, ")")
                                                       : std::string()));
  }
  if (v4_) {
    RETURN_IF_ERROR(RunV4Locked(h, chunk_tokens, all_tokens, &batch.hidden));
  } else if (device_) {
    std::vector<DeviceChunk> chunks;
    for (int i = 0; i < h.chunks_size(); ++i) chunks.push_back({seqs_[h.chunks(i).seq_id()].dev.get(), chunk_tokens[i]});
    RETURN_IF_ERROR(device_->Run(chunks, &batch.hidden));  // RunBatch logs a failure
  } else {
    std::vector<SeqChunk> chunks;
    for (int i = 0; i < h.chunks_size(); ++i) chunks.push_back({seqs_[h.chunks(i).seq_id()].kv.get(), chunk_tokens[i]});
    if (first) {
      batch.hidden.assign(static_cast<size_t>(rows) * H, 0.0f);
      RETURN_IF_ERROR(engine_->Embed(all_tokens, batch.hidden.data()));
    }
    RETURN_IF_ERROR(engine_->RunLayers(chunks, batch.hidden.data()));
  }
  for (int i = 0; i < h.chunks_size(); ++i) {
    RETURN_IF_ERROR(PersistLocked(h.chunks(i), chunk_tokens[i], seqs_[h.chunks(i).seq_id()]));
  }
  if (!last_stage()) return absl::OkStatus();

  // Last stage: sample one token for every chunk that asks for it. On a GPU,
  // plain greedy rows take the device's argmax and every other request the
  // device sampler, penalties and logprobs included (only the ids and the
  // logprobs asked for come back); a CPU stage samples its logits rows.
  enum Where { kArgmax, kDeviceDraw, kHost };
  std::vector<float> rows_of[3];
  std::vector<SampleDraw> draws;
  std::vector<int> sample_chunks, where, slot;
  int count[3] = {0, 0, 0};
  int row = 0;
  for (int i = 0; i < h.chunks_size(); ++i) {
    row += h.chunks(i).tokens_size();
    const v1::StageChunk& c = h.chunks(i);
    Seq& seq = seqs_[c.seq_id()];
    if (c.has_sampling()) {
      ASSIGN_OR_RETURN(seq.sampler, Sampler::Create(FromProto(c.sampling()), cfg.vocab_size));
      seq.logprobs = c.sampling().logprobs();
    }
    if (c.prompt() && seq.sampler) seq.sampler->ObservePrompt(chunk_tokens[i]);
    if (!c.sample()) continue;
    if (!seq.sampler) {
      return absl::FailedPreconditionError(absl::StrCat("sequence ", c.seq_id(), " asks for a token without sampling parameters"));
    }
    const float* src = batch.hidden.data() + static_cast<size_t>(row - 1) * H;
    const Where w = device_ == nullptr ? kHost : seq.sampler->plain_greedy() ? kArgmax : kDeviceDraw;
    rows_of[w].insert(rows_of[w].end(), src, src + H);
    if (w == kDeviceDraw) draws.push_back(seq.sampler->NextDraw());
    sample_chunks.push_back(i);
    where.push_back(w);
    slot.push_back(count[w]++);
  }
  if (sample_chunks.empty()) return absl::OkStatus();
  const int V = cfg.vocab_size;
  std::vector<int> device_tokens[2];
  std::vector<SampleLogprobs> device_logprobs;
  if (count[kArgmax] > 0) {
    RETURN_IF_ERROR(device_->GreedyTokens(rows_of[kArgmax].data(), count[kArgmax], &device_tokens[kArgmax]));
  }
  if (count[kDeviceDraw] > 0) {
    RETURN_IF_ERROR(device_->SampleTokens(rows_of[kDeviceDraw].data(), draws, &device_tokens[kDeviceDraw],
                                          &device_logprobs));
  }
  const int n_logits = count[kHost];
  std::vector<float> logits(static_cast<size_t>(n_logits) * V);
  if (n_logits > 0 && v4_) RETURN_IF_ERROR(v4_->Logits(rows_of[kHost].data(), n_logits, logits.data()));
  if (n_logits > 0 && !v4_) RETURN_IF_ERROR(engine_->Logits(rows_of[kHost].data(), n_logits, logits.data()));
  for (size_t k = 0; k < sample_chunks.size(); ++k) {
    const v1::StageChunk& c = h.chunks(sample_chunks[k]);
    Seq& seq = seqs_[c.seq_id()];
    SampleLogprobs lp;
    int token = 0;
    if (where[k] == kArgmax) {
      token = device_tokens[kArgmax][slot[k]];
      seq.sampler->ConsumeDraw();
    } else if (where[k] == kDeviceDraw) {
      token = device_tokens[kDeviceDraw][slot[k]];  // (its draw was taken above)
      if (seq.logprobs >= 0) lp = device_logprobs[slot[k]];
    } else {
      absl::Span<const float> row_logits(logits.data() + static_cast<size_t>(slot[k]) * V, V);
      token = seq.sampler->Sample(row_logits, seq.logprobs >= 0 ? &lp : nullptr);
    }
    seq.sampler->Observe(token, /*is_prompt=*/false);
    v1::SampledToken* t = result->add_tokens();
    t->set_seq_id(c.seq_id());
    t->set_token(token);
    if (seq.logprobs >= 0) {
      t->set_logprob(lp.logprob);
      t->set_rank(lp.rank);
      for (const auto& a : lp.top) {
        t->add_top_tokens(a.token);
        t->add_top_logprobs(a.logprob);
      }
    }
  }
  return absl::OkStatus();
}

absl::Status StageHost::EnsureLinkLocked() {
  if (link_) {
    bool broken;
    {
      std::lock_guard<std::mutex> l(mu_);
      broken = broken_generation_ == link_generation_;
    }
    if (!broken) return absl::OkStatus();
    link_.reset();
    ++link_generation_;
  }
  const uint64_t gen = link_generation_;
  const std::string name = absl::StrCat("stage ", request_.stage() + 1);
  auto link = StageLink::Open(
      request_.next_address(), name, absl::Seconds(2),
      [this](v1::StageResult&& r) { OnDownstreamResult(std::move(r)); },
      [this, gen](const absl::Status& st) { OnDownstreamBroken(gen, st); },
      options_.dialer ? options_.dialer : GrpcStageDialer(options_.credentials));
  if (!link.ok()) return link.status();
  link_ = std::move(*link);
  return absl::OkStatus();
}

void StageHost::OnDownstreamResult(v1::StageResult&& r) {
  Pending p;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = pending_.find(r.batch_id());
    if (it == pending_.end()) return;
    p = std::move(it->second);
    pending_.erase(it);
  }
  p.series->downstream_seconds->Observe(Seconds(Clock::now() - p.sent));
  p.sink->Send(std::move(r));
}

void StageHost::OnDownstreamBroken(uint64_t gen, const absl::Status& st) {
  std::map<uint64_t, Pending> pending;
  int stage = 0;
  {
    // Runs on the link's reader thread: never take state_mu_ here (the
    // compute thread may be destroying the link while holding it).
    std::lock_guard<std::mutex> l(mu_);
    pending.swap(pending_);
    stage = static_cast<int>(stats_.stage()) + 1;
    // Marked before the batches are failed: a batch submitted once a failure
    // was seen upstream finds the link broken, and EnsureLinkLocked replaces it.
    broken_generation_ = gen;
  }
  if (!pending.empty()) {
    log::Warn("downstream_broken", {{"worker", options_.name}, {"stage", stage - 1}, {"batches", pending.size()},
                                    {"code", absl::StatusCodeToString(st.code())}, {"error", st.message()}});
  }
  for (auto& [id, p] : pending) {
    metrics_.CountError(stage - 1, "downstream", st.code());
    Fail(p.sink, id, st, stage);
  }
}

int64_t StageHost::FreeLocked(const std::vector<uint64_t>& ids, bool all) {
  int64_t n = 0;
  if (all) {
    n = static_cast<int64_t>(seqs_.size());
    seqs_.clear();
  } else {
    for (uint64_t id : ids) n += static_cast<int64_t>(seqs_.erase(id));
  }
  std::lock_guard<std::mutex> l(mu_);
  UpdateStatsLocked();
  return n;
}

int64_t StageHost::Free(const std::vector<uint64_t>& ids, bool all) {
  std::lock_guard<std::mutex> s(state_mu_);
  return FreeLocked(ids, all);
}

std::unique_ptr<SequenceKv> StageHost::NewMirror() const {
  const ModelConfig& c = config();
  return std::make_unique<SequenceKv>(request_.layer_end() - request_.layer_begin(), c.kv_lora_rank,
                                      c.qk_rope_head_dim, c.index_head_dim, KvDtype::kFp8, /*fp8_index=*/true);
}

absl::Status StageHost::PersistLocked(const v1::StageChunk& c, const std::vector<int>& tokens, Seq& seq) {
  if (!c.persist() || c.session_id().empty() || !kvstore_) return absl::OkStatus();
  if (seq.v4) return PersistV4Locked(c, tokens, seq);
  if (seq.dev) {
    // The appender reads rows from a host cache: copy the new rows down.
    if (!seq.kv) seq.kv = NewMirror();
    RETURN_IF_ERROR(device_->MirrorRows(*seq.dev, seq.kv.get()));
  }
  if (!seq.persist) {
    AppenderSpec spec;
    spec.session_id = c.session_id();
    spec.model = ModelId();
    spec.layout = layout_;
    spec.first_position = c.start();
    spec.skip_below = c.start();
    seq.persist = kvstore_->OpenAppender(spec);
  }
  seq.persist->Append(c.start(), tokens, *seq.kv);
  return absl::OkStatus();
}

absl::Status StageHost::LoadSession(const v1::LoadSessionRequest& req, v1::LoadSessionResponse* resp) {
  const Clock::time_point t0 = Clock::now();
  absl::Status st = LoadSessionImpl(req, resp);
  const int stage = MetricsStage();
  if (st.ok()) {
    log::Info("session_load", {{"worker", options_.name}, {"stage", stage}, {"session_id", req.session_id()},
                               {"tokens", resp->tokens()}, {"persist", req.persist()}, {"ms", Ms(Clock::now() - t0)}});
  } else {
    metrics_.CountError(stage, "load_session", st.code());
    log::Warn("session_load_failed", {{"worker", options_.name}, {"stage", stage}, {"session_id", req.session_id()},
                                      {"code", absl::StatusCodeToString(st.code())}, {"error", st.message()}});
  }
  return st;
}

absl::Status StageHost::LoadSessionImpl(const v1::LoadSessionRequest& req, v1::LoadSessionResponse* resp) {
  if (req.session_id().empty() || req.tokens() < 0 || req.tokens() > (int64_t{1} << 31) ||
      (req.persist() && req.append_from() < req.tokens())) {
    return absl::InvalidArgumentError(absl::StrCat("LoadSession needs a session id, 0 <= tokens and, with persist, ",
                                                   "append_from >= tokens; got '", req.session_id(), "', ",
                                                   req.tokens(), ", ", req.append_from()));
  }
  std::unique_ptr<SequenceKv> kv;
  std::shared_ptr<KvStoreClient> client;
  SliceLayout layout;
  KvModelId model;
  bool is_v4 = false;
  {
    std::lock_guard<std::mutex> s(state_mu_);
    if (!loaded()) return absl::FailedPreconditionError(absl::StrCat(options_.name, " has no layers assigned"));
    if (req.epoch() != request_.epoch()) {
      return absl::AbortedError(absl::StrCat("LoadSession for epoch ", req.epoch(), " on a stage of epoch ",
                                             request_.epoch()));
    }
    if (!kvstore_) {
      return absl::FailedPreconditionError(
          absl::StrCat(options_.name, " has no KV store (the coordinator runs without --kvstore)"));
    }
    if (req.tokens() >= config().max_position_embeddings) {
      return absl::InvalidArgumentError(absl::StrCat("cannot load ", req.tokens(), " tokens: the context is ",
                                                     config().max_position_embeddings));
    }
    is_v4 = v4_ != nullptr;
    if (!is_v4) kv = device_ ? NewMirror() : engine_->NewSequence();
    client = kvstore_;
    layout = layout_;
    model = ModelId();
  }
  if (is_v4) return LoadV4Session(req, resp);
  // Off the lock: the compute thread keeps serving other sequences.
  std::vector<int> ids;
  RETURN_IF_ERROR(client->Load(req.session_id(), model, layout, req.tokens(), kv.get(), &ids));
  std::unique_ptr<KvAppender> appender;
  if (req.persist()) {
    AppenderSpec spec;
    spec.session_id = req.session_id();
    spec.model = model;
    spec.layout = layout;
    spec.first_position = req.tokens();
    spec.skip_below = req.append_from();
    spec.start_position = req.append_from();
    appender = client->OpenAppender(spec);
  }
  std::lock_guard<std::mutex> s(state_mu_);
  if (req.epoch() != request_.epoch()) {
    return absl::AbortedError(absl::StrCat("the stage was re-assigned (epoch ", request_.epoch(),
                                           ") while loading session '", req.session_id(), "'"));
  }
  const int64_t loaded_tokens = kv->num_tokens();
  Seq seq;
  if (device_) {
    // Upload the rows to the device; keep the host copy only for the store.
    ASSIGN_OR_RETURN(seq.dev, device_->NewSequence());
    RETURN_IF_ERROR(device_->Upload(*kv, seq.dev.get()));
    if (!req.persist()) kv.reset();
  }
  resp->set_tokens(loaded_tokens);
  resp->mutable_token_ids()->Add(ids.begin(), ids.end());
  seq.kv = std::move(kv);
  seq.persist = std::move(appender);
  seqs_[req.seq_id()] = std::move(seq);
  std::lock_guard<std::mutex> l(mu_);
  UpdateStatsLocked();
  return absl::OkStatus();
}

void StageHost::UpdateStatsLocked() {
  // REQUIRES: state_mu_ and mu_ held.
  stats_.set_epoch(request_.epoch());
  stats_.set_stage(request_.stage());
  stats_.set_layer_begin(request_.layer_begin());
  stats_.set_layer_end(request_.layer_end());
  stats_.set_sequences(static_cast<int64_t>(seqs_.size()));
  int64_t pages = 0, bytes = 0;
  for (const auto& [id, s] : seqs_) {
    if (s.v4) {
      bytes += static_cast<int64_t>(s.v4->bytes());
      continue;
    }
    if (s.dev) {
      pages += s.dev->num_pages() * (request_.layer_end() - request_.layer_begin());
      bytes += s.dev->num_pages() * device_->page_bytes();
      continue;
    }
    pages += static_cast<int64_t>((s.kv->num_tokens() + kPageTokens - 1) / kPageTokens) * s.kv->num_layers();
    bytes += static_cast<int64_t>(s.kv->bytes());
  }
  stats_.set_kv_pages(pages);
  stats_.set_kv_bytes(bytes);
  StageMetrics::Gauges g;
  g.kv_pages_used = pages;
  g.kv_bytes_used = bytes;
  g.sequences = static_cast<int64_t>(seqs_.size());
  g.queue_depth = static_cast<int64_t>(queue_.size());
  g.ready = ready_ && loaded();
  if (device_ && device_->page_bytes() > 0) {
    // The pool holds kv_cache_bytes of page ids; each id is a page of every layer.
    int64_t ids_used = 0;
    for (const auto& [id, s] : seqs_) ids_used += s.dev ? s.dev->num_pages() : 0;
    const int64_t ids = options_.gpu_options.kv_cache_bytes / device_->page_bytes();
    g.kv_pages_free = std::max<int64_t>(0, ids - ids_used) * (request_.layer_end() - request_.layer_begin());
  }
  metrics_.SetGauges(request_.epoch() > 0 ? request_.stage() : -1, g);
  if (loaded()) stats_.set_weight_bytes(static_cast<int64_t>(weight_bytes()));
  if (kvstore_) stats_.set_kv_rows_persisted(kvstore_->rows_committed());
}

v1::WorkerStatsResponse StageHost::Stats() {
  std::lock_guard<std::mutex> l(mu_);
  return stats_;
}

int64_t StageHost::epoch() {
  std::lock_guard<std::mutex> l(mu_);
  return epoch_;
}

bool StageHost::ready() {
  std::lock_guard<std::mutex> l(mu_);
  return ready_;
}

}  // namespace strata::worker
