#include "model/gpu/gpu_engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/status_macros.h"
#include "kernels/cuda/dsa_indexer.h"
#include "kernels/cuda/mla_decode.h"
#include "kernels/cuda/sampling.h"
#include "model/gpu/gpu_engine_impl.h"
#include "model/safetensors.h"
#include "model/weights.h"

namespace strata {

namespace {

absl::Status CheckShapes(const ModelConfig& c) {
  if (c.kv_lora_rank > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv_lora_rank ", c.kv_lora_rank, " is above the GPU engine's limit of 1024"));
  }
  if (c.has_dsa && (int64_t{c.index_n_heads} * c.index_head_dim + c.index_n_heads) * 4 > 48 * 1024) {
    return absl::InvalidArgumentError(absl::StrCat("index_n_heads x index_head_dim = ", c.index_n_heads, " x ",
                                                   c.index_head_dim, " is above the GPU engine's limit"));
  }
  if (c.n_routed_experts > 0 && c.n_group > 128) {
    return absl::InvalidArgumentError(absl::StrCat("n_group ", c.n_group, " is above the GPU engine's limit of 128"));
  }
  return absl::OkStatus();
}

// Weights from `stream` when given, else generated from `seed`.
absl::StatusOr<std::unique_ptr<GpuEngine::Impl>> NewImpl(const ModelConfig& config, const GpuEngineOptions& options,
                                                         WeightStream* stream, uint64_t seed) {
  auto im = std::make_unique<GpuEngine::Impl>();
  im->c = config;
  im->opt = options;
  GpuEngineOptions& opt = im->opt;
  const ModelConfig& c = im->c;
  RETURN_IF_ERROR(CheckStageRange(c, opt.layer_begin, &opt.layer_end));
  RETURN_IF_ERROR(CheckShapes(c));
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    cudaGetLastError();
    return absl::FailedPreconditionError("no CUDA device is visible to this process");
  }
  if (opt.device < 0 || opt.device >= devices) {
    return absl::InvalidArgumentError(absl::StrCat("device ", opt.device, " does not exist (", devices, " visible)"));
  }
  if (opt.max_sequences < 1) return absl::InvalidArgumentError("max_sequences must be at least 1");
  STRATA_CUDA_RETURN(cudaSetDevice(opt.device));
  STRATA_CUDA_RETURN(cudaDeviceGetAttribute(&im->num_sms, cudaDevAttrMultiProcessorCount, opt.device));
  STRATA_CUDA_RETURN(cudaStreamCreateWithFlags(&im->stream, cudaStreamNonBlocking));
  STRATA_CUDA_RETURN(cudaEventCreateWithFlags(&im->ids_ready, cudaEventDisableTiming));
  const cuda::GemmType type = opt.f32_gemm ? cuda::GemmType::kF32 : cuda::GemmType::kBF16;
  if (stream != nullptr) {
    ASSIGN_OR_RETURN(im->w, gpu::BuildDeviceModel(c, opt.layer_begin, opt.layer_end, opt.layer_begin == 0,
                                                  opt.layer_end == c.num_layers, type, *stream,
                                                  opt.on_load_progress));
  } else {
    ASSIGN_OR_RETURN(im->w, gpu::BuildDeviceModel(c, opt.layer_begin, opt.layer_end, opt.layer_begin == 0,
                                                  opt.layer_end == c.num_layers, type, nullptr, seed,
                                                  opt.fp8_weights));
  }
  ASSIGN_OR_RETURN(im->gemm, cuda::GemmRunner::Create(opt.batch_invariant_gemm));
  if (opt.fp8_weights) {
    ASSIGN_OR_RETURN(im->fp8_gemm, cuda::Fp8GemmRunner::Create(opt.batch_invariant_gemm));
  }

  const std::vector<float> inv_freq = RopeInvFreq(c.rope, c.qk_rope_head_dim);
  ASSIGN_OR_RETURN(im->inv_freq, gpu::DeviceBuffer::Alloc(inv_freq.size() * sizeof(float)));
  STRATA_CUDA_RETURN(cudaMemcpy(im->inv_freq.get(), inv_freq.data(), inv_freq.size() * sizeof(float),
                                cudaMemcpyHostToDevice));
  im->attention_factor = static_cast<float>(c.rope.attention_factor);

