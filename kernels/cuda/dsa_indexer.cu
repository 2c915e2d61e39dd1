#include "kernels/cuda/dsa_indexer.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cub/block/block_scan.cuh>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/kv_layout.h"
#include "kernels/cuda/wgmma.cuh"

namespace strata::cuda {
namespace {

// ---- indexer scores ---------------------------------------------------------
// Scores with e4m3 wgmma (m64n64k32: M = the 64 tokens of a page, N = 64
// heads, K = 32 per instruction), both operands in shared memory. The queries
// go in as two e4m3 terms per element (dsa_indexer.h): each head scaled by a
// power of two so that its largest element lies in [128, 256), hi = e4m3(x)
// and lo = e4m3(x - hi), both multiplied into one f32 accumulator (eight
// wgmma per page); the head weight takes the power of two back. Heads past
// index_heads are zero rows.
//
// Block x of a request scores the index pages [x P / G, (x + 1) P / G) of the
// longest request's P pages (G blocks per request, two per SM over the batch),
// clipped to its own length, so the range is known before the length is. A
// producer warp loads the range's page-table entries and moves whole pages
// (codes and scales, 8448 bytes) into a ring of kIdxRing pages with bulk
// copies; at T = 128k a block has at most eight pages, so all are requested
// at once. The two scoring warpgroups take the pages in turn: copy the codes
// into the 128-byte swizzled layout wgmma reads (NaN codes cleared on the
// way, so that they count as 0), hand the ring slot back, multiply, and each
// thread sums the weighted ReLU over its 16 head columns of its two token
// rows (then over the quad) in a fixed order.
constexpr int kIdxWarps = 8;                       // two scoring warpgroups
constexpr int kIdxThreads = (kIdxWarps + 1) * 32;  // and the producer warp
constexpr int kIdxRing = 8;                        // pages in shared memory
constexpr int kIdxMaxHeads = 64;
constexpr int kIdxTileBytes = 64 * kIndexDim;      // a swizzled 64 x 128 e4m3 operand
struct IdxSmem {
  uint8_t q_hi[kIdxTileBytes];      // 1024-byte aligned (swizzled operands first)
  uint8_t q_lo[kIdxTileBytes];
  uint8_t keys[2][kIdxTileBytes];   // per warpgroup
  uint8_t ring[kIdxRing][kIndexPageBytes];
  int hist[kTopkBins1];             // the fused top-k's first-level histogram
  float w[kIdxMaxHeads];
  uint64_t full[kIdxRing], empty[kIdxRing];
};
constexpr size_t kIdxSmemBytes = sizeof(IdxSmem) + 1024;  // + alignment
constexpr int kIdxBarScorers = 1;  // named barriers: the scoring warps; 2 and 3: a warpgroup's

__device__ __forceinline__ uint32_t DevTopkKey(float x) {
  const uint32_t u = __float_as_uint(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The multi-block top-k's radix digits of a key: 11, 11 and 10 bits.
constexpr int kTopkShift1 = 21, kTopkShift2 = 10;
constexpr int kTopkBins3 = 1024;
static_assert(kTopkFrontInts % 4 == 0 && kTopkBins1 % 4 == 0, "histograms 16-byte aligned in the workspace");
static_assert(kTopkBins1 == 1 << (32 - kTopkShift1) && kTopkBins2 == 1 << (kTopkShift1 - kTopkShift2) &&
                  kTopkBins3 == 1 << kTopkShift2,
              "the digits cover the key");

// Adds a block's shared histogram of `bins` bins into a global one, one
// atomic per non-empty bin. Call after a barrier that ends the counting.
__device__ __forceinline__ void AddHistogram(const int* block_hist, int* global_hist, int bins) {
  constexpr int kUnroll = 8;  // shared loads in flight
  for (int base = threadIdx.x; base < bins; base += kUnroll * blockDim.x) {
    int cnt[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = base + u * blockDim.x;
      cnt[u] = i < bins ? block_hist[i] : 0;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (cnt[u] != 0) atomicAdd(&global_hist[base + u * blockDim.x], cnt[u]);
  }
}

// Two f32 values -> two e4m3 codes (round to nearest even, finite values
// saturated), the first in the low byte (dev::E4m3x2ToFloat2 reads them back).
__device__ __forceinline__ uint32_t ToE4m3x2(float a, float b) {
  return __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
}

// The indexer's launch: with hist != null (LaunchDsaIndexerTopk) requests of
// seq_len <= k are not scored (their selection is every position) and the
// others' scores are also counted into hist + b * kTopkFrontInts, the
// first-level histogram of the multi-block top-k.
struct IndexerArgs {
  DsaIndexerParams p;
  int* hist = nullptr;
  int k = 0;
};

__global__ void __launch_bounds__(kIdxThreads, 2) DsaIndexerKernel(const IndexerArgs args) {
  const DsaIndexerParams& p = args.p;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  IdxSmem& sm = *reinterpret_cast<IdxSmem*>(smem_raw + ((1024 - (dev::SmemAddr(smem_raw) & 1023)) & 1023));
  dev::LaunchDependents();
  const int b = blockIdx.y;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const bool producer = warp == kIdxWarps;
  const int64_t max_pages = (p.max_seq_len + 63) / 64;
  const int64_t p0 = static_cast<int64_t>(blockIdx.x) * max_pages / gridDim.x;
  // (the last block also takes any pages past max_seq_len, so that a length
  // above it is still scored whole)
  const int64_t p1 = blockIdx.x + 1 == gridDim.x ? INT64_MAX
                                                 : static_cast<int64_t>(blockIdx.x + 1) * max_pages / gridDim.x;
  const int* table = p.page_table + (p.page_row ? p.page_row[b] : b) * p.page_table_stride;
  // The producer's lane l holds the page of entry (j & ~31) + l while page j
  // is requested; the first 32 are loaded beside the length (clamped to the
  // table row; an entry past the request is never used).
  int page_of_lane = 0;
  if (producer && p.page_table_stride > 0) page_of_lane = table[std::min(p0 + lane, p.page_table_stride - 1)];
  const int heads = p.index_heads;
  // Scoring warp w stages heads 8w .. 8w + 7; lane l holds dims 4l .. 4l + 3.
  float4 qv[8];
  float w_lane = 0.0f;
  if (!producer) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int h = 8 * warp + i;
      qv[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (h < heads) {
        const int64_t at = (static_cast<int64_t>(b) * heads + h) * kIndexDim + 4 * lane;
        if (p.q_is_bf16) {
          const uint2 raw = *reinterpret_cast<const uint2*>(static_cast<const __nv_bfloat16*>(p.q) + at);
          qv[i] = make_float4(__uint_as_float(raw.x << 16), __uint_as_float(raw.x & 0xFFFF0000u),
                              __uint_as_float(raw.y << 16), __uint_as_float(raw.y & 0xFFFF0000u));
        } else {
          qv[i] = *reinterpret_cast<const float4*>(static_cast<const float*>(p.q) + at);
        }
      }
    }
    if (lane < 8 && 8 * warp + lane < heads) w_lane = p.weights[static_cast<int64_t>(b) * heads + 8 * warp + lane];
  }
  const int64_t seq = p.seq_lens[b];
  const bool fused = args.hist != nullptr;
  if (fused && seq <= args.k) return;  // top-k selects every position
  const int64_t n_pages = std::min(p1, (seq + 63) / 64) - p0;
  if (n_pages <= 0) return;  // the whole block

  if (tid == 0) {
    for (int i = 0; i < kIdxRing; ++i) {
      dev::MbarInit(&sm.full[i], 1);
      dev::MbarInit(&sm.empty[i], 128);  // every thread of the warpgroup that takes the page
    }
    dev::MbarInitFence();
  }
  if (fused)
    for (int i = tid; i < kTopkBins1; i += kIdxThreads) sm.hist[i] = 0;
  __syncthreads();

  if (producer) {
    for (int64_t j = 0; j < n_pages; ++j) {
      if ((j & 31) == 0 && j > 0) page_of_lane = j + lane < n_pages ? table[p0 + j + lane] : 0;
      const int page = __shfl_sync(0xffffffffu, page_of_lane, static_cast<int>(j & 31));
      if (lane == 0) {
        const int slot = static_cast<int>(j % kIdxRing);
        if (j >= kIdxRing) dev::MbarWait(&sm.empty[slot], static_cast<uint32_t>(j / kIdxRing - 1) & 1u);
        dev::MbarArriveExpectTx(&sm.full[slot], kIndexPageBytes);
        dev::BulkCopyToShared(sm.ring[slot], p.pool + static_cast<size_t>(page) * kIndexPageBytes,
                              kIndexPageBytes, &sm.full[slot]);
      }
      __syncwarp();
    }
  } else {
    // The query pairs, swizzled (row h, chunk c at c ^ (h % 8)), and the
    // weights with the scale taken back. Rows past `heads` are zero.
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int h = 8 * warp + i;
      float m = fmaxf(fmaxf(fabsf(qv[i].x), fabsf(qv[i].y)), fmaxf(fabsf(qv[i].z), fabsf(qv[i].w)));
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
      const uint32_t e = __float_as_uint(m) >> 23;
      const bool scaled = e >= 8 && e < 255;
      const float s = scaled ? __uint_as_float((261u - e) << 23) : 1.0f;  // 2^(134 - e)
      const float x0 = qv[i].x * s, x1 = qv[i].y * s, x2 = qv[i].z * s, x3 = qv[i].w * s;
      const uint32_t hi01 = ToE4m3x2(x0, x1), hi23 = ToE4m3x2(x2, x3);
      const float2 h01 = dev::E4m3x2ToFloat2(hi01), h23 = dev::E4m3x2ToFloat2(hi23);
      const uint32_t lo01 = ToE4m3x2(x0 - h01.x, x1 - h01.y), lo23 = ToE4m3x2(x2 - h23.x, x3 - h23.y);
      const uint32_t at = wgmma::SwizzledChunk(h, lane >> 2) + 4 * (lane & 3);
      *reinterpret_cast<uint32_t*>(sm.q_hi + at) = hi01 | (hi23 << 16);
      *reinterpret_cast<uint32_t*>(sm.q_lo + at) = lo01 | (lo23 << 16);
      const float w = __shfl_sync(0xffffffffu, w_lane, i);
      if (lane == 0) sm.w[h] = scaled ? w * __uint_as_float((e - 7u) << 23) : w;  // w * 2^(e - 134)
    }
    wgmma::FenceProxyAsync();
    wgmma::BarSync(kIdxBarScorers, kIdxWarps * 32);

    const int wg = warp >> 2, wt = tid & 127, g = lane >> 2, q = lane & 3;
    const int row0 = 16 * (warp & 3) + g;  // this thread's token rows: row0, row0 + 8
    float w_head[8][2];  // this thread's head weights: columns 8j + 2q, 8j + 2q + 1
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      w_head[j][0] = sm.w[8 * j + 2 * q];
      w_head[j][1] = sm.w[8 * j + 2 * q + 1];
    }
    uint8_t* keys = sm.keys[wg];
    const uint64_t desc_k = wgmma::SmemDesc(dev::SmemAddr(keys), 16, 1024);
    const uint64_t desc_hi = wgmma::SmemDesc(dev::SmemAddr(sm.q_hi), 16, 1024);
    const uint64_t desc_lo = wgmma::SmemDesc(dev::SmemAddr(sm.q_lo), 16, 1024);
    for (int64_t j = wg; j < n_pages; j += 2) {
      const int slot = static_cast<int>(j % kIdxRing);
      dev::MbarWait(&sm.full[slot], static_cast<uint32_t>(j / kIdxRing) & 1u);
      const uint8_t* raw = sm.ring[slot];
      const int64_t t0 = (p0 + j) * 64;
      float kscale[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = row0 + 8 * r;
        kscale[r] = t0 + row < seq ? dev::UsableScale(reinterpret_cast<const float*>(raw + kIndexPageScaleOffset)[row])
                                   : 0.0f;
      }
      uint4 v[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) v[u] = reinterpret_cast<const uint4*>(raw)[wt + 128 * u];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const uint4 c = make_uint4(dev::ClearNanCodes(v[u].x), dev::ClearNanCodes(v[u].y),
                                   dev::ClearNanCodes(v[u].z), dev::ClearNanCodes(v[u].w));
        *reinterpret_cast<uint4*>(keys + wgmma::SwizzledChunk((wt >> 3) + 16 * u, wt & 7)) = c;
      }
      dev::MbarArrive(&sm.empty[slot]);  // (each thread releases its own reads)
      wgmma::FenceProxyAsync();
      if (wg == 0) {
        wgmma::BarSync(2, 128);
      } else {
        wgmma::BarSync(3, 128);
      }

      float acc[32];
      wgmma::Fence();
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        wgmma::M64N64K32E4m3SS(acc, wgmma::DescAdd(desc_k, 2 * s), wgmma::DescAdd(desc_hi, 2 * s), s > 0);
        wgmma::M64N64K32E4m3SS(acc, wgmma::DescAdd(desc_k, 2 * s), wgmma::DescAdd(desc_lo, 2 * s), true);
      }
      wgmma::Commit();
      wgmma::Wait<0>();

      float sum[2] = {0.0f, 0.0f};
#pragma unroll
      for (int jn = 0; jn < 8; ++jn) {
        const float w0 = w_head[jn][0], w1 = w_head[jn][1];
        sum[0] += w0 * fmaxf(acc[4 * jn], 0.0f) + w1 * fmaxf(acc[4 * jn + 1], 0.0f);
        sum[1] += w0 * fmaxf(acc[4 * jn + 2], 0.0f) + w1 * fmaxf(acc[4 * jn + 3], 0.0f);
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 1);
        sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 2);
        const int64_t t = t0 + row0 + 8 * r;
        if (q == 0 && t < seq) {
          const float score = kscale[r] * sum[r];
          p.scores[b * p.score_stride + t] = score;
          if (fused) atomicAdd(&sm.hist[DevTopkKey(score) >> kTopkShift1], 1);
        }
      }
    }
  }
  if (!fused) return;
  __syncthreads();
  AddHistogram(sm.hist, args.hist + static_cast<int64_t>(b) * kTopkFrontInts, kTopkBins1);
}

