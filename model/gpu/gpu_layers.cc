// The layer math of GpuEngine on the device: the same steps, in the same
// order, as the CPU engine's model/attention.cc and model/mlp.cc
// (docs/model-math.md), each row computed independently of the others.
#include <algorithm>
#include <cmath>
#include <vector>

#include "common/status_macros.h"
#include "kernels/cuda/dsa_indexer.h"
#include "kernels/cuda/mla_decode.h"
#include "kernels/cuda/moe_gemv.h"
#include "kernels/cuda/small_gemm.h"
#include "model/gpu/gpu_engine_impl.h"

namespace strata {

namespace {
constexpr double kLatentNormEps = 1e-6;   // q_a_layernorm, kv_a_layernorm
constexpr double kIndexerNormEps = 1e-6;  // indexer k_norm
// Split bf16 GEMM inputs: up to this many rows the hi and lo rows share one
// GEMM (weight-bound steps); above it two GEMMs, the second accumulating.
constexpr int kSplitStackedRows = 64;

template <typename T>
absl::Status Reserve(gpu::DeviceBuffer& b, int64_t n) {
  return b.Reserve(static_cast<size_t>(n) * sizeof(T));
}
}  // namespace

absl::Status GpuEngine::Impl::Gemm(const cuda::GemmArgs& in) {
  if (in.type != cuda::GemmType::kBF16) return gemm->Run(in, stream);
  // bf16 weights, f32 inputs (docs/gpu-engine.md, "GEMMs").
  if (opt.small_step_gemv && !opt.batch_invariant_gemm && cuda::SmallGemmSupports(in)) {
    STRATA_CUDA_RETURN(cuda::LaunchSmallGemm(in, stream));  // the f32 inputs as they are
    return absl::OkStatus();
  }
  cuda::GemmArgs a = in;
  if (a.m > opt.split_bf16_max_rows || opt.batch_invariant_gemm) {
    // Rounded: the whole span the GEMM reads is converted.
    const int64_t span = (a.batch - 1) * a.stride_x + (a.m - 1) * a.ldx + a.k;
    RETURN_IF_ERROR(s.bf16.Reserve(static_cast<size_t>(span) * 2));
    STRATA_CUDA_RETURN(cuda::LaunchToBf16(static_cast<const float*>(a.x), span, s.bf16.get(), stream));
    a.x = s.bf16.get();
    return gemm->Run(a, stream);
  }
  // The f32 inputs as hi + lo bf16 rows (cuda::LaunchSplitBf16), so their
  // rounding does not reach y.
  RETURN_IF_ERROR(s.bf16.Reserve(static_cast<size_t>(a.batch) * 2 * a.m * a.k * 2));
  STRATA_CUDA_RETURN(cuda::LaunchSplitBf16(static_cast<const float*>(a.x), a.batch, a.m, a.k, a.ldx, a.stride_x,
                                           s.bf16.get(), stream));
  a.x = s.bf16.get();
  a.ldx = a.k;
  a.stride_x = int64_t{2} * a.m * a.k;
  if (a.m <= kSplitStackedRows && !a.accumulate) {
    // Small steps read the weights once for the 2m rows as for m: one GEMM,
    // then the halves of its product are added.
    RETURN_IF_ERROR(s.split_y.Reserve(static_cast<size_t>(a.batch) * 2 * a.m * a.n * sizeof(float)));
    a.m = 2 * in.m;
    a.y = s.split_y.as<float>();
    a.ldy = in.n;
    a.stride_y = int64_t{2} * in.m * in.n;
    RETURN_IF_ERROR(gemm->Run(a, stream));
    STRATA_CUDA_RETURN(
        cuda::LaunchAddSplitHalves(s.split_y.as<float>(), in.batch, in.m, in.n, in.y, in.ldy, in.stride_y, stream));
    return absl::OkStatus();
  }
  // Larger ones are bound by the products, not the weights: y (+)= W hi,
  // then y += W lo (no scratch as large as y).
  RETURN_IF_ERROR(gemm->Run(a, stream));
  a.x = static_cast<const char*>(s.bf16.get()) + int64_t{a.m} * a.k * 2;  // the lo rows
  a.accumulate = true;
  return gemm->Run(a, stream);
}

absl::Status GpuEngine::Impl::Linear(const float* x, int rows, const gpu::DLinear& l, float* y) {
  if (l.fp8) {
    if (fp8_gemm == nullptr) return absl::InternalError("an fp8 weight without the fp8 GEMM runner");
    cuda::Fp8GemvArgs f;
    f.m = rows, f.n = l.out, f.k = l.in;
    f.x = x, f.ldx = l.in;
    f.w = l.w.as<uint8_t>(), f.ldw = l.in;
    f.scale = l.scale.as<float>(), f.ld_scale = (l.in + cuda::kFp8BlockSize - 1) / cuda::kFp8BlockSize;
    f.y = y, f.ldy = l.out;
    RETURN_IF_ERROR(fp8_gemm->Run(f, stream));
    if (l.bias() != nullptr) STRATA_CUDA_RETURN(cuda::LaunchAddBias(y, l.bias(), rows, l.out, stream));
    return absl::OkStatus();
  }
  cuda::GemmArgs a;
  a.type = l.type;
  a.m = rows;
  a.n = l.out;
  a.k = l.in;
  a.x = x;
  a.ldx = l.in;
  a.w = l.w.get();
  a.ldw = l.in;
  a.y = y;
  a.ldy = l.out;
  RETURN_IF_ERROR(Gemm(a));
  if (l.bias() != nullptr) STRATA_CUDA_RETURN(cuda::LaunchAddBias(y, l.bias(), rows, l.out, stream));
  return absl::OkStatus();
}

absl::Status GpuEngine::Impl::Indexer(const GpuStep& st, int l, const float* x, const float* q_latent) {
  const gpu::DLayer& d = w->layers[l];
  const int rows = st.rows, IH = c.index_n_heads, ID = c.index_head_dim, R = c.qk_rope_head_dim;
  // The new rows' keys go into the cache whatever the step's lengths.
  RETURN_IF_ERROR(Reserve<float>(s.idx_k, int64_t{rows} * ID));
  float* k = s.idx_k.as<float>();
  RETURN_IF_ERROR(Linear(x, rows, d.index_wk, k));
  STRATA_CUDA_RETURN(cuda::LaunchLayerNorm(k, d.index_k_norm_w.as<float>(), d.index_k_norm_b.as<float>(), rows, ID,
                                           ID, kIndexerNormEps, k, stream));
  STRATA_CUDA_RETURN(cuda::LaunchRope(k, rows, ID, 1, 0, R, st.positions, inv_freq.as<float>(), attention_factor,
                                      c.indexer_rope_interleave, stream));
  const cuda::RowPages where{st.positions, st.page_row, page_table.as<int>(), max_pages_per_seq};
  STRATA_CUDA_RETURN(cuda::LaunchAppendIndexKeys(k, ID, rows, where, index_layout, index_base(l), stream));

  const int64_t stride = st.max_len;
  RETURN_IF_ERROR(Reserve<int>(s.indices, int64_t{rows} * c.index_topk));
  if (topk_ws_rows != rows || topk_ws_stride != stride) {
    const size_t bytes = cuda::TopkWorkspaceBytes(rows, stride);
    RETURN_IF_ERROR(s.topk_ws.Reserve(bytes));
    STRATA_CUDA_RETURN(cudaMemsetAsync(s.topk_ws.get(), 0, bytes, stream));
    topk_ws_rows = rows;
    topk_ws_stride = stride;
  }
  RETURN_IF_ERROR(Reserve<float>(s.scores, rows * stride));
  cuda::TopkParams t;
  t.scores = s.scores.as<float>();
  t.score_stride = stride;
  t.seq_lens = st.seq_lens_dev;
  t.batch = rows;
  t.k = c.index_topk;
  t.indices = s.indices.as<int>();
  t.workspace = s.topk_ws.get();

  if (st.max_len <= c.index_topk) {
    // Every row selects all its positions: no queries, weights or scores.
    STRATA_CUDA_RETURN(cuda::LaunchTopk(t, stream));
  } else {
    RETURN_IF_ERROR(Reserve<float>(s.idx_q, int64_t{rows} * IH * ID));
    RETURN_IF_ERROR(Reserve<float>(s.idx_w, int64_t{rows} * IH));
    float* q = s.idx_q.as<float>();
    float* hw = s.idx_w.as<float>();
    RETURN_IF_ERROR(Linear(q_latent, rows, d.index_wq_b, q));
    RETURN_IF_ERROR(Linear(x, rows, d.index_weights_proj, hw));
    const float head_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(IH)));
    const float score_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(ID)));
    STRATA_CUDA_RETURN(cuda::LaunchScale(hw, int64_t{rows} * IH, head_scale, stream));
    STRATA_CUDA_RETURN(cuda::LaunchRope(q, rows, int64_t{IH} * ID, IH, ID, R, st.positions, inv_freq.as<float>(),
                                        attention_factor, c.indexer_rope_interleave, stream));
    if (tuned_indexer()) {
      // ReLU(s * d) = s * ReLU(d) for s > 0: the score scale joins the weights.
      STRATA_CUDA_RETURN(cuda::LaunchScale(hw, int64_t{rows} * IH, score_scale, stream));
      cuda::DsaIndexerParams p;
      p.q = q;
      p.q_is_bf16 = false;
      p.weights = hw;
      p.batch = rows;
      p.index_heads = IH;
      p.pool = index_base(l);
      p.page_table = page_table.as<int>();
      p.page_table_stride = max_pages_per_seq;
      p.page_row = st.page_row;
      p.seq_lens = st.seq_lens_dev;
      p.max_seq_len = st.max_len;
      p.scores = s.scores.as<float>();
      p.score_stride = stride;
      STRATA_CUDA_RETURN(cuda::LaunchDsaIndexerTopk(p, t, stream));
    } else {
      cuda::IndexerScoreParams p;
      p.q = q;
      p.weights = hw;
      p.rows = rows;
      p.heads = IH;
      p.score_scale = score_scale;
      p.layout = index_layout;
      p.pool = index_base(l);
      p.page_row = st.page_row;
      p.page_table = page_table.as<int>();
      p.page_table_stride = max_pages_per_seq;
      p.seq_lens = st.seq_lens_dev;
      p.max_seq_len = st.max_len;
      p.scores = s.scores.as<float>();
      p.score_stride = stride;
      STRATA_CUDA_RETURN(cuda::LaunchIndexerScores(p, stream));
      STRATA_CUDA_RETURN(cuda::LaunchTopk(t, stream));
    }
  }
  if (opt.record_selections) {
    selections.resize(num_local_layers());
    selections[l].resize(static_cast<size_t>(rows) * c.index_topk);
    STRATA_CUDA_RETURN(cudaMemcpyAsync(selections[l].data(), s.indices.get(), selections[l].size() * sizeof(int),
                                       cudaMemcpyDeviceToHost, stream));
    STRATA_CUDA_RETURN(cudaStreamSynchronize(stream));
  }
  return absl::OkStatus();
}

