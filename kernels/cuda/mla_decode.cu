#include "kernels/cuda/mla_decode.h"

#include <cuda_bf16.h>

#include <algorithm>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/kv_layout.h"
#include "kernels/cuda/wgmma.cuh"

namespace strata::cuda {
namespace {

// ---- tile configuration ----------------------------------------------------
// A block handles one split of one request for 64 heads with two warpgroups.
// Per 64-row tile: S = Q K^T with the 576-d contraction cut between the
// warpgroups (wgmma m64n64k16, both operands in shared memory), the partial
// scores exchanged through shared memory so both hold the same S, the online
// softmax in registers, then O += P' V with P' in registers and each
// warpgroup owning 256 of the 512 latent dims (wgmma m64n256k16).
constexpr int kHeadsPerBlock = 64;            // the wgmma M
constexpr int kThreads = 256;                 // two warpgroups
constexpr int kTileRows = kPageTokens;        // 64 tokens (or index entries) per step
constexpr int kKBlocks = kRowDim / 64;        // 9 swizzled blocks of 64 bf16 columns
constexpr int kBlockBytes = 64 * 128;         // 64 rows of 128 bytes
constexpr int kRawStride = kLatentDim + 16;   // bytes; conflict-free conversion reads
// Contraction steps of 16 columns: warpgroup 0 takes steps 0..17 (latent),
// warpgroup 1 steps 18..35 (latent, then the 4 rope steps, whose scale differs).
constexpr int kSplitStep = kRowDim / 16 / 2;
static_assert(kSplitStep - 4 == (kLatentDim / 16) - kSplitStep && kRopeDim == 4 * 16,
              "warpgroup 1's last four steps are exactly the rope");
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

static_assert(kHeadsPerBlock == 64 && kTileRows == 64, "one m64n64 score tile per step");
static_assert(kLatentDim == 2 * 256, "PV: each warpgroup owns 256 latent dims");
static_assert(kRowDim % 64 == 0, "whole swizzled blocks");

struct Smem {
  uint8_t q[kKBlocks][kBlockBytes];     // queries of the 64 heads, bf16, swizzled
  uint8_t kv[kKBlocks][kBlockBytes];    // the tile widened to bf16, swizzled
  float4 xs[2][8][128];                 // partial scores exchanged: [warpgroup][reg / 4][thread]
  uint8_t raw_latent[kTileRows][kRawStride];  // the next tile's codes, as loaded
  uint8_t raw_rope[kTileRows][kRopeDim];
  float raw_scale[kTileRows][2];
  float c_scale[kTileRows];             // usable scale, 0 for masked rows
  float r_scale[kTileRows];
  float bias[kTileRows];                // 0, or -inf for masked rows
  // Row maps of the next tiles, a ring of two indexed by tile & 1: the pool page
  // of each row (-1 when masked) and its slot. Filled two tiles ahead, so the
  // page-table (and index) loads are off the critical path of the tile loop.
  int row_page[2][kTileRows];
  int row_slot[2][kTileRows];
};
constexpr size_t kSmemBytes = sizeof(Smem) + 1024;  // + alignment of the swizzled blocks
static_assert(kSmemBytes <= 227 * 1024, "fits one block per SM");

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
  if (p.indices == nullptr) {
    // Dense: the tile is one whole page (row r in slot r). Rows past the
    // sequence are loaded too and masked by the row map.
    const uint8_t* page = p.pool + static_cast<size_t>(row_page[0]) * kPageBytes;
#pragma unroll
    for (int i = 0; i < kTileRows * 32 / kThreads; ++i) {
      const int c = tid + i * kThreads;
      dev::CpAsync16(&sm.raw_latent[c >> 5][(c & 31) * 16], page + kPageLatentOffset + c * 16, true);
    }
    dev::CpAsync16(&sm.raw_rope[0][0] + tid * 16, page + kPageRopeOffset + tid * 16, true);
    if (tid < kTileRows) dev::CpAsync8(&sm.raw_scale[tid][0], page + kPageScaleOffset + tid * 8, true);
    return;
  }
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
  {  // rope: 64 rows x 4 chunks, one per thread
    const int row = tid >> 2, part = tid & 3;
    const int page = row_page[row];
    const uint8_t* src = page >= 0 ? p.pool + static_cast<size_t>(page) * kPageBytes +
                                         kPageRopeOffset + row_slot[row] * kRopeDim + part * 16
                                   : p.pool;
    dev::CpAsync16(&sm.raw_rope[row][part * 16], src, page >= 0);
  }
  if (tid < kTileRows) {  // scales: 64 rows x 8 bytes
    const int row = tid;
    const int page = row_page[row];
    const uint8_t* src = page >= 0 ? p.pool + static_cast<size_t>(page) * kPageBytes +
                                         kPageScaleOffset + row_slot[row] * 8
                                   : p.pool;
    dev::CpAsync8(&sm.raw_scale[row][0], src, page >= 0);
  }
}

// Stores 16 bf16 values (columns 16 * part16 ..) of `row` into a swizzled
// operand (blocks of 64 columns).
__device__ __forceinline__ void StoreSwizzled16(uint8_t (*blocks)[kBlockBytes], int row,
                                                int part16, uint4 lo, uint4 hi) {
  uint8_t* block = blocks[part16 >> 2];
  const int chunk = (part16 & 3) * 2;
  *reinterpret_cast<uint4*>(block + wgmma::SwizzledChunk(row, chunk)) = lo;
  *reinterpret_cast<uint4*>(block + wgmma::SwizzledChunk(row, chunk + 1)) = hi;
}

// Widens the raw tile to bf16 (exactly) in the swizzled layout and publishes
// the per-row scales and mask. Four threads per row, each 8 chunks of 16
// latent codes and one of rope; a warp's 16-byte reads and writes (8 rows x 4
// chunks) are free of bank conflicts.
__device__ __forceinline__ void ConvertTile(Smem& sm, int64_t tile) {
  static_assert(kThreads == 4 * kTileRows, "four threads per row");
  const int tid = threadIdx.x;
  const int row = ((tid >> 5) << 3) + (tid & 7), sub = (tid >> 3) & 3;
  const uint8_t* src = &sm.raw_latent[row][sub * 16];
  uint8_t* dst_lo = sm.kv[0] + wgmma::SwizzledChunk(row, 2 * sub);
  uint8_t* dst_hi = sm.kv[0] + wgmma::SwizzledChunk(row, 2 * sub + 1);
#pragma unroll
  for (int i = 0; i < kKBlocks; ++i) {  // blocks 0..7 latent, block 8 rope
    const uint4 codes = *reinterpret_cast<const uint4*>(
        i < kKBlocks - 1 ? src + i * 64 : &sm.raw_rope[row][sub * 16]);
    uint4 lo, hi;
    dev::E4m3x16ToBf16(codes, lo, hi);
    *reinterpret_cast<uint4*>(dst_lo + i * kBlockBytes) = lo;
    *reinterpret_cast<uint4*>(dst_hi + i * kBlockBytes) = hi;
  }
  if (tid < kTileRows) {
    const bool valid = sm.row_page[tile & 1][tid] >= 0;
    sm.bias[tid] = valid ? 0.0f : -INFINITY;
    sm.c_scale[tid] = valid ? dev::UsableScale(sm.raw_scale[tid][0]) : 0.0f;
    sm.r_scale[tid] = valid ? dev::UsableScale(sm.raw_scale[tid][1]) : 0.0f;
  }
  wgmma::FenceProxyAsync();
}

// Loads the block's 64 query heads into shared memory as bf16 (zeros past
// `heads`), latent in columns 0..511 and rope in 512..575, swizzled.
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
    *reinterpret_cast<uint4*>(sm.q[part >> 3] + wgmma::SwizzledChunk(row, part & 7)) = v;
  }
}