// ---- top-k --------------------------------------------------------------------
constexpr int kTopkThreads = 1024;
constexpr int kTopkMaxBins = 2048;

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

// ---- multi-block top-k ---------------------------------------------------------
// Three launches over chunks of 2048 scores, one block each (grid: chunks x
// batch), for requests with seq_len > k:
//   1. TopkHist: histogram of the top 11 key bits, added into the request's
//      global histogram.
//   2. TopkCollect: every block finds the bin of the k-th largest key from the
//      global histogram, counts its keys above that bin, appends the keys in
//      it (the candidates) to a list and adds their next 11 bits into a second
//      global histogram. The last block to finish (a ticket) finds the
//      second-level bin from that histogram, the last 10 bits from one pass
//      over the candidates, counts per chunk the keys taken (all above the
//      threshold, and the first `rem` equal ones in position order) in a
//      second pass, turns the counts into each chunk's output offset, and
//      clears the histograms and counters for the next launch. Its passes keep
//      8 loads in flight per thread: it runs alone, on latency.
//   3. TopkWrite: every block writes its chunk's selected positions, in order,
//      at its offset.
constexpr int kTkThreads = 256;
constexpr int kTkPerThread = kTopkChunk / kTkThreads;
static_assert(kTkPerThread == 8, "8 scores per thread");
using TkScan = cub::BlockScan<int, kTkThreads>;