  // The page pool: every page id covers 64 tokens in each local layer.
  im->mla_layout = {c.kv_lora_rank, c.qk_rope_head_dim};
  im->index_layout = {std::max(c.index_head_dim, 1)};
  int full = 0;
  for (int g = opt.layer_begin; g < opt.layer_end; ++g) {
    im->index_slot.push_back(c.layers[g].indexer == IndexerMode::kFull ? full++ : -1);
  }
  const int nl = opt.layer_end - opt.layer_begin;
  const size_t per_id = nl * im->mla_layout.page_bytes() + full * im->index_layout.page_bytes();
  im->page_id_bytes = static_cast<int64_t>(per_id);
  im->total_pages = opt.kv_cache_bytes / static_cast<int64_t>(per_id);
  if (im->total_pages < 1) {
    return absl::InvalidArgumentError(absl::StrCat("kv_cache_bytes ", opt.kv_cache_bytes,
                                                   " cannot hold one 64-token page of these ", nl, " layers (",
                                                   per_id, " bytes)"));
  }
  ASSIGN_OR_RETURN(im->mla_pool, gpu::DeviceBuffer::Alloc(im->total_pages * nl * im->mla_layout.page_bytes()));
  if (full > 0) {
    ASSIGN_OR_RETURN(im->index_pool,
                     gpu::DeviceBuffer::Alloc(im->total_pages * full * im->index_layout.page_bytes()));
  }
  for (int64_t p = im->total_pages - 1; p >= 0; --p) im->free_ids.push_back(static_cast<int>(p));
  const int64_t max_ctx_pages = (std::max<int64_t>(c.max_position_embeddings, 64) + 63) / 64;
  // The context limit, not the pool: a sequence the pool cannot hold now
  // gets RESOURCE_EXHAUSTED, one beyond the model's context INVALID_ARGUMENT.
  im->max_pages_per_seq = max_ctx_pages;
  ASSIGN_OR_RETURN(im->page_table, gpu::DeviceBuffer::Alloc(static_cast<size_t>(opt.max_sequences) *
                                                            im->max_pages_per_seq * sizeof(int)));
  for (int i = opt.max_sequences - 1; i >= 0; --i) im->free_slots.push_back(i);
  return im;
}

}  // namespace

GpuSequence::~GpuSequence() { engine_->Release(this); }

GpuEngine::GpuEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

GpuEngine::~GpuEngine() {
  if (impl_ && impl_->stream) {
    cudaSetDevice(impl_->opt.device);
    cudaStreamSynchronize(impl_->stream);
    for (cudaEvent_t e : impl_->events) cudaEventDestroy(e);
    if (impl_->pinned != nullptr) cudaFreeHost(impl_->pinned);
    if (impl_->pinned_ids != nullptr) cudaFreeHost(impl_->pinned_ids);
    if (impl_->ids_ready != nullptr) cudaEventDestroy(impl_->ids_ready);
    cudaStreamDestroy(impl_->stream);
  }
}

absl::StatusOr<std::unique_ptr<GpuEngine>> GpuEngine::Load(const std::string& model_dir,
                                                           const GpuEngineOptions& options) {
  ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(model_dir));
  if (config.family == ModelFamily::kDeepseekV4) {
    return absl::InvalidArgumentError(absl::StrCat(model_dir, ": deepseek_v4 runs on its own engine (model/v4/)"));
  }
  int end = options.layer_end;
  RETURN_IF_ERROR(CheckStageRange(config, options.layer_begin, &end));
  ASSIGN_OR_RETURN(auto store, TensorStore::OpenDir(model_dir));
  // Only this stage's tensors, layer by layer, uploaded while the next
  // layers are read.
  WeightStreamOptions so;
  so.load.keep_fp8 = options.fp8_weights;
  so.readers = options.load_readers;
  so.max_ahead = options.load_parts_ahead;
  WeightStream stream(*store, config, options.layer_begin, end, options.layer_begin == 0, end == config.num_layers,
                      so);
  ASSIGN_OR_RETURN(auto impl, NewImpl(config, options, &stream, 0));
  return std::unique_ptr<GpuEngine>(new GpuEngine(std::move(impl)));
}

absl::StatusOr<std::unique_ptr<GpuEngine>> GpuEngine::CreateSynthetic(const ModelConfig& config,
                                                                      const GpuEngineOptions& options, uint64_t seed) {
  ASSIGN_OR_RETURN(auto impl, NewImpl(config, options, nullptr, seed));
  return std::unique_ptr<GpuEngine>(new GpuEngine(std::move(impl)));
}

const ModelConfig& GpuEngine::config() const { return impl_->c; }
bool GpuEngine::first_stage() const { return impl_->opt.layer_begin == 0; }
bool GpuEngine::last_stage() const { return impl_->opt.layer_end == impl_->c.num_layers; }
uint64_t GpuEngine::weight_bytes() const { return impl_->w->bytes; }
int64_t GpuEngine::total_pages() const { return impl_->total_pages; }
int64_t GpuEngine::free_pages() const { return static_cast<int64_t>(impl_->free_ids.size()); }
int64_t GpuEngine::page_id_bytes() const { return impl_->page_id_bytes; }

absl::StatusOr<std::unique_ptr<GpuSequence>> GpuEngine::NewSequence() {
  if (impl_->free_slots.empty()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("all ", impl_->opt.max_sequences, " sequence slots of the GPU engine are in use"));
  }
  const int slot = impl_->free_slots.back();
  impl_->free_slots.pop_back();
  return std::unique_ptr<GpuSequence>(new GpuSequence(this, slot));
}

void GpuEngine::Release(GpuSequence* seq) {
  impl_->free_ids.insert(impl_->free_ids.end(), seq->pages_.rbegin(), seq->pages_.rend());
  impl_->free_slots.push_back(seq->slot_);
}

