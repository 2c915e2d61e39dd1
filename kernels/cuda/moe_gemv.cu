#include "kernels/cuda/moe_gemv.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cub/block/block_scan.cuh>
#include <type_traits>

#include "kernels/cuda/device_util.cuh"

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
  {
    // Offsets and the used experts in id order: two block scans, thread e
    // for expert e (E <= 1024).
    using Scan = cub::BlockScan<int, kListThreads>;
    __shared__ typename Scan::TempStorage tmp;
    const int e = threadIdx.x;
    const int cnt = e < E ? s_count[e] : 0;
    int off, pos, used;
    Scan(tmp).ExclusiveSum(cnt, off);
    __syncthreads();
    Scan(tmp).ExclusiveSum(cnt > 0 ? 1 : 0, pos, used);
    if (e < E) s_offset[e] = off;
    if (e == E - 1) s_offset[E] = off + cnt;
    if (cnt > 0) p.used[1 + pos] = e;
    if (e == 0) p.used[0] = used;
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

// Eight consecutive activations (written by an earlier launch) as f32.
__device__ __forceinline__ void LoadX8(const float* x, float (&v)[8]) {
  const float4 a = *reinterpret_cast<const float4*>(x), b = *(reinterpret_cast<const float4*>(x) + 1);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

// Eight fp8 weights: Decode(code) * scale in f32 (NaN codes read as 0).
__device__ __forceinline__ void Load8Fp8(const uint8_t* w, float scale, float (&v)[8]) {
  const uint2 codes = *reinterpret_cast<const uint2*>(w);
  const uint32_t words[2] = {dev::ClearNanCodes(codes.x), dev::ClearNanCodes(codes.y)};
#pragma unroll
  for (int q = 0; q < 2; ++q) {
    const float2 lo = dev::E4m3x2ToFloat2(words[q]), hi = dev::E4m3x2ToFloat2(words[q] >> 16);
    v[4 * q] = __fmul_rn(lo.x, scale), v[4 * q + 1] = __fmul_rn(lo.y, scale);
    v[4 * q + 2] = __fmul_rn(hi.x, scale), v[4 * q + 3] = __fmul_rn(hi.y, scale);
  }
}

// One block per (32 outputs, expert). kGateUp: output j of the inter values
// from weight rows j (gate) and inter + j (up) against the entry's token row
// of x, act = silu(gate) * up. Otherwise: output r of y from row r of down
// against the entry's act. Each lane sums over its chunks of 8 columns (lane,
// lane + 32, ...) in order, then a fixed butterfly over the warp.
// Experts with more than max_count entries are left to the tensor-core
// kernels.
template <bool kGateUp, typename W>
__global__ void __launch_bounds__(kThreads) MoeGemvKernel(MoeGemvParams p, int max_count) {
  if (static_cast<int>(blockIdx.y) >= p.used[0]) return;
  const int e = p.used[1 + blockIdx.y];
  const int begin = p.offsets[e], end = p.offsets[e + 1];
  if (end - begin > max_count) return;
  constexpr int kRows = kGateUp ? 2 : 1;
  const int K = kGateUp ? p.hidden : p.inter;
  const int N = kGateUp ? p.inter : p.hidden;
  const W* wmat = static_cast<const W*>(kGateUp ? p.gate_up[e] : p.down[e]);
  constexpr bool kFp8 = std::is_same_v<W, uint8_t>;
  const float* wscale = kFp8 ? (kGateUp ? p.gate_up_scale[e] : p.down_scale[e]) : nullptr;
  const int ld_scale = (K + 127) / 128;
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
          const int64_t row = static_cast<int64_t>(t) * N + out;
          if constexpr (kFp8) {
            Load8Fp8(wmat + row * K + c, wscale[(row / 128) * ld_scale + c / 128], wv);
          } else {
            dev::Load8(wmat + row * K + c, wv);
          }
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
template <bool kGateUp, typename W>
cudaError_t LaunchGemv(const MoeGemvParams& p, int max_count, cudaStream_t stream) {
  const int slots = std::min(p.experts, p.rows * p.k);
  const int n = kGateUp ? p.inter : p.hidden;
  MoeGemvKernel<kGateUp, W><<<dim3((n + kOutPerBlock - 1) / kOutPerBlock, slots), kThreads, 0, stream>>>(p, max_count);
  return cudaGetLastError();
}

// ---- tensor-core products for larger steps ---------------------------------
// mma.sync m16n8k16 with the weights as the 16-row operand and the entries
// as the 8 columns. A block owns 64 of an expert's weight rows (four m16
// tiles) and up to 32 of its entries at a time (four n8 tiles); its eight
// warps split K into eight slices (a step touches few experts, so rows
// alone would leave the GPU idle) and their partial sums are added through
// shared memory in warp order — a fixed order, so an entry's bits depend on
// its own values only. Within a slice, K goes in chunks of 32: each thread
// loads 16 bytes (8 values) of two weight rows per m16 tile and 8 values of
// one entry's row per n8 tile (converted to bf16), and the two k16 steps of
// a chunk take each thread's values 0-3 and 4-7 — the same permutation of k
// on both operands, so the dot products are unchanged and every load is 16
// bytes wide. Gate/up: the 64 rows are 32 gate rows and the matching 32 up
// rows, so one thread holds both values of an output.
constexpr int kMmaWarps = 8;                   // K slices
constexpr int kMmaThreads = 32 * kMmaWarps;
constexpr int kMTiles = 4;                     // weight rows per block: 64
constexpr int kNTiles = 4;                     // entries per pass: 32
constexpr int kKChunk = 32;
constexpr int kRedFloats = kMmaWarps * kMTiles * kNTiles * 4 * 32;

__device__ __forceinline__ uint32_t PackBf16(float a, float b) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Experts with fewer than min_count entries are left to the matrix-vector
// kernels.
template <bool kGateUp>
__global__ void __launch_bounds__(kMmaThreads, 2) MoeMmaKernel(MoeGemvParams p, int min_count) {
  extern __shared__ float red[];  // [warp][mt][nt][4][lane]
  if (static_cast<int>(blockIdx.y) >= p.used[0]) return;
  const int e = p.used[1 + blockIdx.y];
  const int begin = p.offsets[e], end = p.offsets[e + 1];
  if (end - begin < min_count) return;
  const int K = kGateUp ? p.hidden : p.inter;
  const int N = kGateUp ? p.inter : p.hidden;
  const __nv_bfloat16* w = static_cast<const __nv_bfloat16*>(kGateUp ? p.gate_up[e] : p.down[e]);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  // The block's outputs start at o0: 32 (gate/up) or 64 (down) of them.
  const int o0 = blockIdx.x * (kGateUp ? 32 : 64);
  const int kslice = K / kMmaWarps, k0 = warp * kslice;
  // The weight rows this thread loads: rows g and g + 8 of each m16 tile.
  const __nv_bfloat16* wrow[kMTiles][2];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = 16 * (kGateUp ? mt % 2 : mt) + g + 8 * h;
      const int row = kGateUp ? (mt < 2 ? o0 + r : N + o0 + r) : o0 + r;
      wrow[mt][h] = w + static_cast<int64_t>(row) * K + k0 + 8 * q;
    }
  }
  for (int g0 = begin; g0 < end; g0 += 8 * kNTiles) {
    const int n = min(8 * kNTiles, end - g0);
    const int ntiles = (n + 7) / 8;
    // The row (of x or act) this thread loads for each n8 tile: entry g.
    const float* arow[kNTiles];
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
      const int slot = 8 * nt + g;
      const int en = slot < n ? p.list[g0 + slot] : -1;
      arow[nt] = en < 0 ? nullptr
                 : kGateUp ? p.x + static_cast<int64_t>(en / p.k) * K + k0 + 8 * q
                           : p.act + static_cast<int64_t>(en) * K + k0 + 8 * q;
    }
    float acc[kMTiles][kNTiles][4] = {};
#pragma unroll 2
    for (int kc = 0; kc < kslice; kc += kKChunk) {
      uint4 a[kMTiles][2];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) a[mt][h] = __ldg(reinterpret_cast<const uint4*>(wrow[mt][h] + kc));
      }
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) {
        if (nt >= ntiles) break;
        float4 lo = make_float4(0.f, 0.f, 0.f, 0.f), hi = lo;
        if (arow[nt] != nullptr) {
          lo = *reinterpret_cast<const float4*>(arow[nt] + kc);
          hi = *reinterpret_cast<const float4*>(arow[nt] + kc + 4);
        }
        const uint32_t b0 = PackBf16(lo.x, lo.y), b1 = PackBf16(lo.z, lo.w);
        const uint32_t b2 = PackBf16(hi.x, hi.y), b3 = PackBf16(hi.z, hi.w);
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          // values 0-3: a0 (row g) .x, a1 (row g + 8) .x, a2 (row g) .y, a3 .y
          const uint32_t f0[4] = {a[mt][0].x, a[mt][1].x, a[mt][0].y, a[mt][1].y};
          const uint32_t f1[4] = {a[mt][0].z, a[mt][1].z, a[mt][0].w, a[mt][1].w};
          dev::MmaBf16(acc[mt][nt], f0, b0, b1);
          dev::MmaBf16(acc[mt][nt], f1, b2, b3);
        }
      }
    }
    // Partial sums to shared memory; warp w then adds, in warp order, the
    // fragments of n8 tile w % 4 and m16 tiles w / 4 and w / 4 + 2 (for
    // gate/up: gate rows and their up rows) and writes those outputs.
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
        for (int i = 0; i < 4; ++i) red[(((warp * kMTiles + mt) * kNTiles + nt) * 4 + i) * 32 + lane] = acc[mt][nt][i];
      }
    }
    __syncthreads();
    const int nt = warp % kNTiles, m_lo = warp / kNTiles;
    if (nt < ntiles) {
      float sum[2][4] = {};
#pragma unroll
      for (int w2 = 0; w2 < kMmaWarps; ++w2) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
#pragma unroll
          for (int i = 0; i < 4; ++i) sum[j][i] += red[(((w2 * kMTiles + m_lo + 2 * j) * kNTiles + nt) * 4 + i) * 32 + lane];
        }
      }
      // sum[j][0..1]: (weight row g of m16 tile m_lo + 2j, entries 2q, 2q + 1); [2..3]: row g + 8.
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int slot = 8 * nt + 2 * q + c;
        if (slot >= n) continue;
        const int64_t en = p.list[g0 + slot];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if (kGateUp) {
            const float gt = sum[0][2 * h + c], up = sum[1][2 * h + c];
            p.act[en * N + o0 + 16 * m_lo + g + 8 * h] = gt / (1.0f + expf(-gt)) * up;
          } else {
#pragma unroll
            for (int j = 0; j < 2; ++j) p.y[en * N + o0 + 16 * (m_lo + 2 * j) + g + 8 * h] = sum[j][2 * h + c];
          }
        }
      }
    }
    __syncthreads();  // (red is reused by the next pass)
  }
}

}  // namespace

