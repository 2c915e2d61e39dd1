// DeepSeek-V4 attention (docs/deepseek-v4.md §3.4–3.6): the low-rank query,
// one shared K=V head, a per-head sink, the sliding window over the
// sequence's ring, the compressed rows of CSA / HCA layers (CSA through the
// lightning indexer's stable top-k), the inverse RoPE of the output and the
// grouped output projection.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/ops.h"
#include "model/v4/layers.h"

namespace strata::v4::internal {
namespace {

// x / sqrt(mean(x²) + eps), no weight (q_b_norm).
void UnweightedRmsNorm(float* x, int n, double eps) {
  double ss = 0;
  for (int i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv = static_cast<float>(1.0 / std::sqrt(ss / n + eps));
  for (int i = 0; i < n; ++i) x[i] *= inv;
}

// Per batch row: the compressed rows its query reads, ascending.
using Selections = std::vector<std::vector<int32_t>>;

// The lightning indexer's choice for every row of a CSA layer, from the index
// keys already in each sequence's state.
void RunIndexer(const V4Config& c, const V4LayerWeights& w, const RopeTable& rope,
                absl::Span<const SeqRows> seqs, int rows, const float* x, const float* q_latent, int layer,
                Selections* sel, ThreadPool* pool) {
  const int ni = c.index_n_heads, di = c.index_head_dim, m = c.layers[layer].compress_rate;
  std::vector<float> q(static_cast<size_t>(rows) * ni * di), hw(static_cast<size_t>(rows) * ni);
  cpu::Linear(q_latent, rows, w.indexer.q_b.w.data(), nullptr, c.q_lora_rank, ni * di, q.data(), pool);
  cpu::Linear(x, rows, w.indexer.weights_proj.w.data(), nullptr, c.hidden_size, ni, hw.data(), pool);
  const float head_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(ni)));
  const float score_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(di)));
  for (float& v : hw) v *= head_scale;
  std::vector<const SeqRows*> owner(rows);
  for (const SeqRows& s : seqs) {
    for (int i = 0; i < s.n; ++i) owner[s.row_begin + i] = &s;
  }
  pool->ParallelFor(rows, 1, [&](int64_t r0, int64_t r1) {
    std::vector<float> scores;
    for (int64_t r = r0; r < r1; ++r) {
      const SeqRows& s = *owner[r];
      const int64_t t = s.pos_begin + (r - s.row_begin);
      float* qr = &q[static_cast<size_t>(r) * ni * di];
      for (int h = 0; h < ni; ++h) rope.Apply(qr + static_cast<size_t>(h) * di, di, t);
      const CompressorState& keys = s.seq->layer(layer).indexer;
      const int visible = static_cast<int>((t + 1) / m);
      scores.assign(visible, 0.0f);
      for (int blk = 0; blk < visible; ++blk) {
        float acc = 0;
        for (int h = 0; h < ni; ++h) {
          const float dot = cpu::Dot(qr + static_cast<size_t>(h) * di, keys.row(blk), di);
          acc += (std::max(dot, 0.0f) * score_scale) * hw[static_cast<size_t>(r) * ni + h];
        }
        scores[blk] = acc;
      }
      (*sel)[r] = StableTopK(scores.data(), visible, c.index_topk);
    }
  });
}

}  // namespace