absl::Status GpuEngine::Impl::Attention(const GpuStep& st, int g, int l, const float* x, float* out) {
  const gpu::DLayer& d = w->layers[l];
  const int rows = st.rows, NH = c.num_heads, NOPE = c.qk_nope_head_dim, R = c.qk_rope_head_dim, QK = NOPE + R,
            V = c.v_head_dim, L = c.kv_lora_rank;
  RETURN_IF_ERROR(Reserve<float>(s.q, int64_t{rows} * NH * QK));
  float* q = s.q.as<float>();
  float* q_latent = nullptr;
  if (c.q_lora_rank == 0) {
    RETURN_IF_ERROR(Linear(x, rows, d.q_proj, q));
  } else {
    RETURN_IF_ERROR(Reserve<float>(s.q_latent, int64_t{rows} * c.q_lora_rank));
    q_latent = s.q_latent.as<float>();
    RETURN_IF_ERROR(Linear(x, rows, d.q_a, q_latent));
    STRATA_CUDA_RETURN(cuda::LaunchRmsNorm(q_latent, d.q_a_norm.as<float>(), rows, c.q_lora_rank, c.q_lora_rank,
                                           kLatentNormEps, q_latent, stream));
    RETURN_IF_ERROR(Linear(q_latent, rows, d.q_b, q));
  }
  // The new cache rows: c = RMSNorm(first kv_lora), r = rope(last qk_rope).
  RETURN_IF_ERROR(Reserve<float>(s.kv, int64_t{rows} * (L + R)));
  float* kv = s.kv.as<float>();
  RETURN_IF_ERROR(Linear(x, rows, d.kv_a, kv));
  STRATA_CUDA_RETURN(cuda::LaunchRmsNorm(kv, d.kv_a_norm.as<float>(), rows, L, L + R, kLatentNormEps, kv, stream));
  STRATA_CUDA_RETURN(cuda::LaunchRope(kv + L, rows, L + R, 1, 0, R, st.positions, inv_freq.as<float>(),
                                      attention_factor, c.rope_interleave, stream));
  STRATA_CUDA_RETURN(cuda::LaunchRope(q + NOPE, rows, int64_t{NH} * QK, NH, QK, R, st.positions,
                                      inv_freq.as<float>(), attention_factor, c.rope_interleave, stream));
  const cuda::RowPages where{st.positions, st.page_row, page_table.as<int>(), max_pages_per_seq};
  STRATA_CUDA_RETURN(cuda::LaunchAppendMlaRows(kv, kv + L, L + R, rows, where, mla_layout, mla_base(l), stream));

  const IndexerMode mode = c.layers[g].indexer;
  if (mode == IndexerMode::kFull) RETURN_IF_ERROR(Indexer(st, l, x, q_latent));
  const bool sparse = mode != IndexerMode::kNone;

  // q_abs[r][h] = W_UK[h]^T q_nope[r][h]: one GEMM per head, batched.
  RETURN_IF_ERROR(Reserve<float>(s.q_abs, int64_t{rows} * NH * L));
  const size_t wsize = d.kv_b.type == cuda::GemmType::kBF16 ? 2 : 4;
  cuda::GemmArgs a;
  a.type = d.kv_b.type;
  a.m = rows;
  a.n = L;
  a.k = NOPE;
  a.x = q;
  a.ldx = int64_t{NH} * QK;
  a.stride_x = QK;
  a.w = d.kv_b.w.get();
  a.ldw = L;
  a.w_is_kn = true;
  a.stride_w = int64_t{NOPE + V} * L;
  a.y = s.q_abs.as<float>();
  a.ldy = int64_t{NH} * L;
  a.stride_y = L;
  a.batch = NH;
  RETURN_IF_ERROR(Gemm(a));

  RETURN_IF_ERROR(Reserve<float>(s.o_lat, int64_t{rows} * NH * L));
  if (tuned_mla()) {
    RETURN_IF_ERROR(Reserve<float>(s.q_pe, int64_t{rows} * NH * R));
    STRATA_CUDA_RETURN(cudaMemcpy2DAsync(s.q_pe.get(), R * sizeof(float), q + NOPE, QK * sizeof(float),
                                         R * sizeof(float), static_cast<size_t>(rows) * NH, cudaMemcpyDeviceToDevice,
                                         stream));
    RETURN_IF_ERROR(Reserve<float>(s.partial, cuda::MlaPartialFloats(st.max_total_splits, NH)));
    RETURN_IF_ERROR(Reserve<float>(s.ml, int64_t{st.max_total_splits} * NH * 2));
    RETURN_IF_ERROR(Reserve<float>(s.lse, int64_t{rows} * NH));
    // Blocks of rows one after the other: the partials are reused.
    for (const GpuStep::Block& blk : st.blocks) {
      const int64_t r0 = blk.row_begin;
      const GpuStep::Plan& plan = sparse ? blk.sparse : blk.dense;
      cuda::MlaDecodeParams p;
      p.q_abs = s.q_abs.as<float>() + r0 * NH * L;
      p.q_pe = s.q_pe.as<float>() + r0 * NH * R;
      p.q_is_bf16 = false;
      p.batch = blk.rows;
      p.heads = NH;
      p.softmax_scale = static_cast<float>(c.softmax_scale);
      p.pool = mla_base(l);
      p.page_table = page_table.as<int>();
      p.page_table_stride = max_pages_per_seq;
      p.page_row = st.page_row + r0;
      p.seq_lens = st.seq_lens_dev + r0;
      if (sparse) {
        p.indices = s.indices.as<int>() + r0 * c.index_topk;
        p.index_stride = c.index_topk;
      }
      p.work = plan.work;
      p.num_work = plan.num_work;
      p.split_offset = plan.split_offset;
      p.o_partial = s.partial.as<float>();
      p.ml_partial = s.ml.as<float>();
      p.out = s.o_lat.as<float>() + r0 * NH * L;
      p.lse = s.lse.as<float>() + r0 * NH;
      STRATA_CUDA_RETURN(cuda::LaunchMlaDecode(p, stream));
    }
  } else {
    cuda::MlaAttendParams p;
    p.q_abs = s.q_abs.as<float>();
    p.q_pe = q + NOPE;
    p.q_pe_row_stride = int64_t{NH} * QK;
    p.q_pe_head_stride = QK;
    p.rows = rows;
    p.heads = NH;
    p.softmax_scale = static_cast<float>(c.softmax_scale);
    p.layout = mla_layout;
    p.pool = mla_base(l);
    p.page_row = st.page_row;
    p.page_table = page_table.as<int>();
    p.page_table_stride = max_pages_per_seq;
    p.seq_lens = st.seq_lens_dev;
    if (sparse) {
      p.indices = s.indices.as<int>();
      p.index_stride = c.index_topk;
    }
    p.out = s.o_lat.as<float>();
    STRATA_CUDA_RETURN(cuda::LaunchMlaAttend(p, stream));
  }

  // ctx[r][h] = W_UV[h] o_lat[r][h], then o_proj.
  RETURN_IF_ERROR(Reserve<float>(s.ctx, int64_t{rows} * NH * V));
  cuda::GemmArgs b;
  b.type = d.kv_b.type;
  b.m = rows;
  b.n = V;
  b.k = L;
  b.x = s.o_lat.get();
  b.ldx = int64_t{NH} * L;
  b.stride_x = L;
  b.w = static_cast<const char*>(d.kv_b.w.get()) + static_cast<size_t>(NOPE) * L * wsize;
  b.ldw = L;
  b.stride_w = int64_t{NOPE + V} * L;
  b.y = s.ctx.as<float>();
  b.ldy = int64_t{NH} * V;
  b.stride_y = V;
  b.batch = NH;
  RETURN_IF_ERROR(Gemm(b));
  return Linear(s.ctx.as<float>(), rows, d.o, out);
}