cudaError_t LaunchMoeGemm(const MoeGemvParams& p, cudaStream_t stream) {
  if (p.rows <= 0 || p.k <= 0) return cudaSuccess;
  if (p.type != GemmType::kBF16 || p.fp8 || p.hidden % 256 != 0 || p.inter % 256 != 0 ||
      p.rows * p.k > kMoeGemvMaxEntries || p.experts <= 0 || p.experts > 1024) {
    return cudaErrorInvalidValue;
  }
  MoeListKernel<<<1, kListThreads, 0, stream>>>(p);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  const int slots = std::min(p.experts, p.rows * p.k);
  const int smem = kRedFloats * static_cast<int>(sizeof(float));
  for (auto* kernel : {MoeMmaKernel<true>, MoeMmaKernel<false>}) {
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err != cudaSuccess) return err;
  }
  // Experts with at most kGroup entries read their weights once in the
  // matrix-vector kernels too, which run closer to the bandwidth there.
  err = LaunchGemv<true, __nv_bfloat16>(p, kGroup, stream);
  if (err != cudaSuccess) return err;
  MoeMmaKernel<true><<<dim3(p.inter / 32, slots), kMmaThreads, smem, stream>>>(p, kGroup + 1);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  err = LaunchGemv<false, __nv_bfloat16>(p, kGroup, stream);
  if (err != cudaSuccess) return err;
  MoeMmaKernel<false><<<dim3(p.hidden / 64, slots), kMmaThreads, smem, stream>>>(p, kGroup + 1);
  return cudaGetLastError();
}

