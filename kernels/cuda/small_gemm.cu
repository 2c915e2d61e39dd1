#include "kernels/cuda/small_gemm.h"

#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/device_util.cuh"

namespace strata::cuda {
namespace {

constexpr int kThreads = 256;  // 8 warps
constexpr int kWarps = kThreads / 32;
constexpr int kKnMaxInputs = 4096;  // m * k floats of x staged in shared memory ([k][n] weights)
// Blocks a launch should have at least to keep an H100/H200 (132 SMs) busy:
// two per SM with a warp per weight row(s), four per SM when the block works
// along k (its blocks are short).
constexpr int kWarpRowsMinBlocks = 264, kSplitMinBlocks = 528;

bool Aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// Weight rows j0 .. j0 + kRows - 1 of a [n][k] matrix (the last row repeated
// past n; those outputs are computed and dropped).
template <int kRows>
__device__ __forceinline__ void RowPointers(const __nv_bfloat16* w, int j0, const GemmArgs& a,
                                            const __nv_bfloat16* (&wr)[kRows]) {
#pragma unroll
  for (int r = 0; r < kRows; ++r) wr[r] = w + static_cast<int64_t>(min(j0 + r, a.n - 1)) * a.ldw;
}

// acc[r][i] += the products of columns c .. c + 7 of weight row r and x row i,
// in column order.
template <int kRows, int kM>
__device__ __forceinline__ void AccumulateChunk(const float* x, int64_t ldx, const __nv_bfloat16* const (&wr)[kRows],
                                                int c, float (&acc)[kRows][kM]) {
  float xv[kM][8];
#pragma unroll
  for (int i = 0; i < kM; ++i) dev::Load8(x + i * ldx + c, xv[i]);
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    float wv[8];
    dev::Load8(wr[r] + c, wv);
#pragma unroll
    for (int i = 0; i < kM; ++i) {
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[r][i] = fmaf(wv[e], xv[i][e], acc[r][i]);
    }
  }
}

// A butterfly over the warp: every lane gets the warp's sums.
template <int kRows, int kM>
__device__ __forceinline__ void WarpSums(float (&acc)[kRows][kM]) {
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int i = 0; i < kM; ++i) {
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) acc[r][i] += __shfl_xor_sync(0xffffffffu, acc[r][i], off);
    }
  }
}

// [n][k] weights. Warp w of block x computes outputs (8x + w) * kRows ...
// + kRows - 1 of batch blockIdx.y for the kM rows of x: lane t sums its
// chunks of 8 columns t, t + 32, ... in order, then a butterfly over the warp.
template <int kRows, int kM>
__global__ void __launch_bounds__(kThreads) SmallGemmNkKernel(const GemmArgs a) {
  const int lane = threadIdx.x & 31;
  const int j0 = (blockIdx.x * kWarps + (threadIdx.x >> 5)) * kRows;
  if (j0 >= a.n) return;
  const int64_t b = blockIdx.y;
  const float* x = static_cast<const float*>(a.x) + b * a.stride_x;
  const __nv_bfloat16* w = static_cast<const __nv_bfloat16*>(a.w) + b * a.stride_w;
  const __nv_bfloat16* wr[kRows];
  RowPointers<kRows>(w, j0, a, wr);
  float acc[kRows][kM] = {};
  constexpr int kUnroll = kM <= 2 ? 4 : 2;  // loads in flight; registers bound it
#pragma unroll kUnroll
  for (int c = lane * 8; c < a.k; c += 32 * 8) AccumulateChunk<kRows, kM>(x, a.ldx, wr, c, acc);
  WarpSums<kRows, kM>(acc);
  if (lane != 0) return;
  float* y = a.y + b * a.stride_y;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if (j0 + r >= a.n) break;
#pragma unroll
    for (int i = 0; i < kM; ++i) {
      float& out = y[static_cast<int64_t>(i) * a.ldy + j0 + r];
      out = a.accumulate ? out + acc[r][i] : acc[r][i];
    }
  }
}