absl::Status GpuEngine::Impl::RunMlp(const gpu::DMlp& m, int rows, const float* x, float* out) {
  const int inter = m.gate_up.out / 2;
  RETURN_IF_ERROR(Reserve<float>(s.mlp_g, int64_t{rows} * 2 * inter));
  RETURN_IF_ERROR(Reserve<float>(s.mlp_act, int64_t{rows} * inter));
  float* gu = s.mlp_g.as<float>();  // row r: gate [0, inter), up [inter, 2 inter)
  RETURN_IF_ERROR(Linear(x, rows, m.gate_up, gu));
  STRATA_CUDA_RETURN(cuda::LaunchSiluMul(gu, gu + inter, rows, inter, 2 * int64_t{inter}, s.mlp_act.as<float>(),
                                         stream));
  return Linear(s.mlp_act.as<float>(), rows, m.down, out);
}

// Up to this many rows an expert has at most this many entries (a row's k
// experts are distinct), one group of the matrix-vector kernel, so every
// weight row is read once; with more, experts shared by many rows are better
// served by the tensor-core kernel (32 entries per pass over the weights).
constexpr int kMoeGemvMaxRows = 4;
// fp8 experts run the matrix-vector kernels up to this many rows.
constexpr int kFp8MoeGemvMaxRows = 32;

