// Host kernels of the CPU engine: dense products, norms, activations.
//
// Determinism contract: every output element is computed by one thread with
// a fixed reduction order that depends only on the vector length, never on
// the batch size, the thread count or the scheduling. So a row computed
// alone or beside other rows gives the same bits (batch invariance,
// docs/design.md §5.1).
//
// Thread-safety: pure functions; the ThreadPool argument may be shared.
#ifndef STRATA_KERNELS_CPU_OPS_H_
#define STRATA_KERNELS_CPU_OPS_H_

#include <cstdint>

#include "common/thread_pool.h"

namespace strata::cpu {

// Dot product with a fixed blocked summation order.
float Dot(const float* a, const float* b, int64_t n);

// y += alpha * x
void Axpy(float alpha, const float* x, float* y, int64_t n);

// Y[i][o] = sum_k X[i][k] * W[o][k] (+ bias[o]) for i < rows, o < out.
// W is [out, in] row-major (the PyTorch Linear layout); X is [rows, in];
// Y is [rows, out]. `bias` may be null.
void Linear(const float* x, int64_t rows, const float* w, const float* bias, int64_t in,
            int64_t out, float* y, ThreadPool* pool);

// out = x / sqrt(mean(x^2) + eps) * weight, over n elements. out may alias x.
void RmsNorm(const float* x, const float* weight, int64_t n, double eps, float* out);

// out = (x - mean) / sqrt(var + eps) * weight + bias (biased variance).
void LayerNorm(const float* x, const float* weight, const float* bias, int64_t n, double eps,
               float* out);

// x / (1 + exp(-x))
float Silu(float x);

inline float Sigmoid(float x);

}  // namespace strata::cpu

#include <cmath>
inline float strata::cpu::Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

#endif  // STRATA_KERNELS_CPU_OPS_H_
