#include "kernels/cuda/fp8_gemv.h"

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/device_util.cuh"

namespace strata::cuda {
namespace {

constexpr int kThreads = 256;  // 8 warps
constexpr int kWarps = kThreads / 32;
constexpr int kChunk = 16;  // columns per 16-byte load of codes
static_assert(kFp8BlockSize % kChunk == 0, "a chunk never straddles two scale blocks");
// Blocks a launch should have at least to keep an H100/H200 (132 SMs) busy:
// two per SM with a warp per weight row(s), four per SM when the block works
// along k (its blocks are short).
constexpr int kWarpRowsMinBlocks = 264, kSplitMinBlocks = 528;

bool Aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// acc[r][i] += scale_r * (the 16 products of columns c .. c + 15 of weight
// row r and x row i, in column order), for kRows weight rows: the weight
// chunks are decoded once, then each x row is loaded and used against all of
// them (the registers hold kRows × 16 weights and 16 inputs at a time).
template <int kRows, int kM>
__device__ __forceinline__ void AccumulateChunk(const Fp8GemvArgs& a, const uint8_t* const (&wr)[kRows],
                                                const float* const (&sr)[kRows], int c, float (&acc)[kRows][kM]) {
  float wv[kRows][kChunk];
  float s[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const uint4 codes = __ldg(reinterpret_cast<const uint4*>(wr[r] + c));
    s[r] = __ldg(sr[r] + c / kFp8BlockSize);
    const uint32_t words[4] = {dev::ClearNanCodes(codes.x), dev::ClearNanCodes(codes.y), dev::ClearNanCodes(codes.z),
                               dev::ClearNanCodes(codes.w)};
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const float2 lo = dev::E4m3x2ToFloat2(words[q]), hi = dev::E4m3x2ToFloat2(words[q] >> 16);
      wv[r][4 * q] = lo.x, wv[r][4 * q + 1] = lo.y, wv[r][4 * q + 2] = hi.x, wv[r][4 * q + 3] = hi.y;
    }
  }
#pragma unroll
  for (int i = 0; i < kM; ++i) {
    float xv[kChunk];
    const float4* p = reinterpret_cast<const float4*>(a.x + i * a.ldx + c);
#pragma unroll
    for (int q = 0; q < kChunk / 4; ++q) {
      const float4 v = __ldg(p + q);
      xv[4 * q] = v.x, xv[4 * q + 1] = v.y, xv[4 * q + 2] = v.z, xv[4 * q + 3] = v.w;
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float part = 0.0f;
#pragma unroll
      for (int e = 0; e < kChunk; ++e) part = fmaf(wv[r][e], xv[e], part);
      acc[r][i] = fmaf(part, s[r], acc[r][i]);
    }
  }
}

// The code and scale rows of weight rows j0 .. j0 + kRows - 1 (the last row
// repeated past n; those outputs are computed and dropped).
template <int kRows>
__device__ __forceinline__ void RowPointers(const Fp8GemvArgs& a, int j0, const uint8_t* (&wr)[kRows],
                                            const float* (&sr)[kRows]) {
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int j = min(j0 + r, a.n - 1);
    wr[r] = a.w + static_cast<int64_t>(j) * a.ldw;
    sr[r] = a.scale + static_cast<int64_t>(j / kFp8BlockSize) * a.ld_scale;
  }
}

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

__device__ __forceinline__ void Store(const Fp8GemvArgs& a, int j, int i, float v) {
  float& out = a.y[static_cast<int64_t>(i) * a.ldy + j];
  out = a.accumulate ? out + v : v;
}

