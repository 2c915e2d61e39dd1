#include "kernels/cuda/dsa_indexer.h"

#include <cuda_bf16.h>

#include <algorithm>
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
//
// Persistent warps (two blocks per SM): warp w of block x scores the 16-token
// tiles x * 8 + w + i * (gridDim.x * 8), with the next tile's keys in flight
// (in registers) while it scores one. The pages of a warp's tiles are loaded
// 32 tiles at a time ahead of the keys, so a tile's loads wait on nothing.
constexpr int kIdxWarps = 8;
constexpr int kIdxThreads = kIdxWarps * 32;
constexpr int kIdxTokensPerBlock = kIdxWarps * 16;
constexpr int kIdxMaxHeads = 64;
constexpr int kIdxQStride = kIndexDim + 16;   // 288-byte rows: 8-byte fragment loads conflict-free

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

// Raw key bytes and scale of rows g and g + 8 of one 16-token tile, as loaded
// (NaN codes and unusable scales are cleared at use, so that the loads of the
// next tile stay in flight while this one is scored).
struct IdxTile {
  uint4 lo[2], hi[2];
  float scale[2];
};

__device__ __forceinline__ void LoadIdxTile(const uint8_t* pool, int page, int64_t seq, int64_t t0, int g,
                                            int q, IdxTile& k) {
  k.lo[0] = k.lo[1] = k.hi[0] = k.hi[1] = make_uint4(0, 0, 0, 0);
  k.scale[0] = k.scale[1] = 0.0f;
  if (t0 >= seq) return;
  // The 16 tokens of a tile share one page (tiles are 16-aligned).
  const uint8_t* base = pool + static_cast<size_t>(page) * kIndexPageBytes;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t t = t0 + g + 8 * r;
    if (t < seq) {
      const int slot = static_cast<int>(t & 63);
      const uint4* src = reinterpret_cast<const uint4*>(base + slot * kIndexDim + q * 32);
      k.lo[r] = src[0];
      k.hi[r] = src[1];
      k.scale[r] = reinterpret_cast<const float*>(base + kIndexPageScaleOffset)[slot];
    }
  }
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
  __shared__ __align__(16) __nv_bfloat16 q_s[kIdxMaxHeads][kIdxQStride];
  __shared__ float w_s[kIdxMaxHeads];
  __shared__ int hist_s[kTopkBins1];  // the fused top-k's first-level histogram
  dev::LaunchDependents();
  const int b = blockIdx.y;
  const int tid = threadIdx.x;
  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, q = lane & 3;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kIdxTokensPerBlock;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kIdxTokensPerBlock + warp * 16;
  const int64_t seq = p.seq_lens[b];
  const int* table = p.page_table + (p.page_row ? p.page_row[b] : b) * p.page_table_stride;
  // Lane l holds the page of tile (i & ~31) + l while tile i is loaded. The
  // first 32 are loaded before the length is known (the entry clamped to the
  // table row; a page past the sequence is never used).
  int page_of_lane = p.page_table_stride > 0
                         ? table[std::min<int64_t>((first + lane * step) / 64, p.page_table_stride - 1)]
                         : 0;
  const bool fused = args.hist != nullptr;
  if (fused && seq <= args.k) return;  // top-k selects every position
  if (static_cast<int64_t>(blockIdx.x) * kIdxTokensPerBlock >= seq) return;  // the whole block
  const int heads = p.index_heads;
  const int n_tiles = first < seq ? static_cast<int>((seq - first + step - 1) / step) : 0;
  auto load_pages = [&](int base) {
    const int i = base + lane;
    page_of_lane = i < n_tiles ? table[(first + i * step) / 64] : 0;
  };
  auto load_tile = [&](int i, IdxTile& k) {
    if (i < n_tiles && (i & 31) == 0 && i > 0) load_pages(i);
    const int page = __shfl_sync(0xffffffffu, page_of_lane, i & 31);
    LoadIdxTile(p.pool, page, i < n_tiles ? seq : 0, first + i * step, g, q, k);
  };
  IdxTile cur;
  load_tile(0, cur);  // in flight while the queries are staged

  // The queries: 8 loads in flight per thread.
  constexpr int kQChunks = kIdxMaxHeads * (kIndexDim / 4) / kIdxThreads;
  uint2 qv[kQChunks];
