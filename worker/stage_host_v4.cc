// The deepseek_v4 part of StageHost (worker/stage_host.h): a stage of the V4
// CPU engine (model/v4/engine.h), whose rows between stages are the hc_mult
// residual streams of each token (docs/deepseek-v4.md §3, docs/service.md
// "DeepSeek-V4").
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/stage_host.h"

namespace strata::worker {

absl::Status StageHost::LoadV4(const v1::AssignLayersRequest& req, const ModelConfig& view,
                               std::unique_ptr<v4::V4Engine>* engine) const {
  if (options_.gpu) {
    return absl::FailedPreconditionError(absl::StrCat(
        options_.name, " runs on a GPU; deepseek_v4 runs on the CPU engine only: start the worker without --device gpu"));
  }
  if (req.synthetic_weights()) {
    return absl::FailedPreconditionError("deepseek_v4 has no synthetic weights: give the workers a checkpoint");
  }
  if (req.kv_dtype() != v1::KV_DTYPE_F32) {
    return absl::InvalidArgumentError(
        "deepseek_v4 keeps its state in float32 only (no fp8 V4 cache yet): assign it with kv dtype f32");
  }
  v4::V4EngineOptions o;
  o.num_threads = req.threads() > 0 ? req.threads() : options_.threads;
  o.layer_begin = req.layer_begin();
  o.layer_end = req.layer_end();
  if (o.layer_end > view.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("layer range [", o.layer_begin, ", ", o.layer_end,
                                                   ") is outside the model's ", view.num_layers, " layers"));
  }
  ASSIGN_OR_RETURN(*engine, v4::V4Engine::Load(req.model_dir(), o));
  std::fprintf(stderr, "%s: deepseek_v4 stage, layers [%d, %d), %d floats per row between stages\n",
               options_.name.c_str(), o.layer_begin, o.layer_end, (*engine)->stream_width());
  return absl::OkStatus();
}

absl::Status StageHost::RunV4Locked(const v1::StageBatch& h, const std::vector<std::vector<int>>& chunk_tokens,
                                    const std::vector<int>& all_tokens, std::vector<float>* hidden) {
  std::vector<v4::V4Chunk> chunks;
  for (int i = 0; i < h.chunks_size(); ++i) chunks.push_back({seqs_[h.chunks(i).seq_id()].v4.get(), chunk_tokens[i]});
  if (v4_->first_stage()) {
    hidden->assign(all_tokens.size() * static_cast<size_t>(v4_->stream_width()), 0.0f);
    RETURN_IF_ERROR(v4_->Embed(all_tokens, hidden->data()));
  }
  return v4_->RunLayers(chunks, hidden->data());
}

absl::Status StageHost::PersistV4Locked(const v1::StageChunk& c, const std::vector<int>& tokens, Seq& seq) {
  if (!v4_store_) return absl::OkStatus();
  const int begin = request_.layer_begin(), end = request_.layer_end();
  if (!seq.v4persist) {
    V4AppenderSpec spec;
    spec.session_id = c.session_id();
    spec.model = ModelId();
    spec.layer_begin = begin;
    spec.layer_end = end;
    spec.start_position = c.start();
    seq.v4persist = v4_store_->Open(spec);
  }
  std::string slices, blocks;
  RETURN_IF_ERROR(v4::EncodeV4Step(v4_->config(), *seq.v4, begin, end, c.start(), *v4_layout_, &slices, &blocks));
  seq.v4persist->Append(c.start(), std::vector<int32_t>(tokens.begin(), tokens.end()), std::move(slices),
                        std::move(blocks));
  return absl::OkStatus();
}

absl::Status StageHost::LoadV4Session(const v1::LoadSessionRequest& req, v1::LoadSessionResponse* resp) {
  std::shared_ptr<V4Appenders> store;
  KvModelId model;
  int begin = 0, end = 0;
  {
    std::lock_guard<std::mutex> s(state_mu_);
    if (!v4_ || !v4_store_) return absl::FailedPreconditionError(absl::StrCat(options_.name, " has no V4 stage"));
    store = v4_store_;
    model = ModelId();
    begin = request_.layer_begin();
    end = request_.layer_end();
  }
  // Off the lock: the compute thread keeps serving other sequences.
  V4Appenders::Loaded loaded;
  RETURN_IF_ERROR(store->Load(req.session_id(), model, begin, end, absl::Seconds(300), &loaded));
  if (loaded.tokens != req.tokens() || (req.persist() && req.append_from() != req.tokens())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "session '", req.session_id(), "' is a V4 session, which loads whole: the store holds the state at ",
        loaded.tokens, " tokens; asked for ", req.tokens(), " (appending from ", req.append_from(), ")"));
  }
  std::lock_guard<std::mutex> s(state_mu_);
  if (req.epoch() != request_.epoch() || !v4_) {
    return absl::AbortedError(absl::StrCat("the stage was re-assigned (epoch ", request_.epoch(),
                                           ") while loading session '", req.session_id(), "'"));
  }
  Seq seq;
  seq.v4 = v4_->NewSequence();
  RETURN_IF_ERROR(v4::DecodeV4Stage(v4_->config(), *v4_layout_, begin, end, loaded.tokens, loaded.slices,
                                    loaded.blocks, seq.v4.get()));
  seq.v4->Commit(static_cast<int>(loaded.tokens));
  if (req.persist()) {
    V4AppenderSpec spec;
    spec.session_id = req.session_id();
    spec.model = model;
    spec.layer_begin = begin;
    spec.layer_end = end;
    spec.start_position = req.append_from();
    seq.v4persist = v4_store_->Open(spec);
  }
  resp->set_tokens(loaded.tokens);
  resp->mutable_token_ids()->Add(loaded.live_ids.begin(), loaded.live_ids.end());
  seqs_[req.seq_id()] = std::move(seq);
  std::lock_guard<std::mutex> l(mu_);
  UpdateStatsLocked();
  return absl::OkStatus();
}

}  // namespace strata::worker
