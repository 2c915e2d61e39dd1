// DeviceStage: a stage's layers on a GPU (model/gpu/gpu_engine.h) behind an
// interface the worker uses without CUDA headers. Builds without CUDA get a
// Create() that answers UNIMPLEMENTED.
//
// The device holds each sequence's fp8 cache; a host SequenceKv mirror of
// the rows is kept only for sequences whose rows go to the KV store (the
// appenders read rows from a SequenceKv), filled by MirrorRows after each
// step, and a session loaded from the store is uploaded with Upload.
//
// Thread-compatible (the stage host's state lock guards it).
#ifndef STRATA_WORKER_DEVICE_STAGE_H_
#define STRATA_WORKER_DEVICE_STAGE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "model/config.h"
#include "model/kv_cache.h"
#include "model/sampler.h"

namespace strata::worker {

struct DeviceStageOptions {
  int device = 0;
  int64_t kv_cache_bytes = int64_t{4} << 30;  // the page pool, reserved at load
  bool f32_gemm = false;                       // test mode
  bool round_gemm_inputs = false;              // split_bf16_max_rows = 0 (GpuEngineOptions)
  bool fp8_weights = true;                     // GpuEngineOptions::fp8_weights
  // Weights generated on the device from this seed (only config.json is
  // read): GpuEngine::CreateSynthetic.
  std::optional<uint64_t> synthetic_seed;
};

class DeviceSequence {
 public:
  virtual ~DeviceSequence() = default;
  virtual int64_t num_tokens() const = 0;
  virtual int64_t num_pages() const = 0;
};

struct DeviceChunk {
  DeviceSequence* seq;
  absl::Span<const int> tokens;
};

class DeviceStage {
 public:
  // Loads layers [layer_begin, layer_end) of the model onto the device.
  // FAILED_PRECONDITION without a device, UNIMPLEMENTED in a build without
  // CUDA, the loader's codes otherwise.
  static absl::StatusOr<std::unique_ptr<DeviceStage>> Create(const std::string& model_dir, int layer_begin,
                                                             int layer_end, const DeviceStageOptions& options);
  // Total and free bytes of GPU `device` (cudaMemGetInfo). UNIMPLEMENTED in
  // a build without CUDA, FAILED_PRECONDITION without that device.
  static absl::Status Memory(int device, int64_t* total, int64_t* free);
  // False in a build without CUDA.
  static bool Built();
  virtual ~DeviceStage() = default;

  virtual const ModelConfig& config() const = 0;
  virtual bool first_stage() const = 0;
  virtual bool last_stage() const = 0;
  virtual uint64_t weight_bytes() const = 0;
  // Bytes of one page id (64 tokens in every layer of the stage).
  virtual int64_t page_bytes() const = 0;

  // RESOURCE_EXHAUSTED when every sequence slot is in use.
  virtual absl::StatusOr<std::unique_ptr<DeviceSequence>> NewSequence() = 0;
  // Runs the layers; `hidden` as GpuEngine::RunStage. RESOURCE_EXHAUSTED
  // when the page pool is short (nothing changed).
  virtual absl::Status Run(absl::Span<const DeviceChunk> chunks, std::vector<float>* hidden) = 0;
  // Argmax of each row's logits, on the device (Sampler's greedy rules).
  virtual absl::Status GreedyTokens(const float* hidden, int rows, std::vector<int>* tokens) = 0;
  // One token per draw (a row of `hidden` each), sampled on the device, and
  // the logprobs of the draws that ask for them (GpuEngine::SampleTokens).
  virtual absl::Status SampleTokens(const float* hidden, absl::Span<const SampleDraw> draws,
                                    std::vector<int>* tokens, std::vector<SampleLogprobs>* logprobs) = 0;
  // Appends the rows `seq` holds beyond kv->num_tokens() to the mirror.
  virtual absl::Status MirrorRows(const DeviceSequence& seq, SequenceKv* kv) = 0;
  // Appends kv's rows (fp8, as loaded from the store) to an empty `seq`.
  virtual absl::Status Upload(const SequenceKv& kv, DeviceSequence* seq) = 0;
};

}  // namespace strata::worker

#endif  // STRATA_WORKER_DEVICE_STAGE_H_
