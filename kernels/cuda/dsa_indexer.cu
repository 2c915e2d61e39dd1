#include "kernels/cuda/dsa_indexer.h"

#include <cuda_bf16.h>

#include <cub/block/block_scan.cuh>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/kv_layout.h"

namespace strata::cuda {
namespace {

// ---- indexer scores ---------------------------------------------------------
// A warp scores 16 tokens against up to 64 heads with bf16 mma.sync
// (M = tokens, N = heads, K = 128). The reduction dimension is permuted so
// that every thread loads its key bytes with two 16-byte loads: thread q of a
// quad owns key bytes [32q, 32q + 32), and k-step ks uses its word ks. Query
// element d = 32q + 4ks + j is stored at position 16ks + 4q + j of its
// shared-memory row, so the matching B fragment is one 8-byte load.
constexpr int kIdxWarps = 8;
constexpr int kIdxThreads = kIdxWarps * 32;
constexpr int kIdxTokensPerBlock = kIdxWarps * 16;
constexpr int kIdxMaxHeads = 64;
constexpr int kIdxQStride = kIndexDim + 16;  // 288-byte rows: 8-byte fragment loads conflict-free

__global__ void __launch_bounds__(kIdxThreads) DsaIndexerKernel(const DsaIndexerParams p) {
  __shared__ __align__(16) __nv_bfloat16 q_s[kIdxMaxHeads][kIdxQStride];
  __shared__ float w_s[kIdxMaxHeads];
  const int b = blockIdx.y;
  const int64_t seq = p.seq_lens[b];
  const int64_t t_block = static_cast<int64_t>(blockIdx.x) * kIdxTokensPerBlock;
  if (t_block >= seq) return;
  const int tid = threadIdx.x;
  const int heads = p.index_heads;

  for (int c = tid; c < kIdxMaxHeads * (kIndexDim / 4); c += kIdxThreads) {
    const int h = c / (kIndexDim / 4), c4 = c % (kIndexDim / 4);
    uint2 v = make_uint2(0, 0);
    if (h < heads) {
      const int64_t base = (static_cast<int64_t>(b) * heads + h) * kIndexDim + c4 * 4;
      if (p.q_is_bf16) {
        v = *reinterpret_cast<const uint2*>(static_cast<const __nv_bfloat16*>(p.q) + base);
      } else {
        const float4 f = *reinterpret_cast<const float4*>(static_cast<const float*>(p.q) + base);
        v = make_uint2(dev::PackBf16x2(f.x, f.y), dev::PackBf16x2(f.z, f.w));
      }
    }
    *reinterpret_cast<uint2*>(&q_s[h][(c4 % 8) * 16 + (c4 / 8) * 4]) = v;
  }
  if (tid < kIdxMaxHeads) w_s[tid] = tid < heads ? p.weights[static_cast<int64_t>(b) * heads + tid] : 0.0f;
  __syncthreads();

  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, q = lane & 3;
  const int64_t t0 = t_block + warp * 16;
  if (t0 >= seq) return;

  uint32_t words[2][8];
  float kscale[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t t = t0 + g + 8 * r;
    uint4 lo = make_uint4(0, 0, 0, 0), hi = lo;
    kscale[r] = 0.0f;
    if (t < seq) {
      const int page = p.page_table[b * p.page_table_stride + t / 64];
      const uint8_t* base = p.pool + static_cast<size_t>(page) * kIndexPageBytes;
      const int slot = static_cast<int>(t & 63);
      const uint4* src = reinterpret_cast<const uint4*>(base + slot * kIndexDim + q * 32);
      lo = src[0];
      hi = src[1];
      kscale[r] = dev::UsableScale(reinterpret_cast<const float*>(base + kIndexPageScaleOffset)[slot]);
    }
    words[r][0] = dev::ClearNanCodes(lo.x);
    words[r][1] = dev::ClearNanCodes(lo.y);
    words[r][2] = dev::ClearNanCodes(lo.z);
    words[r][3] = dev::ClearNanCodes(lo.w);
    words[r][4] = dev::ClearNanCodes(hi.x);
    words[r][5] = dev::ClearNanCodes(hi.y);
    words[r][6] = dev::ClearNanCodes(hi.z);
    words[r][7] = dev::ClearNanCodes(hi.w);
  }

  const int n_tiles = heads / 8;
  float acc[8][4] = {};
#pragma unroll
  for (int ks = 0; ks < 8; ++ks) {
    uint32_t a[4];
    a[0] = dev::E4m3x2ToBf16x2(words[0][ks]);
    a[1] = dev::E4m3x2ToBf16x2(words[1][ks]);
    a[2] = dev::E4m3x2ToBf16x2(words[0][ks] >> 16);
    a[3] = dev::E4m3x2ToBf16x2(words[1][ks] >> 16);
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      if (nt < n_tiles) {
        const uint2 bq = *reinterpret_cast<const uint2*>(&q_s[nt * 8 + g][ks * 16 + q * 4]);
        dev::MmaBf16(acc[nt], a, bq.x, bq.y);
      }
    }
  }
  float sum[2] = {0.0f, 0.0f};
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
    if (nt < n_tiles) {
      const float w0 = w_s[nt * 8 + 2 * q], w1 = w_s[nt * 8 + 2 * q + 1];
      sum[0] += w0 * fmaxf(acc[nt][0], 0.0f) + w1 * fmaxf(acc[nt][1], 0.0f);
      sum[1] += w0 * fmaxf(acc[nt][2], 0.0f) + w1 * fmaxf(acc[nt][3], 0.0f);
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 1);
    sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 2);
    const int64_t t = t0 + g + 8 * r;
    if (q == 0 && t < seq) p.scores[b * p.score_stride + t] = kscale[r] * sum[r];
  }
}