GpuEngine::Impl::MoePath GpuEngine::Impl::DeviceMoePath(int l, int rows) {
  const gpu::DLayer& d = w->layers[l];
  const int entries = rows * c.num_experts_per_tok;
  if (d.experts.empty() || entries > cuda::kMoeGemvMaxEntries || d.experts.size() > 1024) return MoePath::kHost;
  const int inter = d.experts[0].gate_up.out / 2;
  if (c.hidden_size % 8 != 0 || inter % 8 != 0) return MoePath::kHost;
  // The batch-invariant mode keeps one kernel for every step size; fp8
  // experts run the matrix-vector kernels at every size (the tensor-core
  // kernel reads bf16).
  const bool fp8 = d.experts[0].gate_up.fp8;
  // fp8 experts in large steps (prefill): the matrix-vector kernels would
  // read each expert's weights once per four entries (a 512-token prefill's
  // MoE layer took 2.5x the bf16 tensor-core time, bench/RESULTS.md); the
  // host-dispatched path runs each expert's rows as fp8 GEMMs instead.
  if (fp8 && rows > kFp8MoeGemvMaxRows && !opt.batch_invariant_gemm) return MoePath::kHost;
  const MoePath path =
      rows <= kMoeGemvMaxRows || opt.batch_invariant_gemm || fp8 ? MoePath::kGemv : MoePath::kGemm;
  if (path == MoePath::kGemm &&
      (d.experts[0].gate_up.type != cuda::GemmType::kBF16 || c.hidden_size % 256 != 0 || inter % 256 != 0)) {
    return MoePath::kHost;
  }
  if (expert_tables.size() != w->layers.size()) expert_tables.resize(w->layers.size());
  if (expert_tables[l].bytes() != 0) return path;
  const size_t E = d.experts.size();
  // The table: gate_up pointers, down pointers, then (fp8) their scales.
  std::vector<const void*> ptrs(4 * E);
  for (size_t e = 0; e < E; ++e) {
    const gpu::DMlp& m = d.experts[e];
    if (m.gate_up.bias() != nullptr || m.down.bias() != nullptr || m.gate_up.out != 2 * inter ||
        m.down.in != inter || m.gate_up.type != d.experts[0].gate_up.type || m.down.type != m.gate_up.type ||
        m.gate_up.fp8 != fp8 || m.down.fp8 != fp8) {
      return MoePath::kHost;
    }
    ptrs[e] = m.gate_up.w.get();
    ptrs[E + e] = m.down.w.get();
    ptrs[2 * E + e] = m.gate_up.scale.get();
    ptrs[3 * E + e] = m.down.scale.get();
  }
  auto table = gpu::DeviceBuffer::Alloc(ptrs.size() * sizeof(void*));
  if (!table.ok() || cudaMemcpy(table->get(), ptrs.data(), ptrs.size() * sizeof(void*), cudaMemcpyHostToDevice) !=
                         cudaSuccess) {
    return MoePath::kHost;  // (the host-dispatched path needs no table)
  }
  expert_tables[l] = std::move(*table);
  return path;
}