struct TopkWs {
  int* hist;        // [kTopkBins1] zero between launches; 16-byte aligned (FindBin)
  int* hist2;       // [kTopkBins2] the candidates' next 11 bits; zero between launches
  int* ticket;      // zero between launches
  int* n_cand;      // zero between launches
  int* thr_rem;     // [2] threshold key, equal keys to take
  int* gt;          // [chunks] keys above the first-level bin
  int* cgt;         // [chunks] candidates above the threshold
  int* ceq;         // [chunks] candidates equal to the threshold
  int* sel_before;  // [chunks] output offset of the chunk
  int* eq_before;   // [chunks] equal keys in earlier chunks
  uint32_t* cand_key;  // [score_stride]
  int* cand_pos;       // [score_stride]
};

__device__ __forceinline__ TopkWs WsFor(const TopkParams& p, int b) {
  const int64_t chunks = TopkChunks(p.score_stride);
  int* front = static_cast<int*>(p.workspace) + static_cast<int64_t>(b) * kTopkFrontInts;
  int* rest = static_cast<int*>(p.workspace) + static_cast<int64_t>(p.batch) * kTopkFrontInts +
              static_cast<int64_t>(b) * (5 * chunks + 2 * p.score_stride);
  TopkWs w;
  w.hist = front;
  w.hist2 = front + kTopkBins1;
  w.ticket = front + kTopkBins1 + kTopkBins2;
  w.n_cand = w.ticket + 1;
  w.thr_rem = w.ticket + 2;
  w.gt = rest;
  w.cgt = rest + chunks;
  w.ceq = rest + 2 * chunks;
  w.sel_before = rest + 3 * chunks;
  w.eq_before = rest + 4 * chunks;
  w.cand_key = reinterpret_cast<uint32_t*>(rest + 5 * chunks);
  w.cand_pos = rest + 5 * chunks + p.score_stride;
  return w;
}