// Many outputs: warp w of block x computes outputs (8x + w) * kRows ...
// + kRows - 1; lane t sums its chunks t, t + 32, ... in order.
template <int kRows, int kM>
__global__ void __launch_bounds__(kThreads) Fp8GemvWarpKernel(const Fp8GemvArgs a) {
  const int lane = threadIdx.x & 31;
  const int j0 = (blockIdx.x * kWarps + (threadIdx.x >> 5)) * kRows;
  if (j0 >= a.n) return;
  const uint8_t* wr[kRows];
  const float* sr[kRows];
  RowPointers<kRows>(a, j0, wr, sr);
  float acc[kRows][kM] = {};
  constexpr int kUnroll = kM <= 2 ? 4 : 2;  // loads in flight; registers bound it
#pragma unroll kUnroll
  for (int c = lane * kChunk; c < a.k; c += 32 * kChunk) AccumulateChunk<kRows, kM>(a, wr, sr, c, acc);
  WarpSums<kRows, kM>(acc);
  if (lane != 0) return;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if (j0 + r >= a.n) break;
#pragma unroll
    for (int i = 0; i < kM; ++i) Store(a, j0 + r, i, acc[r][i]);
  }
}

// Few outputs: block x computes outputs kRows x ... kRows x + kRows - 1 with
// all its threads along k: thread t sums its chunks t, t + 256, ... in
// order, a butterfly sums each warp, then the warps' sums are added in warp
// order.
template <int kRows, int kM>
__global__ void __launch_bounds__(kThreads) Fp8GemvSplitKernel(const Fp8GemvArgs a) {
  __shared__ float part[kWarps][kRows][kM];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int j0 = blockIdx.x * kRows;
  const uint8_t* wr[kRows];
  const float* sr[kRows];
  RowPointers<kRows>(a, j0, wr, sr);
  float acc[kRows][kM] = {};
#pragma unroll 2
  for (int c = threadIdx.x * kChunk; c < a.k; c += kThreads * kChunk) AccumulateChunk<kRows, kM>(a, wr, sr, c, acc);
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
  Store(a, j0 + r, i, sum);
}

// ---- tensor-core form ----------------------------------------------------
// mma.sync m16n8k16 (f16 in, f32 out) with 16 weight rows as the A operand
// and the (up to 8) rows of x as the 8 columns of B.
//
// Weights: two e4m3 codes become two f16 (exactly: e4m3's values are f16
// normals) with one conversion instruction. (An integer decode — the f16 bits
// (c & 0x80) << 8 | (c & 0x7F) << 7, 2^-8 times the value — measured slower
// on the H200: bench/RESULTS.md, 2026-12-02.)
//
// x: per x row and 64-column step, the values are scaled by a power of two
// 2^-e that puts their largest magnitude in [2^13, 2^14), then split as hi
// (11 bits, Dekker's split) + lo (the rest, rounded to f16), both
// multiplied; |x - 2^e (hi + lo)| <= 2^-22 |x| + 2^-37 max|x of the step|
// (the last term from f16's subnormals).
// Every product is exact in f32 (11 by 11 bits). A step's result is
// multiplied by the block scale times 2^e, a power of two apart.
//
// A block owns 16 * kTiles weight rows; its kKWarps warps take K in steps of
// 64 columns, warp w the steps w, w + kKWarps, .... In a step, lane (g, t) (g = lane
// / 4, t = lane % 4) loads 16 codes of rows g and g + 8 of each tile at
// columns 16t .. 16t + 15 of the step, and 16 values of x row g at the same
// columns; k16 sub-step s takes its codes and values 4s .. 4s + 3 — one
// permutation of k for both operands, so each load is 16 bytes wide. A
// step's 8 mma (4 sub-steps, hi then lo) sum into fresh accumulators, which
// are then scaled (a step never straddles a 128-column block, a tile never
// a 128-row block) and added to the warp's sums; the warps' sums are added
// through shared memory in warp order. Every x row is a separate column of
// B with its own scaling, so a row's bits depend on its own values only; the
// order depends on the shape alone.
constexpr int kStep = 64;

// Codes 2 and 3 (hi) or 0 and 1 of w -> f16x2 of their values (e4m3's
// subnormals are f16 normals), one conversion instruction.
__device__ __forceinline__ uint32_t E4m3x2ToF16x2(uint32_t w, bool hi) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>((hi ? w >> 16 : w) & 0xFFFFu), __NV_E4M3);
  return *reinterpret_cast<const uint32_t*>(&h);
}