cudaError_t LaunchMoeGemv(const MoeGemvParams& p, cudaStream_t stream) {
  if (p.rows <= 0 || p.k <= 0) return cudaSuccess;
  if (p.hidden % 8 != 0 || p.inter % 8 != 0 || p.rows * p.k > kMoeGemvMaxEntries || p.experts <= 0 ||
      p.experts > 1024) {
    return cudaErrorInvalidValue;
  }
  MoeListKernel<<<1, kListThreads, 0, stream>>>(p);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  constexpr int kAll = 1 << 30;
  if (p.fp8) {
    if (p.gate_up_scale == nullptr || p.down_scale == nullptr) return cudaErrorInvalidValue;
    err = LaunchGemv<true, uint8_t>(p, kAll, stream);
    return err != cudaSuccess ? err : LaunchGemv<false, uint8_t>(p, kAll, stream);
  }
  if (p.type == GemmType::kBF16) {
    err = LaunchGemv<true, __nv_bfloat16>(p, kAll, stream);
    return err != cudaSuccess ? err : LaunchGemv<false, __nv_bfloat16>(p, kAll, stream);
  }
  err = LaunchGemv<true, float>(p, kAll, stream);
  return err != cudaSuccess ? err : LaunchGemv<false, float>(p, kAll, stream);
}

}  // namespace strata::cuda
