// V4Engine: the single-process CPU engine for DeepSeek-V4 (model_type
// "deepseek_v4"), float32 and exact with respect to transformers 5.17 (what
// it computes: docs/deepseek-v4.md §3; why it is a class of its own:
// docs/engine.md).
//
// A V4Engine owns the whole model or one pipeline stage's layers (the first
// stage also embeds, the last also runs the hyper head and lm_head); between
// stages a token's hidden state is its hc_mult residual streams, hc_mult ×
// hidden_size floats (docs/deepseek-v4.md §3). Sequences keep their carried state (the
// window rings, compressors and indexers: model/v4/sequence.h) in a
// V4Sequence the caller owns; a step runs a batch of chunks, one per
// sequence, each with one token (decode) or many (prefill). Results are
// batch- and chunking-invariant: a sequence's numbers never depend on what
// else is in the batch or on how its tokens were split into steps (tested
// bit for bit).
//
// Thread-safety: an engine may be shared, but Forward calls must not run
// concurrently on the same V4Sequence; concurrent calls on different
// sequences are serialised by the engine's thread pool.
#ifndef STRATA_MODEL_V4_ENGINE_H_
#define STRATA_MODEL_V4_ENGINE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/thread_pool.h"
#include "model/v4/config.h"
#include "model/v4/sequence.h"
#include "model/v4/weights.h"

namespace strata::v4 {

struct V4EngineOptions {
  // Worker threads for matmuls and attention; 0 = one per hardware thread.
  int num_threads = 0;
  // The stage's layers [layer_begin, layer_end); layer_end -1: to the last.
  int layer_begin = 0;
  int layer_end = -1;
};

// One sequence's part of a batch.
struct V4Chunk {
  V4Sequence* seq;               // advanced by the chunk's tokens
  absl::Span<const int> tokens;  // at least one
};

class V4Engine {
 public:
  using Chunk = V4Chunk;

  // Loads <dir>/config.json (+ generation_config.json) and every weight.
  static absl::StatusOr<std::unique_ptr<V4Engine>> Load(const std::string& model_dir,
                                                        const V4EngineOptions& options);

  const V4Config& config() const { return config_; }
  int layer_begin() const { return begin_; }
  int layer_end() const { return end_; }
  bool first_stage() const { return begin_ == 0; }
  bool last_stage() const { return end_ == config_.num_layers; }
  // Floats of one token's hidden state between stages: hc_mult × hidden_size.
  int stream_width() const { return config_.hc_mult * config_.hidden_size; }
  uint64_t weight_bytes() const { return weights_->bytes; }
  int num_threads() const { return pool_->num_threads(); }

  // A new, empty sequence.
  std::unique_ptr<V4Sequence> NewSequence() const { return std::make_unique<V4Sequence>(config_); }

  // Appends the chunks' tokens to their sequences and returns logits:
  // [sum of tokens, vocab] when all_logits, else the last token of each
  // chunk ([chunks, vocab]). INVALID_ARGUMENT (and no sequence changed) for
  // an empty chunk, a sequence given twice or not made by this engine, or a
  // token id outside the vocabulary.
  absl::Status Forward(absl::Span<const V4Chunk> chunks, bool all_logits, std::vector<float>* logits);

  // The stage steps (Forward is Embed, RunLayers and Logits on one engine).
  // streams [tokens, stream_width()]: every stream starts as the token's
  // embedding. First stage only (FAILED_PRECONDITION otherwise).
  absl::Status Embed(absl::Span<const int> tokens, float* streams) const;
  // Runs this stage's layers on the chunks' tokens, whose streams sit back to
  // back in `streams` and are updated in place, and commits the tokens to the
  // sequences. The chunk errors of Forward.
  absl::Status RunLayers(absl::Span<const V4Chunk> chunks, float* streams);
  // logits [rows, vocab] of streams [rows, stream_width()] (hyper head,
  // final norm, lm_head). Last stage only.
  absl::Status Logits(const float* streams, int rows, float* logits) const;

 private:
  V4Engine(V4Config config, std::unique_ptr<V4Weights> weights, int num_threads, int begin, int end);
  absl::Status CheckChunks(absl::Span<const V4Chunk> chunks) const;

  const V4Config config_;
  std::unique_ptr<V4Weights> weights_;
  std::unique_ptr<ThreadPool> pool_;
  const int begin_, end_;
};

}  // namespace strata::v4

#endif  // STRATA_MODEL_V4_ENGINE_H_