#pragma unroll
  for (int j = 0; j < kQChunks; ++j) {
    const int c = tid + j * kIdxThreads, h = c / (kIndexDim / 4), c4 = c % (kIndexDim / 4);
    qv[j] = make_uint2(0, 0);
    if (h < heads) {
      const int64_t base = (static_cast<int64_t>(b) * heads + h) * kIndexDim + c4 * 4;
      if (p.q_is_bf16) {
        qv[j] = *reinterpret_cast<const uint2*>(static_cast<const __nv_bfloat16*>(p.q) + base);
      } else {
        const float4 f = *reinterpret_cast<const float4*>(static_cast<const float*>(p.q) + base);
        qv[j] = make_uint2(dev::PackBf16x2(f.x, f.y), dev::PackBf16x2(f.z, f.w));
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kQChunks; ++j) {
    const int c = tid + j * kIdxThreads, h = c / (kIndexDim / 4), c4 = c % (kIndexDim / 4);
    *reinterpret_cast<uint2*>(&q_s[h][(c4 % 8) * 16 + (c4 / 8) * 4]) = qv[j];
  }
  if (tid < kIdxMaxHeads) w_s[tid] = tid < heads ? p.weights[static_cast<int64_t>(b) * heads + tid] : 0.0f;
  if (fused)
    for (int i = tid; i < kTopkBins1; i += kIdxThreads) hist_s[i] = 0;
  __syncthreads();

  const int n_head_tiles = heads / 8;
  float w_head[8][2];  // this thread's head weights (columns 2q, 2q + 1 of each head tile)
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
    w_head[nt][0] = w_s[nt * 8 + 2 * q];
    w_head[nt][1] = w_s[nt * 8 + 2 * q + 1];
  }
  for (int i = 0; i < n_tiles; ++i) {
    const int64_t t0 = first + i * step;
    IdxTile nxt;
    load_tile(i + 1, nxt);

    uint32_t words[2][8];
    float kscale[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const bool in = t0 + g + 8 * r < seq;
      kscale[r] = in ? dev::UsableScale(cur.scale[r]) : 0.0f;
      words[r][0] = dev::ClearNanCodes(cur.lo[r].x);
      words[r][1] = dev::ClearNanCodes(cur.lo[r].y);
      words[r][2] = dev::ClearNanCodes(cur.lo[r].z);
      words[r][3] = dev::ClearNanCodes(cur.lo[r].w);
      words[r][4] = dev::ClearNanCodes(cur.hi[r].x);
      words[r][5] = dev::ClearNanCodes(cur.hi[r].y);
      words[r][6] = dev::ClearNanCodes(cur.hi[r].z);
      words[r][7] = dev::ClearNanCodes(cur.hi[r].w);
    }

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
        if (nt < n_head_tiles) {
          const uint2 bq = *reinterpret_cast<const uint2*>(&q_s[nt * 8 + g][ks * 16 + q * 4]);
          dev::MmaBf16(acc[nt], a, bq.x, bq.y);
        }
      }
    }
    float sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      if (nt < n_head_tiles) {
        const float w0 = w_head[nt][0], w1 = w_head[nt][1];
        sum[0] += w0 * fmaxf(acc[nt][0], 0.0f) + w1 * fmaxf(acc[nt][1], 0.0f);
        sum[1] += w0 * fmaxf(acc[nt][2], 0.0f) + w1 * fmaxf(acc[nt][3], 0.0f);
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 1);
      sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 2);
      const int64_t t = t0 + g + 8 * r;
      if (q == 0 && t < seq) {
        const float score = kscale[r] * sum[r];
        p.scores[b * p.score_stride + t] = score;
        if (fused) atomicAdd(&hist_s[DevTopkKey(score) >> kTopkShift1], 1);
      }
    }
    cur = nxt;
  }
  if (!fused) return;
  __syncthreads();
  AddHistogram(hist_s, args.hist + static_cast<int64_t>(b) * kTopkFrontInts, kTopkBins1);
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
  // Two resident blocks per SM over the whole batch; each warp then loops over
  // its tiles with the next one's keys in flight.
  const int64_t blocks = (p.max_seq_len + kIdxTokensPerBlock - 1) / kIdxTokensPerBlock;
  const int64_t cap = std::max<int64_t>(1, (2 * static_cast<int64_t>(sms) + p.batch - 1) / p.batch);
  const dim3 grid(static_cast<unsigned>(std::min(blocks, cap)), p.batch);
  DsaIndexerKernel<<<grid, kIdxThreads, 0, stream>>>(args);
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
