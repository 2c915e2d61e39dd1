// DeepSeek-V4 mixture of experts (docs/deepseek-v4.md §3.7): sqrtsoftplus
// scores, hash routing (tid2eid) or top-k with a selection-only correction
// bias, always-normalised weights times routed_scaling_factor, clipped SwiGLU
// experts, one shared expert clipped the same way.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>
#include <vector>

#include "kernels/cpu/ops.h"
#include "model/v4/layers.h"

namespace strata::v4::internal {
namespace {

// sqrt(softplus(z)), softplus with torch's threshold: z for z > 20.
float SqrtSoftplus(float z) {
  const float sp = z > 20.0f ? z : std::log1p(std::exp(z));
  return std::sqrt(sp);
}

// out[rows, H] = down(silu(min(gate(x), L)) · clamp(up(x), −L, L)).
void ClampedSwiGlu(const MlpWeights& m, float limit, int rows, const float* x, float* out, ThreadPool* pool) {
  const int inter = m.gate.out;
  std::vector<float> g(static_cast<size_t>(rows) * inter), u(g.size());
  cpu::Linear(x, rows, m.gate.w.data(), nullptr, m.gate.in, inter, g.data(), pool);
  cpu::Linear(x, rows, m.up.w.data(), nullptr, m.up.in, inter, u.data(), pool);
  for (size_t i = 0; i < g.size(); ++i) {
    g[i] = cpu::Silu(std::min(g[i], limit)) * std::clamp(u[i], -limit, limit);
  }
  cpu::Linear(g.data(), rows, m.down.w.data(), nullptr, inter, m.down.out, out, pool);
}

struct Route {
  std::vector<int> experts;    // K ids, ascending (a hash row may repeat one)
  std::vector<float> weights;  // same order
};

}  // namespace

void MoeLayer(const V4Config& c, const V4LayerWeights& w, int rows, const float* x, const int* tokens,
              float* out, ThreadPool* pool) {
  const int H = c.hidden_size, E = c.n_routed_experts, K = c.num_experts_per_tok;
  const bool hash = !w.tid2eid.empty();
  std::vector<float> logits(static_cast<size_t>(rows) * E);
  cpu::Linear(x, rows, w.router.w.data(), nullptr, H, E, logits.data(), pool);
  std::vector<Route> routes(rows);
  std::vector<float> s(E), choice(E);
  std::vector<int> order(E);
  for (int r = 0; r < rows; ++r) {
    for (int e = 0; e < E; ++e) s[e] = SqrtSoftplus(logits[static_cast<size_t>(r) * E + e]);
    Route& rt = routes[r];
    if (hash) {
      const int32_t* ids = &w.tid2eid[static_cast<size_t>(tokens[r]) * K];
      rt.experts.assign(ids, ids + K);
    } else {
      for (int e = 0; e < E; ++e) choice[e] = s[e] + w.router_bias[e];
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return choice[a] > choice[b]; });
      rt.experts.assign(order.begin(), order.begin() + K);
    }
    std::sort(rt.experts.begin(), rt.experts.end());
    float sum = 0;
    for (int e : rt.experts) sum += s[e];
    const float scale = static_cast<float>(c.routed_scaling_factor);
    for (int e : rt.experts) rt.weights.push_back(s[e] / (sum + 1e-20f) * scale);
  }

  // Each expert's rows run as one batch (per-row results are batch-invariant).
  std::vector<std::vector<std::pair<int, int>>> users(E);
  for (int r = 0; r < rows; ++r) {
    for (int k = 0; k < K; ++k) users[routes[r].experts[k]].push_back({r, k});
  }
  const float limit = static_cast<float>(c.swiglu_limit);
  std::vector<float> expert_out(static_cast<size_t>(rows) * K * H), xin, yout;
  for (int e = 0; e < E; ++e) {
    const auto& us = users[e];
    if (us.empty()) continue;
    const int n = static_cast<int>(us.size());
    xin.resize(static_cast<size_t>(n) * H);
    yout.resize(static_cast<size_t>(n) * H);
    for (int i = 0; i < n; ++i) std::copy_n(x + static_cast<size_t>(us[i].first) * H, H, &xin[static_cast<size_t>(i) * H]);
    ClampedSwiGlu(w.experts[e], limit, n, xin.data(), yout.data(), pool);
    for (int i = 0; i < n; ++i) {
      std::copy_n(&yout[static_cast<size_t>(i) * H], H,
                  &expert_out[(static_cast<size_t>(us[i].first) * K + us[i].second) * H]);
    }
  }
  std::vector<float> shared(static_cast<size_t>(rows) * H);
  ClampedSwiGlu(w.shared, limit, rows, x, shared.data(), pool);
  // Routed experts in ascending id, then the shared expert.
  for (int r = 0; r < rows; ++r) {
    float* o = out + static_cast<size_t>(r) * H;
    std::fill(o, o + H, 0.0f);
    for (int k = 0; k < K; ++k) {
      const float* y = &expert_out[(static_cast<size_t>(r) * K + k) * H];
      const float wgt = routes[r].weights[k];
      for (int i = 0; i < H; ++i) o[i] += y[i] * wgt;
    }
    const float* sh = &shared[static_cast<size_t>(r) * H];
    for (int i = 0; i < H; ++i) o[i] += sh[i];
  }
}

}  // namespace strata::v4::internal
