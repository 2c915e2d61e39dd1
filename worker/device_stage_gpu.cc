// DeviceStage on a GpuEngine.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "model/gpu/gpu_engine.h"
#include "worker/device_stage.h"

namespace strata::worker {
namespace {

// Prompt tokens of the warm-up step: the coordinator's default prefill chunk.
constexpr int kWarmUpRows = 256;

class GpuSeqHandle : public DeviceSequence {
 public:
  explicit GpuSeqHandle(std::unique_ptr<GpuSequence> s) : seq(std::move(s)) {}
  int64_t num_tokens() const override { return seq->num_tokens(); }
  int64_t num_pages() const override { return seq->num_pages(); }
  std::unique_ptr<GpuSequence> seq;
};

GpuSequence* Unwrap(DeviceSequence* s) { return static_cast<GpuSeqHandle*>(s)->seq.get(); }
const GpuSequence& Unwrap(const DeviceSequence& s) { return *static_cast<const GpuSeqHandle&>(s).seq; }

class GpuStage : public DeviceStage {
 public:
  GpuStage(std::unique_ptr<GpuEngine> e, int layer_begin, int64_t page_bytes)
      : e_(std::move(e)), layer_begin_(layer_begin), page_bytes_(page_bytes) {}

  const ModelConfig& config() const override { return e_->config(); }
  bool first_stage() const override { return e_->first_stage(); }
  bool last_stage() const override { return e_->last_stage(); }
  uint64_t weight_bytes() const override { return e_->weight_bytes(); }
  int64_t page_bytes() const override { return page_bytes_; }

  absl::StatusOr<std::unique_ptr<DeviceSequence>> NewSequence() override {
    ASSIGN_OR_RETURN(auto s, e_->NewSequence());
    return std::unique_ptr<DeviceSequence>(new GpuSeqHandle(std::move(s)));
  }

  absl::Status Run(absl::Span<const DeviceChunk> chunks, std::vector<float>* hidden) override {
    std::vector<GpuChunk> g;
    for (const DeviceChunk& c : chunks) g.push_back({Unwrap(c.seq), c.tokens});
    return e_->RunStage(g, hidden);
  }

  absl::Status GreedyTokens(const float* hidden, int rows, std::vector<int>* tokens) override {
    return e_->GreedyTokens(hidden, rows, tokens);
  }

  absl::Status SampleTokens(const float* hidden, absl::Span<const SampleDraw> draws,
                            std::vector<int>* tokens, std::vector<SampleLogprobs>* logprobs) override {
    return e_->SampleTokens(hidden, draws, tokens, logprobs);
  }

  absl::Status MirrorRows(const DeviceSequence& dseq, SequenceKv* kv) override {
    const GpuSequence& seq = Unwrap(dseq);
    const ModelConfig& c = e_->config();
    const int64_t first = kv->num_tokens(), n = seq.num_tokens() - first;
    if (n <= 0) return absl::OkStatus();
    const int L = c.kv_lora_rank, R = c.qk_rope_head_dim;
    const size_t row = L + 4 + R + 4;
    std::vector<uint8_t> rows;
    std::vector<float> keys;
    for (int l = 0; l < kv->num_layers(); ++l) {
      RETURN_IF_ERROR(e_->ReadKvRows(seq, l, first, n, &rows));
      const bool indexed = IsIndexed(l);
      if (indexed) RETURN_IF_ERROR(e_->ReadIndexKeys(seq, l, first, n, &keys));
      for (int64_t t = 0; t < n; ++t) {
        const uint8_t* r = &rows[t * row];
        float cs, rs;
        std::memcpy(&cs, r + L, 4);
        std::memcpy(&rs, r + L + 4 + R, 4);
        kv->AppendQuantizedRow(l, r, cs, r + L + 4, rs);
        if (indexed) kv->AppendStoredIndexKey(l, &keys[t * c.index_head_dim]);
      }
    }
    kv->Commit(static_cast<int>(n));
    return absl::OkStatus();
  }