absl::StatusOr<GpuStep> GpuEngine::Prepare(absl::Span<const GpuChunk> chunks, bool embed) {
  Impl& im = *impl_;
  const ModelConfig& c = im.c;
  if (chunks.empty()) return absl::InvalidArgumentError("a step needs at least one chunk");
  int64_t rows = 0, need = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const GpuChunk& ch = chunks[i];
    if (ch.seq == nullptr || ch.seq->engine_ != this) {
      return absl::InvalidArgumentError("a chunk's sequence does not belong to this engine");
    }
    if (ch.tokens.empty()) return absl::InvalidArgumentError("a chunk has no tokens");
    for (size_t j = 0; j < i; ++j) {
      if (chunks[j].seq == ch.seq) return absl::InvalidArgumentError("a sequence appears twice in one batch");
    }
    if (embed) {
      for (size_t t = 0; t < ch.tokens.size(); ++t) {
        if (ch.tokens[t] < 0 || ch.tokens[t] >= c.vocab_size) {
          return absl::InvalidArgumentError(absl::StrCat("token id ", ch.tokens[t], " at index ", t,
                                                         " is outside the vocabulary [0, ", c.vocab_size, ")"));
        }
      }
    }
    const int64_t end = ch.seq->num_tokens_ + static_cast<int64_t>(ch.tokens.size());
    if (end > im.max_pages_per_seq * 64) {
      return absl::InvalidArgumentError(absl::StrCat("a sequence of ", end, " tokens exceeds this engine's limit of ",
                                                     im.max_pages_per_seq * 64, " tokens"));
    }
    need += std::max<int64_t>(0, (end + 63) / 64 - ch.seq->num_pages());
    rows += static_cast<int64_t>(ch.tokens.size());
  }
  if (rows > 65535) return absl::InvalidArgumentError(absl::StrCat("a step of ", rows, " tokens is above 65535"));
  if (need > static_cast<int64_t>(im.free_ids.size())) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "GPU KV cache is full: this step needs ", need, " more pages of 64 tokens and ", im.free_ids.size(), " of ",
        im.total_pages, " are free; end other sessions or give the worker more KV memory"));
  }
  // Pages: the check above covers the whole step, so no Grow fails halfway.
  for (const GpuChunk& ch : chunks) {
    RETURN_IF_ERROR(im.Grow(&ch.seq->pages_, ch.seq->slot_,
                            ch.seq->num_tokens_ + static_cast<int64_t>(ch.tokens.size())));
  }
  // Per-row arrays, uploaded as one block: positions (i64), then i32 arrays.
  GpuStep st;
  st.rows = static_cast<int>(rows);
  st.chunks = static_cast<int>(chunks.size());
  std::vector<int64_t> positions;
  std::vector<int> page_row, tokens, lens;
  for (const GpuChunk& ch : chunks) {
    for (size_t t = 0; t < ch.tokens.size(); ++t) {
      const int64_t pos = ch.seq->num_tokens_ + static_cast<int64_t>(t);
      positions.push_back(pos);
      page_row.push_back(ch.seq->slot_);
      tokens.push_back(embed ? ch.tokens[t] : 0);
      lens.push_back(static_cast<int>(pos + 1));
      st.max_len = std::max<int64_t>(st.max_len, pos + 1);
    }
  }
  st.seq_lens = lens;
  std::vector<int> ints;
  ints.insert(ints.end(), page_row.begin(), page_row.end());
  ints.insert(ints.end(), tokens.begin(), tokens.end());
  ints.insert(ints.end(), lens.begin(), lens.end());
  const int NH = c.num_heads;
  cuda::MlaSplitPolicy policy;
  policy.num_sms = im.num_sms;
  // Per block of rows: the dense and sparse plans and their offsets (ints).
  struct BlockPlans {
    size_t dense_at = 0, sparse_at = 0;
    cuda::MlaDecodePlan dense, sparse;
  };
  std::vector<BlockPlans> plans;
  if (im.tuned_mla()) {
    for (int r0 = 0; r0 < st.rows; r0 += kAttentionBlockRows) {
      const int n = std::min(kAttentionBlockRows, st.rows - r0);
      BlockPlans bp;
      const std::vector<int64_t> l64(lens.begin() + r0, lens.begin() + r0 + n);
      bp.dense = cuda::PlanMlaDecode(l64.data(), n, NH, policy, false);
      bp.dense_at = ints.size();
      ints.insert(ints.end(), bp.dense.work.begin(), bp.dense.work.end());
      ints.insert(ints.end(), bp.dense.split_offset.begin(), bp.dense.split_offset.end());
      st.max_total_splits = std::max(st.max_total_splits, bp.dense.total_splits);
      if (c.has_dsa) {
        // A row's selection holds min(length, k) positions, then -1s: the
        // plan covers only those entries (a 512-token prefill at prefix 0
        // would otherwise walk 2048 entries per row, 1536 of them empty).
        std::vector<int64_t> k64(n);
        for (int i = 0; i < n; ++i) k64[i] = std::min<int64_t>(l64[i], c.index_topk);
        bp.sparse = cuda::PlanMlaDecode(k64.data(), n, NH, policy, true);
        bp.sparse_at = ints.size();
        ints.insert(ints.end(), bp.sparse.work.begin(), bp.sparse.work.end());
        ints.insert(ints.end(), bp.sparse.split_offset.begin(), bp.sparse.split_offset.end());
        st.max_total_splits = std::max(st.max_total_splits, bp.sparse.total_splits);
      }
      plans.push_back(std::move(bp));
    }
  }
  const size_t pos_bytes = positions.size() * sizeof(int64_t);
  RETURN_IF_ERROR(im.s.step_ints.Reserve(pos_bytes + ints.size() * sizeof(int)));
  std::vector<char> block(pos_bytes + ints.size() * sizeof(int));
  std::memcpy(block.data(), positions.data(), pos_bytes);
  std::memcpy(block.data() + pos_bytes, ints.data(), ints.size() * sizeof(int));
  STRATA_CUDA_RETURN(cudaMemcpyAsync(im.s.step_ints.get(), block.data(), block.size(), cudaMemcpyHostToDevice,
                                     im.stream));
  const int* base = reinterpret_cast<const int*>(im.s.step_ints.as<char>() + pos_bytes);
  st.positions = im.s.step_ints.as<int64_t>();
  st.page_row = base;
  st.tokens = base + rows;
  st.seq_lens_dev = base + 2 * rows;
  auto plan_at = [&](size_t at, const cuda::MlaDecodePlan& p) {
    return GpuStep::Plan{base + at, base + at + p.work.size(), p.num_work, p.total_splits};
  };
  for (size_t i = 0; i < plans.size(); ++i) {
    GpuStep::Block b;
    b.row_begin = static_cast<int>(i) * kAttentionBlockRows;
    b.rows = std::min(kAttentionBlockRows, st.rows - b.row_begin);
    b.dense = plan_at(plans[i].dense_at, plans[i].dense);
    if (c.has_dsa) b.sparse = plan_at(plans[i].sparse_at, plans[i].sparse);
    st.blocks.push_back(b);
  }
  RETURN_IF_ERROR(im.s.hidden.Reserve(static_cast<size_t>(rows) * c.hidden_size * sizeof(float)));
  if (embed) {
    STRATA_CUDA_RETURN(cuda::LaunchEmbed(im.w->embed.get(), im.w->embed_bf16, st.tokens, st.rows, c.hidden_size,
                                         im.s.hidden.as<float>(), im.stream));
  }
  return st;
}