__device__ __forceinline__ uint32_t PackF16(float a, float b) {
  const __half2 v = __floats2half2_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Dekker's split of v (|v| < 2^14): hi keeps the top 11 bits, v - hi exact.
__device__ __forceinline__ float SplitHi(float v) {
  const float c = __fmul_rn(v, 8193.0f);
  return __fsub_rn(c, __fsub_rn(c, v));
}

template <int kTiles>
struct MmaStep {
  uint4 codes[kTiles][2];
  float4 x[4];
};

// Loads step k0's codes and x values of this lane (zeros past k or m).
template <int kTiles>
__device__ __forceinline__ void LoadStep(const Fp8GemvArgs& a, const uint8_t* const (&wrow)[kTiles][2], const float* xrow,
                                         int k0, int t, MmaStep<kTiles>& st) {
  const bool in = k0 + 16 * t < a.k;  // k is a multiple of 16: a lane's 16 columns are all in or all out
#pragma unroll
  for (int tile = 0; tile < kTiles; ++tile) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      st.codes[tile][h] = in ? __ldg(reinterpret_cast<const uint4*>(wrow[tile][h] + k0)) : make_uint4(0, 0, 0, 0);
    }
  }
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    st.x[s] = in && xrow != nullptr ? __ldg(reinterpret_cast<const float4*>(xrow + k0) + s) : make_float4(0, 0, 0, 0);
  }
}

template <int kTiles, int kKWarps>
__global__ void __launch_bounds__(32 * kKWarps) Fp8GemvMmaKernel(const Fp8GemvArgs a) {
  __shared__ float part[kKWarps][kTiles][4][32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int r0 = blockIdx.x * 16 * kTiles;
  // This lane's weight rows (the last row repeated past n: those outputs are
  // dropped) and its x row (none past m).
  const uint8_t* wrow[kTiles][2];
  const float* srow[kTiles];
#pragma unroll
  for (int tile = 0; tile < kTiles; ++tile) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int j = min(r0 + 16 * tile + g + 8 * h, a.n - 1);
      wrow[tile][h] = a.w + static_cast<int64_t>(j) * a.ldw + 16 * t;
    }
    srow[tile] = a.scale + static_cast<int64_t>(min(r0 + 16 * tile, a.n - 1) / kFp8BlockSize) * a.ld_scale;
  }
  const float* xrow = g < a.m ? a.x + static_cast<int64_t>(g) * a.ldx + 16 * t : nullptr;
  float acc[kTiles][4] = {};
  constexpr int kStride = kKWarps * kStep;
  MmaStep<kTiles> next;
  if (warp * kStep < a.k) LoadStep<kTiles>(a, wrow, xrow, warp * kStep, t, next);
  for (int k0 = warp * kStep; k0 < a.k; k0 += kStride) {
    // This step's operands; the next step's loads go out before its math.
    const MmaStep<kTiles> cur = next;
    if (k0 + kStride < a.k) LoadStep<kTiles>(a, wrow, xrow, k0 + kStride, t, next);
    float xv[16];
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      xv[4 * s] = cur.x[s].x, xv[4 * s + 1] = cur.x[s].y, xv[4 * s + 2] = cur.x[s].z, xv[4 * s + 3] = cur.x[s].w;
    }
    // The step's largest |x| of row g (the four lanes of group g), its
    // biased exponent clamped so that both factors below are normal floats.
    float mx = 0.0f;
