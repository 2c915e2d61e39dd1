#include "kernels/cuda/moe_gemv.h"

#include <cuda_bf16.h>

#include <algorithm>

namespace strata::cuda {
namespace {

constexpr int kListThreads = 1024;
constexpr int kThreads = 256;          // 8 warps
constexpr int kOutPerWarp = 4;         // output values (weight rows, or row pairs) per warp
constexpr int kOutPerBlock = kOutPerWarp * kThreads / 32;
constexpr int kGroup = 4;              // entries sharing one pass over the weight rows

// Groups the entries by expert: offsets (exclusive scan of the counts) and the
// list of entries of each expert. The order within an expert does not matter:
// each entry's products do not depend on the entries it is grouped with.
// Entries whose id is out of range are not listed and get y = 0.
__global__ void __launch_bounds__(kListThreads) MoeListKernel(MoeGemvParams p) {
  __shared__ int s_count[1024];
  __shared__ int s_offset[1025];
  const int n = p.rows * p.k, E = p.experts;
  for (int e = threadIdx.x; e < E; e += kListThreads) s_count[e] = 0;
  __syncthreads();
  bool invalid = false;
  for (int i = threadIdx.x; i < n; i += kListThreads) {
    const int e = p.expert_ids[i];
    if (e >= 0 && e < E) {
      atomicAdd(&s_count[e], 1);
    } else {
      invalid = true;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    s_offset[0] = 0;
    int used = 0;
    for (int e = 0; e < E; ++e) {
      s_offset[e + 1] = s_offset[e] + s_count[e];
      if (s_count[e] > 0) p.used[1 + used++] = e;
    }
    p.used[0] = used;
  }
  __syncthreads();
  for (int e = threadIdx.x; e <= E; e += kListThreads) p.offsets[e] = s_offset[e];
  for (int e = threadIdx.x; e < E; e += kListThreads) s_count[e] = 0;  // now fill positions
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += kListThreads) {
    const int e = p.expert_ids[i];
    if (e >= 0 && e < E) p.list[s_offset[e] + atomicAdd(&s_count[e], 1)] = i;
  }
  if (!__syncthreads_or(invalid)) return;
  for (int i = 0; i < n; ++i) {
    const int e = p.expert_ids[i];
    if (e >= 0 && e < E) continue;
    for (int c = threadIdx.x; c < p.hidden; c += kListThreads) p.y[static_cast<int64_t>(i) * p.hidden + c] = 0.0f;
  }
}

// Eight consecutive weights as f32.
__device__ __forceinline__ void Load8(const __nv_bfloat16* w, float (&v)[8]) {
  const uint4 raw = __ldg(reinterpret_cast<const uint4*>(w));
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    v[2 * i] = f.x;
    v[2 * i + 1] = f.y;
  }
}
__device__ __forceinline__ void Load8(const float* w, float (&v)[8]) {
  const float4 a = __ldg(reinterpret_cast<const float4*>(w)), b = __ldg(reinterpret_cast<const float4*>(w) + 1);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
__device__ __forceinline__ void LoadX8(const float* x, float (&v)[8]) {
  const float4 a = *reinterpret_cast<const float4*>(x), b = *(reinterpret_cast<const float4*>(x) + 1);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

// One block per (32 outputs, expert). kGateUp: output j of the inter values
// from weight rows j (gate) and inter + j (up) against the entry's token row
// of x, act = silu(gate) * up. Otherwise: output r of y from row r of down
// against the entry's act. Each lane sums over its chunks of 8 columns (lane,
// lane + 32, ...) in order, then a fixed butterfly over the warp.
template <bool kGateUp, typename W>
__global__ void __launch_bounds__(kThreads) MoeGemvKernel(MoeGemvParams p) {
  if (static_cast<int>(blockIdx.y) >= p.used[0]) return;
  const int e = p.used[1 + blockIdx.y];
  const int begin = p.offsets[e], end = p.offsets[e + 1];
  constexpr int kRows = kGateUp ? 2 : 1;
  const int K = kGateUp ? p.hidden : p.inter;
  const int N = kGateUp ? p.inter : p.hidden;
  const W* wmat = static_cast<const W*>(kGateUp ? p.gate_up[e] : p.down[e]);
  const int lane = threadIdx.x & 31;
  const int o0 = blockIdx.x * kOutPerBlock + (threadIdx.x >> 5) * kOutPerWarp;
  if (o0 >= N) return;
  for (int g = begin; g < end; g += kGroup) {
    const int ne = min(kGroup, end - g);
    int ent[kGroup];
    const float* xr[kGroup];
#pragma unroll
    for (int q = 0; q < kGroup; ++q) {
      ent[q] = p.list[g + min(q, ne - 1)];
      xr[q] = kGateUp ? p.x + static_cast<int64_t>(ent[q] / p.k) * K : p.act + static_cast<int64_t>(ent[q]) * K;
    }
    float acc[kOutPerWarp][kRows][kGroup] = {};
    for (int c = lane * 8; c < K; c += 32 * 8) {
      float xv[kGroup][8];
#pragma unroll
      for (int q = 0; q < kGroup; ++q) LoadX8(xr[q] + c, xv[q]);
#pragma unroll
      for (int o = 0; o < kOutPerWarp; ++o) {
        const int out = min(o0 + o, N - 1);  // (a repeated row past N is computed and dropped)
#pragma unroll
        for (int t = 0; t < kRows; ++t) {
          float wv[8];
          Load8(wmat + (static_cast<int64_t>(t) * N + out) * K + c, wv);
#pragma unroll
          for (int q = 0; q < kGroup; ++q) {
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[o][t][q] = fmaf(wv[i], xv[q][i], acc[o][t][q]);
          }
        }
      }
    }
#pragma unroll
    for (int o = 0; o < kOutPerWarp; ++o) {
#pragma unroll
      for (int t = 0; t < kRows; ++t) {
#pragma unroll
        for (int q = 0; q < kGroup; ++q) {
#pragma unroll
          for (int off = 16; off > 0; off >>= 1)
            acc[o][t][q] += __shfl_xor_sync(0xffffffffu, acc[o][t][q], off);
        }
      }
    }
    if (lane != 0) continue;
#pragma unroll
    for (int o = 0; o < kOutPerWarp; ++o) {
      const int out = o0 + o;
      if (out >= N) break;
#pragma unroll
      for (int q = 0; q < kGroup; ++q) {
        if (q >= ne) break;
        if (kGateUp) {
          const float a = acc[o][0][q];
          p.act[static_cast<int64_t>(ent[q]) * N + out] = a / (1.0f + expf(-a)) * acc[o][kRows - 1][q];
        } else {
          p.y[static_cast<int64_t>(ent[q]) * N + out] = acc[o][0][q];
        }
      }
    }
  }
}

// The grid's y covers the experts that can be used: rows * k at most.
template <typename W>
cudaError_t LaunchProducts(const MoeGemvParams& p, cudaStream_t stream) {
  const int slots = std::min(p.experts, p.rows * p.k);
  MoeGemvKernel<true, W><<<dim3((p.inter + kOutPerBlock - 1) / kOutPerBlock, slots), kThreads, 0, stream>>>(p);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  MoeGemvKernel<false, W><<<dim3((p.hidden + kOutPerBlock - 1) / kOutPerBlock, slots), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchMoeGemv(const MoeGemvParams& p, cudaStream_t stream) {
  if (p.rows <= 0 || p.k <= 0) return cudaSuccess;
  if (p.hidden % 8 != 0 || p.inter % 8 != 0 || p.rows * p.k > kMoeGemvMaxEntries || p.experts <= 0 ||
      p.experts > 1024) {
    return cudaErrorInvalidValue;
  }
  MoeListKernel<<<1, kListThreads, 0, stream>>>(p);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  return p.type == GemmType::kBF16 ? LaunchProducts<__nv_bfloat16>(p, stream) : LaunchProducts<float>(p, stream);
}

}  // namespace strata::cuda
