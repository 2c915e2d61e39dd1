// GpuEngine: the model's layers on one CUDA device (docs/gpu-engine.md).
//
// The device counterpart of Engine (model/engine.h), with the same layer math
// and the same batch semantics: a step runs chunks of one or more tokens per
// sequence and a sequence's numbers never depend on the rest of its batch.
// The KV cache lives on the device in fp8 pages of 64 tokens
// (kernels/cuda/layer_ops.h MlaPageLayout; for DeepSeek-V3 shapes the
// 37 376-byte pages of docs/design.md §4.7), indexer keys in fp8 index pages. Pages
// come from one pool whose size is fixed when the engine is created (the
// placement budget); a step that needs more pages than are free fails with
// RESOURCE_EXHAUSTED before it changes anything.
//
// GEMMs run through cuBLASLt in bf16 (production) or f32 (a test mode whose
// logits match the CPU engine to ~1e-6); the router and everything between
// GEMMs stay f32. Attention uses the tuned split-T kernels of
// kernels/cuda/mla_decode.h and dsa_indexer.h when the shapes are DeepSeek's
// (latent 512, rope 64, index dim 128), else the generic kernels.
//
// Thread-compatible: one thread at a time drives an engine (and its
// sequences), which thread does not matter (each call selects the engine's
// device). Sequences must be destroyed before their engine.
#ifndef STRATA_MODEL_GPU_GPU_ENGINE_H_
#define STRATA_MODEL_GPU_GPU_ENGINE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "model/config.h"
#include "model/sampler.h"
#include "model/weight_stream.h"

namespace strata {

struct GpuEngineOptions {
  // f32 weights and GEMMs (test mode); false: bf16 weights and GEMMs.
  bool f32_gemm = false;
  // Every GEMM uses the algorithm cuBLASLt picks for one row (bit-identical
  // rows whatever the batch; slower from 32 rows on, bench/RESULTS.md).
  bool batch_invariant_gemm = false;
  // bf16 GEMMs of at most this many rows that the small-step kernels below do
  // not take get their f32 inputs as two bf16 terms (hi + lo rows, twice the
  // rows for the same weights), so that rounding the inputs does not move the
  // logits; 0 rounds those inputs to bf16 (faster prefill). The
  // batch-invariant mode always rounds (a row's bits must not depend on the
  // step's size). docs/gpu-engine.md, "GEMMs" and "Accuracy".
  int split_bf16_max_rows = INT32_MAX;
  // bf16 GEMMs of steps of at most cuda::kSmallGemmMaxRows (4) rows run as
  // matrix-vector kernels on the f32 inputs (cuda::LaunchSmallGemm): no
  // conversion, nothing rounded, each weight read once. Not in the
  // batch-invariant mode.
  bool small_step_gemv = true;
  // Keep the checkpoint's fp8 block-scaled weights (F8_E4M3 with
  // `weight_scale_inv`) as fp8 on the device and run those layers as fp8
  // GEMMs (cuda::Fp8GemmRunner): half the memory of bf16. Every projection
  // and the dense and shared-expert MLPs; kv_b, the router and the routed
  // experts are still decoded (to bf16, or f32 with f32_gemm, where the fp8
  // layers stay fp8: a test mode). docs/gpu-engine.md, "fp8 weights".
  bool fp8_weights = false;
  // Load: reader threads and parts (layers) read ahead of the upload
  // (WeightStream), and a callback after each part is resident (may be
  // empty). docs/gpu-engine.md, "Loading".
  int load_readers = 4;
  int load_parts_ahead = 3;
  std::function<void(const LoadProgress&)> on_load_progress;
  // Layers owned: [layer_begin, layer_end); -1 = num_layers.
  int layer_begin = 0;
  int layer_end = -1;
  // Device bytes of the KV page pool (MLA pages + DSA index pages).
  int64_t kv_cache_bytes = int64_t{1} << 30;
  // Sequences alive at once (rows of the device page table).
  int max_sequences = 256;
  // Use the tuned DeepSeek-shape attention kernels where they apply.
  bool tuned_kernels = true;
  int device = 0;
  // Tests: keep each step's DSA selections (see last_selections()).
  bool record_selections = false;
  // Benchmarks: time each layer of a step with CUDA events (see profile()).
  bool profile_layers = false;
};

// Per local layer, of the last step (profile_layers).
struct GpuLayerProfile {
  float ms = 0;             // device time of the layer
  int experts_used = 0;     // distinct routed experts the step ran (MoE layers)
};

class GpuEngine;
struct GpuStep;

// One sequence's cache on the device. Created by GpuEngine::NewSequence;
// returns its pages to the pool when destroyed.
class GpuSequence {
 public:
  ~GpuSequence();
  GpuSequence(const GpuSequence&) = delete;
  GpuSequence& operator=(const GpuSequence&) = delete;
  int64_t num_tokens() const { return num_tokens_; }
  // Pages held (each page id covers 64 tokens in every layer of the engine).
  int64_t num_pages() const { return static_cast<int64_t>(pages_.size()); }

