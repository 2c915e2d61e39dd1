// Linear-layer GEMMs on the device through cuBLASLt (docs/gpu-kernels.md
// "GEMMs").
//
//   y[b][i][j] = sum_l x[b][i][l] * W[b](j, l)      i < m, j < n, l < k
//
// (or y += that sum when GemmArgs::accumulate)
// with x, y row-major ([m][k], [m][n], leading dimensions ldx, ldy) and W
// either [n][k] row-major (a Linear weight, W(j,l) = w[j*ldw + l]) or [k][n]
// (W(j,l) = w[l*ldw + j]); b < batch with element strides between batches.
// Operands are f32 (the engine's f32 test mode, full f32 arithmetic: no
// TF32) or bf16; accumulation and y are f32.
//
// Algorithms: by default cuBLASLt's heuristic picks one per shape and row
// class (m up to 16, then powers of two: a prefill chunk or an expert's rows
// take a new m almost every step, and a heuristic query costs more than a
// small GEMM); the exact m is queried only if cuBLASLt refuses the class's
// algorithm for it.
//
// Batch invariance: the the algorithm for m >= 32 rounds differently from the one for
// m = 1 (bench/RESULTS.md). With batch_invariant, every m uses the algorithm
// the heuristic picks for m = 1, so a row's bits never depend on how many
// rows share the call. When the heuristic offers nothing (unusual strides
// or alignment) a plain CUDA kernel computes the product in the same
// per-row order for every m.
//
// Thread-compatible: one GemmRunner per stream.
#ifndef STRATA_KERNELS_CUDA_GEMM_H_
#define STRATA_KERNELS_CUDA_GEMM_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/layer_ops.h"

namespace strata::cuda {

class GemmRunner {
 public:
  static absl::StatusOr<std::unique_ptr<GemmRunner>> Create(bool batch_invariant);
  ~GemmRunner();
  GemmRunner(const GemmRunner&) = delete;
  GemmRunner& operator=(const GemmRunner&) = delete;

  // Enqueues y = x W^T on `stream`. Errors: INVALID_ARGUMENT for bad
  // shapes, INTERNAL for a cuBLASLt or launch failure.
  absl::Status Run(const GemmArgs& a, cudaStream_t stream);

  // Calls that fell back to the plain kernel (no cuBLASLt algorithm).
  int64_t fallback_calls() const { return fallback_calls_; }
  // cuBLASLt heuristic queries so far (one per shape and row class).
  int64_t heuristic_queries() const;

 private:
  struct Impl;
  explicit GemmRunner(bool batch_invariant);
  bool batch_invariant_;
  std::unique_ptr<Impl> impl_;
  int64_t fallback_calls_ = 0;
};

}  // namespace strata::cuda

#endif  // STRATA_KERNELS_CUDA_GEMM_H_