void GpuEngine::Commit(absl::Span<const GpuChunk> chunks) {
  for (const GpuChunk& ch : chunks) ch.seq->num_tokens_ += static_cast<int64_t>(ch.tokens.size());
}

absl::Status GpuEngine::Forward(absl::Span<const GpuChunk> chunks, bool all_logits, std::vector<float>* logits) {
  STRATA_CUDA_RETURN(cudaSetDevice(impl_->opt.device));  // calls may come from any thread
  if (!first_stage() || !last_stage()) {
    return absl::FailedPreconditionError("Forward needs an engine that owns the whole model");
  }
  Impl& im = *impl_;
  ASSIGN_OR_RETURN(GpuStep st, Prepare(chunks, /*embed=*/true));
  RETURN_IF_ERROR(im.RunLayers(st));
  const int V = im.c.vocab_size;
  int n = st.rows;
  const int* rows_dev = nullptr;
  std::vector<int> last;
  if (!all_logits) {
    int row = 0;
    for (const GpuChunk& ch : chunks) {
      row += static_cast<int>(ch.tokens.size());
      last.push_back(row - 1);
    }
    n = static_cast<int>(last.size());
    RETURN_IF_ERROR(im.s.moe_idx.Reserve(last.size() * sizeof(int)));
    STRATA_CUDA_RETURN(cudaMemcpyAsync(im.s.moe_idx.get(), last.data(), last.size() * sizeof(int),
                                       cudaMemcpyHostToDevice, im.stream));
    rows_dev = im.s.moe_idx.as<int>();
  }
  RETURN_IF_ERROR(im.s.logits.Reserve(static_cast<size_t>(n) * V * sizeof(float)));
  RETURN_IF_ERROR(im.Logits(rows_dev, n, im.s.logits.as<float>()));
  logits->resize(static_cast<size_t>(n) * V);
  STRATA_CUDA_RETURN(cudaMemcpyAsync(logits->data(), im.s.logits.get(), logits->size() * sizeof(float),
                                     cudaMemcpyDeviceToHost, im.stream));
  STRATA_CUDA_RETURN(cudaStreamSynchronize(im.stream));
  Commit(chunks);
  return absl::OkStatus();
}