  absl::Status Upload(const SequenceKv& kv, DeviceSequence* dseq) override {
    const ModelConfig& c = e_->config();
    const int nl = kv.num_layers(), L = c.kv_lora_rank, R = c.qk_rope_head_dim;
    const int64_t n = kv.num_tokens();
    const size_t row = L + 4 + R + 4;
    std::vector<std::vector<uint8_t>> rows(nl);
    std::vector<std::vector<float>> keys(nl);
    for (int l = 0; l < nl; ++l) {
      const LayerKv& k = kv.layer(l);
      if (static_cast<int64_t>(k.c_scale.size()) != n) {
        return absl::InternalError("a session loaded for the GPU must hold fp8 rows");
      }
      rows[l].resize(n * row);
      for (int64_t t = 0; t < n; ++t) {
        uint8_t* r = &rows[l][t * row];
        std::memcpy(r, &k.c_codes[t * L], L);
        std::memcpy(r + L, &k.c_scale[t], 4);
        std::memcpy(r + L + 4, &k.r_codes[t * R], R);
        std::memcpy(r + L + 4 + R, &k.r_scale[t], 4);
      }
      if (IsIndexed(l)) keys[l] = k.index_k;
    }
    return e_->AppendStoredRows(Unwrap(dseq), n, rows, keys);
  }

 private:
  bool IsIndexed(int local) const {
    const ModelConfig& c = e_->config();
    const int g = layer_begin_ + local;
    return g < c.num_layers && c.layers[g].indexer == IndexerMode::kFull;
  }

  std::unique_ptr<GpuEngine> e_;
  int layer_begin_;
  int64_t page_bytes_;
};

}  // namespace

bool DeviceStage::Built() { return true; }

absl::Status DeviceStage::Memory(int device, int64_t* total, int64_t* free) {
  size_t f = 0, t = 0;
  if (cudaSetDevice(device) != cudaSuccess || cudaMemGetInfo(&f, &t) != cudaSuccess) {
    cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat("cannot query CUDA device ", device));
  }
  *total = static_cast<int64_t>(t);
  *free = static_cast<int64_t>(f);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<DeviceStage>> DeviceStage::Create(const std::string& model_dir, int layer_begin,
                                                                 int layer_end, const DeviceStageOptions& options) {
  GpuEngineOptions o;
  o.layer_begin = layer_begin;
  o.layer_end = layer_end;
  o.kv_cache_bytes = options.kv_cache_bytes;
  o.device = options.device;
  o.f32_gemm = options.f32_gemm;
  if (options.round_gemm_inputs) o.split_bf16_max_rows = 0;
  o.fp8_weights = options.fp8_weights;
  // One event per part resident on the device: bytes, rate, time left.
  o.on_load_progress = [layer_begin, layer_end](const LoadProgress& p) {
    const double gb = p.host_bytes / 1e9, rate = p.seconds > 0 ? gb / p.seconds : 0;
    const double left = p.parts_done > 0 ? p.seconds * (p.parts - p.parts_done) / p.parts_done : 0;
    log::Info("gpu_load_progress", {{"layer_begin", layer_begin},
                                    {"layer_end", layer_end},
                                    {"parts_done", p.parts_done},
                                    {"parts", p.parts},
                                    {"gb_read", gb},
                                    {"gb_on_gpu", p.device_bytes / 1e9},
                                    {"gb_per_s", rate},
                                    {"s_left", left}});
  };
  std::unique_ptr<GpuEngine> engine;
  if (options.synthetic_seed.has_value()) {
    ASSIGN_OR_RETURN(const ModelConfig config, LoadModelConfig(model_dir));
    ASSIGN_OR_RETURN(engine, GpuEngine::CreateSynthetic(config, o, *options.synthetic_seed));
  } else {
    ASSIGN_OR_RETURN(engine, GpuEngine::Load(model_dir, o));
  }
  // A throwaway step of a full prefill chunk, so that the first request does
  // not pay for allocations and first GEMM algorithm choices (~0.3 s at
  // DeepSeek-V3's dimensions).
  const auto t0 = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(engine->WarmUp(kWarmUpRows));
  log::Info("gpu_warm_up", {{"layer_begin", layer_begin},
                            {"layer_end", layer_end},
                            {"ms", std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count()}});
  const int64_t page_bytes = engine->page_id_bytes();
  return std::unique_ptr<DeviceStage>(new GpuStage(std::move(engine), layer_begin, page_bytes));
}

}  // namespace strata::worker