// The K-major descriptor of contraction step `ks` (16 columns) of a swizzled
// 64-row operand.
__device__ __forceinline__ uint64_t KStepDesc(const uint8_t (*blocks)[kBlockBytes], int ks) {
  return wgmma::SmemDesc(dev::SmemAddr(blocks[ks >> 2]) + (ks & 3) * 32, 16, 1024);
}

__global__ void __launch_bounds__(kThreads, 1) MlaDecodeSplitKernel(const MlaDecodeParams p) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  // (offset arithmetic keeps the shared address space visible to the compiler)
  Smem& sm = *reinterpret_cast<Smem*>(smem_raw + ((1024 - (dev::SmemAddr(smem_raw) & 1023)) & 1023));

  const int* w = p.work + 4 * blockIdx.x;
  const int b = w[0], split = w[1];
  const int64_t tile_begin = w[2], tile_end = w[3];
  const int h0 = blockIdx.y * kHeadsPerBlock;
  const int wg = threadIdx.x >> 7, wt = threadIdx.x & 127;  // warpgroup, thread in it
  const int lane = threadIdx.x & 31;
  const int row0 = ((wt >> 5) << 4) + (lane >> 2);  // heads row0 and row0 + 8 of the block
  const int q = lane & 3;
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

  float o[128];  // heads row0 (+8) x this warpgroup's 256 dims: o[4j + 2i + c]