#pragma unroll
    for (int e = 0; e < 16; ++e) mx = fmaxf(mx, fabsf(xv[e]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const int eb = min(max(static_cast<int>(__float_as_uint(mx) >> 23), 14), 254);
    const float down = __uint_as_float(static_cast<uint32_t>(267 - eb) << 23);  // 2^-(E - 13)
    // 2^(E - 13 + 8) for x rows 2t and 2t + 1 (group 2t's and 2t + 1's exponent).
    const int eb0 = __shfl_sync(0xffffffffu, eb, 8 * t), eb1 = __shfl_sync(0xffffffffu, eb, 8 * t + 4);
    const float up0 = __uint_as_float(static_cast<uint32_t>(eb0 - 13) << 23);
    const float up1 = __uint_as_float(static_cast<uint32_t>(eb1 - 13) << 23);
    uint32_t bhi[4][2], blo[4][2];
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      float h[4], l[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float v = __fmul_rn(xv[4 * s + e], down);
        h[e] = SplitHi(v);
        l[e] = __fsub_rn(v, h[e]);
      }
      bhi[s][0] = PackF16(h[0], h[1]), bhi[s][1] = PackF16(h[2], h[3]);
      blo[s][0] = PackF16(l[0], l[1]), blo[s][1] = PackF16(l[2], l[3]);
    }
#pragma unroll
    for (int tile = 0; tile < kTiles; ++tile) {
      const uint4& q0 = cur.codes[tile][0];
      const uint4& q1 = cur.codes[tile][1];
      const uint32_t w0[4] = {q0.x, q0.y, q0.z, q0.w};
      const uint32_t w1[4] = {q1.x, q1.y, q1.z, q1.w};
      float d[4] = {};
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        const uint32_t c0 = dev::ClearNanCodes(w0[s]), c1 = dev::ClearNanCodes(w1[s]);
        // a0 (row g, cols 2t, 2t+1) = codes 4s, 4s+1; a2 (row g, cols 2t+8, 2t+9) = codes 4s+2, 4s+3.
        const uint32_t frag[4] = {E4m3x2ToF16x2(c0, false), E4m3x2ToF16x2(c1, false), E4m3x2ToF16x2(c0, true),
                                  E4m3x2ToF16x2(c1, true)};
        dev::MmaF16(d, frag, bhi[s][0], bhi[s][1]);
        dev::MmaF16(d, frag, blo[s][0], blo[s][1]);
      }
      const float sc = __ldg(srow[tile] + k0 / kFp8BlockSize);
      const float f0 = sc * up0, f1 = sc * up1;  // exact: powers of two apart
      acc[tile][0] = fmaf(d[0], f0, acc[tile][0]);
      acc[tile][1] = fmaf(d[1], f1, acc[tile][1]);
      acc[tile][2] = fmaf(d[2], f0, acc[tile][2]);
      acc[tile][3] = fmaf(d[3], f1, acc[tile][3]);
    }
  }
#pragma unroll
  for (int tile = 0; tile < kTiles; ++tile) {
#pragma unroll
    for (int e = 0; e < 4; ++e) part[warp][tile][e][lane] = acc[tile][e];
  }
  __syncthreads();
  // Element (tile, e, lane): row r0 + 16 tile + g + 8 (e / 2), x row 2t + e % 2.
  for (int idx = threadIdx.x; idx < kTiles * 4 * 32; idx += 32 * kKWarps) {
    const int tile = idx / 128, e = (idx / 32) % 4, l = idx % 32;
    const int j = r0 + 16 * tile + (l >> 2) + 8 * (e >> 1), i = 2 * (l & 3) + (e & 1);
    if (j >= a.n || i >= a.m) continue;
    float sum = part[0][tile][e][l];
#pragma unroll
    for (int v = 1; v < kKWarps; ++v) sum += part[v][tile][e][l];
    Store(a, j, i, sum);
  }
}

// Calls launch(std::integral_constant<int, m>) for m = 1 .. 8.
template <typename Launch>
cudaError_t ForRowCount(int m, Launch&& launch) {
  switch (m) {
    case 1: launch(std::integral_constant<int, 1>()); break;
    case 2: launch(std::integral_constant<int, 2>()); break;
    case 3: launch(std::integral_constant<int, 3>()); break;
    case 4: launch(std::integral_constant<int, 4>()); break;
    case 5: launch(std::integral_constant<int, 5>()); break;
    case 6: launch(std::integral_constant<int, 6>()); break;
    case 7: launch(std::integral_constant<int, 7>()); break;
    default: launch(std::integral_constant<int, 8>()); break;
  }
  return cudaGetLastError();
}