// ---- top-k --------------------------------------------------------------------
constexpr int kTopkThreads = 1024;
constexpr int kTopkMaxBins = 2048;

__device__ __forceinline__ uint32_t DevTopkKey(float x) {
  const uint32_t u = __float_as_uint(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__global__ void __launch_bounds__(kTopkThreads) TopkKernel(const TopkParams p) {
  using Scan = cub::BlockScan<int, kTopkThreads>;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ int hist[kTopkMaxBins];
  __shared__ int s_bin, s_rem;
  const int b = blockIdx.x, tid = threadIdx.x;
  const int64_t seq = p.seq_lens[b];
  int* out = p.indices + static_cast<int64_t>(b) * p.k;
  if (seq <= p.k) {
    for (int i = tid; i < p.k; i += kTopkThreads) out[i] = i < seq ? i : -1;
    return;
  }
  const float* sc = p.scores + b * p.score_stride;

  // Radix select of the k-th largest key: 11, 11 and 10 bits.
  uint32_t prefix = 0, mask = 0;
  int rem = p.k;
  constexpr int kShift[3] = {21, 10, 0};
  constexpr int kBits[3] = {11, 11, 10};
#pragma unroll
  for (int pass = 0; pass < 3; ++pass) {
    const int nbins = 1 << kBits[pass];
    const int shift = kShift[pass];
    for (int i = tid; i < nbins; i += kTopkThreads) hist[i] = 0;
    __syncthreads();
    for (int64_t i = tid; i < seq; i += kTopkThreads) {
      const uint32_t key = DevTopkKey(sc[i]);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & (nbins - 1)], 1);
    }
    __syncthreads();
    // Bins in descending order; thread tid owns ranks per*tid .. per*tid+per-1.
    const int per = nbins / kTopkThreads;  // 2 or 1
    const int bin_a = nbins - 1 - per * tid;
    const int c0 = hist[bin_a];
    const int c1 = per == 2 ? hist[bin_a - 1] : 0;
    int above;
    Scan(scan_tmp).ExclusiveSum(c0 + c1, above);
    if (above < rem && above + c0 >= rem) {
      s_bin = bin_a;
      s_rem = rem - above;
    } else if (per == 2 && above + c0 < rem && above + c0 + c1 >= rem) {
      s_bin = bin_a - 1;
      s_rem = rem - above - c0;
    }
    __syncthreads();
    prefix |= static_cast<uint32_t>(s_bin) << shift;
    mask |= static_cast<uint32_t>(nbins - 1) << shift;
    rem = s_rem;
    __syncthreads();
  }

  // Ordered pass: keys above the threshold, then the first `rem` equal ones.
  const uint32_t thr = prefix;
  int eq_seen = 0, written = 0;
  for (int64_t base = 0; base < seq && written < p.k; base += 4 * kTopkThreads) {
    uint32_t keys[4];
    int n_eq = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t i = base + 4 * tid + j;
      keys[j] = i < seq ? DevTopkKey(sc[i]) : 0u;
      n_eq += (i < seq && keys[j] == thr) ? 1 : 0;
    }
    int eq_before, eq_total;
    Scan(scan_tmp).ExclusiveSum(n_eq, eq_before, eq_total);
    __syncthreads();
    eq_before += eq_seen;
    bool sel[4];
    int n_sel = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t i = base + 4 * tid + j;
      const bool valid = i < seq;
      const bool eq = valid && keys[j] == thr;
      sel[j] = valid && (keys[j] > thr || (eq && eq_before < rem));
      eq_before += eq ? 1 : 0;
      n_sel += sel[j] ? 1 : 0;
    }
    int sel_before, sel_total;
    Scan(scan_tmp).ExclusiveSum(n_sel, sel_before, sel_total);
    __syncthreads();
    int pos = written + sel_before;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (sel[j]) out[pos++] = static_cast<int>(base + 4 * tid + j);
    }
    eq_seen += eq_total;
    written += sel_total;
  }
}

}  // namespace

cudaError_t LaunchDsaIndexer(const DsaIndexerParams& p, cudaStream_t stream) {
  if (p.batch <= 0 || p.max_seq_len <= 0) return cudaSuccess;
  if (p.index_heads <= 0 || p.index_heads > kIdxMaxHeads || p.index_heads % 8 != 0)
    return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>((p.max_seq_len + kIdxTokensPerBlock - 1) / kIdxTokensPerBlock),
                  p.batch);
  DsaIndexerKernel<<<grid, kIdxThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t LaunchTopk(const TopkParams& p, cudaStream_t stream) {
  if (p.batch <= 0) return cudaSuccess;
  if (p.k <= 0 || p.k > 65535) return cudaErrorInvalidValue;
  TopkKernel<<<p.batch, kTopkThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace strata::cuda