// Over the kPer * kTkThreads bins of `h` read in descending order, finds the
// bin where the running count first reaches `need` (1 <= need <= total
// count). Every thread gets {bin, count above it}.
template <bool kFromGlobal, int kPer>
__device__ __forceinline__ int2 FindBin(const int* h, int need, typename TkScan::TempStorage& tmp,
                                        int2& s_out) {
  const int hi = kPer * kTkThreads - 1 - kPer * static_cast<int>(threadIdx.x);
  int c[kPer];  // c[j]: bin hi - j
  if constexpr (kFromGlobal && kPer % 4 == 0) {
    // 16-byte loads (the thread's bins are contiguous and 16-byte aligned).
    const int4* v = reinterpret_cast<const int4*>(h + hi - kPer + 1);
#pragma unroll
    for (int i = 0; i < kPer / 4; ++i) {
      const int4 x = __ldcg(v + i);
      c[kPer - 1 - 4 * i] = x.x;
      c[kPer - 2 - 4 * i] = x.y;
      c[kPer - 3 - 4 * i] = x.z;
      c[kPer - 4 - 4 * i] = x.w;
    }
  } else {
#pragma unroll
    for (int j = 0; j < kPer; ++j) c[j] = kFromGlobal ? __ldcg(h + hi - j) : h[hi - j];
  }
  int sum = 0;
#pragma unroll
  for (int j = 0; j < kPer; ++j) sum += c[j];
  int above;
  TkScan(tmp).ExclusiveSum(sum, above);
  if (above < need && above + sum >= need) {
    int run = above;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      if (run < need && run + c[j] >= need) s_out = make_int2(hi - j, run);
      run += c[j];
    }
  }
  __syncthreads();
  const int2 r = s_out;
  __syncthreads();
  return r;
}

