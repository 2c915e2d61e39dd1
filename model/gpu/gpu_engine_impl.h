// GpuEngine's internals, shared by gpu_engine.cc (setup, pages, steps) and
// gpu_layers.cc (the layer math). Internal to model/gpu.
#ifndef STRATA_MODEL_GPU_GPU_ENGINE_IMPL_H_
#define STRATA_MODEL_GPU_GPU_ENGINE_IMPL_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/fp8_gemm.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/layer_ops.h"
#include "model/gpu/device_weights.h"
#include "model/gpu/gpu_engine.h"

#define STRATA_CUDA_RETURN(expr)                                                               \
  do {                                                                                         \
    const cudaError_t strata_cuda_e_ = (expr);                                                 \
    if (strata_cuda_e_ != cudaSuccess) {                                                       \
      return absl::InternalError(absl::StrCat(#expr, ": ", cudaGetErrorString(strata_cuda_e_))); \
    }                                                                                          \
  } while (0)

namespace strata {

// The rows of one step, on the host and the device.
struct GpuStep {
  int rows = 0;
  int chunks = 0;
  int64_t max_len = 0;             // max over rows of seq_len
  std::vector<int> seq_lens;       // host copy, per row
  const int64_t* positions = nullptr;  // device [rows]
  const int* page_row = nullptr;       // device [rows]: the row's sequence slot
  const int* seq_lens_dev = nullptr;   // device [rows]
  const int* tokens = nullptr;         // device [rows] (first stage)
  // The tuned decode kernel's plans, when it applies: rows run in blocks of
  // at most kAttentionBlockRows (a prefill chunk is one request per row), so
  // the split partials stay bounded; per block a dense and a sparse plan.
  struct Plan {
    const int* work = nullptr;
    const int* split_offset = nullptr;
    int num_work = 0, total_splits = 0;
  };
  struct Block {
    int row_begin = 0, rows = 0;
    Plan dense, sparse;
  };
  std::vector<Block> blocks;
  int max_total_splits = 0;  // over blocks and both plans
};

inline constexpr int kAttentionBlockRows = 64;

struct GpuEngine::Impl {
  ModelConfig c;
  GpuEngineOptions opt;
  std::unique_ptr<gpu::DModel> w;
  std::unique_ptr<cuda::GemmRunner> gemm;
  std::unique_ptr<cuda::Fp8GemmRunner> fp8_gemm;  // with fp8_weights
  cudaStream_t stream = nullptr;
  int num_sms = 132;
  cuda::MlaPageLayout mla_layout;
  cuda::IndexPageLayout index_layout;
  gpu::DeviceBuffer inv_freq;
  float attention_factor = 1.0f;

  // Pages: one id space; page id p of local layer l lives at
  // mla_pool + (l * total_pages + p) * page_bytes (index pages likewise,
  // for the kFull layers only).
  int64_t total_pages = 0;
  int64_t page_id_bytes = 0;  // one page id over every local layer
  std::vector<int> free_ids;
  gpu::DeviceBuffer mla_pool, index_pool;
  std::vector<int> index_slot;  // per local layer: position among kFull layers, or -1
  // One row of page ids per live sequence (slot), max_pages_per_seq wide.
  gpu::DeviceBuffer page_table;
  int64_t max_pages_per_seq = 0;
  std::vector<int> free_slots;

  // Scratch, grown on demand.
  struct Scratch {
    gpu::DeviceBuffer hidden, xn, delta, q, q_latent, kv, q_abs, q_pe, o_lat, lse, ctx, bf16, split_y;
    gpu::DeviceBuffer idx_q, idx_k, idx_w, scores, topk_ws, indices, partial, ml;
    gpu::DeviceBuffer step_ints, mlp_g, mlp_act, moe_logits, moe_ids, moe_w, moe_in, moe_out,
        expert_out, shared_out, moe_idx, logits, last_rows, upload, argmax, sample_rows, sample_logprobs;
  } s;
  int64_t topk_ws_rows = -1, topk_ws_stride = -1;
  std::vector<std::vector<int>> selections;  // record_selections
  std::vector<GpuLayerProfile> profile;      // profile_layers
  std::vector<cudaEvent_t> events;
  void* pinned = nullptr;  // host staging of AppendStoredRows (cudaHostAlloc)
  size_t pinned_bytes = 0;
  int* pinned_ids = nullptr;  // the router's expert ids on the host (cudaHostAlloc)
  size_t pinned_ids_count = 0;
  cudaEvent_t ids_ready = nullptr;

  int num_local_layers() const { return static_cast<int>(w->layers.size()); }
  const int* table_row(int slot) const { return page_table.as<int>() + static_cast<int64_t>(slot) * max_pages_per_seq; }
  // Takes pages so that `seq` covers `tokens` positions; RESOURCE_EXHAUSTED
  // (nothing taken) when too few are free.
  absl::Status Grow(std::vector<int>* pages, int slot, int64_t tokens);
  bool tuned_mla() const { return opt.tuned_kernels && c.kv_lora_rank == 512 && c.qk_rope_head_dim == 64; }
  bool tuned_indexer() const {
    return opt.tuned_kernels && c.index_head_dim == 128 && c.index_n_heads % 8 == 0 && c.index_n_heads <= 64;
  }
  uint8_t* mla_base(int local) const {
    return mla_pool.as<uint8_t>() + static_cast<size_t>(local) * total_pages * mla_layout.page_bytes();
  }
  uint8_t* index_base(int local) const {
    return index_pool.as<uint8_t>() +
           static_cast<size_t>(index_slot[local]) * total_pages * index_layout.page_bytes();
  }

  // y[rows][out] = x[rows][in] W^T (+ bias); x is f32 (converted to bf16
  // for a bf16 layer).
  absl::Status Linear(const float* x, int rows, const gpu::DLinear& l, float* y);
  // The batched absorb GEMMs of every head (see gpu_layers.cc).
  absl::Status Gemm(const cuda::GemmArgs& a);

  absl::Status Attention(const GpuStep& st, int global_layer, int local_layer, const float* x, float* out);
  absl::Status Mlp(const GpuStep& st, int global_layer, int local_layer, const float* x, float* out);
  // Where the routed experts of local layer `l` run for a step of `rows`
  // rows (up to cuda::kMoeGemvMaxEntries entries, experts without biases):
  // device matrix-vector products (cuda::LaunchMoeGemv) up to
  // kMoeGemvMaxRows rows and for any step in the batch-invariant mode,
  // device tensor-core products (cuda::LaunchMoeGemm, bf16 weights, hidden a
  // multiple of 256 and inter of 256) for larger steps, else the host-
  // dispatched GEMMs. Builds the layer's table of expert pointers on first
  // use.
  enum class MoePath { kHost, kGemv, kGemm };
  MoePath DeviceMoePath(int l, int rows);
  std::vector<gpu::DeviceBuffer> expert_tables;  // per local layer: [2 * experts] pointers
  absl::Status RunMlp(const gpu::DMlp& m, int rows, const float* x, float* out);
  absl::Status Indexer(const GpuStep& st, int local_layer, const float* x, const float* q_latent);
  absl::Status RunLayers(const GpuStep& st);
  // logits [rows][vocab] (device) of the hidden rows listed in `rows_dev`
  // (null: all rows).
  absl::Status Logits(const int* rows_dev, int n, float* logits);
};

}  // namespace strata

#endif  // STRATA_MODEL_GPU_GPU_ENGINE_IMPL_H_