absl::Status GpuEngine::RunStage(absl::Span<const GpuChunk> chunks, std::vector<float>* hidden) {
  Impl& im = *impl_;
  STRATA_CUDA_RETURN(cudaSetDevice(impl_->opt.device));  // calls may come from any thread
  const int H = im.c.hidden_size;
  if (!first_stage()) {
    int64_t rows = 0;
    for (const GpuChunk& ch : chunks) rows += static_cast<int64_t>(ch.tokens.size());
    if (static_cast<int64_t>(hidden->size()) != rows * H) {
      return absl::InvalidArgumentError(absl::StrCat("hidden has ", hidden->size(), " values, expected ", rows,
                                                     " rows of ", H));
    }
  }
  ASSIGN_OR_RETURN(GpuStep st, Prepare(chunks, first_stage()));
  const size_t bytes = static_cast<size_t>(st.rows) * H * sizeof(float);
  if (!first_stage()) {
    STRATA_CUDA_RETURN(cudaMemcpyAsync(im.s.hidden.get(), hidden->data(), bytes, cudaMemcpyHostToDevice, im.stream));
  }
  RETURN_IF_ERROR(im.RunLayers(st));
  hidden->resize(static_cast<size_t>(st.rows) * H);
  STRATA_CUDA_RETURN(cudaMemcpyAsync(hidden->data(), im.s.hidden.get(), bytes, cudaMemcpyDeviceToHost, im.stream));
  STRATA_CUDA_RETURN(cudaStreamSynchronize(im.stream));
  Commit(chunks);
  return absl::OkStatus();
}

absl::Status GpuEngine::DeviceLogits(const float* hidden, int rows, const char* what) {
  STRATA_CUDA_RETURN(cudaSetDevice(impl_->opt.device));  // calls may come from any thread
  if (!last_stage()) return absl::FailedPreconditionError(absl::StrCat(what, " called on a stage without lm_head"));
  if (rows <= 0) return absl::InvalidArgumentError(absl::StrCat(what, " needs at least one row"));
  Impl& im = *impl_;
  const size_t bytes = static_cast<size_t>(rows) * im.c.hidden_size * sizeof(float);
  RETURN_IF_ERROR(im.s.hidden.Reserve(bytes));
  STRATA_CUDA_RETURN(cudaMemcpyAsync(im.s.hidden.get(), hidden, bytes, cudaMemcpyHostToDevice, im.stream));
  RETURN_IF_ERROR(im.s.logits.Reserve(static_cast<size_t>(rows) * im.c.vocab_size * sizeof(float)));
  return im.Logits(nullptr, rows, im.s.logits.as<float>());
}

absl::Status GpuEngine::Logits(const float* hidden, int rows, std::vector<float>* logits) {
  RETURN_IF_ERROR(DeviceLogits(hidden, rows, "Logits"));
  Impl& im = *impl_;
  logits->resize(static_cast<size_t>(rows) * im.c.vocab_size);
  STRATA_CUDA_RETURN(cudaMemcpyAsync(logits->data(), im.s.logits.get(), logits->size() * sizeof(float),
                                     cudaMemcpyDeviceToHost, im.stream));
  return Synchronize();
}

absl::Status GpuEngine::GreedyTokens(const float* hidden, int rows, std::vector<int>* tokens) {
  RETURN_IF_ERROR(DeviceLogits(hidden, rows, "GreedyTokens"));
  Impl& im = *impl_;
  RETURN_IF_ERROR(im.s.argmax.Reserve(static_cast<size_t>(rows) * sizeof(int)));
  STRATA_CUDA_RETURN(
      cuda::LaunchArgmaxRows(im.s.logits.as<float>(), rows, im.c.vocab_size, im.s.argmax.as<int>(), im.stream));
  tokens->resize(rows);
  STRATA_CUDA_RETURN(cudaMemcpyAsync(tokens->data(), im.s.argmax.get(), rows * sizeof(int), cudaMemcpyDeviceToHost,
                                     im.stream));
  return Synchronize();
}

absl::Status GpuEngine::WarmUp(int prompt_rows) {
  const int64_t pages = (int64_t{prompt_rows} + 1 + 63) / 64;
  if (prompt_rows <= 0 || free_pages() < pages) return absl::OkStatus();
  auto seq = NewSequence();
  if (!seq.ok()) return absl::OkStatus();
  const int H = impl_->c.hidden_size;
  const std::vector<int> tokens(prompt_rows, 0);
  for (int n : {prompt_rows, 1}) {
    const GpuChunk chunk{seq->get(), absl::MakeConstSpan(tokens.data(), n)};
    std::vector<float> hidden;
    if (!first_stage()) hidden.assign(static_cast<size_t>(n) * H, 0.0f);
    RETURN_IF_ERROR(RunStage(absl::MakeConstSpan(&chunk, 1), &hidden));
    if (last_stage()) {
      std::vector<int> ids;
      const float* last = hidden.data() + static_cast<size_t>(n - 1) * H;
      RETURN_IF_ERROR(GreedyTokens(last, 1, &ids));
      const SampleDraw draw;
      RETURN_IF_ERROR(SampleTokens(last, absl::MakeConstSpan(&draw, 1), &ids));
    }
  }
  return absl::OkStatus();
}

