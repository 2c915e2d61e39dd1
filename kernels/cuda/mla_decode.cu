#include "kernels/cuda/mla_decode.h"

#include <cuda_bf16.h>

#include <algorithm>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/kv_layout.h"

namespace strata::cuda {
namespace {

// ---- tile configuration ----------------------------------------------------
constexpr int kHeadsPerBlock = 64;            // 4 head tiles of 16 (the MMA M)
constexpr int kWarps = 16;                    // warp w: head tile w / 4, quarter w % 4
constexpr int kThreads = kWarps * 32;
constexpr int kTileRows = kPageTokens;        // 64 tokens (or index entries) per step
constexpr int kRowStride = kRowDim + 8;       // bf16 elements; 1168 B rows: ldmatrix conflict-free
constexpr int kSStride = kTileRows + 8;       // floats; 64-bit fragment accesses conflict-free
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

static_assert(kHeadsPerBlock == 4 * 16 && kWarps == 16, "4 head tiles x 4 quarters");
static_assert(kTileRows == 4 * 16, "QK: each quarter warp owns 16 tokens");
static_assert(kLatentDim == 4 * 128, "PV: each quarter warp owns 128 latent dims");
static_assert((kRowStride * 2) % 16 == 0 && ((kRowStride * 2 / 16) & 1) == 1,
              "row stride must be an odd number of 16-byte units");

struct Smem {
  __nv_bfloat16 q[kHeadsPerBlock][kRowStride];    // queries of the block's 64 heads
  __nv_bfloat16 kv[kTileRows][kRowStride];        // the tile widened to bf16 (latent | rope)
  uint8_t raw_latent[kTileRows][kLatentDim];      // the next tile's codes, as loaded
  uint8_t raw_rope[kTileRows][kRopeDim];
  float raw_scale[kTileRows][2];
  float s[kHeadsPerBlock][kSStride];              // scores of the tile, log2 units
  float c_scale[kTileRows];                       // usable scale, 0 for masked rows
  float r_scale[kTileRows];
  int valid[kTileRows];
  // Row maps of the next tiles, a ring of two indexed by tile & 1: the pool page
  // of each row (-1 when masked) and its slot. Filled two tiles ahead, so the
  // page-table (and index) loads are off the critical path of the tile loop.
  int row_page[2][kTileRows];
  int row_slot[2][kTileRows];
};
static_assert(sizeof(Smem) <= 227 * 1024, "fits one block per SM");

// Maps entry `e` of request `b` to its pool page (or -1 when masked).
__device__ __forceinline__ int64_t RowPage(const MlaDecodeParams& p, int b, int64_t e,
                                           int& slot) {
  int64_t pos = e;
  if (p.indices != nullptr) {
    if (e >= p.index_stride) return -1;
    pos = p.indices[b * p.index_stride + e];
  }
  if (pos < 0 || pos >= p.seq_lens[b]) return -1;
  slot = static_cast<int>(pos & (kPageTokens - 1));
  return p.page_table[(p.page_row ? p.page_row[b] : b) * p.page_table_stride + (pos / kPageTokens)];
}

// Issues the cp.async copies of tile `tile` into the raw buffers, with the
// row map of that tile already in the ring.
__device__ __forceinline__ void LoadTile(const MlaDecodeParams& p, Smem& sm, int64_t tile) {
  const int tid = threadIdx.x;
  const int* const row_page = sm.row_page[tile & 1];
  const int* const row_slot = sm.row_slot[tile & 1];
#pragma unroll
  for (int i = 0; i < kTileRows * 32 / kThreads; ++i) {  // latent: 64 rows x 32 chunks
    const int c = tid + i * kThreads;
    const int row = c >> 5, part = c & 31;
    const int page = row_page[row];
    const uint8_t* src = page >= 0 ? p.pool + static_cast<size_t>(page) * kPageBytes +
                                         kPageLatentOffset + row_slot[row] * kLatentDim + part * 16
                                   : p.pool;
    dev::CpAsync16(&sm.raw_latent[row][part * 16], src, page >= 0);
  }
  if (tid < kTileRows * 4) {  // rope: 64 rows x 4 chunks
    const int row = tid >> 2, part = tid & 3;
    const int page = row_page[row];
    const uint8_t* src = page >= 0 ? p.pool + static_cast<size_t>(page) * kPageBytes +
                                         kPageRopeOffset + row_slot[row] * kRopeDim + part * 16
                                   : p.pool;
    dev::CpAsync16(&sm.raw_rope[row][part * 16], src, page >= 0);
  } else if (tid < kTileRows * 5) {  // scales: 64 rows x 8 bytes
    const int row = tid - kTileRows * 4;
    const int page = row_page[row];
    const uint8_t* src = page >= 0 ? p.pool + static_cast<size_t>(page) * kPageBytes +
                                         kPageScaleOffset + row_slot[row] * 8
                                   : p.pool;
    dev::CpAsync8(&sm.raw_scale[row][0], src, page >= 0);
  }
}

// Widens the raw tile to bf16 and publishes the per-row scales and validity.
__device__ __forceinline__ void ConvertTile(Smem& sm, int64_t tile) {
  const int tid = threadIdx.x;
#pragma unroll
  for (int i = 0; i < kTileRows * 32 / kThreads; ++i) {
    const int c = tid + i * kThreads;
    const int row = c >> 5, part = c & 31;
    const uint4 codes = *reinterpret_cast<const uint4*>(&sm.raw_latent[row][part * 16]);
    uint4 lo, hi;
    dev::E4m3x16ToBf16(codes, lo, hi);
    uint4* dst = reinterpret_cast<uint4*>(&sm.kv[row][part * 16]);
    dst[0] = lo;
    dst[1] = hi;
  }
  if (tid < kTileRows * 4) {
    const int row = tid >> 2, part = tid & 3;
    const uint4 codes = *reinterpret_cast<const uint4*>(&sm.raw_rope[row][part * 16]);
    uint4 lo, hi;
    dev::E4m3x16ToBf16(codes, lo, hi);
    uint4* dst = reinterpret_cast<uint4*>(&sm.kv[row][kLatentDim + part * 16]);
    dst[0] = lo;
    dst[1] = hi;
  } else if (tid < kTileRows * 5) {
    const int row = tid - kTileRows * 4;
    const bool valid = sm.row_page[tile & 1][row] >= 0;
    sm.valid[row] = valid ? 1 : 0;
    sm.c_scale[row] = valid ? dev::UsableScale(sm.raw_scale[row][0]) : 0.0f;
    sm.r_scale[row] = valid ? dev::UsableScale(sm.raw_scale[row][1]) : 0.0f;
  }
}

// Loads the block's 64 query heads into shared memory as bf16 (zeros past
// `heads`), latent in columns 0..511 and rope in 512..575.
__device__ __forceinline__ void LoadQueries(const MlaDecodeParams& p, Smem& sm, int b, int h0) {
  constexpr int kChunks = kRowDim / 8;  // 8 elements per chunk
  for (int c = threadIdx.x; c < kHeadsPerBlock * kChunks; c += kThreads) {
    const int row = c / kChunks, part = c % kChunks;
    const int h = h0 + row;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (h < p.heads) {
      const bool latent = part < kLatentDim / 8;
      const int64_t base = latent ? (static_cast<int64_t>(b) * p.heads + h) * kLatentDim + part * 8
                                  : (static_cast<int64_t>(b) * p.heads + h) * kRopeDim +
                                        (part - kLatentDim / 8) * 8;
      const void* src = latent ? p.q_abs : p.q_pe;
      if (p.q_is_bf16) {
        v = *reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(src) + base);
      } else {
        const float4* f = reinterpret_cast<const float4*>(static_cast<const float*>(src) + base);
        const float4 a = f[0], d = f[1];
        v = make_uint4(dev::PackBf16x2(a.x, a.y), dev::PackBf16x2(a.z, a.w),
                       dev::PackBf16x2(d.x, d.y), dev::PackBf16x2(d.z, d.w));
      }
    }
    *reinterpret_cast<uint4*>(&sm.q[row][part * 8]) = v;
  }
}

__global__ void __launch_bounds__(kThreads, 1) MlaDecodeSplitKernel(const MlaDecodeParams p) {
  extern __shared__ __align__(128) uint8_t smem_raw[];
  Smem& sm = *reinterpret_cast<Smem*>(smem_raw);

  const int* w = p.work + 4 * blockIdx.x;
  const int b = w[0], split = w[1];
  const int64_t tile_begin = w[2], tile_end = w[3];
  const int h0 = blockIdx.y * kHeadsPerBlock;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int ht = warp >> 2, quarter = warp & 3;
  const int g = lane >> 2, q = lane & 3;
  const float scale_log2 = p.softmax_scale * kLog2e;

  // Row maps of the first two tiles (later ones are fetched two tiles ahead).
  const bool mapper = threadIdx.x < kTileRows;
  if (mapper) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int64_t t = tile_begin + j;
      if (t < tile_end) {
        int slot = 0;
        const int64_t page = RowPage(p, b, t * kTileRows + threadIdx.x, slot);
        sm.row_page[t & 1][threadIdx.x] = static_cast<int>(page);
        sm.row_slot[t & 1][threadIdx.x] = slot;
      }
    }
  }
  __syncthreads();
  if (tile_begin < tile_end) LoadTile(p, sm, tile_begin);
  dev::CpAsyncCommit();
  LoadQueries(p, sm, b, h0);

  float o[16][4];  // 16 heads x 128 dims: n-tile j covers dims quarter*128 + 8j