template <int kRows>
cudaError_t LaunchWarp(const Fp8GemvArgs& a, cudaStream_t stream) {
  const dim3 grid((a.n + kRows * kWarps - 1) / (kRows * kWarps));
  return ForRowCount(a.m, [&](auto m) { Fp8GemvWarpKernel<kRows, decltype(m)::value><<<grid, kThreads, 0, stream>>>(a); });
}

template <int kRows>
cudaError_t LaunchSplit(const Fp8GemvArgs& a, cudaStream_t stream) {
  const dim3 grid((a.n + kRows - 1) / kRows);
  return ForRowCount(a.m,
                     [&](auto m) { Fp8GemvSplitKernel<kRows, decltype(m)::value><<<grid, kThreads, 0, stream>>>(a); });
}

template <int kTiles, int kKWarps>
cudaError_t LaunchMma(const Fp8GemvArgs& a, cudaStream_t stream) {
  const dim3 grid((a.n + 16 * kTiles - 1) / (16 * kTiles));
  Fp8GemvMmaKernel<kTiles, kKWarps><<<grid, 32 * kKWarps, 0, stream>>>(a);
  return cudaGetLastError();
}

// One warp per (row, group): blockIdx.y the row, warp w of block x the
// group 8x + w; the last group's warp also zeroes the row's padding.
__global__ void __launch_bounds__(256) QuantizeGroups128Kernel(const float* x, int m, int k, int64_t ldx,
                                                               uint8_t* codes, int64_t ldc, float* scales, int rows) {
  const int lane = threadIdx.x & 31, g = blockIdx.x * 8 + (threadIdx.x >> 5), i = blockIdx.y;
  const int groups = (k + kFp8BlockSize - 1) / kFp8BlockSize;
  if (g >= groups) return;
  const int c0 = g * kFp8BlockSize, n = min(kFp8BlockSize, k - c0);
  uint8_t* row = codes + static_cast<int64_t>(i) * ldc;
  float s = 1.0f;
  if (i < m) {
    s = dev::QuantizeRowWarp(x + static_cast<int64_t>(i) * ldx + c0, n, row + c0, lane);
  } else {
    for (int c = lane; c < n; c += 32) row[c0 + c] = 0;
  }
  if (lane == 0) scales[static_cast<int64_t>(g) * rows + i] = s;
  if (g == groups - 1) {
    for (int64_t c = k + lane; c < ldc; c += 32) row[c] = 0;
  }
}

__global__ void FillRandomFp8Kernel(uint8_t* codes, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint64_t z = seed + static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull;  // splitmix64
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float u = static_cast<float>(static_cast<int64_t>(z >> 40) - (int64_t{1} << 23)) * 0x1.0p-23f;
    codes[i] = dev::EncodeE4m3(u * 448.0f);
  }
}

__global__ void ClearNanCodesKernel(uint8_t* codes, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if ((codes[i] & 0x7F) == 0x7F) codes[i] = 0;
  }
}

__global__ void CopyRowsKernel(const float* src, int n, int64_t lds, float* y, int64_t ldy, bool accumulate) {
  const int i = blockIdx.y;
  for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < n; j += gridDim.x * blockDim.x) {
    const float v = src[static_cast<int64_t>(i) * lds + j];
    float& out = y[static_cast<int64_t>(i) * ldy + j];
    out = accumulate ? out + v : v;
  }
}

}  // namespace

cudaError_t LaunchFillRandomFp8(uint8_t* codes, int64_t n, uint64_t seed, cudaStream_t stream) {
  if (n < 0 || (n > 0 && codes == nullptr)) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const int64_t blocks = std::min<int64_t>((n + 255) / 256, 65536);
  FillRandomFp8Kernel<<<static_cast<int>(blocks), 256, 0, stream>>>(codes, n, seed);
  return cudaGetLastError();
}

