// RoPE tables and the gated pooling compressors of CSA / HCA layers and of
// the CSA lightning indexer (docs/deepseek-v4.md §3.2, §3.5, §3.6).
#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/cpu/ops.h"
#include "model/v4/layers.h"

namespace strata::v4::internal {

RopeTable::RopeTable(const RopeConfig& rope, int rope_dim)
    : rope_dim_(rope_dim), inv_freq_(RopeInvFreq(rope, rope_dim)),
      attention_factor_(static_cast<float>(rope.attention_factor)) {}

void RopeTable::Apply(float* x, int n, int64_t pos, bool inverse) const {
  float* r = x + (n - rope_dim_);
  const float p = static_cast<float>(pos);
  for (int i = 0; i < rope_dim_ / 2; ++i) {
    const float angle = p * inv_freq_[i];
    const float cs = static_cast<float>(std::cos(static_cast<double>(angle))) * attention_factor_;
    float sn = static_cast<float>(std::sin(static_cast<double>(angle))) * attention_factor_;
    if (inverse) sn = -sn;
    const float x0 = r[2 * i], x1 = r[2 * i + 1];
    r[2 * i] = x0 * cs - x1 * sn;
    r[2 * i + 1] = x1 * cs + x0 * sn;
  }
}

std::vector<int32_t> StableTopK(const float* scores, int n, int k) {
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

void CompressorPush(const CompressorWeights& w, const RopeTable& rope, double eps, const float* kv,
                    const float* gate, CompressorState* s) {
  const int width = s->width, coff = s->coff, m = s->rate, cw = coff * width;
  s->open_kv.insert(s->open_kv.end(), kv, kv + cw);
  s->open_gate.insert(s->open_gate.end(), gate, gate + cw);
  if (s->open_tokens() < m) return;

  // The block is closed: pool its m tokens (and, for CSA, the previous
  // block's Ca halves) channel by channel. Slot order: the previous block's
  // Ca tokens, then this block's own part (Cb for CSA).
  const bool has_prev = coff == 2 && !s->overlap_kv.empty();
  const int own = coff == 2 ? width : 0;  // offset of the part that pools into this block
  const float* bias = w.position_bias.data();
  std::vector<float> pooled(width), z(2 * m), v(2 * m);
  for (int e = 0; e < width; ++e) {
    int n = 0;
    if (has_prev) {
      for (int j = 0; j < m; ++j, ++n) {
        // The same f32 sum the block's own tokens get: stored raw, so that
        // the state is the tokens' projections alone (docs/deepseek-v4.md §4.4).
        z[n] = s->overlap_gate[static_cast<size_t>(j) * width + e] + bias[static_cast<size_t>(j) * cw + e];
        v[n] = s->overlap_kv[static_cast<size_t>(j) * width + e];
      }
    }
    for (int j = 0; j < m; ++j, ++n) {
      const size_t at = static_cast<size_t>(j) * cw + own + e;
      z[n] = s->open_gate[at] + bias[at];
      v[n] = s->open_kv[at];
    }
    float mx = -INFINITY;
    for (int i = 0; i < n; ++i) mx = std::max(mx, z[i]);
    float sum = 0;
    for (int i = 0; i < n; ++i) {
      z[i] = std::exp(z[i] - mx);
      sum += z[i];
    }
    float acc = 0;
    for (int i = 0; i < n; ++i) acc += v[i] * (z[i] / sum);
    pooled[e] = acc;
  }
  const int64_t block = s->num_rows();
  cpu::RmsNorm(pooled.data(), w.norm.data(), width, eps, pooled.data());
  rope.Apply(pooled.data(), width, block * m);
  s->rows.insert(s->rows.end(), pooled.begin(), pooled.end());
  if (coff == 2) {
    // Keep this block's Ca halves (raw: the position bias is added when the
    // next block pools them) for the next.
    s->overlap_kv.resize(static_cast<size_t>(m) * width);
    s->overlap_gate.resize(static_cast<size_t>(m) * width);
    for (int j = 0; j < m; ++j) {
      for (int e = 0; e < width; ++e) {
        const size_t at = static_cast<size_t>(j) * cw + e;
        s->overlap_kv[static_cast<size_t>(j) * width + e] = s->open_kv[at];
        s->overlap_gate[static_cast<size_t>(j) * width + e] = s->open_gate[at];
      }
    }
  }
  s->open_kv.clear();
  s->open_gate.clear();
}

}  // namespace strata::v4::internal