absl::Status GpuEngine::SampleTokens(const float* hidden, absl::Span<const SampleDraw> draws,
                                     std::vector<int>* tokens, std::vector<SampleLogprobs>* logprobs) {
  const int rows = static_cast<int>(draws.size());
  RETURN_IF_ERROR(DeviceLogits(hidden, rows, "SampleTokens"));
  Impl& im = *impl_;
  std::vector<cuda::SampleRow> host(rows);
  std::vector<cuda::PenaltyEntry> penalties;
  bool any_logprobs = false;
  for (int r = 0; r < rows; ++r) {
    const SampleDraw& d = draws[r];
    cuda::SampleRow& h = host[r];
    h.temperature = d.temperature;
    h.top_k = d.top_k;
    h.top_p = d.top_p;
    h.min_p = d.min_p;
    h.u = d.u;
    h.repetition = d.repetition_penalty;
    h.frequency = d.frequency_penalty;
    h.presence = d.presence_penalty;
    h.penalty_begin = static_cast<int>(penalties.size());
    h.penalty_count = static_cast<int>(d.counts.size());
    h.logprobs = logprobs != nullptr ? std::min(d.logprobs, cuda::kSampleMaxLogprobs) : -1;
    any_logprobs |= h.logprobs >= 0;
    for (const PenaltyCount& c : d.counts) penalties.push_back({c.token, c.prompt, c.output});
  }
  const size_t row_bytes = host.size() * sizeof(cuda::SampleRow);
  const size_t penalty_bytes = penalties.size() * sizeof(cuda::PenaltyEntry);
  const size_t logprob_bytes = any_logprobs ? rows * sizeof(cuda::SampleLogprobsOut) : 0;
  RETURN_IF_ERROR(im.s.sample_rows.Reserve(row_bytes + penalty_bytes));
  if (any_logprobs) RETURN_IF_ERROR(im.s.sample_logprobs.Reserve(logprob_bytes));
  RETURN_IF_ERROR(im.s.argmax.Reserve(static_cast<size_t>(rows) * sizeof(int)));
  STRATA_CUDA_RETURN(
      cudaMemcpyAsync(im.s.sample_rows.get(), host.data(), row_bytes, cudaMemcpyHostToDevice, im.stream));
  if (penalty_bytes > 0) {
    STRATA_CUDA_RETURN(cudaMemcpyAsync(static_cast<uint8_t*>(im.s.sample_rows.get()) + row_bytes, penalties.data(),
                                       penalty_bytes, cudaMemcpyHostToDevice, im.stream));
  }
  cuda::SampleParams p;
  p.penalties = penalty_bytes > 0 ? reinterpret_cast<const cuda::PenaltyEntry*>(
                                        static_cast<uint8_t*>(im.s.sample_rows.get()) + row_bytes)
                                  : nullptr;
  p.logits = im.s.logits.as<float>();
  p.ld = im.c.vocab_size;
  p.rows = rows;
  p.vocab = im.c.vocab_size;
  p.row = im.s.sample_rows.as<cuda::SampleRow>();
  p.tokens = im.s.argmax.as<int>();
  p.logprobs = any_logprobs ? im.s.sample_logprobs.as<cuda::SampleLogprobsOut>() : nullptr;
  STRATA_CUDA_RETURN(cuda::LaunchSampleRows(p, im.stream));
  tokens->resize(rows);
  STRATA_CUDA_RETURN(cudaMemcpyAsync(tokens->data(), im.s.argmax.get(), rows * sizeof(int), cudaMemcpyDeviceToHost,
                                     im.stream));
  std::vector<cuda::SampleLogprobsOut> lp(any_logprobs ? rows : 0);
  if (any_logprobs) {
    STRATA_CUDA_RETURN(cudaMemcpyAsync(lp.data(), im.s.sample_logprobs.get(), logprob_bytes, cudaMemcpyDeviceToHost,
                                       im.stream));
  }
  RETURN_IF_ERROR(Synchronize());
  if (logprobs != nullptr) {
    logprobs->assign(rows, SampleLogprobs{});
    for (int r = 0; r < rows; ++r) {
      if (host[r].logprobs < 0) continue;
      SampleLogprobs& out = (*logprobs)[r];
      out.logprob = lp[r].logprob;
      out.rank = lp[r].rank;
      for (int j = 0; j < lp[r].count; ++j) out.top.push_back({lp[r].token[j], lp[r].value[j]});
    }
  }
  return absl::OkStatus();
}

absl::Status GpuEngine::FillRandomContext(GpuSequence* seq, int64_t n_tokens, uint64_t seed) {
  Impl& im = *impl_;
  STRATA_CUDA_RETURN(cudaSetDevice(impl_->opt.device));  // calls may come from any thread
  if (seq == nullptr || seq->engine_ != this || seq->num_tokens_ != 0) {
    return absl::InvalidArgumentError("FillRandomContext needs an empty sequence of this engine");
  }
  RETURN_IF_ERROR(im.Grow(&seq->pages_, seq->slot_, n_tokens));
  const int64_t pages = seq->num_pages();
  // Fill the pages' bytes in every layer (each page id is one slab per layer).
  const int nl = im.num_local_layers();
  for (int l = 0; l < nl; ++l) {
    for (int64_t p = 0; p < pages; ++p) {
      const int id = seq->pages_[p];
      // Runs of consecutive ids go in one launch.
      int64_t run = 1;
      while (p + run < pages && seq->pages_[p + run] == id + run) ++run;
      STRATA_CUDA_RETURN(cuda::LaunchFillRandomPages(
          im.mla_base(l) + static_cast<size_t>(id) * im.mla_layout.page_bytes(), run, im.mla_layout.page_bytes(),
          im.mla_layout.scale_offset(), 128, seed + 7919 * l + id, im.stream));
      if (im.index_slot[l] >= 0) {
        STRATA_CUDA_RETURN(cuda::LaunchFillRandomPages(
            im.index_base(l) + static_cast<size_t>(id) * im.index_layout.page_bytes(), run,
            im.index_layout.page_bytes(), im.index_layout.scale_offset(), 64, seed + 104729 * l + id, im.stream));
      }
      p += run - 1;
    }
  }
  seq->num_tokens_ = n_tokens;
  return Synchronize();
}

