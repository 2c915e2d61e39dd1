// Multi-head latent attention in the absorbed form, over the sequence's KV
// cache, with the DSA lightning indexer. Prefill chunks and single decode
// tokens go through the same per-row code, so both give the same bits.
// See docs/model-math.md for the formulas.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/cpu/ops.h"
#include "model/layer_ops.h"

namespace strata::internal {

namespace {
constexpr double kLatentNormEps = 1e-6;  // q_a_layernorm, kv_a_layernorm
constexpr double kIndexerNormEps = 1e-6;  // indexer k_norm (LayerNorm)
}  // namespace

Rope::Rope(const ModelConfig& c)
    : inv_freq_(RopeInvFreq(c.rope, c.qk_rope_head_dim)),
      attention_factor_(static_cast<float>(c.rope.attention_factor)) {}

void Rope::Apply(float* x, int dim, int64_t pos, bool interleave) const {
  const int half = dim / 2;
  const float p = static_cast<float>(pos);
  for (int i = 0; i < half; ++i) {
    const float angle = inv_freq_[i] * p;
    const float cs = static_cast<float>(std::cos(static_cast<double>(angle))) * attention_factor_;
    const float sn = static_cast<float>(std::sin(static_cast<double>(angle))) * attention_factor_;
    float* a = interleave ? &x[2 * i] : &x[i];
    float* b = interleave ? &x[2 * i + 1] : &x[i + half];
    const float x0 = *a, x1 = *b;
    *a = x0 * cs - x1 * sn;
    *b = x1 * cs + x0 * sn;
  }
}

std::vector<int32_t> TopKPositions(const float* scores, int n, int k) {
  std::vector<int32_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  if (k >= n) return idx;
  auto key = [&](int32_t i) { return std::isnan(scores[i]) ? -INFINITY : scores[i]; };
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
    const float ka = key(a), kb = key(b);
    return ka > kb || (ka == kb && a < b);
  });
  idx.resize(k);
  std::sort(idx.begin(), idx.end());
  return idx;
}

namespace {

// The indexer's selection for every row of the batch.
void RunIndexer(const ModelConfig& c, const IndexerWeights& w, int local_layer, const Rope& rope,
                absl::Span<const ChunkRows> chunks, int rows, const float* x, const float* q_latent,
                Selections* sel, ThreadPool* pool) {
  const int IH = c.index_n_heads, ID = c.index_head_dim, R = c.qk_rope_head_dim, H = c.hidden_size;
  std::vector<float> q(static_cast<size_t>(rows) * IH * ID), k(static_cast<size_t>(rows) * ID),
      hw(static_cast<size_t>(rows) * IH);
  cpu::Linear(q_latent, rows, w.wq_b.w.data(), nullptr, c.q_lora_rank, IH * ID, q.data(), pool);
  cpu::Linear(x, rows, w.wk.w.data(), nullptr, H, ID, k.data(), pool);
  cpu::Linear(x, rows, w.weights_proj.w.data(), nullptr, H, IH, hw.data(), pool);
  const float head_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(IH)));
  for (auto& v : hw) v *= head_scale;
  for (const ChunkRows& ch : chunks) {
    for (int i = 0; i < ch.n; ++i) {
      const int row = ch.row_begin + i;
      const int64_t pos = ch.pos_begin + i;
      float* kr = &k[static_cast<size_t>(row) * ID];
      cpu::LayerNorm(kr, w.k_norm_w.data(), w.k_norm_b.data(), ID, kIndexerNormEps, kr);
      rope.Apply(kr, R, pos, c.indexer_rope_interleave);
      for (int h = 0; h < IH; ++h) {
        rope.Apply(&q[(static_cast<size_t>(row) * IH + h) * ID], R, pos, c.indexer_rope_interleave);
      }
      ch.kv->AppendIndexKey(local_layer, kr);
    }
  }
  const float score_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(ID)));
  // Row -> chunk lookup.
  std::vector<const ChunkRows*> owner(rows);
  for (const ChunkRows& ch : chunks) {
    for (int i = 0; i < ch.n; ++i) owner[ch.row_begin + i] = &ch;
  }
  pool->ParallelFor(rows, 1, [&](int64_t r0, int64_t r1) {
    std::vector<float> scores;
    for (int64_t row = r0; row < r1; ++row) {
      const ChunkRows& ch = *owner[row];
      const int pos = ch.pos_begin + static_cast<int>(row - ch.row_begin);
      const int n = pos + 1;
      const float* keys = ch.kv->layer(local_layer).index_k.data();
      scores.assign(n, 0.0f);
      for (int t = 0; t < n; ++t) {
        float s = 0;
        for (int h = 0; h < IH; ++h) {
          const float d = cpu::Dot(&q[(static_cast<size_t>(row) * IH + h) * ID], keys + static_cast<size_t>(t) * ID, ID) * score_scale;
          s += hw[static_cast<size_t>(row) * IH + h] * std::max(d, 0.0f);
        }
        scores[t] = s;
      }
      (*sel)[row] = TopKPositions(scores.data(), n, c.index_topk);
    }
  });
}

}  // namespace