absl::Status GpuEngine::Impl::Mlp(const GpuStep& st, int g, int l, const float* x, float* out) {
  const gpu::DLayer& d = w->layers[l];
  const int rows = st.rows, H = c.hidden_size;
  if (!c.layers[g].moe) return RunMlp(d.dense, rows, x, out);
  const int E = c.n_routed_experts, K = c.num_experts_per_tok;
  RETURN_IF_ERROR(Reserve<float>(s.moe_logits, int64_t{rows} * E));
  RETURN_IF_ERROR(Reserve<int>(s.moe_ids, int64_t{rows} * K));
  RETURN_IF_ERROR(Reserve<float>(s.moe_w, int64_t{rows} * K));
  RETURN_IF_ERROR(Linear(x, rows, d.router, s.moe_logits.as<float>()));
  cuda::MoeRouteParams rp;
  rp.logits = s.moe_logits.as<float>();
  rp.bias = d.router_bias.as<float>();
  rp.rows = rows;
  rp.experts = E;
  rp.groups = c.n_group;
  rp.topk_groups = c.topk_group;
  rp.k = K;
  rp.normalize = c.norm_topk_prob;
  rp.routed_scale = static_cast<float>(c.routed_scaling_factor);
  rp.expert_ids = s.moe_ids.as<int>();
  rp.expert_weights = s.moe_w.as<float>();
  STRATA_CUDA_RETURN(cuda::LaunchMoeRoute(rp, stream));
  const float* shared = nullptr;
  if (const MoePath path = DeviceMoePath(l, rows); path != MoePath::kHost) {
    // The routed experts on the device, no host trip: matrix-vector
    // products for small steps (and every step in the batch-invariant
    // mode), tensor-core products for larger ones.
    if (c.n_shared_experts > 0) {
      RETURN_IF_ERROR(Reserve<float>(s.shared_out, int64_t{rows} * H));
      RETURN_IF_ERROR(RunMlp(d.shared, rows, x, s.shared_out.as<float>()));
      shared = s.shared_out.as<float>();
    }
    const int n = rows * K, inter = d.experts[0].gate_up.out / 2;
    RETURN_IF_ERROR(Reserve<int>(s.moe_idx, cuda::MoeIndexInts(E, n)));
    RETURN_IF_ERROR(Reserve<float>(s.moe_in, int64_t{n} * inter));
    RETURN_IF_ERROR(Reserve<float>(s.expert_out, int64_t{n} * H));
    const void* const* tables = expert_tables[l].as<const void*>();
    cuda::MoeGemvParams mp;
    mp.type = d.experts[0].gate_up.type;
    mp.gate_up = tables;
    mp.down = tables + E;
    mp.fp8 = d.experts[0].gate_up.fp8;
    mp.gate_up_scale = reinterpret_cast<const float* const*>(tables + 2 * E);
    mp.down_scale = reinterpret_cast<const float* const*>(tables + 3 * E);
    mp.experts = E;
    mp.hidden = H;
    mp.inter = inter;
    mp.x = x;
    mp.expert_ids = s.moe_ids.as<int>();
    mp.rows = rows;
    mp.k = K;
    cuda::SetMoeIndexWorkspace(mp, s.moe_idx.as<int>());
    mp.act = s.moe_in.as<float>();
    mp.y = s.expert_out.as<float>();
    STRATA_CUDA_RETURN(path == MoePath::kGemv ? cuda::LaunchMoeGemv(mp, stream) : cuda::LaunchMoeGemm(mp, stream));
    if (opt.profile_layers) {
      std::vector<int> offsets(E + 1);
      STRATA_CUDA_RETURN(cudaMemcpyAsync(offsets.data(), mp.offsets, offsets.size() * sizeof(int),
                                         cudaMemcpyDeviceToHost, stream));
      STRATA_CUDA_RETURN(cudaStreamSynchronize(stream));
      int used = 0;
      for (int e = 0; e < E; ++e) used += offsets[e + 1] > offsets[e];
      profile[l].experts_used = used;
    }
    STRATA_CUDA_RETURN(cuda::LaunchMoeCombine(s.expert_out.as<float>(), s.moe_w.as<float>(), shared, rows, K, H, out,
                                              stream));
    return absl::OkStatus();
  }

  // Dispatch on the host: each expert's rows run as one batch. The ids come
  // down while the device runs the shared experts.
  const size_t n_ids = static_cast<size_t>(rows) * K;
  if (pinned_ids_count < n_ids) {
    if (pinned_ids != nullptr) cudaFreeHost(pinned_ids);
    pinned_ids = nullptr;
    pinned_ids_count = 0;
    STRATA_CUDA_RETURN(cudaHostAlloc(reinterpret_cast<void**>(&pinned_ids), n_ids * sizeof(int), cudaHostAllocDefault));
    pinned_ids_count = n_ids;
  }
  STRATA_CUDA_RETURN(cudaMemcpyAsync(pinned_ids, s.moe_ids.get(), n_ids * sizeof(int), cudaMemcpyDeviceToHost,
                                     stream));
  STRATA_CUDA_RETURN(cudaEventRecord(ids_ready, stream));
  if (c.n_shared_experts > 0) {
    RETURN_IF_ERROR(Reserve<float>(s.shared_out, int64_t{rows} * H));
    RETURN_IF_ERROR(RunMlp(d.shared, rows, x, s.shared_out.as<float>()));
    shared = s.shared_out.as<float>();
  }
  STRATA_CUDA_RETURN(cudaEventSynchronize(ids_ready));
  const std::vector<int> ids(pinned_ids, pinned_ids + n_ids);
  std::vector<int> count(E, 0);
  for (int id : ids) {
    if (id < 0 || id >= E) return absl::InternalError("router produced an expert id out of range");
    ++count[id];
  }
  if (opt.profile_layers) {
    profile[l].experts_used = static_cast<int>(std::count_if(count.begin(), count.end(), [](int n) { return n > 0; }));
  }
  std::vector<int> offset(E + 1, 0);
  for (int e = 0; e < E; ++e) offset[e + 1] = offset[e] + count[e];
  const int n = rows * K;
  std::vector<int> idx(2 * static_cast<size_t>(n));  // [src rows | dst slots], grouped by expert
  std::vector<int> fill(offset.begin(), offset.end() - 1);
  for (int r = 0; r < rows; ++r) {
    for (int k = 0; k < K; ++k) {
      const int at = fill[ids[r * K + k]]++;
      idx[at] = r;
      idx[n + at] = r * K + k;
    }
  }
  RETURN_IF_ERROR(Reserve<int>(s.moe_idx, 2 * int64_t{n}));
  STRATA_CUDA_RETURN(cudaMemcpyAsync(s.moe_idx.get(), idx.data(), idx.size() * sizeof(int), cudaMemcpyHostToDevice,
                                     stream));
  RETURN_IF_ERROR(Reserve<float>(s.moe_in, int64_t{n} * H));
  RETURN_IF_ERROR(Reserve<float>(s.moe_out, int64_t{n} * H));
  RETURN_IF_ERROR(Reserve<float>(s.expert_out, int64_t{n} * H));
  STRATA_CUDA_RETURN(cuda::LaunchGatherRows(x, s.moe_idx.as<int>(), n, H, s.moe_in.as<float>(), stream));
  for (int e = 0; e < E; ++e) {
    if (count[e] == 0) continue;
    const int64_t off = int64_t{offset[e]} * H;
    RETURN_IF_ERROR(RunMlp(d.experts[e], count[e], s.moe_in.as<float>() + off, s.moe_out.as<float>() + off));
  }
  STRATA_CUDA_RETURN(cuda::LaunchScatterRows(s.moe_out.as<float>(), s.moe_idx.as<int>() + n, n, H,
                                             s.expert_out.as<float>(), stream));
  STRATA_CUDA_RETURN(cuda::LaunchMoeCombine(s.expert_out.as<float>(), s.moe_w.as<float>(), shared, rows, K, H, out,
                                            stream));
  return absl::OkStatus();
}