#pragma unroll
  for (int j = 0; j < 16; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY};  // rows g and g+8 of the head tile
  float l_run[2] = {0.0f, 0.0f};            // this thread's share of the row sums

  for (int64_t tile = tile_begin; tile < tile_end; ++tile) {
    dev::CpAsyncWaitAll();
    __syncthreads();  // raw tile landed; every warp is done with the previous tile
    ConvertTile(sm, tile);
    __syncthreads();  // bf16 tile ready; raw buffers and this tile's row map free
    if (tile + 1 < tile_end) LoadTile(p, sm, tile + 1);
    dev::CpAsyncCommit();

    // Row map of tile + 2, first half: the position (sparse: an index load) and,
    // for dense, the page-table load. Consumed after P.V, so the loads overlap
    // this tile's math.
    int pf_pos = -1, pf_page = -1;
    if (mapper && tile + 2 < tile_end) {
      const int64_t e = (tile + 2) * kTileRows + threadIdx.x;
      if (p.indices != nullptr) {
        pf_pos = e < p.index_stride ? p.indices[b * p.index_stride + e] : -1;
      } else if (e < p.seq_lens[b]) {
        pf_pos = static_cast<int>(e);
        pf_page = p.page_table[(p.page_row ? p.page_row[b] : b) * p.page_table_stride + e / kPageTokens];
      }
    }

    // ---- S = Q K^T for 16 heads x 16 tokens (this warp's quarter) ---------
    float acc_c[2][4] = {}, acc_r[2][4] = {};
    const __nv_bfloat16* qa = &sm.q[ht * 16 + (lane & 15)][(lane >> 4) * 8];
    const __nv_bfloat16* kb =
        &sm.kv[quarter * 16 + (lane & 7) + ((lane >> 4) << 3)][((lane >> 3) & 1) * 8];
#pragma unroll 8
    for (int ks = 0; ks < kLatentDim / 16; ++ks) {
      uint32_t a[4], bb[4];
      dev::Ldmatrix4(a, qa + ks * 16);
      dev::Ldmatrix4(bb, kb + ks * 16);
      dev::MmaBf16(acc_c[0], a, bb[0], bb[1]);
      dev::MmaBf16(acc_c[1], a, bb[2], bb[3]);
    }
#pragma unroll
    for (int ks = kLatentDim / 16; ks < kRowDim / 16; ++ks) {
      uint32_t a[4], bb[4];
      dev::Ldmatrix4(a, qa + ks * 16);
      dev::Ldmatrix4(bb, kb + ks * 16);
      dev::MmaBf16(acc_r[0], a, bb[0], bb[1]);
      dev::MmaBf16(acc_r[1], a, bb[2], bb[3]);
    }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const int t = quarter * 16 + nt * 8 + 2 * q;
      float v[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int tt = t + (e & 1);
        const float s = (acc_c[nt][e] * sm.c_scale[tt] + acc_r[nt][e] * sm.r_scale[tt]) * scale_log2;
        v[e] = sm.valid[tt] ? s : -INFINITY;
      }
      *reinterpret_cast<float2*>(&sm.s[ht * 16 + g][t]) = make_float2(v[0], v[1]);
      *reinterpret_cast<float2*>(&sm.s[ht * 16 + g + 8][t]) = make_float2(v[2], v[3]);
    }
    __syncthreads();  // the whole 64 x 64 score tile is in shared memory

    // ---- online softmax over the tile's 64 tokens (rows g, g+8) ----------
    const float* s0 = sm.s[ht * 16 + g];
    const float* s1 = sm.s[ht * 16 + g + 8];
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const float2 a0 = *reinterpret_cast<const float2*>(s0 + kk * 16 + 2 * q);
      const float2 a1 = *reinterpret_cast<const float2*>(s0 + kk * 16 + 8 + 2 * q);
      const float2 c0 = *reinterpret_cast<const float2*>(s1 + kk * 16 + 2 * q);
      const float2 c1 = *reinterpret_cast<const float2*>(s1 + kk * 16 + 8 + 2 * q);
      mx[0] = fmaxf(mx[0], fmaxf(fmaxf(a0.x, a0.y), fmaxf(a1.x, a1.y)));
      mx[1] = fmaxf(mx[1], fmaxf(fmaxf(c0.x, c0.y), fmaxf(c1.x, c1.y)));
    }
    float m_use[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float m_new = fmaxf(m_run[r], mx[r]);
      m_use[r] = m_new == -INFINITY ? 0.0f : m_new;
      const float alpha = exp2f(m_run[r] - m_use[r]);
      l_run[r] *= alpha;
      m_run[r] = m_new;
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        o[j][2 * r] *= alpha;
        o[j][2 * r + 1] *= alpha;
      }
    }

    // ---- O += P' V with P' = p * c_scale (bf16), V = codes (bf16) ---------
    const __nv_bfloat16* vb =
        &sm.kv[(lane & 7) + (((lane >> 3) & 1) << 3)][quarter * 128 + (lane >> 4) * 8];
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const int t0 = kk * 16 + 2 * q, t1 = t0 + 8;
      const float2 a0 = *reinterpret_cast<const float2*>(s0 + t0);
      const float2 a1 = *reinterpret_cast<const float2*>(s0 + t1);
      const float2 c0 = *reinterpret_cast<const float2*>(s1 + t0);
      const float2 c1 = *reinterpret_cast<const float2*>(s1 + t1);
      const float p00 = exp2f(a0.x - m_use[0]), p01 = exp2f(a0.y - m_use[0]);
      const float p02 = exp2f(a1.x - m_use[0]), p03 = exp2f(a1.y - m_use[0]);
      const float p10 = exp2f(c0.x - m_use[1]), p11 = exp2f(c0.y - m_use[1]);
      const float p12 = exp2f(c1.x - m_use[1]), p13 = exp2f(c1.y - m_use[1]);
      l_run[0] += (p00 + p01) + (p02 + p03);
      l_run[1] += (p10 + p11) + (p12 + p13);
      const float cs0 = sm.c_scale[t0], cs1 = sm.c_scale[t0 + 1];
      const float cs2 = sm.c_scale[t1], cs3 = sm.c_scale[t1 + 1];
      uint32_t pa[4];
      pa[0] = dev::PackBf16x2(p00 * cs0, p01 * cs1);
      pa[1] = dev::PackBf16x2(p10 * cs0, p11 * cs1);
      pa[2] = dev::PackBf16x2(p02 * cs2, p03 * cs3);
      pa[3] = dev::PackBf16x2(p12 * cs2, p13 * cs3);
      const __nv_bfloat16* vk = vb + kk * 16 * kRowStride;