__global__ void __launch_bounds__(kTkThreads) TopkHistKernel(const TopkParams p) {
  __shared__ int hist[kTopkBins1];
  dev::LaunchDependents();
  const int b = blockIdx.y, tid = threadIdx.x;
  const int64_t seq = p.seq_lens[b];
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kTopkChunk;
  if (seq <= p.k || c0 >= seq) return;
  for (int i = tid; i < kTopkBins1; i += kTkThreads) hist[i] = 0;
  __syncthreads();
  const float* sc = p.scores + b * p.score_stride + c0;
  const int n = static_cast<int>(seq - c0 < kTopkChunk ? seq - c0 : kTopkChunk);
  float v[kTkPerThread];
#pragma unroll
  for (int j = 0; j < kTkPerThread; ++j) {
    const int i = tid + j * kTkThreads;
    v[j] = i < n ? sc[i] : 0.0f;
  }
#pragma unroll
  for (int j = 0; j < kTkPerThread; ++j)
    if (tid + j * kTkThreads < n) atomicAdd(&hist[DevTopkKey(v[j]) >> kTopkShift1], 1);
  __syncthreads();
  AddHistogram(hist, WsFor(p, b).hist, kTopkBins1);
}

// The last block keeps up to kTkSmemCand candidates in shared memory between
// its two passes, and counts per chunk in shared memory for up to
// kTkSmemChunks chunks (else in the workspace).
constexpr int kTkSmemCand = 4096;
constexpr int kTkSmemChunks = kTopkBins2 / 2;