absl::Status GpuEngine::Impl::RunLayers(const GpuStep& st) {
  const int rows = st.rows, H = c.hidden_size;
  RETURN_IF_ERROR(Reserve<float>(s.xn, int64_t{rows} * H));
  RETURN_IF_ERROR(Reserve<float>(s.delta, int64_t{rows} * H));
  float* hidden = s.hidden.as<float>();
  float* xn = s.xn.as<float>();
  float* delta = s.delta.as<float>();
  const int nl = num_local_layers();
  if (opt.profile_layers) {
    profile.assign(nl, GpuLayerProfile{});
    while (static_cast<int>(events.size()) < nl + 1) {
      cudaEvent_t e;
      STRATA_CUDA_RETURN(cudaEventCreate(&e));
      events.push_back(e);
    }
    STRATA_CUDA_RETURN(cudaEventRecord(events[0], stream));
  }
  for (int l = 0; l < nl; ++l) {
    const int g = opt.layer_begin + l;
    const gpu::DLayer& d = w->layers[l];
    STRATA_CUDA_RETURN(cuda::LaunchRmsNorm(hidden, d.input_norm.as<float>(), rows, H, H, c.rms_norm_eps, xn, stream));
    RETURN_IF_ERROR(Attention(st, g, l, xn, delta));
    STRATA_CUDA_RETURN(cuda::LaunchAdd(hidden, delta, int64_t{rows} * H, stream));
    STRATA_CUDA_RETURN(cuda::LaunchRmsNorm(hidden, d.post_norm.as<float>(), rows, H, H, c.rms_norm_eps, xn, stream));
    RETURN_IF_ERROR(Mlp(st, g, l, xn, delta));
    STRATA_CUDA_RETURN(cuda::LaunchAdd(hidden, delta, int64_t{rows} * H, stream));
    if (opt.profile_layers) STRATA_CUDA_RETURN(cudaEventRecord(events[l + 1], stream));
  }
  if (opt.profile_layers) {
    STRATA_CUDA_RETURN(cudaEventSynchronize(events[nl]));
    for (int l = 0; l < nl; ++l) {
      STRATA_CUDA_RETURN(cudaEventElapsedTime(&profile[l].ms, events[l], events[l + 1]));
    }
  }
  return absl::OkStatus();
}

absl::Status GpuEngine::Impl::Logits(const int* rows_dev, int n, float* logits) {
  const int H = c.hidden_size;
  RETURN_IF_ERROR(Reserve<float>(s.last_rows, int64_t{n} * H));
  float* x = s.last_rows.as<float>();
  if (rows_dev != nullptr) {
    STRATA_CUDA_RETURN(cuda::LaunchGatherRows(s.hidden.as<float>(), rows_dev, n, H, x, stream));
  } else {
    STRATA_CUDA_RETURN(cudaMemcpyAsync(x, s.hidden.get(), int64_t{n} * H * sizeof(float), cudaMemcpyDeviceToDevice,
                                       stream));
  }
  STRATA_CUDA_RETURN(cuda::LaunchRmsNorm(x, w->final_norm.as<float>(), n, H, H, c.rms_norm_eps, x, stream));
  return Linear(x, n, w->lm_head, logits);
}

}  // namespace strata