absl::Status GpuEngine::ReadKvRows(const GpuSequence& seq, int layer, int64_t first, int64_t n,
                                   std::vector<uint8_t>* rows) {
  Impl& im = *impl_;
  STRATA_CUDA_RETURN(cudaSetDevice(impl_->opt.device));  // calls may come from any thread
  if (seq.engine_ != this || layer < 0 || layer >= im.num_local_layers() || first < 0 || n < 0 ||
      first + n > seq.num_tokens_) {
    return absl::InvalidArgumentError(absl::StrCat("rows [", first, ", ", first + n, ") of layer ", layer,
                                                   " are outside the sequence's ", seq.num_tokens_, " tokens"));
  }
  const int L = im.c.kv_lora_rank, R = im.c.qk_rope_head_dim;
  const size_t row_bytes = L + 4 + R + 4, page_bytes = im.mla_layout.page_bytes();
  rows->resize(static_cast<size_t>(n) * row_bytes);
  STRATA_CUDA_RETURN(cudaStreamSynchronize(im.stream));
  std::vector<uint8_t> page(page_bytes);
  for (int64_t t = first; t < first + n;) {
    const int64_t p = t / 64;
    STRATA_CUDA_RETURN(cudaMemcpy(page.data(), im.mla_base(layer) + static_cast<size_t>(seq.pages_[p]) * page_bytes,
                                  page_bytes, cudaMemcpyDeviceToHost));
    for (; t < first + n && t / 64 == p; ++t) {
      const int slot = static_cast<int>(t % 64);
      uint8_t* out = rows->data() + static_cast<size_t>(t - first) * row_bytes;
      std::memcpy(out, page.data() + static_cast<size_t>(slot) * L, L);
      std::memcpy(out + L, page.data() + im.mla_layout.scale_offset() + 8 * slot, 4);
      std::memcpy(out + L + 4, page.data() + im.mla_layout.rope_offset() + static_cast<size_t>(slot) * R, R);
      std::memcpy(out + L + 4 + R, page.data() + im.mla_layout.scale_offset() + 8 * slot + 4, 4);
    }
  }
  return absl::OkStatus();
}

absl::Status GpuEngine::Impl::Grow(std::vector<int>* pages, int slot, int64_t tokens) {
  const int64_t want = (tokens + 63) / 64, have = static_cast<int64_t>(pages->size());
  if (want <= have) return absl::OkStatus();
  if (want > max_pages_per_seq) {
    return absl::InvalidArgumentError(absl::StrCat("a sequence of ", tokens, " tokens exceeds this engine's limit of ",
                                                   max_pages_per_seq * 64, " tokens"));
  }
  if (want - have > static_cast<int64_t>(free_ids.size())) {
    return absl::ResourceExhaustedError(absl::StrCat("GPU KV cache is full: ", want - have, " more pages of 64 tokens needed, ",
                                                     free_ids.size(), " of ", total_pages, " free"));
  }
  for (int64_t p = have; p < want; ++p) {
    pages->push_back(free_ids.back());
    free_ids.pop_back();
  }
  STRATA_CUDA_RETURN(cudaMemcpyAsync(page_table.as<int>() + static_cast<int64_t>(slot) * max_pages_per_seq + have,
                                     pages->data() + have, (want - have) * sizeof(int), cudaMemcpyHostToDevice,
                                     stream));
  return absl::OkStatus();
}

absl::Status GpuEngine::ReadIndexKeys(const GpuSequence& seq, int layer, int64_t first, int64_t n,
                                      std::vector<float>* keys) {
  Impl& im = *impl_;
  STRATA_CUDA_RETURN(cudaSetDevice(impl_->opt.device));  // calls may come from any thread
  if (seq.engine_ != this || layer < 0 || layer >= im.num_local_layers() || im.index_slot[layer] < 0 || first < 0 ||
      n < 0 || first + n > seq.num_tokens_) {
    return absl::InvalidArgumentError(absl::StrCat("no index keys [", first, ", ", first + n, ") in layer ", layer));
  }
  const int D = im.c.index_head_dim;
  RETURN_IF_ERROR(im.s.upload.Reserve(static_cast<size_t>(n) * D * sizeof(float)));
  STRATA_CUDA_RETURN(cuda::LaunchLoadIndexKeys(im.index_base(layer), im.table_row(seq.slot_), first, n,
                                               im.index_layout, im.s.upload.as<float>(), im.stream));
  keys->resize(static_cast<size_t>(n) * D);
  STRATA_CUDA_RETURN(cudaMemcpyAsync(keys->data(), im.s.upload.get(), keys->size() * sizeof(float),
                                     cudaMemcpyDeviceToHost, im.stream));
  return Synchronize();
}

