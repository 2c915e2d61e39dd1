#include "model/engine.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cpu/ops.h"
#include "model/layer_ops.h"

namespace strata {

absl::StatusOr<std::unique_ptr<Engine>> Engine::Load(const std::string& model_dir,
                                                     const EngineOptions& options) {
  ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(model_dir));
  if (config.family == ModelFamily::kDeepseekV4) {
    return absl::InvalidArgumentError(absl::StrCat(model_dir, ": deepseek_v4 runs on its own engine (model/v4/)"));
  }
  EngineOptions opt = options;
  RETURN_IF_ERROR(CheckStageRange(config, opt.layer_begin, &opt.layer_end));
  ASSIGN_OR_RETURN(auto store, TensorStore::OpenDir(model_dir));
  ASSIGN_OR_RETURN(auto weights, LoadWeights(*store, config, opt.layer_begin, opt.layer_end,
                                             opt.layer_begin == 0, opt.layer_end == config.num_layers));
  return std::unique_ptr<Engine>(new Engine(std::move(config), opt, std::move(weights)));
}

Engine::Engine(ModelConfig config, EngineOptions options, std::unique_ptr<ModelWeights> weights)
    : config_(std::move(config)), options_(options), weights_(std::move(weights)),
      pool_(std::make_unique<ThreadPool>(options.num_threads)) {}

std::unique_ptr<SequenceKv> Engine::NewSequence() const {
  return std::make_unique<SequenceKv>(options_.layer_end - options_.layer_begin, config_.kv_lora_rank,
                                      config_.qk_rope_head_dim, config_.index_head_dim,
                                      options_.kv_dtype, options_.fp8_indexer_keys);
}

absl::Status Engine::Embed(absl::Span<const int> tokens, float* hidden) const {
  if (!first_stage()) return absl::FailedPreconditionError("Embed called on a stage without the embedding");
  const int H = config_.hidden_size;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= config_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", tokens[i], " at index ", i,
                                                     " is outside the vocabulary [0, ", config_.vocab_size, ")"));
    }
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    std::memcpy(hidden + i * H, weights_->embed.data() + static_cast<size_t>(tokens[i]) * H, H * sizeof(float));
  }
  return absl::OkStatus();
}

absl::Status Engine::RunLayers(absl::Span<const SeqChunk> chunks, float* hidden) {
  const int H = config_.hidden_size;
  std::vector<internal::ChunkRows> rows_of;
  int rows = 0;
  for (const SeqChunk& ch : chunks) {
    if (ch.kv == nullptr || ch.kv->num_layers() != options_.layer_end - options_.layer_begin) {
      return absl::InvalidArgumentError("sequence cache does not belong to this engine's layers");
    }
    if (ch.tokens.empty()) return absl::InvalidArgumentError("a chunk has no tokens");
    for (const auto& other : rows_of) {
      if (other.kv == ch.kv) return absl::InvalidArgumentError("a sequence appears twice in one batch");
    }
    rows_of.push_back({ch.kv, rows, static_cast<int>(ch.tokens.size()), ch.kv->num_tokens()});
    rows += static_cast<int>(ch.tokens.size());
  }
  internal::Rope rope(config_);
  internal::Selections selections(rows);
  std::vector<float> xn(static_cast<size_t>(rows) * H), delta(xn.size());
  for (int g = options_.layer_begin; g < options_.layer_end; ++g) {
    const int l = g - options_.layer_begin;
    const LayerWeights& w = weights_->layers[l];
    for (int r = 0; r < rows; ++r) {
      cpu::RmsNorm(hidden + static_cast<size_t>(r) * H, w.input_norm.data(), H, config_.rms_norm_eps,
                   &xn[static_cast<size_t>(r) * H]);
    }
    internal::AttentionLayer(config_, w, g, l, rope, rows_of, rows, xn.data(), delta.data(), &selections,
                             pool_.get());
    if (options_.record_selections) {
      selections_.resize(options_.layer_end - options_.layer_begin);
      selections_[l].clear();
      if (config_.layers[g].indexer == IndexerMode::kFull) selections_[l] = selections;
    }
    for (size_t i = 0; i < xn.size(); ++i) hidden[i] += delta[i];
    for (int r = 0; r < rows; ++r) {
      cpu::RmsNorm(hidden + static_cast<size_t>(r) * H, w.post_attention_norm.data(), H,
                   config_.rms_norm_eps, &xn[static_cast<size_t>(r) * H]);
    }
    internal::MlpLayer(config_, w, config_.layers[g].moe, rows, xn.data(), delta.data(), pool_.get());
    for (size_t i = 0; i < xn.size(); ++i) hidden[i] += delta[i];
  }
  for (const auto& ch : rows_of) ch.kv->Commit(ch.n);
  return absl::OkStatus();
}

absl::Status Engine::Logits(const float* hidden, int rows, float* logits) const {
  if (!last_stage()) return absl::FailedPreconditionError("Logits called on a stage without lm_head");
  const int H = config_.hidden_size;
  std::vector<float> xn(static_cast<size_t>(rows) * H);
  for (int r = 0; r < rows; ++r) {
    cpu::RmsNorm(hidden + static_cast<size_t>(r) * H, weights_->final_norm.data(), H, config_.rms_norm_eps,
                 &xn[static_cast<size_t>(r) * H]);
  }
  cpu::Linear(xn.data(), rows, weights_->lm_head.w.data(), nullptr, H, config_.vocab_size, logits, pool_.get());
  return absl::OkStatus();
}

absl::Status Engine::Forward(absl::Span<const SeqChunk> chunks, bool all_logits,
                             std::vector<float>* logits) {
  if (!first_stage() || !last_stage()) {
    return absl::FailedPreconditionError("Forward needs an engine that owns the whole model");
  }
  const int H = config_.hidden_size;
  std::vector<int> tokens;
  for (const SeqChunk& ch : chunks) tokens.insert(tokens.end(), ch.tokens.begin(), ch.tokens.end());
  std::vector<float> hidden(tokens.size() * H);
  RETURN_IF_ERROR(Embed(tokens, hidden.data()));
  RETURN_IF_ERROR(RunLayers(chunks, hidden.data()));
  const int V = config_.vocab_size;
  if (all_logits) {
    logits->resize(tokens.size() * V);
    return Logits(hidden.data(), static_cast<int>(tokens.size()), logits->data());
  }
  std::vector<float> last(chunks.size() * H);
  size_t row = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    row += chunks[i].tokens.size();
    std::memcpy(&last[i * H], &hidden[(row - 1) * H], H * sizeof(float));
  }
  logits->resize(chunks.size() * V);
  return Logits(last.data(), static_cast<int>(chunks.size()), logits->data());
}

}  // namespace strata
