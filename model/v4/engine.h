// V4Engine: the single-process CPU engine for DeepSeek-V4 (model_type
// "deepseek_v4"), float32 and exact with respect to transformers 5.17 (what
// it computes: docs/deepseek-v4.md §3; why it is a class of its own:
// docs/engine.md).
//
// A V4Engine owns the whole model. Sequences keep their carried state (the
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

 private:
  V4Engine(V4Config config, std::unique_ptr<V4Weights> weights, int num_threads);

  const V4Config config_;
  std::unique_ptr<V4Weights> weights_;
  std::unique_ptr<ThreadPool> pool_;
};

}  // namespace strata::v4

#endif  // STRATA_MODEL_V4_ENGINE_H_
