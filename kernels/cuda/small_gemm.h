// Linear layers of small steps on bf16 weights with f32 inputs: the
// matrix-vector form of a GEMM (docs/gpu-engine.md, "GEMMs").
//
//   y[b][i][j] (+)= sum_l x[b][i][l] * W[b](j, l)      i < m <= kSmallGemmMaxRows
//
// with the GemmArgs layout of gemm.h (x f32 here, W bf16, either [n][k] or
// [k][n]). The inputs are not rounded: each product is a bf16 weight times
// an f32 input, summed in f32. A decode step is bound by reading the
// weights, so the kernels read every weight once per call, 16 bytes per
// load for [n][k] weights, with several loads in flight per thread.
//
// Each output is summed in an order fixed by k alone (for [n][k]: lane t of
// a warp takes the chunks of 8 columns t, t + 32, ..., then a butterfly over
// the warp; for [k][n]: l in order), so a row's bits do not depend on the
// other rows of the call.
#ifndef STRATA_KERNELS_CUDA_SMALL_GEMM_H_
#define STRATA_KERNELS_CUDA_SMALL_GEMM_H_

#include <cuda_runtime_api.h>

#include "kernels/cuda/layer_ops.h"

namespace strata::cuda {

inline constexpr int kSmallGemmMaxRows = 4;

// Whether LaunchSmallGemm takes `a`: bf16 weights, 1 <= m <= 4, and the
// alignment its vector loads need ([n][k]: k, ldw, ldx and the batch strides
// multiples of 8 elements and x, W 16-byte aligned; [k][n]: n and ldw even,
// W 4-byte aligned, m * k <= 8192).
bool SmallGemmSupports(const GemmArgs& a);

// REQUIRES: SmallGemmSupports(a) (else cudaErrorInvalidValue); a.x is f32.
cudaError_t LaunchSmallGemm(const GemmArgs& a, cudaStream_t stream);

}  // namespace strata::cuda

#endif  // STRATA_KERNELS_CUDA_SMALL_GEMM_H_