void AttentionLayer(const ModelConfig& c, const LayerWeights& w, int global_layer, int local_layer,
                    const Rope& rope, absl::Span<const ChunkRows> chunks, int rows, const float* x,
                    float* out, Selections* selections, ThreadPool* pool) {
  const int H = c.hidden_size, NH = c.num_heads, NOPE = c.qk_nope_head_dim, R = c.qk_rope_head_dim,
            QK = c.qk_head_dim(), V = c.v_head_dim, L = c.kv_lora_rank;
  // Queries.
  std::vector<float> q(static_cast<size_t>(rows) * NH * QK), q_latent;
  if (c.q_lora_rank == 0) {
    cpu::Linear(x, rows, w.q_proj.w.data(), nullptr, H, NH * QK, q.data(), pool);
  } else {
    q_latent.resize(static_cast<size_t>(rows) * c.q_lora_rank);
    cpu::Linear(x, rows, w.q_a.w.data(), w.q_a.bias(), H, c.q_lora_rank, q_latent.data(), pool);
    for (int r = 0; r < rows; ++r) {
      float* ql = &q_latent[static_cast<size_t>(r) * c.q_lora_rank];
      cpu::RmsNorm(ql, w.q_a_norm.data(), c.q_lora_rank, kLatentNormEps, ql);
    }
    cpu::Linear(q_latent.data(), rows, w.q_b.w.data(), nullptr, c.q_lora_rank, NH * QK, q.data(), pool);
  }
  // Latent rows: c = RMSNorm(first kv_lora), r = rope(last qk_rope).
  std::vector<float> kv(static_cast<size_t>(rows) * (L + R));
  cpu::Linear(x, rows, w.kv_a.w.data(), w.kv_a.bias(), H, L + R, kv.data(), pool);
  for (const ChunkRows& ch : chunks) {
    for (int i = 0; i < ch.n; ++i) {
      const int row = ch.row_begin + i;
      const int64_t pos = ch.pos_begin + i;
      float* cr = &kv[static_cast<size_t>(row) * (L + R)];
      cpu::RmsNorm(cr, w.kv_a_norm.data(), L, kLatentNormEps, cr);
      rope.Apply(cr + L, R, pos, c.rope_interleave);
      for (int h = 0; h < NH; ++h) {
        rope.Apply(&q[(static_cast<size_t>(row) * NH + h) * QK + NOPE], R, pos, c.rope_interleave);
      }
      ch.kv->AppendRow(local_layer, cr, cr + L);
    }
  }
  // Which rows each query reads.
  const IndexerMode mode = c.layers[global_layer].indexer;
  if (mode == IndexerMode::kFull) {
    RunIndexer(c, w.indexer, local_layer, rope, chunks, rows, x, q_latent.data(), selections, pool);
  }
  const bool sparse = mode != IndexerMode::kNone;

  std::vector<const ChunkRows*> owner(rows);
  for (const ChunkRows& ch : chunks) {
    for (int i = 0; i < ch.n; ++i) owner[ch.row_begin + i] = &ch;
  }
  const float scale = static_cast<float>(c.softmax_scale);
  std::vector<float> ctx(static_cast<size_t>(rows) * NH * V);
  const float* kvb = w.kv_b.w.data();  // [NH * (NOPE + V), L]
  pool->ParallelFor(static_cast<int64_t>(rows) * NH, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> q_abs(L), o_lat(L), p;
    std::vector<int32_t> dense;
    for (int64_t task = t0; task < t1; ++task) {
      const int row = static_cast<int>(task / NH), h = static_cast<int>(task % NH);
      const ChunkRows& ch = *owner[row];
      const int pos = ch.pos_begin + (row - ch.row_begin);
      const LayerKv& lk = ch.kv->layer(local_layer);
      const std::vector<int32_t>* rows_read;
      if (sparse) {
        rows_read = &(*selections)[row];
      } else {
        dense.resize(pos + 1);
        std::iota(dense.begin(), dense.end(), 0);
        rows_read = &dense;
      }
      const float* qh = &q[(static_cast<size_t>(row) * NH + h) * QK];
      const float* wuk = kvb + static_cast<size_t>(h) * (NOPE + V) * L;
      const float* wuv = wuk + static_cast<size_t>(NOPE) * L;
      // q_abs = W_UK[h]^T q_nope
      std::fill(q_abs.begin(), q_abs.end(), 0.0f);
      for (int i = 0; i < NOPE; ++i) cpu::Axpy(qh[i], wuk + static_cast<size_t>(i) * L, q_abs.data(), L);
      const int n = static_cast<int>(rows_read->size());
      p.resize(n);
      float m = -INFINITY;
      for (int j = 0; j < n; ++j) {
        const int t = (*rows_read)[j];
        const float s = (cpu::Dot(q_abs.data(), &lk.c[static_cast<size_t>(t) * L], L) +
                         cpu::Dot(qh + NOPE, &lk.r[static_cast<size_t>(t) * R], R)) * scale;
        p[j] = s;
        m = std::max(m, s);
      }
      float sum = 0;
      for (int j = 0; j < n; ++j) {
        p[j] = std::exp(p[j] - m);
        sum += p[j];
      }
      std::fill(o_lat.begin(), o_lat.end(), 0.0f);
      for (int j = 0; j < n; ++j) {
        cpu::Axpy(p[j] / sum, &lk.c[static_cast<size_t>((*rows_read)[j]) * L], o_lat.data(), L);
      }
      float* o = &ctx[(static_cast<size_t>(row) * NH + h) * V];
      for (int v = 0; v < V; ++v) o[v] = cpu::Dot(wuv + static_cast<size_t>(v) * L, o_lat.data(), L);
    }
  });
  cpu::Linear(ctx.data(), rows, w.o.w.data(), w.o.bias(), NH * V, H, out, pool);
}

}  // namespace strata::internal