absl::Status GpuEngine::AppendStoredRows(GpuSequence* seq, int64_t n, absl::Span<const std::vector<uint8_t>> rows,
                                         absl::Span<const std::vector<float>> index_keys) {
  Impl& im = *impl_;
  STRATA_CUDA_RETURN(cudaSetDevice(impl_->opt.device));  // calls may come from any thread
  const int nl = im.num_local_layers();
  const size_t row_bytes = im.c.kv_lora_rank + 4 + im.c.qk_rope_head_dim + 4;
  const size_t key_floats = static_cast<size_t>(n) * im.c.index_head_dim;
  if (seq == nullptr || seq->engine_ != this || n < 0) return absl::InvalidArgumentError("bad sequence or count");
  if (static_cast<int>(rows.size()) != nl || static_cast<int>(index_keys.size()) != nl) {
    return absl::InvalidArgumentError(absl::StrCat("stored rows for ", rows.size(), " layers, the engine has ", nl));
  }
  for (int l = 0; l < nl; ++l) {
    const size_t want_keys = im.index_slot[l] >= 0 ? key_floats : 0;
    if (rows[l].size() != n * row_bytes || index_keys[l].size() != want_keys) {
      return absl::InvalidArgumentError(absl::StrCat("layer ", l, ": ", rows[l].size(), " row bytes and ",
                                                     index_keys[l].size(), " key values, expected ", n * row_bytes,
                                                     " and ", want_keys));
    }
  }
  if (n == 0) return absl::OkStatus();
  const int64_t first = seq->num_tokens_;
  RETURN_IF_ERROR(im.Grow(&seq->pages_, seq->slot_, first + n));
  // Positions and the page-table row, then every layer's rows and keys
  // (each block 16-byte aligned): one pinned buffer, one copy.
  std::vector<size_t> row_at(nl), key_at(nl);
  size_t at = cuda::Align16(static_cast<size_t>(n) * (sizeof(int64_t) + sizeof(int)));
  for (int l = 0; l < nl; ++l) {
    row_at[l] = at;
    at = cuda::Align16(at + rows[l].size());
    key_at[l] = at;
    at = cuda::Align16(at + index_keys[l].size() * sizeof(float));
  }
  const size_t total = at;
  STRATA_CUDA_RETURN(cudaStreamSynchronize(im.stream));  // the staging buffer is free
  if (im.pinned_bytes < total) {
    if (im.pinned != nullptr) cudaFreeHost(im.pinned);
    im.pinned = nullptr;
    im.pinned_bytes = 0;
    STRATA_CUDA_RETURN(cudaHostAlloc(&im.pinned, total, cudaHostAllocDefault));
    im.pinned_bytes = total;
  }
  char* h = static_cast<char*>(im.pinned);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t pos = first + i;
    std::memcpy(h + i * sizeof(int64_t), &pos, sizeof(int64_t));
    std::memcpy(h + n * sizeof(int64_t) + i * sizeof(int), &seq->slot_, sizeof(int));
  }
  for (int l = 0; l < nl; ++l) {
    std::memcpy(h + row_at[l], rows[l].data(), rows[l].size());
    std::memcpy(h + key_at[l], index_keys[l].data(), index_keys[l].size() * sizeof(float));
  }
  RETURN_IF_ERROR(im.s.upload.Reserve(total));
  char* d = im.s.upload.as<char>();
  STRATA_CUDA_RETURN(cudaMemcpyAsync(d, h, total, cudaMemcpyHostToDevice, im.stream));
  const cuda::RowPages where{reinterpret_cast<const int64_t*>(d),
                             reinterpret_cast<const int*>(d + n * sizeof(int64_t)), im.page_table.as<int>(),
                             im.max_pages_per_seq};
  for (int l = 0; l < nl; ++l) {
    STRATA_CUDA_RETURN(cuda::LaunchStoreV2Rows(reinterpret_cast<const uint8_t*>(d + row_at[l]), n, first,
                                               im.table_row(seq->slot_), im.mla_layout, im.mla_base(l), im.stream));
    if (im.index_slot[l] >= 0) {
      STRATA_CUDA_RETURN(cuda::LaunchAppendIndexKeys(reinterpret_cast<const float*>(d + key_at[l]),
                                                     im.c.index_head_dim, static_cast<int>(n), where,
                                                     im.index_layout, im.index_base(l), im.stream));
    }
  }
  RETURN_IF_ERROR(Synchronize());
  seq->num_tokens_ += n;
  return absl::OkStatus();
}

const std::vector<std::vector<int>>& GpuEngine::last_selections() const { return impl_->selections; }
const std::vector<GpuLayerProfile>& GpuEngine::profile() const { return impl_->profile; }

absl::Status GpuEngine::Synchronize() {
  STRATA_CUDA_RETURN(cudaSetDevice(impl_->opt.device));  // calls may come from any thread
  STRATA_CUDA_RETURN(cudaStreamSynchronize(impl_->stream));
  return absl::OkStatus();
}

}  // namespace strata