__global__ void __launch_bounds__(kTkThreads) TopkCollectKernel(const TopkParams p) {
  __shared__ typename TkScan::TempStorage scan_tmp;
  __shared__ int hist[kTopkBins2];
  __shared__ uint32_t s_ckey[kTkSmemCand];
  __shared__ int s_cpos[kTkSmemCand];
  __shared__ int2 s_find;
  __shared__ int s_base, s_last;
  const int b = blockIdx.y, tid = threadIdx.x, chunk = blockIdx.x;
  const int64_t seq = p.seq_lens[b];  // (not written by the kernel before: loaded before the wait)
  dev::GridDependencyWait();          // the histogram is complete
  dev::LaunchDependents();
  const int64_t c0 = static_cast<int64_t>(chunk) * kTopkChunk;
  if (seq <= p.k || c0 >= seq) return;
  const int64_t n_chunks = (seq + kTopkChunk - 1) / kTopkChunk;
  const TopkWs ws = WsFor(p, b);

  // The chunk's keys (in flight while the histogram is read), the
  // first-level bin of the k-th largest key and how many of its keys to take.
  const float* sc = p.scores + b * p.score_stride + c0;
  const int n = static_cast<int>(seq - c0 < kTopkChunk ? seq - c0 : kTopkChunk);
  uint32_t key[kTkPerThread];
#pragma unroll
  for (int j = 0; j < kTkPerThread; ++j) {
    const int i = tid + j * kTkThreads;
    key[j] = i < n ? DevTopkKey(sc[i]) : 0u;
  }
  for (int i = tid; i < kTopkBins2; i += kTkThreads) hist[i] = 0;  // (FindBin's barriers order it)
  const int2 f1 = FindBin<true, kTopkBins1 / kTkThreads>(ws.hist, p.k, scan_tmp, s_find);
  const uint32_t bin1 = static_cast<uint32_t>(f1.x);
  const int rem1 = p.k - f1.y;
  int n_gt = 0, n_c = 0;
#pragma unroll
  for (int j = 0; j < kTkPerThread; ++j) {
    const int i = tid + j * kTkThreads;
    n_gt += (i < n && (key[j] >> kTopkShift1) > bin1) ? 1 : 0;
    n_c += (i < n && (key[j] >> kTopkShift1) == bin1) ? 1 : 0;
  }
  // One scan of both counts (each at most kTopkChunk, so 16 bits apiece).
  int ex, tot;
  TkScan(scan_tmp).ExclusiveSum(n_c | (n_gt << 16), ex, tot);
  const int c_ex = ex & 0xFFFF, c_tot = tot & 0xFFFF;
  // The candidates' place in the list: the atomic is in flight while the
  // block counts their next 11 bits.
  int base = 0;
  if (tid == 0) {
    if (c_tot > 0) base = atomicAdd(ws.n_cand, c_tot);
    ws.gt[chunk] = tot >> 16;
    ws.cgt[chunk] = 0;
    ws.ceq[chunk] = 0;
  }
#pragma unroll
  for (int j = 0; j < kTkPerThread; ++j)
    if (tid + j * kTkThreads < n && (key[j] >> kTopkShift1) == bin1)
      atomicAdd(&hist[(key[j] >> kTopkShift2) & (kTopkBins2 - 1)], 1);
  if (tid == 0) s_base = base;
  __syncthreads();
  AddHistogram(hist, ws.hist2, kTopkBins2);
  int at = s_base + c_ex;
#pragma unroll
  for (int j = 0; j < kTkPerThread; ++j) {
    const int i = tid + j * kTkThreads;
    if (i < n && (key[j] >> kTopkShift1) == bin1) {
      ws.cand_key[at] = key[j];
      ws.cand_pos[at] = static_cast<int>(c0 + i);
      ++at;
    }
  }

  // The last block of the request resolves the threshold.
  __threadfence();
  __syncthreads();
  if (tid == 0) s_last = atomicAdd(ws.ticket, 1) == n_chunks - 1;
  __syncthreads();
  if (!s_last) return;
  __threadfence();

  // (every chunk's count above the first-level bin, loaded now for the
  // offsets at the end when one pass of the block covers the chunks)
  const bool one_pass = n_chunks <= kTkThreads;
  const int gt_early = one_pass && tid < n_chunks ? __ldcg(ws.gt + tid) : 0;
  const int n_cand = __ldcg(ws.n_cand);
  const bool cand_in_smem = n_cand <= kTkSmemCand;
  const int2 f2 = FindBin<true, kTopkBins2 / kTkThreads>(ws.hist2, rem1, scan_tmp, s_find);
  const uint32_t prefix = (bin1 << kTopkShift1) | (static_cast<uint32_t>(f2.x) << kTopkShift2);
  constexpr uint32_t kPrefixMask = ~static_cast<uint32_t>(kTopkBins3 - 1);
  int rem = rem1 - f2.y;
  // The last 10 bits, over the candidates sharing the first 22 (kept in shared
  // memory for the second pass when they fit).
  constexpr int kUnroll = 8;
  for (int i = tid; i < kTopkBins3; i += kTkThreads) hist[i] = 0;
  __syncthreads();
  for (int base = 0; base < n_cand; base += kUnroll * kTkThreads) {
    uint32_t k[kUnroll];
    int pos[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = base + u * kTkThreads + tid;
      k[u] = i < n_cand ? __ldcg(ws.cand_key + i) : 0u;
      pos[u] = i < n_cand && cand_in_smem ? __ldcg(ws.cand_pos + i) : 0;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = base + u * kTkThreads + tid;
      if (i >= n_cand) continue;
      if ((k[u] & kPrefixMask) == prefix) atomicAdd(&hist[k[u] & (kTopkBins3 - 1)], 1);
      if (cand_in_smem) {
        s_ckey[i] = k[u];
        s_cpos[i] = pos[u];
      }
    }
  }
  __syncthreads();
  const int2 f3 = FindBin<false, kTopkBins3 / kTkThreads>(hist, rem, scan_tmp, s_find);
  const uint32_t thr = prefix | static_cast<uint32_t>(f3.x);
  rem -= f3.y;

  // Per chunk: candidates above the threshold and equal to it.
  const bool count_in_smem = n_chunks <= kTkSmemChunks;
  int* cgt = count_in_smem ? hist : ws.cgt;
  int* ceq = count_in_smem ? hist + kTkSmemChunks : ws.ceq;
  if (count_in_smem)
    for (int i = tid; i < 2 * kTkSmemChunks; i += kTkThreads) hist[i] = 0;
  __syncthreads();
  for (int base = 0; base < n_cand; base += kUnroll * kTkThreads) {
    uint32_t k[kUnroll];
    int pos[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = base + u * kTkThreads + tid;
      const bool in = i < n_cand;
      k[u] = !in ? 0u : cand_in_smem ? s_ckey[i] : __ldcg(ws.cand_key + i);
      pos[u] = !in ? 0 : cand_in_smem ? s_cpos[i] : __ldcg(ws.cand_pos + i);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (base + u * kTkThreads + tid < n_cand && k[u] >= thr) {
        const int c = pos[u] / kTopkChunk;
        atomicAdd(k[u] > thr ? cgt + c : ceq + c, 1);
      }
    }
  }
  __syncthreads();

  // Chunk offsets: chunk c takes its keys above the threshold and the equal
  // ones whose rank among all equal keys (in position order) is below rem.
  int carry_eq = 0, carry_sel = 0;
  for (int64_t base = 0; base < n_chunks; base += kTkThreads) {
    const int64_t c = base + tid;
    const bool in = c < n_chunks;
    const int gt_c = !in ? 0 : one_pass ? gt_early : __ldcg(ws.gt + c);
    const int gtc = in ? gt_c + (count_in_smem ? cgt[c] : __ldcg(cgt + c)) : 0;
    const int eqc = in ? (count_in_smem ? ceq[c] : __ldcg(ceq + c)) : 0;
    int e_ex, e_tot, s_ex, s_tot;
    TkScan(scan_tmp).ExclusiveSum(eqc, e_ex, e_tot);
    __syncthreads();
    const int eq_before = carry_eq + e_ex;
    const int take = min(max(rem - eq_before, 0), eqc);
    TkScan(scan_tmp).ExclusiveSum(gtc + take, s_ex, s_tot);
    __syncthreads();
    if (in) {
      ws.sel_before[c] = carry_sel + s_ex;
      ws.eq_before[c] = eq_before;
    }
    carry_eq += e_tot;
    carry_sel += s_tot;
  }
  if (tid == 0) {
    ws.thr_rem[0] = static_cast<int>(thr);
    ws.thr_rem[1] = rem;
    *ws.ticket = 0;
    *ws.n_cand = 0;
  }
  for (int i = tid; i < kTopkBins1; i += kTkThreads) ws.hist[i] = 0;
  for (int i = tid; i < kTopkBins2; i += kTkThreads) ws.hist2[i] = 0;
}