#pragma unroll
  for (int j = 0; j < 128; ++j) o[j] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY};  // rows row0 and row0 + 8
  float l_run[2] = {0.0f, 0.0f};            // this thread's share of the row sums

  for (int64_t tile = tile_begin; tile < tile_end; ++tile) {
    dev::CpAsyncWaitAll();
    __syncthreads();  // raw tile landed; the previous tile's P.V is complete everywhere
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

    // ---- partial scores. Both warpgroups run the same steps (so the wgmma
    // stream is not divergent): 14 into `a` and 4 into `r`, warpgroup 0 over
    // latent steps 0..13 and 14..17, warpgroup 1 over latent steps 18..31 and
    // the rope steps 32..35; `r` is scaled by c_scale or r_scale accordingly.
    float a[32], r[32];
    const int ks0 = wg * kSplitStep;
    wgmma::Fence();
#pragma unroll
    for (int i = 0; i < kSplitStep - 4; ++i)
      wgmma::M64N64K16SS(a, KStepDesc(sm.q, ks0 + i), KStepDesc(sm.kv, ks0 + i), i > 0);
#pragma unroll
    for (int i = kSplitStep - 4; i < kSplitStep; ++i)
      wgmma::M64N64K16SS(r, KStepDesc(sm.q, ks0 + i), KStepDesc(sm.kv, ks0 + i),
                         i > kSplitStep - 4);
    wgmma::Commit();
    wgmma::Wait<0>();

    // Exchange: each warpgroup publishes v = a * c_scale + r * (its r scale);
    // both then form s = v0 + v1 from the same two values (equal bits). This
    // thread's columns are t = 8j + 2q + {0, 1}.
    float2 cs[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) cs[j] = *reinterpret_cast<const float2*>(&sm.c_scale[8 * j + 2 * q]);
    {
      const float* rsel = wg == 0 ? sm.c_scale : sm.r_scale;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float2 rs = *reinterpret_cast<const float2*>(&rsel[8 * j + 2 * q]);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int k = 4 * j + e;
          a[k] = __fadd_rn(__fmul_rn(a[k], (e & 1) ? cs[j].y : cs[j].x),
                           __fmul_rn(r[k], (e & 1) ? rs.y : rs.x));
        }
        sm.xs[wg][j][wt] = make_float4(a[4 * j], a[4 * j + 1], a[4 * j + 2], a[4 * j + 3]);
      }
    }
    __syncthreads();
    float s[32];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float4 other = sm.xs[wg ^ 1][j][wt];
      const float2 bias = *reinterpret_cast<const float2*>(&sm.bias[8 * j + 2 * q]);
      const float ov[4] = {other.x, other.y, other.z, other.w};
