#include "kernels/cpu/ops.h"

#include <algorithm>
#include <cmath>

namespace strata::cpu {

float Dot(const float* a, const float* b, int64_t n) {
  // 16 independent partial sums, combined in a fixed tree: vectorises well
  // and the order depends only on n.
  float acc[16] = {0};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int k = 0; k < 16; ++k) acc[k] += a[i + k] * b[i + k];
  }
  for (int k = 0; i < n; ++i, ++k) acc[k] += a[i] * b[i];
  for (int w = 8; w >= 1; w /= 2) {
    for (int k = 0; k < w; ++k) acc[k] += acc[k + w];
  }
  return acc[0];
}

void Axpy(float alpha, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

void Linear(const float* x, int64_t rows, const float* w, const float* bias, int64_t in,
            int64_t out, float* y, ThreadPool* pool) {
  if (rows <= 0 || out <= 0) return;
  // Split over output features; each task streams its block of W once for
  // all rows (weights dominate the bytes in decode).
  const int64_t grain = std::max<int64_t>(1, (1 << 15) / std::max<int64_t>(in, 1));
  auto body = [&](int64_t o0, int64_t o1) {
    constexpr int64_t kBlock = 16;
    for (int64_t ob = o0; ob < o1; ob += kBlock) {
      const int64_t oe = std::min(o1, ob + kBlock);
      for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * in;
        float* yr = y + r * out;
        for (int64_t o = ob; o < oe; ++o) {
          float v = Dot(xr, w + o * in, in);
          if (bias != nullptr) v += bias[o];
          yr[o] = v;
        }
      }
    }
  };
  if (pool == nullptr) {
    body(0, out);
  } else {
    pool->ParallelFor(out, grain, body);
  }
}

void RmsNorm(const float* x, const float* weight, int64_t n, double eps, float* out) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
  for (int64_t i = 0; i < n; ++i) out[i] = weight[i] * (x[i] * inv);
}

void LayerNorm(const float* x, const float* weight, const float* bias, int64_t n, double eps,
               float* out) {
  double mean = 0;
  for (int64_t i = 0; i < n; ++i) mean += x[i];
  mean /= static_cast<double>(n);
  double var = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = x[i] - mean;
    var += d * d;
  }
  var /= static_cast<double>(n);
  const double inv = 1.0 / std::sqrt(var + eps);
  for (int64_t i = 0; i < n; ++i) {
    out[i] = static_cast<float>((x[i] - mean) * inv) * weight[i] + bias[i];
  }
}

float Silu(float x) { return x / (1.0f + std::exp(-x)); }

}  // namespace strata::cpu