#pragma unroll
      for (int np = 0; np < 8; ++np) {
        uint32_t bb[4];
        dev::Ldmatrix4Trans(bb, vk + np * 16);
        dev::MmaBf16(o[2 * np], pa, bb[0], bb[1]);
        dev::MmaBf16(o[2 * np + 1], pa, bb[2], bb[3]);
      }
    }

    // Row map of tile + 2, second half (the slot of `tile`, whose readers all
    // passed the barrier after the conversion; LoadTile(tile + 2) reads it after
    // the next iteration's first barrier).
    if (mapper && tile + 2 < tile_end) {
      if (p.indices != nullptr) {
        pf_page = pf_pos >= 0 && pf_pos < p.seq_lens[b]
                      ? p.page_table[(p.page_row ? p.page_row[b] : b) * p.page_table_stride + pf_pos / kPageTokens]
                      : -1;
      }
      sm.row_page[tile & 1][threadIdx.x] = pf_page;
      sm.row_slot[tile & 1][threadIdx.x] = pf_pos & (kPageTokens - 1);
    }
  }

  // ---- epilogue ------------------------------------------------------------
  float l_tot[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_tot[r] = l_run[r] + __shfl_xor_sync(0xffffffffu, l_run[r], 1);
    l_tot[r] = l_tot[r] + __shfl_xor_sync(0xffffffffu, l_tot[r], 2);
  }
  const int slot = p.split_offset[b] + split;
  const bool single = p.split_offset[b + 1] - p.split_offset[b] == 1;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int h = h0 + ht * 16 + g + 8 * r;
    if (h >= p.heads) continue;
    if (single) {
      const float inv = l_tot[r] > 0.0f ? 1.0f / l_tot[r] : 0.0f;
      float* dst = p.out + (static_cast<int64_t>(b) * p.heads + h) * kLatentDim + quarter * 128;
#pragma unroll
      for (int j = 0; j < 16; ++j)
        *reinterpret_cast<float2*>(dst + j * 8 + 2 * q) =
            make_float2(o[j][2 * r] * inv, o[j][2 * r + 1] * inv);
      if (quarter == 0 && q == 0)
        p.lse[static_cast<int64_t>(b) * p.heads + h] =
            l_tot[r] > 0.0f ? (m_run[r] + log2f(l_tot[r])) * kLn2 : -INFINITY;
    } else {
      float* dst = p.o_partial + (static_cast<int64_t>(slot) * p.heads + h) * kLatentDim + quarter * 128;
#pragma unroll
      for (int j = 0; j < 16; ++j)
        *reinterpret_cast<float2*>(dst + j * 8 + 2 * q) = make_float2(o[j][2 * r], o[j][2 * r + 1]);
      if (quarter == 0 && q == 0)
        *reinterpret_cast<float2*>(p.ml_partial + (static_cast<int64_t>(slot) * p.heads + h) * 2) =
            make_float2(m_run[r], l_tot[r]);
    }
  }
}