// [n][k] weights, few outputs: block x computes outputs kRows x ... kRows x
// + kRows - 1 of batch blockIdx.y with all its threads along k: thread t sums
// its chunks of 8 columns t, t + 256, ... in order, a butterfly sums each
// warp, then the eight warps' sums are added in warp order.
template <int kRows, int kM>
__global__ void __launch_bounds__(kThreads) SmallGemmNkSplitKernel(const GemmArgs a) {
  __shared__ float part[kWarps][kRows][kM];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int j0 = blockIdx.x * kRows;
  const int64_t b = blockIdx.y;
  const float* x = static_cast<const float*>(a.x) + b * a.stride_x;
  const __nv_bfloat16* w = static_cast<const __nv_bfloat16*>(a.w) + b * a.stride_w;
  const __nv_bfloat16* wr[kRows];
  RowPointers<kRows>(w, j0, a, wr);
  float acc[kRows][kM] = {};
#pragma unroll 2
  for (int c = threadIdx.x * 8; c < a.k; c += kThreads * 8) AccumulateChunk<kRows, kM>(x, a.ldx, wr, c, acc);
  WarpSums<kRows, kM>(acc);
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
#pragma unroll
      for (int i = 0; i < kM; ++i) part[warp][r][i] = acc[r][i];
    }
  }
  __syncthreads();
  if (threadIdx.x >= kRows * kM) return;
  const int r = threadIdx.x / kM, i = threadIdx.x % kM;
  if (j0 + r >= a.n) return;
  float sum = part[0][r][i];
#pragma unroll
  for (int v = 1; v < kWarps; ++v) sum += part[v][r][i];
  float& out = a.y[b * a.stride_y + static_cast<int64_t>(i) * a.ldy + j0 + r];
  out = a.accumulate ? out + sum : sum;
}

// [k][n] weights: thread t of block x computes outputs j .. j + 7, j =
// 512x + 8 (t % 64), over the rows l = t / 64, t / 64 + 4, ... of W in order
// (16-byte loads); the four slices are then added in slice order. The kM
// rows of x are staged in shared memory.
constexpr int kKnSlices = kThreads / 64;
template <int kM>
__global__ void __launch_bounds__(kThreads) SmallGemmKnKernel(const GemmArgs a) {
  extern __shared__ float xs[];  // [kM][k]
  __shared__ float part[kKnSlices - 1][kM][512];
  const int64_t b = blockIdx.y;
  const float* x = static_cast<const float*>(a.x) + b * a.stride_x;
  for (int e = threadIdx.x; e < kM * a.k; e += kThreads) xs[e] = x[static_cast<int64_t>(e / a.k) * a.ldx + e % a.k];
  __syncthreads();
  const int col = 8 * (threadIdx.x % 64), slice = threadIdx.x / 64;
  const int j = 512 * blockIdx.x + col;
  float acc[kM][8] = {};
  if (j < a.n) {
    const __nv_bfloat16* w = static_cast<const __nv_bfloat16*>(a.w) + b * a.stride_w + j;
#pragma unroll 4
    for (int l = slice; l < a.k; l += kKnSlices) {
      float wv[8];
      dev::Load8(w + static_cast<int64_t>(l) * a.ldw, wv);
#pragma unroll
      for (int i = 0; i < kM; ++i) {
        const float xv = xs[i * a.k + l];
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[i][e] = fmaf(wv[e], xv, acc[i][e]);
      }
    }
  }
  if (slice > 0) {
#pragma unroll
    for (int i = 0; i < kM; ++i) {
#pragma unroll
      for (int e = 0; e < 8; ++e) part[slice - 1][i][col + e] = acc[i][e];
    }
  }
  __syncthreads();
  if (slice > 0 || j >= a.n) return;
  float* y = a.y + b * a.stride_y + j;
#pragma unroll
  for (int i = 0; i < kM; ++i) {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      float sum = acc[i][e];
#pragma unroll
      for (int v = 0; v < kKnSlices - 1; ++v) sum += part[v][i][col + e];
      float& out = y[static_cast<int64_t>(i) * a.ldy + e];
      out = a.accumulate ? out + sum : sum;
    }
  }
}