__global__ void __launch_bounds__(kTkThreads) TopkWriteKernel(const TopkParams p) {
  __shared__ typename TkScan::TempStorage scan_tmp;
  __shared__ uint32_t s_key[kTopkChunk + kTopkChunk / 32];  // padded: conflict-free row reads
  const int b = blockIdx.y, tid = threadIdx.x, chunk = blockIdx.x;
  const int64_t seq = p.seq_lens[b];
  const int64_t c0 = static_cast<int64_t>(chunk) * kTopkChunk;
  // The scores are final before the collect kernel starts (it waits for the
  // kernel before it), so they are read before this kernel's wait.
  const bool active = seq > p.k && c0 < seq;
  const int n = active ? static_cast<int>(seq - c0 < kTopkChunk ? seq - c0 : kTopkChunk) : 0;
  const float* sc = p.scores + b * p.score_stride + c0;
  float v[kTkPerThread];
#pragma unroll
  for (int j = 0; j < kTkPerThread; ++j) {
    const int i = tid + j * kTkThreads;
    v[j] = i < n ? sc[i] : 0.0f;
  }
  // Thread t owns positions 8t .. 8t + 7 of the chunk.
#pragma unroll
  for (int j = 0; j < kTkPerThread; ++j) {
    const int i = tid + j * kTkThreads;
    s_key[i + (i >> 5)] = i < n ? DevTopkKey(v[j]) : 0u;
  }
  __syncthreads();
  uint32_t key[kTkPerThread];
#pragma unroll
  for (int j = 0; j < kTkPerThread; ++j) {
    const int i = tid * kTkPerThread + j;
    key[j] = s_key[i + (i >> 5)];
  }
  dev::GridDependencyWait();  // thresholds and chunk offsets are written
  int* out = p.indices + static_cast<int64_t>(b) * p.k;
  if (seq <= p.k) {
    if (chunk == 0)
      for (int i = tid; i < p.k; i += kTkThreads) out[i] = i < seq ? i : -1;
    return;
  }
  if (!active) return;
  const TopkWs ws = WsFor(p, b);
  const uint32_t thr = static_cast<uint32_t>(ws.thr_rem[0]);
  const int rem = ws.thr_rem[1];
  const int sel_before = ws.sel_before[chunk], eq_before = ws.eq_before[chunk];
  int n_eq = 0;
#pragma unroll
  for (int j = 0; j < kTkPerThread; ++j) n_eq += (tid * kTkPerThread + j < n && key[j] == thr) ? 1 : 0;
  int eq_ex;
  TkScan(scan_tmp).ExclusiveSum(n_eq, eq_ex);
  __syncthreads();
  int eq_rank = eq_before + eq_ex, n_sel = 0;
  bool sel[kTkPerThread];
#pragma unroll
  for (int j = 0; j < kTkPerThread; ++j) {
    const int i = tid * kTkPerThread + j;
    const bool eq = i < n && key[j] == thr;
    sel[j] = i < n && (key[j] > thr || (eq && eq_rank < rem));
    eq_rank += eq ? 1 : 0;
    n_sel += sel[j] ? 1 : 0;
  }
  int sel_ex;
  TkScan(scan_tmp).ExclusiveSum(n_sel, sel_ex);
  int at = sel_before + sel_ex;
#pragma unroll
  for (int j = 0; j < kTkPerThread; ++j)
    if (sel[j]) out[at++] = static_cast<int>(c0 + tid * kTkPerThread + j);
}

