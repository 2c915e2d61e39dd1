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
  ASSIGN_OR_RETURN(auto store, TensorStore::OpenDir(model_dir));
  ASSIGN_OR_RETURN(auto weights, LoadV4Weights(*store, config));
  return std::unique_ptr<V4Engine>(new V4Engine(std::move(config), std::move(weights), options.num_threads));
}

V4Engine::V4Engine(V4Config config, std::unique_ptr<V4Weights> weights, int num_threads)
    : config_(std::move(config)), weights_(std::move(weights)),
      pool_(std::make_unique<ThreadPool>(num_threads)) {}

absl::Status V4Engine::Forward(absl::Span<const V4Chunk> chunks, bool all_logits, std::vector<float>* logits) {
  const V4Config& c = config_;
  const int H = c.hidden_size, n = c.hc_mult, V = c.vocab_size;
  std::vector<internal::SeqRows> seqs;
  std::vector<int> tokens;
  for (const V4Chunk& ch : chunks) {
    if (ch.seq == nullptr || ch.seq->num_layers() != c.num_layers) {
      return absl::InvalidArgumentError("a chunk's sequence does not belong to this engine");
    }
    if (ch.tokens.empty()) return absl::InvalidArgumentError("a chunk has no tokens");
    for (const auto& other : seqs) {
      if (other.seq == ch.seq) return absl::InvalidArgumentError("a sequence appears twice in one batch");
    }
    for (size_t i = 0; i < ch.tokens.size(); ++i) {
      const int t = ch.tokens[i];
      if (t < 0 || t >= V) {
        return absl::InvalidArgumentError(absl::StrCat("token id ", t, " at index ", i,
                                                       " is outside the vocabulary [0, ", V, ")"));
      }
    }
    seqs.push_back({ch.seq, static_cast<int>(tokens.size()), static_cast<int>(ch.tokens.size()),
                    ch.seq->num_tokens()});
    tokens.insert(tokens.end(), ch.tokens.begin(), ch.tokens.end());
  }
  const int rows = static_cast<int>(tokens.size());
  const size_t R = static_cast<size_t>(rows);

  // Every stream starts as the token's embedding.
  std::vector<float> streams(R * n * H);
  for (size_t r = 0; r < R; ++r) {
    const float* e = weights_->embed.data() + static_cast<size_t>(tokens[r]) * H;
    for (int j = 0; j < n; ++j) std::memcpy(&streams[(r * n + j) * H], e, H * sizeof(float));
  }
  const internal::RopeTable main(c.rope_main, c.rope_dim), compress(c.rope_compress, c.rope_dim);
  std::vector<float> post(R * n), comb(R * n * n), x(R * H), xn(R * H), out(R * H);
  for (int l = 0; l < c.num_layers; ++l) {
    const V4LayerWeights& w = weights_->layers[l];
    internal::HyperPre(c, w.hc_attn, rows, streams.data(), post.data(), comb.data(), x.data(), pool_.get());
    for (size_t r = 0; r < R; ++r) cpu::RmsNorm(&x[r * H], w.attn_norm.data(), H, c.rms_norm_eps, &xn[r * H]);
    internal::AttentionLayer(c, w, l, main, compress, seqs, rows, xn.data(), out.data(), pool_.get());
    internal::HyperPost(c, rows, post.data(), comb.data(), out.data(), streams.data());

    internal::HyperPre(c, w.hc_ffn, rows, streams.data(), post.data(), comb.data(), x.data(), pool_.get());
    for (size_t r = 0; r < R; ++r) cpu::RmsNorm(&x[r * H], w.ffn_norm.data(), H, c.rms_norm_eps, &xn[r * H]);
    internal::MoeLayer(c, w, rows, xn.data(), tokens.data(), out.data(), pool_.get());
    internal::HyperPost(c, rows, post.data(), comb.data(), out.data(), streams.data());
  }
  for (const auto& s : seqs) s.seq->Commit(s.n);

  // Final collapse, norm, lm_head: every row, or each chunk's last.
  std::vector<int> pick;
  if (all_logits) {
    pick.resize(R);
    for (int r = 0; r < rows; ++r) pick[r] = r;
  } else {
    for (const auto& s : seqs) pick.push_back(s.row_begin + s.n - 1);
  }
  const int P = static_cast<int>(pick.size());
  std::vector<float> sel(static_cast<size_t>(P) * n * H);
  for (int i = 0; i < P; ++i) {
    std::memcpy(&sel[static_cast<size_t>(i) * n * H], &streams[static_cast<size_t>(pick[i]) * n * H],
                static_cast<size_t>(n) * H * sizeof(float));
  }
  std::vector<float> h(static_cast<size_t>(P) * H);
  internal::HyperHead(c, *weights_, P, sel.data(), h.data(), pool_.get());
  for (int i = 0; i < P; ++i) {
    float* hr = &h[static_cast<size_t>(i) * H];
    cpu::RmsNorm(hr, weights_->final_norm.data(), H, c.rms_norm_eps, hr);
  }
  logits->resize(static_cast<size_t>(P) * V);
  cpu::Linear(h.data(), P, weights_->head.w.data(), nullptr, H, V, logits->data(), pool_.get());
  return absl::OkStatus();
}

}  // namespace strata::v4