// Calls launch(std::integral_constant<int, m>) for m = 1 .. 4: the kernels
// are instantiated per row count.
template <typename Launch>
cudaError_t ForRowCount(int m, Launch&& launch) {
  switch (m) {
    case 1: launch(std::integral_constant<int, 1>()); break;
    case 2: launch(std::integral_constant<int, 2>()); break;
    case 3: launch(std::integral_constant<int, 3>()); break;
    default: launch(std::integral_constant<int, 4>()); break;
  }
  return cudaGetLastError();
}

template <int kRows>
cudaError_t LaunchNk(const GemmArgs& a, cudaStream_t stream) {
  const dim3 grid((a.n + kRows * kWarps - 1) / (kRows * kWarps), a.batch);
  return ForRowCount(a.m, [&](auto m) { SmallGemmNkKernel<kRows, decltype(m)::value><<<grid, kThreads, 0, stream>>>(a); });
}

template <int kRows>
cudaError_t LaunchNkSplit(const GemmArgs& a, cudaStream_t stream) {
  const dim3 grid((a.n + kRows - 1) / kRows, a.batch);
  return ForRowCount(a.m,
                     [&](auto m) { SmallGemmNkSplitKernel<kRows, decltype(m)::value><<<grid, kThreads, 0, stream>>>(a); });
}

}  // namespace

bool SmallGemmSupports(const GemmArgs& a) {
  if (a.type != GemmType::kBF16 || a.m < 1 || a.m > kSmallGemmMaxRows || a.n < 1 || a.k < 1 || a.batch < 1 ||
      a.batch > 65535 || a.x == nullptr || a.w == nullptr || a.y == nullptr) {
    return false;
  }
  if (a.w_is_kn) {
    return a.n % 8 == 0 && a.ldw % 8 == 0 && a.stride_w % 8 == 0 && Aligned(a.w, 16) &&
           int64_t{a.m} * a.k <= kKnMaxInputs;
  }
  return a.k % 8 == 0 && a.ldw % 8 == 0 && a.ldx % 8 == 0 && a.stride_w % 8 == 0 && a.stride_x % 8 == 0 &&
         Aligned(a.w, 16) && Aligned(a.x, 16);
}

cudaError_t LaunchSmallGemm(const GemmArgs& a, cudaStream_t stream) {
  if (!SmallGemmSupports(a)) return cudaErrorInvalidValue;
  if (a.w_is_kn) {
    const dim3 grid((a.n + 511) / 512, a.batch);
    const size_t smem = static_cast<size_t>(a.m) * a.k * sizeof(float);
    return ForRowCount(a.m, [&](auto m) { SmallGemmKnKernel<decltype(m)::value><<<grid, kThreads, smem, stream>>>(a); });
  }
  // Many outputs: a warp per two or four weight rows (they share each load
  // of x). Fewer: a block per one to four rows, its threads along k, so
  // that enough loads are in flight. The choice depends on the shape, never
  // on m.
  const int64_t outputs = int64_t{a.n} * a.batch;
  if (outputs >= 4 * kWarps * kWarpRowsMinBlocks) return LaunchNk<4>(a, stream);
  if (outputs >= 2 * kWarps * kWarpRowsMinBlocks) return LaunchNk<2>(a, stream);
  if (outputs >= 4 * kSplitMinBlocks) return LaunchNkSplit<4>(a, stream);
  if (outputs >= 2 * kSplitMinBlocks) return LaunchNkSplit<2>(a, stream);
  return LaunchNkSplit<1>(a, stream);
}

}  // namespace strata::cuda
