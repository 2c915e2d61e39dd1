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
// Each output is summed in an order fixed by the shape alone (for [n][k]
// with many outputs: lane t of a warp takes the chunks of 8 columns t,
// t + 32, ..., then a butterfly over the warp; with few outputs the block's
// 256 threads share the chunks and the warps' sums are added in order; for
// [k][n]: four slices of l in order, added in slice order), so a row's bits
// do not depend on the other rows of the call.
#ifndef STRATA_KERNELS_CUDA_SMALL_GEMM_H_
#define STRATA_KERNELS_CUDA_SMALL_GEMM_H_

#include <cuda_runtime_api.h>

#include "kernels/cuda/layer_ops.h"

namespace strata::cuda {

inline constexpr int kSmallGemmMaxRows = 4;

// Whether LaunchSmallGemm takes `a`: bf16 weights, 1 <= m <= 4, and the
// alignment its vector loads need ([n][k]: k, ldw, ldx and the batch strides
// multiples of 8 elements and x, W 16-byte aligned; [k][n]: n, ldw and the
// W batch stride multiples of 8, W 16-byte aligned, m * k <= 4096).
bool SmallGemmSupports(const GemmArgs& a);

// REQUIRES: SmallGemmSupports(a) (else cudaErrorInvalidValue); a.x is f32.
cudaError_t LaunchSmallGemm(const GemmArgs& a, cudaStream_t stream);

}  // namespace strata::cuda

#endif  // STRATA_KERNELS_CUDA_SMALL_GEMM_H_
