// Dense MLP and mixture-of-experts layers (sigmoid router, selection-only
// bias, group-limited top-k, normalised weights, routed scaling, shared
// experts). See docs/model-math.md.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/cpu/ops.h"
#include "model/layer_ops.h"

namespace strata::internal {
namespace {

// out[rows, hidden] = down(silu(gate(x)) * up(x))
void RunMlp(const MlpWeights& m, int rows, const float* x, float* out, ThreadPool* pool) {
  const int inter = m.gate.out;
  std::vector<float> g(static_cast<size_t>(rows) * inter), u(g.size());
  cpu::Linear(x, rows, m.gate.w.data(), nullptr, m.gate.in, inter, g.data(), pool);
  cpu::Linear(x, rows, m.up.w.data(), nullptr, m.up.in, inter, u.data(), pool);
  for (size_t i = 0; i < g.size(); ++i) g[i] = cpu::Silu(g[i]) * u[i];
  cpu::Linear(g.data(), rows, m.down.w.data(), nullptr, inter, m.down.out, out, pool);
}

struct Route {
  std::vector<int> experts;     // ascending expert ids
  std::vector<float> weights;   // same order
};

Route RouteToken(const ModelConfig& c, const float* logits, const float* bias) {
  const int E = c.n_routed_experts;
  const int per_group = E / c.n_group;
  std::vector<float> s(E), choice(E);
  for (int e = 0; e < E; ++e) {
    s[e] = cpu::Sigmoid(logits[e]);
    choice[e] = s[e] + bias[e];
  }
  // Group score: sum of the two largest choice scores in the group.
  std::vector<float> gscore(c.n_group);
  for (int g = 0; g < c.n_group; ++g) {
    float a = -INFINITY, b = -INFINITY;
    for (int e = g * per_group; e < (g + 1) * per_group; ++e) {
      const float v = choice[e];
      if (v > a) {
        b = a;
        a = v;
      } else if (v > b) {
        b = v;
      }
    }
    gscore[g] = a + b;
  }
  std::vector<int> gorder(c.n_group);
  std::iota(gorder.begin(), gorder.end(), 0);
  std::stable_sort(gorder.begin(), gorder.end(), [&](int x, int y) { return gscore[x] > gscore[y]; });
  std::vector<char> group_on(c.n_group, 0);
  for (int i = 0; i < c.topk_group; ++i) group_on[gorder[i]] = 1;
  std::vector<int> cand;
  for (int e = 0; e < E; ++e) {
    if (group_on[e / per_group]) cand.push_back(e);
  }
  std::stable_sort(cand.begin(), cand.end(), [&](int x, int y) { return choice[x] > choice[y]; });
  Route r;
  r.experts.assign(cand.begin(), cand.begin() + c.num_experts_per_tok);
  std::sort(r.experts.begin(), r.experts.end());
  float sum = 0;
  for (int e : r.experts) {
    r.weights.push_back(s[e]);
    sum += s[e];
  }
  const float scale = static_cast<float>(c.routed_scaling_factor);
  for (float& wgt : r.weights) {
    if (c.norm_topk_prob) wgt /= (sum + 1e-20f);
    wgt *= scale;
  }
  return r;
}

}  // namespace

void MlpLayer(const ModelConfig& c, const LayerWeights& w, bool moe, int rows, const float* x,
              float* out, ThreadPool* pool) {
  const int H = c.hidden_size;
  if (!moe) {
    RunMlp(w.dense, rows, x, out, pool);
    return;
  }
  const int E = c.n_routed_experts;
  std::vector<float> logits(static_cast<size_t>(rows) * E);
  cpu::Linear(x, rows, w.router.w.data(), nullptr, H, E, logits.data(), pool);
  std::vector<Route> routes(rows);
  for (int r = 0; r < rows; ++r) routes[r] = RouteToken(c, &logits[static_cast<size_t>(r) * E], w.router_bias.data());

  // Per expert, the (row, slot) pairs that chose it; each expert's rows run
  // as one batch (per-row results are batch-invariant).
  const int K = c.num_experts_per_tok;
  std::vector<std::vector<std::pair<int, int>>> users(E);
  for (int r = 0; r < rows; ++r) {
    for (int k = 0; k < K; ++k) users[routes[r].experts[k]].push_back({r, k});
  }
  std::vector<float> expert_out(static_cast<size_t>(rows) * K * H);
  std::vector<float> xin, yout;
  for (int e = 0; e < E; ++e) {
    const auto& us = users[e];
    if (us.empty()) continue;
    const int n = static_cast<int>(us.size());
    xin.resize(static_cast<size_t>(n) * H);
    yout.resize(static_cast<size_t>(n) * H);
    for (int i = 0; i < n; ++i) {
      std::copy_n(x + static_cast<size_t>(us[i].first) * H, H, xin.data() + static_cast<size_t>(i) * H);
    }
    RunMlp(w.experts[e], n, xin.data(), yout.data(), pool);
    for (int i = 0; i < n; ++i) {
      std::copy_n(yout.data() + static_cast<size_t>(i) * H, H,
                  expert_out.data() + (static_cast<size_t>(us[i].first) * K + us[i].second) * H);
    }
  }
  std::vector<float> shared;
  if (c.n_shared_experts > 0) {
    shared.resize(static_cast<size_t>(rows) * H);
    RunMlp(w.shared, rows, x, shared.data(), pool);
  }
  // Sum in ascending expert order, then the shared experts.
  for (int r = 0; r < rows; ++r) {
    float* o = out + static_cast<size_t>(r) * H;
    std::fill(o, o + H, 0.0f);
    for (int k = 0; k < K; ++k) {
      const float* y = expert_out.data() + (static_cast<size_t>(r) * K + k) * H;
      const float wgt = routes[r].weights[k];
      for (int i = 0; i < H; ++i) o[i] += y[i] * wgt;
    }
    if (!shared.empty()) {
      const float* s = shared.data() + static_cast<size_t>(r) * H;
      for (int i = 0; i < H; ++i) o[i] += s[i];
    }
  }
}

}  // namespace strata::internal