#pragma unroll
      for (int e = 0; e < 4; ++e)
        s[4 * j + e] = __fmul_rn(__fadd_rn(a[4 * j + e], ov[e]), scale_log2) + ((e & 1) ? bias.y : bias.x);
    }

    // ---- online softmax over the tile's 64 tokens (rows row0, row0 + 8) ------
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int k = 0; k < 32; ++k) mx[(k >> 1) & 1] = fmaxf(mx[(k >> 1) & 1], s[k]);
    float m_use[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
      const float m_new = fmaxf(m_run[i], mx[i]);
      m_use[i] = m_new == -INFINITY ? 0.0f : m_new;
      const float alpha = exp2f(m_run[i] - m_use[i]);
      l_run[i] *= alpha;
      m_run[i] = m_new;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        o[4 * j + 2 * i] *= alpha;
        o[4 * j + 2 * i + 1] *= alpha;
      }
    }
    // P' = p * c_scale in bf16, as the A fragments of the four 16-token steps.
    uint32_t pa[4][4];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float cs0 = cs[j].x, cs1 = cs[j].y;
      float pv[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        pv[e] = exp2f(s[4 * j + e] - m_use[e >> 1]);
        l_run[e >> 1] += pv[e];
      }
      pa[j >> 1][(j & 1) * 2] = dev::PackBf16x2(pv[0] * cs0, pv[1] * cs1);
      pa[j >> 1][(j & 1) * 2 + 1] = dev::PackBf16x2(pv[2] * cs0, pv[3] * cs1);
    }

    // ---- O += P' V over this warpgroup's 256 dims (V = codes, MN-major) ------
    wgmma::Fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      wgmma::M64N256K16RS(o, pa[kk],
                          wgmma::SmemDesc(dev::SmemAddr(sm.kv[4 * wg]) + kk * 2048,
                                          kBlockBytes, 1024));
    wgmma::Commit();

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
    wgmma::Wait<0>();
  }

  // ---- epilogue ------------------------------------------------------------
  float l_tot[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l_tot[i] = l_run[i] + __shfl_xor_sync(0xffffffffu, l_run[i], 1);
    l_tot[i] = l_tot[i] + __shfl_xor_sync(0xffffffffu, l_tot[i], 2);
  }
  const int slot = p.split_offset[b] + split;
  const bool single = p.split_offset[b + 1] - p.split_offset[b] == 1;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int h = h0 + row0 + 8 * i;
    if (h >= p.heads) continue;
    const float inv = single ? (l_tot[i] > 0.0f ? 1.0f / l_tot[i] : 0.0f) : 1.0f;
    float* dst = (single ? p.out + (static_cast<int64_t>(b) * p.heads + h) * kLatentDim
                         : p.o_partial + (static_cast<int64_t>(slot) * p.heads + h) * kLatentDim) +
                 wg * 256 + 2 * q;
#pragma unroll
    for (int j = 0; j < 32; ++j)
      *reinterpret_cast<float2*>(dst + 8 * j) =
          make_float2(o[4 * j + 2 * i] * inv, o[4 * j + 2 * i + 1] * inv);
    if (wg == 0 && q == 0) {
      if (single) {
        p.lse[static_cast<int64_t>(b) * p.heads + h] =
            l_tot[i] > 0.0f ? (m_run[i] + log2f(l_tot[i])) * kLn2 : -INFINITY;
      } else {
        *reinterpret_cast<float2*>(p.ml_partial + (static_cast<int64_t>(slot) * p.heads + h) * 2) =
            make_float2(m_run[i], l_tot[i]);
      }
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
  const size_t smem = kSmemBytes;
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