 private:
  friend class GpuEngine;
struct GpuStep;
  GpuSequence(GpuEngine* engine, int slot) : engine_(engine), slot_(slot) {}
  GpuEngine* engine_;
  int slot_;  // row of the engine's device page table
  int64_t num_tokens_ = 0;
  std::vector<int> pages_;
};

struct GpuChunk {
  GpuSequence* seq;
  absl::Span<const int> tokens;
};

class GpuEngine {
 public:
  // Loads <dir>/config.json and the weights of the layer range (read as the
  // CPU engine reads them, then uploaded in the GEMM type).
  static absl::StatusOr<std::unique_ptr<GpuEngine>> Load(const std::string& model_dir,
                                                         const GpuEngineOptions& options);
  // A model of `config`'s shape whose weights are generated on the device
  // from `seed` (uniform, scaled by 1/sqrt(fan-in)); nothing is read.
  static absl::StatusOr<std::unique_ptr<GpuEngine>> CreateSynthetic(const ModelConfig& config,
                                                                    const GpuEngineOptions& options,
                                                                    uint64_t seed);
  ~GpuEngine();
  GpuEngine(const GpuEngine&) = delete;
  GpuEngine& operator=(const GpuEngine&) = delete;

  const ModelConfig& config() const;
  bool first_stage() const;
  bool last_stage() const;
  uint64_t weight_bytes() const;
  int64_t total_pages() const;
  int64_t free_pages() const;
  // Device bytes of one page id: 64 tokens of fp8 KV (and indexer keys) in
  // every local layer.
  int64_t page_id_bytes() const;

  // RESOURCE_EXHAUSTED when max_sequences sequences are alive.
  absl::StatusOr<std::unique_ptr<GpuSequence>> NewSequence();

  // One throwaway step of `prompt_rows` prompt tokens and one decode step on
  // a temporary sequence (and, on the last stage, a device argmax and a
  // device draw), which is then freed: the first real request finds the
  // step scratch allocated, the kernels loaded and the common GEMM
  // algorithms chosen. Nothing a later step sees changes (its pages go back
  // to the pool). Does nothing when the pool or the sequence table has no
  // room. Errors: INTERNAL (a CUDA failure).
  absl::Status WarmUp(int prompt_rows);

  // Whole-model step: appends the chunks' tokens to their sequences and
  // returns logits ([sum of tokens, vocab] when all_logits, else the last
  // token of each chunk). Errors: INVALID_ARGUMENT (bad tokens, empty or
  // repeated chunks, a sequence of another engine), RESOURCE_EXHAUSTED (not
  // enough free pages; nothing changed), INTERNAL (a CUDA failure).
  absl::Status Forward(absl::Span<const GpuChunk> chunks, bool all_logits, std::vector<float>* logits);