cudaError_t LaunchIndexer(const IndexerArgs& args, cudaStream_t stream) {
  const DsaIndexerParams& p = args.p;
  if (p.index_heads <= 0 || p.index_heads > kIdxMaxHeads || p.index_heads % 8 != 0)
    return cudaErrorInvalidValue;
  int dev = 0, sms = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (err != cudaSuccess) return err;
  err = cudaFuncSetAttribute(DsaIndexerKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(kIdxSmemBytes));
  if (err != cudaSuccess) return err;
  // Two resident blocks per SM over the whole batch, each over a run of whole
  // pages: one wave (a second, partial one would double the time of the
  // blocks in it).
  const int64_t pages = (p.max_seq_len + 63) / 64;
  const int64_t cap = std::max<int64_t>(1, 2 * static_cast<int64_t>(sms) / p.batch);
  const dim3 grid(static_cast<unsigned>(std::min(pages, cap)), p.batch);
  DsaIndexerKernel<<<grid, kIdxThreads, kIdxSmemBytes, stream>>>(args);
  return cudaGetLastError();
}

// The second and third launches of the multi-block top-k, each allowed to
// start while the previous kernel finishes.
cudaError_t LaunchTopkResolve(const TopkParams& p, dim3 grid, cudaStream_t stream) {
  cudaError_t err = dev::LaunchAfter(TopkCollectKernel, grid, dim3(kTkThreads), stream, p);
  if (err != cudaSuccess) return err;
  return dev::LaunchAfter(TopkWriteKernel, grid, dim3(kTkThreads), stream, p);
}

bool TopkGrid(const TopkParams& p, dim3& grid) {
  const int64_t chunks = std::max<int64_t>(1, TopkChunks(p.score_stride));
  if (chunks > 0x7FFFFFFF || p.batch > 65535) return false;
  grid = dim3(static_cast<unsigned>(chunks), p.batch);
  return true;
}

}  // namespace

cudaError_t LaunchDsaIndexer(const DsaIndexerParams& p, cudaStream_t stream) {
  if (p.batch <= 0 || p.max_seq_len <= 0) return cudaSuccess;
  IndexerArgs args;
  args.p = p;
  return LaunchIndexer(args, stream);
}

cudaError_t LaunchTopk(const TopkParams& p, cudaStream_t stream) {
  if (p.batch <= 0) return cudaSuccess;
  if (p.k <= 0 || p.k > 65535) return cudaErrorInvalidValue;
  if (p.workspace == nullptr) {
    TopkKernel<<<p.batch, kTopkThreads, 0, stream>>>(p);
    return cudaGetLastError();
  }
  dim3 grid;
  if (!TopkGrid(p, grid)) return cudaErrorInvalidValue;
  TopkHistKernel<<<grid, kTkThreads, 0, stream>>>(p);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  return LaunchTopkResolve(p, grid, stream);
}

cudaError_t LaunchDsaIndexerTopk(const DsaIndexerParams& p, const TopkParams& t, cudaStream_t stream) {
  if (t.workspace == nullptr || t.scores != p.scores || t.score_stride != p.score_stride ||
      t.seq_lens != p.seq_lens || t.batch != p.batch || t.k <= 0 || t.k > 65535)
    return cudaErrorInvalidValue;
  if (p.batch <= 0) return cudaSuccess;
  dim3 grid;
  if (!TopkGrid(t, grid)) return cudaErrorInvalidValue;
  if (p.max_seq_len > t.k) {  // otherwise nothing needs a score
    IndexerArgs args;
    args.p = p;
    args.hist = static_cast<int*>(t.workspace);
    args.k = t.k;
    const cudaError_t err = LaunchIndexer(args, stream);
    if (err != cudaSuccess) return err;
  }
  return LaunchTopkResolve(t, grid, stream);
}

}  // namespace strata::cuda
