// Engine: the single-process CPU inference engine for the MLA families.
//
// An Engine owns the weights of a contiguous range of layers — the whole
// model, or one pipeline stage (the first stage also embeds tokens, the last
// also applies the final norm and lm_head). Sequences keep their KV cache in
// a SequenceKv the caller owns; a step runs a batch of chunks, one per
// sequence, each with one token (decode) or many (prefill). Results are
// batch-invariant: a sequence's numbers never depend on what else is in the
// batch or how its tokens were chunked.
//
// Thread-safety: an Engine may be shared, but RunLayers/Forward calls must
// not run concurrently on the same SequenceKv; concurrent calls on different
// sequences are serialised by the engine's thread pool.
#ifndef STRATA_MODEL_ENGINE_H_
#define STRATA_MODEL_ENGINE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/thread_pool.h"
#include "model/config.h"
#include "model/kv_cache.h"
#include "model/safetensors.h"
#include "model/weights.h"

namespace strata {

struct EngineOptions {
  // Cache dtype of the MLA rows (docs/design.md §4.1). Default: float32.
  KvDtype kv_dtype = KvDtype::kF32;
  // Quantise DSA indexer keys with the fp8 codec (one scale per key).
  bool fp8_indexer_keys = false;
  // Worker threads for matmuls and attention; 0 = one per hardware thread.
  int num_threads = 0;
  // Layers this engine owns: [layer_begin, layer_end); -1 = num_layers.
  int layer_begin = 0;
  int layer_end = -1;
  // Tests: keep each step's DSA selections (see last_selections()).
  bool record_selections = false;
};

// One sequence's part of a batch.
struct SeqChunk {
  SequenceKv* kv;                 // appended to
  absl::Span<const int> tokens;   // first stage: the tokens; else only the count is used
};

class Engine {
 public:
  // Loads <dir>/config.json and the weights of the layer range.
  static absl::StatusOr<std::unique_ptr<Engine>> Load(const std::string& model_dir,
                                                      const EngineOptions& options);

  const ModelConfig& config() const { return config_; }
  const EngineOptions& options() const { return options_; }
  bool first_stage() const { return options_.layer_begin == 0; }
  bool last_stage() const { return options_.layer_end == config_.num_layers; }
  uint64_t weight_bytes() const { return weights_->bytes; }
  int num_threads() const { return pool_->num_threads(); }

  // A new, empty cache for this engine's layers.
  std::unique_ptr<SequenceKv> NewSequence() const;

  // hidden [tokens.size(), hidden_size] = embedding rows. First stage only.
  // Token ids outside the vocabulary give INVALID_ARGUMENT.
  absl::Status Embed(absl::Span<const int> tokens, float* hidden) const;

  // Runs this engine's layers over the batch. hidden holds the chunks' rows
  // back to back ([sum of tokens, hidden_size]) and is updated in place.
  // Appends every row to its sequence's cache.
  absl::Status RunLayers(absl::Span<const SeqChunk> chunks, float* hidden);

  // logits [rows, vocab] = lm_head(norm(hidden)). Last stage only.
  absl::Status Logits(const float* hidden, int rows, float* logits) const;

  // Whole-model step (first and last stage in one engine): appends the
  // chunks' tokens and returns logits, [sum of tokens, vocab] when
  // all_logits, else the last token of each chunk ([chunks, vocab]).
  absl::Status Forward(absl::Span<const SeqChunk> chunks, bool all_logits,
                       std::vector<float>* logits);

  // With record_selections: per local layer with an indexer (kFull), the
  // positions each row of the last step attended to (sorted); empty for
  // other layers.
  const std::vector<std::vector<std::vector<int32_t>>>& last_selections() const { return selections_; }

 private:
  Engine(ModelConfig config, EngineOptions options, std::unique_ptr<ModelWeights> weights);

  const ModelConfig config_;
  const EngineOptions options_;
  std::unique_ptr<ModelWeights> weights_;
  std::unique_ptr<ThreadPool> pool_;
  std::vector<std::vector<std::vector<int32_t>>> selections_;
};

}  // namespace strata

#endif  // STRATA_MODEL_ENGINE_H_