// One block per (request, head): four groups of 128 threads, each thread 4
// dims. Group g accumulates splits g, g + 4, ... (four loads in flight per
// thread), then the groups are added in a fixed order, so the bits depend on
// the request's splits only.
constexpr int kMergeGroups = 4;
constexpr int kMergeThreads = kMergeGroups * kLatentDim / 4;

__global__ void __launch_bounds__(kMergeThreads) MlaDecodeMergeKernel(const MlaDecodeParams p) {
  __shared__ float s_red[kMergeThreads / 32];
  __shared__ float4 s_acc[kMergeGroups - 1][kLatentDim / 4];
  __shared__ float s_l[kMergeGroups];
  const int b = blockIdx.x, h = blockIdx.y;
  const int first = p.split_offset[b], n = p.split_offset[b + 1] - first;
  if (n <= 1) return;  // written by the split kernel
  const int tid = threadIdx.x, grp = tid / (kLatentDim / 4), col = tid % (kLatentDim / 4);
  const float* ml = p.ml_partial + (static_cast<int64_t>(first) * p.heads + h) * 2;
  const int64_t ml_step = static_cast<int64_t>(p.heads) * 2;

  // The largest running max over the splits (fmaxf: exact, order-free).
  float m = -INFINITY;
  for (int s = tid; s < n; s += kMergeThreads) m = fmaxf(m, ml[s * ml_step]);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  if ((tid & 31) == 0) s_red[tid >> 5] = m;
  __syncthreads();
  m = s_red[0];
#pragma unroll
  for (int i = 1; i < kMergeThreads / 32; ++i) m = fmaxf(m, s_red[i]);

  // Group sums; an empty split (sum 0) or an all-empty request weighs 0.
  float l = 0.0f;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  const float4* o = reinterpret_cast<const float4*>(
      p.o_partial + (static_cast<int64_t>(first) * p.heads + h) * kLatentDim) + col;
  const int64_t o_step = static_cast<int64_t>(p.heads) * (kLatentDim / 4);
  constexpr int kUnroll = 4;
  for (int s0 = grp; s0 < n; s0 += kMergeGroups * kUnroll) {
    float wgt[kUnroll], ls[kUnroll];
    float4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int s = s0 + u * kMergeGroups;
      wgt[u] = 0.0f;
      ls[u] = 0.0f;
      v[u] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (s < n) {
        const float2 mls = *reinterpret_cast<const float2*>(ml + s * ml_step);
        v[u] = o[s * o_step];  // every split's partial is written, empty ones as zeros
        if (mls.y > 0.0f && m != -INFINITY) {
          wgt[u] = exp2f(mls.x - m);
          ls[u] = mls.y;
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      l += wgt[u] * ls[u];
      acc.x += wgt[u] * v[u].x;
      acc.y += wgt[u] * v[u].y;
      acc.z += wgt[u] * v[u].z;
      acc.w += wgt[u] * v[u].w;
    }
  }
  if (grp > 0) {
    s_acc[grp - 1][col] = acc;
    if (col == 0) s_l[grp] = l;
  }
  __syncthreads();
  if (grp != 0) return;
#pragma unroll
  for (int g = 1; g < kMergeGroups; ++g) {
    const float4 a = s_acc[g - 1][col];
    acc.x += a.x;
    acc.y += a.y;
    acc.z += a.z;
    acc.w += a.w;
    l += s_l[g];
  }
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  const int64_t orow = static_cast<int64_t>(b) * p.heads + h;
  reinterpret_cast<float4*>(p.out + orow * kLatentDim)[col] =
      make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
  if (col == 0) p.lse[orow] = l > 0.0f ? (m + log2f(l)) * kLn2 : -INFINITY;
}

}  // namespace