cudaError_t LaunchClearNanCodes(uint8_t* codes, int64_t n, cudaStream_t stream) {
  if (n < 0 || (n > 0 && codes == nullptr)) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  ClearNanCodesKernel<<<static_cast<int>(std::min<int64_t>((n + 255) / 256, 65536)), 256, 0, stream>>>(codes, n);
  return cudaGetLastError();
}

cudaError_t LaunchCopyRows(const float* src, int m, int n, int64_t lds, float* y, int64_t ldy, bool accumulate,
                           cudaStream_t stream) {
  if (m < 0 || n < 1 || m > 65535 || lds < n || ldy < n) return cudaErrorInvalidValue;
  if (m == 0) return cudaSuccess;
  CopyRowsKernel<<<dim3(std::min((n + 255) / 256, 64), m), 256, 0, stream>>>(src, n, lds, y, ldy, accumulate);
  return cudaGetLastError();
}

cudaError_t LaunchQuantizeGroups128(const float* x, int m, int k, int64_t ldx, uint8_t* codes, int64_t ldc,
                                    float* scales, int rows, cudaStream_t stream) {
  if (m < 1 || rows < m || rows > 65535 || k < 1 || ldx < k || ldc < k || x == nullptr || codes == nullptr ||
      scales == nullptr) {
    return cudaErrorInvalidValue;
  }
  const int groups = (k + kFp8BlockSize - 1) / kFp8BlockSize;
  QuantizeGroups128Kernel<<<dim3((groups + 7) / 8, rows), 256, 0, stream>>>(x, m, k, ldx, codes, ldc, scales, rows);
  return cudaGetLastError();
}

bool Fp8GemvSupports(const Fp8GemvArgs& a) {
  if (a.m < 1 || a.m > kFp8GemvMaxRows || a.n < 1 || a.k < 1 || a.x == nullptr || a.w == nullptr ||
      a.scale == nullptr || a.y == nullptr) {
    return false;
  }
  const int64_t scale_cols = (a.k + kFp8BlockSize - 1) / kFp8BlockSize;
  return a.k % kChunk == 0 && a.ldw % kChunk == 0 && a.ldw >= a.k && a.ldx % 4 == 0 && a.ldx >= a.k &&
         a.ldy >= a.n && a.ld_scale >= scale_cols && Aligned(a.w, 16) && Aligned(a.x, 16);
}

cudaError_t LaunchFp8Gemv(const Fp8GemvArgs& a, cudaStream_t stream) {
  if (!Fp8GemvSupports(a)) return cudaErrorInvalidValue;
  // Within a form, the choice depends on the shape alone, never on m.
  const bool tensor_cores = a.form == Fp8GemvForm::kTensorCores || (a.form == Fp8GemvForm::kAuto && a.m > 1);
  if (tensor_cores) {
    // As many rows per block as still leave two blocks per SM; with fewer
    // blocks, more warps along k in each (more loads in flight).
    const int blocks16 = (a.n + 15) / 16;
    if (blocks16 >= 4 * kWarpRowsMinBlocks) return LaunchMma<4, 8>(a, stream);
    if (blocks16 >= 2 * kWarpRowsMinBlocks) return LaunchMma<2, 8>(a, stream);
    if (blocks16 >= kWarpRowsMinBlocks) return LaunchMma<1, 8>(a, stream);
    if (blocks16 >= kWarpRowsMinBlocks / 4) return LaunchMma<1, 16>(a, stream);
    return LaunchMma<1, 32>(a, stream);
  }
  // Many outputs: a warp per one or two weight rows. Fewer: a block per one
  // to four rows, its threads along k, so that enough loads are in flight.
  if (a.n >= 2 * kWarps * kWarpRowsMinBlocks) return LaunchWarp<2>(a, stream);
  if (a.n >= kWarps * kWarpRowsMinBlocks) return LaunchWarp<1>(a, stream);
  if (a.n >= 4 * kSplitMinBlocks) return LaunchSplit<4>(a, stream);
  if (a.n >= 2 * kSplitMinBlocks) return LaunchSplit<2>(a, stream);
  return LaunchSplit<1>(a, stream);
}

}  // namespace strata::cuda
