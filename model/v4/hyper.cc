// Manifold-constrained hyper-connections (docs/deepseek-v4.md §3.3): the
// per-token pre / post / Sinkhorn-projected comb weights of each sub-layer,
// and the final collapse before the norm and lm_head.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/ops.h"
#include "model/v4/layers.h"

namespace strata::v4::internal {
namespace {

// v̂ = v / sqrt(mean(v²) + eps) over the n·H flattened streams of each row.
std::vector<float> NormedStreams(const V4Config& c, int rows, const float* streams) {
  const size_t nH = static_cast<size_t>(c.hc_mult) * c.hidden_size;
  std::vector<float> v(streams, streams + rows * nH);
  for (int r = 0; r < rows; ++r) {
    float* x = &v[r * nH];
    double ss = 0;
    for (size_t i = 0; i < nH; ++i) ss += static_cast<double>(x[i]) * x[i];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(nH) + c.rms_norm_eps));
    for (size_t i = 0; i < nH; ++i) x[i] *= inv;
  }
  return v;
}

// out[H] = Σ_j pre[j] · streams[j].
void Collapse(int n, int H, const float* pre, const float* streams, float* out) {
  for (int i = 0; i < H; ++i) out[i] = 0.0f;
  for (int j = 0; j < n; ++j) cpu::Axpy(pre[j], streams + static_cast<size_t>(j) * H, out, H);
}

}  // namespace

void HyperPre(const V4Config& c, const HyperWeights& w, int rows, const float* streams, float* post, float* comb,
              float* collapsed, ThreadPool* pool) {
  const int n = c.hc_mult, H = c.hidden_size, m = (2 + n) * n;
  const float eps = static_cast<float>(c.hc_eps);
  const std::vector<float> v = NormedStreams(c, rows, streams);
  std::vector<float> z(static_cast<size_t>(rows) * m);
  cpu::Linear(v.data(), rows, w.fn.data(), nullptr, static_cast<int64_t>(n) * H, m, z.data(), pool);
  std::vector<float> pre(n);
  for (int r = 0; r < rows; ++r) {
    const float* zr = &z[static_cast<size_t>(r) * m];
    float* po = post + static_cast<size_t>(r) * n;
    float* cb = comb + static_cast<size_t>(r) * n * n;
    for (int j = 0; j < n; ++j) {
      pre[j] = cpu::Sigmoid(zr[j] * w.scale[0] + w.base[j]) + eps;
      po[j] = 2.0f * cpu::Sigmoid(zr[n + j] * w.scale[1] + w.base[n + j]);
    }
    // comb: row softmax + eps, a column normalisation, then (iters − 1)
    // rounds of row and column normalisation.
    for (int j = 0; j < n; ++j) {
      float* row = cb + j * n;
      float mx = -INFINITY;
      for (int k = 0; k < n; ++k) {
        row[k] = zr[2 * n + j * n + k] * w.scale[2] + w.base[2 * n + j * n + k];
        mx = std::max(mx, row[k]);
      }
      float sum = 0;
      for (int k = 0; k < n; ++k) {
        row[k] = std::exp(row[k] - mx);
        sum += row[k];
      }
      for (int k = 0; k < n; ++k) row[k] = row[k] / sum + eps;
    }
    auto normalise_columns = [&] {
      for (int k = 0; k < n; ++k) {
        float sum = 0;
        for (int j = 0; j < n; ++j) sum += cb[j * n + k];
        for (int j = 0; j < n; ++j) cb[j * n + k] /= (sum + eps);
      }
    };
    normalise_columns();
    for (int it = 1; it < c.hc_sinkhorn_iters; ++it) {
      for (int j = 0; j < n; ++j) {
        float sum = 0;
        for (int k = 0; k < n; ++k) sum += cb[j * n + k];
        for (int k = 0; k < n; ++k) cb[j * n + k] /= (sum + eps);
      }
      normalise_columns();
    }
    Collapse(n, H, pre.data(), streams + static_cast<size_t>(r) * n * H, collapsed + static_cast<size_t>(r) * H);
  }
}

void HyperPost(const V4Config& c, int rows, const float* post, const float* comb, const float* out,
               float* streams) {
  const int n = c.hc_mult, H = c.hidden_size;
  std::vector<float> mixed(static_cast<size_t>(n) * H);
  for (int r = 0; r < rows; ++r) {
    float* x = streams + static_cast<size_t>(r) * n * H;
    const float* cb = comb + static_cast<size_t>(r) * n * n;
    const float* o = out + static_cast<size_t>(r) * H;
    for (int k = 0; k < n; ++k) {
      float* mk = &mixed[static_cast<size_t>(k) * H];
      for (int i = 0; i < H; ++i) mk[i] = 0.0f;
      for (int j = 0; j < n; ++j) cpu::Axpy(cb[j * n + k], x + static_cast<size_t>(j) * H, mk, H);
      const float pk = post[static_cast<size_t>(r) * n + k];
      for (int i = 0; i < H; ++i) mk[i] += pk * o[i];
    }
    std::copy(mixed.begin(), mixed.end(), x);
  }
}

void HyperHead(const V4Config& c, const V4Weights& w, int rows, const float* streams, float* h, ThreadPool* pool) {
  const int n = c.hc_mult, H = c.hidden_size;
  const float eps = static_cast<float>(c.hc_eps);
  const std::vector<float> v = NormedStreams(c, rows, streams);
  std::vector<float> z(static_cast<size_t>(rows) * n), pre(n);
  cpu::Linear(v.data(), rows, w.hc_head_fn.data(), nullptr, static_cast<int64_t>(n) * H, n, z.data(), pool);
  for (int r = 0; r < rows; ++r) {
    for (int j = 0; j < n; ++j) {
      pre[j] = cpu::Sigmoid(z[static_cast<size_t>(r) * n + j] * w.hc_head_scale + w.hc_head_base[j]) + eps;
    }
    Collapse(n, H, pre.data(), streams + static_cast<size_t>(r) * n * H, h + static_cast<size_t>(r) * H);
  }
}

}  // namespace strata::v4::internal