int MlaSplitCount(int64_t length, int heads, const MlaSplitPolicy& policy, bool sparse) {
  const int64_t tiles = (length + kTileRows - 1) / kTileRows;
  if (tiles <= 0) return 1;
  const int groups = (heads + kHeadsPerBlock - 1) / kHeadsPerBlock;
  const int64_t target = std::max(1, policy.num_sms / std::max(1, groups));
  const int min_tiles = sparse ? policy.sparse_min_tiles_per_split : policy.min_tiles_per_split;
  const int64_t per_split =
      std::max<int64_t>(std::max(1, min_tiles), (tiles + target - 1) / target);
  return static_cast<int>((tiles + per_split - 1) / per_split);
}

MlaDecodePlan PlanMlaDecode(const int64_t* lengths, int batch, int heads,
                            const MlaSplitPolicy& policy, bool sparse) {
  MlaDecodePlan plan;
  plan.split_offset.assign(batch + 1, 0);
  for (int b = 0; b < batch; ++b) {
    const int64_t tiles = (std::max<int64_t>(lengths[b], 0) + kTileRows - 1) / kTileRows;
    const int splits = MlaSplitCount(lengths[b], heads, policy, sparse);
    const int64_t per = (tiles + splits - 1) / splits;
    for (int s = 0; s < splits; ++s) {
      const int64_t begin = std::min<int64_t>(tiles, s * per);
      const int64_t end = std::min<int64_t>(tiles, begin + per);
      plan.work.insert(plan.work.end(),
                       {b, s, static_cast<int>(begin), static_cast<int>(end)});
    }
    plan.split_offset[b + 1] = plan.split_offset[b] + splits;
  }
  plan.num_work = static_cast<int>(plan.work.size() / 4);
  plan.total_splits = plan.split_offset[batch];
  return plan;
}

cudaError_t LaunchMlaDecode(const MlaDecodeParams& p, cudaStream_t stream) {
  if (p.batch <= 0 || p.num_work <= 0) return cudaSuccess;
  if (p.heads <= 0) return cudaErrorInvalidValue;
  const size_t smem = sizeof(Smem);
  cudaError_t err = cudaFuncSetAttribute(MlaDecodeSplitKernel,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  const dim3 grid(p.num_work, (p.heads + kHeadsPerBlock - 1) / kHeadsPerBlock);
  MlaDecodeSplitKernel<<<grid, kThreads, smem, stream>>>(p);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  MlaDecodeMergeKernel<<<dim3(p.batch, p.heads), kMergeThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace strata::cuda