void AttentionLayer(const V4Config& c, const V4LayerWeights& w, int layer, const RopeTable& main,
                    const RopeTable& compress, absl::Span<const SeqRows> seqs, int rows, const float* x,
                    float* out, ThreadPool* pool) {
  const V4LayerSpec& spec = c.layers[layer];
  const RopeTable& rope = spec.attention == AttentionKind::kSliding ? main : compress;
  const int H = c.hidden_size, d = c.head_dim, nh = c.num_heads, Q = c.q_lora_rank;
  const double eps = c.rms_norm_eps;
  const size_t R = static_cast<size_t>(rows);

  // Query latent, per-head query, the K=V row.
  std::vector<float> qr(R * Q), q(R * nh * d), kv(R * d);
  cpu::Linear(x, rows, w.q_a.w.data(), nullptr, H, Q, qr.data(), pool);
  for (size_t r = 0; r < R; ++r) cpu::RmsNorm(&qr[r * Q], w.q_norm.data(), Q, eps, &qr[r * Q]);
  cpu::Linear(qr.data(), rows, w.q_b.w.data(), nullptr, Q, nh * d, q.data(), pool);
  cpu::Linear(x, rows, w.kv.w.data(), nullptr, H, d, kv.data(), pool);
  for (const SeqRows& s : seqs) {
    for (int i = 0; i < s.n; ++i) {
      const size_t r = s.row_begin + i;
      const int64_t t = s.pos_begin + i;
      for (int h = 0; h < nh; ++h) {
        float* qh = &q[(r * nh + h) * d];
        UnweightedRmsNorm(qh, d, eps);
        rope.Apply(qh, d, t);
      }
      cpu::RmsNorm(&kv[r * d], w.kv_norm.data(), d, eps, &kv[r * d]);
      rope.Apply(&kv[r * d], d, t);
    }
  }

  // Compressors: advance each sequence token by token (rows close in order).
  Selections sel;
  if (spec.attention != AttentionKind::kSliding) {
    const int cw = c.compressor_width(spec);
    std::vector<float> ckv(R * cw), cg(R * cw);
    cpu::Linear(x, rows, w.compressor.kv.w.data(), nullptr, H, cw, ckv.data(), pool);
    cpu::Linear(x, rows, w.compressor.gate.w.data(), nullptr, H, cw, cg.data(), pool);
    std::vector<float> ikv, ig;
    const int iw = 2 * c.index_head_dim;
    if (spec.attention == AttentionKind::kCsa) {
      ikv.resize(R * iw);
      ig.resize(R * iw);
      cpu::Linear(x, rows, w.indexer.compressor.kv.w.data(), nullptr, H, iw, ikv.data(), pool);
      cpu::Linear(x, rows, w.indexer.compressor.gate.w.data(), nullptr, H, iw, ig.data(), pool);
    }
    for (const SeqRows& s : seqs) {
      V4LayerState& st = s.seq->layer(layer);
      for (int i = 0; i < s.n; ++i) {
        const size_t r = s.row_begin + i;
        CompressorPush(w.compressor, compress, eps, &ckv[r * cw], &cg[r * cw], &st.compressor);
        if (spec.attention == AttentionKind::kCsa) {
          CompressorPush(w.indexer.compressor, compress, eps, &ikv[r * iw], &ig[r * iw], &st.indexer);
        }
      }
    }
    if (spec.attention == AttentionKind::kCsa) {
      sel.resize(R);
      RunIndexer(c, w, compress, seqs, rows, x, qr.data(), layer, &sel, pool);
    }
  }

  // Attention per (row, head): window rows, then compressed rows.
  std::vector<const SeqRows*> owner(R);
  for (const SeqRows& s : seqs) {
    for (int i = 0; i < s.n; ++i) owner[s.row_begin + i] = &s;
  }
  const float scale = static_cast<float>(c.softmax_scale);
  const int W = c.sliding_window, m = spec.compress_rate;
  std::vector<float> attn(R * nh * d);
  pool->ParallelFor(static_cast<int64_t>(R) * nh, 1, [&](int64_t i0, int64_t i1) {
    std::vector<const float*> keys;
    std::vector<float> p;
    for (int64_t i = i0; i < i1; ++i) {
      const size_t r = static_cast<size_t>(i / nh);
      const int h = static_cast<int>(i % nh);
      const SeqRows& s = *owner[r];
      const int64_t t = s.pos_begin + static_cast<int64_t>(r - s.row_begin);
      keys.clear();
      for (int64_t u = std::max<int64_t>(0, t - W + 1); u <= t; ++u) {
        keys.push_back(u >= s.pos_begin ? &kv[(s.row_begin + (u - s.pos_begin)) * d] : s.seq->WindowRow(layer, u));
      }
      if (spec.attention == AttentionKind::kHca) {
        const CompressorState& cs = s.seq->layer(layer).compressor;
        for (int blk = 0; blk < (t + 1) / m; ++blk) keys.push_back(cs.row(blk));
      } else if (spec.attention == AttentionKind::kCsa) {
        const CompressorState& cs = s.seq->layer(layer).compressor;
        for (int32_t blk : sel[r]) keys.push_back(cs.row(blk));
      }
      const float* qh = &q[(r * nh + h) * d];
      const float sink = w.sinks[h];
      p.resize(keys.size());
      float mx = sink;
      for (size_t k = 0; k < keys.size(); ++k) {
        p[k] = cpu::Dot(qh, keys[k], d) * scale;
        mx = std::max(mx, p[k]);
      }
      float sum = std::exp(sink - mx);
      for (size_t k = 0; k < keys.size(); ++k) {
        p[k] = std::exp(p[k] - mx);
        sum += p[k];
      }
      float* o = &attn[(r * nh + h) * d];
      std::fill(o, o + d, 0.0f);
      for (size_t k = 0; k < keys.size(); ++k) cpu::Axpy(p[k] / sum, keys[k], o, d);
      rope.Apply(o, d, t, /*inverse=*/true);
    }
  });

  // The window ring keeps the last W − 1 rows of each sequence.
  for (const SeqRows& s : seqs) {
    V4LayerState& st = s.seq->layer(layer);
    if (st.window_slots == 0) continue;
    const int64_t end = s.pos_begin + s.n;
    for (int64_t u = std::max<int64_t>(s.pos_begin, end - st.window_slots); u < end; ++u) {
      std::copy_n(&kv[(s.row_begin + (u - s.pos_begin)) * d], d,
                  st.window.data() + static_cast<size_t>(u % st.window_slots) * d);
    }
  }

  // Grouped output projection: group g's heads through rows g·R.. of o_a.
  const int G = c.o_groups, OR = c.o_lora_rank, gin = nh * d / G;
  std::vector<float> gx(R * gin), gy(R * OR), y(R * G * OR);
  for (int g = 0; g < G; ++g) {
    for (size_t r = 0; r < R; ++r) std::copy_n(&attn[r * nh * d + static_cast<size_t>(g) * gin], gin, &gx[r * gin]);
    cpu::Linear(gx.data(), rows, w.o_a.w.data() + static_cast<size_t>(g) * OR * gin, nullptr, gin, OR, gy.data(),
                pool);
    for (size_t r = 0; r < R; ++r) std::copy_n(&gy[r * OR], OR, &y[r * G * OR + static_cast<size_t>(g) * OR]);
  }
  cpu::Linear(y.data(), rows, w.o_b.w.data(), nullptr, G * OR, H, out, pool);
}

}  // namespace strata::v4::internal
