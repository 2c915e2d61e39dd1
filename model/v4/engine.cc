#include "model/v4/engine.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cpu/ops.h"
#include "model/safetensors.h"
#include "model/v4/layers.h"

namespace strata::v4 {

absl::StatusOr<std::unique_ptr<V4Engine>> V4Engine::Load(const std::string& model_dir,
                                                         const V4EngineOptions& options) {
  ASSIGN_OR_RETURN(V4Config config, LoadV4Config(model_dir));
  const int begin = options.layer_begin, end = options.layer_end < 0 ? config.num_layers : options.layer_end;
  ASSIGN_OR_RETURN(auto store, TensorStore::OpenDir(model_dir));
  ASSIGN_OR_RETURN(auto weights, LoadV4Weights(*store, config, begin, end));
  return std::unique_ptr<V4Engine>(
      new V4Engine(std::move(config), std::move(weights), options.num_threads, begin, end));
}

V4Engine::V4Engine(V4Config config, std::unique_ptr<V4Weights> weights, int num_threads, int begin, int end)
    : config_(std::move(config)), weights_(std::move(weights)),
      pool_(std::make_unique<ThreadPool>(num_threads)), begin_(begin), end_(end) {}

absl::Status V4Engine::CheckChunks(absl::Span<const V4Chunk> chunks) const {
  const int V = config_.vocab_size;
  for (size_t k = 0; k < chunks.size(); ++k) {
    const V4Chunk& ch = chunks[k];
    if (ch.seq == nullptr || ch.seq->num_layers() != config_.num_layers) {
      return absl::InvalidArgumentError("a chunk's sequence does not belong to this engine");
    }
    if (ch.tokens.empty()) return absl::InvalidArgumentError("a chunk has no tokens");
    for (size_t j = 0; j < k; ++j) {
      if (chunks[j].seq == ch.seq) return absl::InvalidArgumentError("a sequence appears twice in one batch");
    }
    for (size_t i = 0; i < ch.tokens.size(); ++i) {
      const int t = ch.tokens[i];
      if (t < 0 || t >= V) {
        return absl::InvalidArgumentError(absl::StrCat("token id ", t, " at index ", i,
                                                       " is outside the vocabulary [0, ", V, ")"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status V4Engine::Embed(absl::Span<const int> tokens, float* streams) const {
  if (!first_stage()) return absl::FailedPreconditionError("only the first stage embeds tokens");
  const int H = config_.hidden_size, n = config_.hc_mult, V = config_.vocab_size;
  for (size_t r = 0; r < tokens.size(); ++r) {
    if (tokens[r] < 0 || tokens[r] >= V) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", tokens[r], " is outside the vocabulary"));
    }
    const float* e = weights_->embed.data() + static_cast<size_t>(tokens[r]) * H;
    for (int j = 0; j < n; ++j) std::memcpy(&streams[(r * n + j) * H], e, H * sizeof(float));
  }
  return absl::OkStatus();
}

absl::Status V4Engine::RunLayers(absl::Span<const V4Chunk> chunks, float* streams) {
  RETURN_IF_ERROR(CheckChunks(chunks));
  const V4Config& c = config_;
  const int H = c.hidden_size;
  std::vector<internal::SeqRows> seqs;
  std::vector<int> tokens;
  for (const V4Chunk& ch : chunks) {
    seqs.push_back({ch.seq, static_cast<int>(tokens.size()), static_cast<int>(ch.tokens.size()),
                    ch.seq->num_tokens()});
    tokens.insert(tokens.end(), ch.tokens.begin(), ch.tokens.end());
  }
  const int rows = static_cast<int>(tokens.size());
  const size_t R = static_cast<size_t>(rows), n = static_cast<size_t>(c.hc_mult);
  const internal::RopeTable main(c.rope_main, c.rope_dim), compress(c.rope_compress, c.rope_dim);
  std::vector<float> post(R * n), comb(R * n * n), x(R * H), xn(R * H), out(R * H);
  for (int l = begin_; l < end_; ++l) {
    const V4LayerWeights& w = weights_->layers[l];
    internal::HyperPre(c, w.hc_attn, rows, streams, post.data(), comb.data(), x.data(), pool_.get());
    for (size_t r = 0; r < R; ++r) cpu::RmsNorm(&x[r * H], w.attn_norm.data(), H, c.rms_norm_eps, &xn[r * H]);
    internal::AttentionLayer(c, w, l, main, compress, seqs, rows, xn.data(), out.data(), pool_.get());
    internal::HyperPost(c, rows, post.data(), comb.data(), out.data(), streams);

    internal::HyperPre(c, w.hc_ffn, rows, streams, post.data(), comb.data(), x.data(), pool_.get());
    for (size_t r = 0; r < R; ++r) cpu::RmsNorm(&x[r * H], w.ffn_norm.data(), H, c.rms_norm_eps, &xn[r * H]);
    internal::MoeLayer(c, w, rows, xn.data(), tokens.data(), out.data(), pool_.get());
    internal::HyperPost(c, rows, post.data(), comb.data(), out.data(), streams);
  }
  for (const auto& s : seqs) s.seq->Commit(s.n);
  return absl::OkStatus();
}

absl::Status V4Engine::Logits(const float* streams, int rows, float* logits) const {
  if (!last_stage()) return absl::FailedPreconditionError("only the last stage computes logits");
  const V4Config& c = config_;
  const int H = c.hidden_size, V = c.vocab_size;
  std::vector<float> h(static_cast<size_t>(rows) * H);
  internal::HyperHead(c, *weights_, rows, streams, h.data(), pool_.get());
  for (int i = 0; i < rows; ++i) {
    float* hr = &h[static_cast<size_t>(i) * H];
    cpu::RmsNorm(hr, weights_->final_norm.data(), H, c.rms_norm_eps, hr);
  }
  cpu::Linear(h.data(), rows, weights_->head.w.data(), nullptr, H, V, logits, pool_.get());
  return absl::OkStatus();
}

absl::Status V4Engine::Forward(absl::Span<const V4Chunk> chunks, bool all_logits, std::vector<float>* logits) {
  if (!first_stage() || !last_stage()) {
    return absl::FailedPreconditionError("Forward needs the whole model; a stage runs Embed, RunLayers, Logits");
  }
  RETURN_IF_ERROR(CheckChunks(chunks));
  const size_t W = static_cast<size_t>(stream_width());
  std::vector<int> tokens;
  std::vector<int> pick;
  for (const V4Chunk& ch : chunks) {
    tokens.insert(tokens.end(), ch.tokens.begin(), ch.tokens.end());
    if (!all_logits) pick.push_back(static_cast<int>(tokens.size()) - 1);
  }
  if (all_logits) {
    for (size_t r = 0; r < tokens.size(); ++r) pick.push_back(static_cast<int>(r));
  }
  std::vector<float> streams(tokens.size() * W);
  RETURN_IF_ERROR(Embed(tokens, streams.data()));
  RETURN_IF_ERROR(RunLayers(chunks, streams.data()));
  // Final collapse, norm, lm_head: every row, or each chunk's last.
  const int P = static_cast<int>(pick.size());
  std::vector<float> sel(static_cast<size_t>(P) * W);
  for (int i = 0; i < P; ++i) {
    std::memcpy(&sel[static_cast<size_t>(i) * W], &streams[static_cast<size_t>(pick[i]) * W], W * sizeof(float));
  }
  logits->resize(static_cast<size_t>(P) * config_.vocab_size);
  return Logits(sel.data(), P, logits->data());
}

}  // namespace strata::v4