  // A pipeline stage's step: hidden [sum of tokens, hidden] in and out (host
  // memory). The first stage embeds `tokens` instead of reading hidden.
  absl::Status RunStage(absl::Span<const GpuChunk> chunks, std::vector<float>* hidden);

  // logits [rows][vocab] = lm_head(norm(hidden)) for host rows of a stage's
  // output. Last stage only.
  absl::Status Logits(const float* hidden, int rows, std::vector<float>* logits);

  // Greedy tokens for host rows of a stage's output: the argmax of each row's
  // logits, computed on the device (only the ids come back), with Sampler's
  // rules (NaN as -inf, ties to the lowest id). Last stage only.
  absl::Status GreedyTokens(const float* hidden, int rows, std::vector<int>* tokens);

  // Sampled tokens for host rows of a stage's output, one draw per row,
  // chosen on the device with Sampler's rules (penalties from the draw's
  // counts; kernels/cuda/sampling.h); only the ids come back, and for rows
  // whose draw asks for logprobs (and when `logprobs` is given) what
  // Sample() would report, in (*logprobs)[row]. Last stage only.
  absl::Status SampleTokens(const float* hidden, absl::Span<const SampleDraw> draws, std::vector<int>* tokens,
                            std::vector<SampleLogprobs>* logprobs = nullptr);

  // Benchmarks: gives `seq` (empty) n_tokens of random cache rows in every
  // layer, as if a context of that length had been prefilled.
  absl::Status FillRandomContext(GpuSequence* seq, int64_t n_tokens, uint64_t seed);

  // The stored cache rows of positions [first, first + n) of local layer
  // `layer`, as `.coli_kv` v2 layer rows (docs/coli-kv.md): kv_lora fp8
  // codes, f32 c_scale, rope codes, f32 r_scale; bytes as stored.
  absl::Status ReadKvRows(const GpuSequence& seq, int layer, int64_t first, int64_t n,
                          std::vector<uint8_t>* rows);

  // The indexer keys of positions [first, first + n) of local layer `layer`
  // (a kFull layer), as the f32 values the cache holds (code * scale):
  // [n][index_head_dim].
  absl::Status ReadIndexKeys(const GpuSequence& seq, int layer, int64_t first, int64_t n, std::vector<float>* keys);

  // Appends n tokens of stored cache to `seq` without recomputation (a
  // resumed session): rows[l] holds n v2 layer rows of local layer l, copied
  // byte for byte; index_keys[l] n x index_head_dim values for kFull layers
  // (empty for others), quantised again, which gives back the codes and
  // scales they were read from. Staged through pinned memory, one copy.
  // Errors: INVALID_ARGUMENT (sizes), RESOURCE_EXHAUSTED (pages).
  absl::Status AppendStoredRows(GpuSequence* seq, int64_t n, absl::Span<const std::vector<uint8_t>> rows,
                                absl::Span<const std::vector<float>> index_keys);

  // With record_selections: per local layer with an indexer (kFull), the
  // last step's selected positions, [rows][index_topk] increasing with -1
  // padding; empty for other layers.
  const std::vector<std::vector<int>>& last_selections() const;
  const std::vector<GpuLayerProfile>& profile() const;

  // Waits for the device; returns the first asynchronous CUDA error.
  absl::Status Synchronize();

  struct Impl;  // model/gpu/gpu_engine_impl.h (internal)

 private:
  friend class GpuSequence;
  explicit GpuEngine(std::unique_ptr<Impl> impl);
  // Uploads host rows of a stage's output and computes their logits into
  // the logits scratch (Logits, GreedyTokens and SampleTokens; `what` names
  // the caller).
  absl::Status DeviceLogits(const float* hidden, int rows, const char* what);
  void Release(GpuSequence* seq);
  absl::StatusOr<GpuStep> Prepare(absl::Span<const GpuChunk> chunks, bool embed);
  void Commit(absl::Span<const GpuChunk> chunks);
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata

#endif  // STRATA_MODEL_GPU_GPU_ENGINE_H_
