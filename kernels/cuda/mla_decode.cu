#include "kernels/cuda/mla_decode.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cstddef>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/kv_layout.h"
#include "kernels/cuda/wgmma.cuh"

namespace strata::cuda {
namespace {

// ---- tile configuration ----------------------------------------------------
// A block handles one split of one request for 64 heads with three
// warpgroups. The producer (warpgroup 2) copies 32-row stages of the
// cache into shared memory (cp.async, three raw stages in flight) and widens
// them to bf16 in the 128-byte swizzled layout wgmma reads (two stages). The
// two math warpgroups take the stages in turn (a "seesaw"): the owner of a
// stage computes S = Q K^T over the whole 576-d contraction (wgmma
// m64n32k16, both operands in shared memory), the online softmax and
// P' = P * c_scale, which it publishes in shared memory with the running max
// and the rescale factor; each math warpgroup adds P' V for its 256 of the 512
// latent dims (m64n256k16: the owner with P' in registers, the other one from
// shared memory, issued just before the scores of its own next stage). So
// one warpgroup's softmax runs while the other's MMAs do, and no partial
// scores are exchanged. Named barriers hand a widened stage to its owner
// (full) and back to the producer (empty), and P' between the math
// warpgroups (ready); not mbarriers, whose wait is a loop: wgmma in flight
// across a branch would be serialised by the compiler.
constexpr int kHeadsPerBlock = 64;            // the wgmma M
constexpr int kMathThreads = 256;             // warpgroups 0 and 1
constexpr int kProducerThreads = 128;         // warpgroup 2
constexpr int kThreads = kMathThreads + kProducerThreads;
constexpr int kTileRows = kPageTokens;        // the plan's tiles: 64 tokens (or index entries)
constexpr int kStageRows = 32;                // rows per pipeline stage
constexpr int kKBlocks = kRowDim / 64;        // 9 swizzled blocks of 64 bf16 columns
constexpr int kQBlockBytes = kHeadsPerBlock * 128;
constexpr int kKvBlockBytes = kStageRows * 128;
constexpr int kKvStages = 2;
constexpr int kRawStages = 3;
constexpr int kRawStride = kLatentDim + 16;   // bytes; conflict-free conversion reads
constexpr int kRawRopeStride = kRopeDim + 16; // (at 64 bytes, 8 rows' reads hit two bank groups)
// Registers after setmaxnreg (384 x 168 at launch): a block of one item, and
// one of several, whose item loop needs 8 more math registers; the producer
// gets by with few. (Two producer warpgroups do not fit: at 512 threads a
// thread may hold only 128 registers, fewer than one m64n256 wgmma needs.)
template <bool kMulti> constexpr int kProducerRegs = kMulti ? 72 : 88;
template <bool kMulti> constexpr int kMathRegs = kMulti ? 216 : 208;
// Named barriers: stage s empty (math -> producer), P' of stage s ready
// (owner -> other math warpgroup), the math warpgroups together (queries, row
// sums), the producer's own, the item table, stage s full (producer -> the
// stage's owner).
constexpr int kBarEmpty = 1, kBarReady = 3, kBarMath = 5, kBarProducer = 6, kBarItems = 7, kBarFull = 8;
// A block takes up to kMaxItems consecutive (head group, split) items of the
// plan and runs their stages as one pipeline (see ItemInfo).
constexpr int kMaxItems = 32;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

static_assert(kLatentDim == 2 * 256, "PV: each math warpgroup owns 256 latent dims");
static_assert(kTileRows % kStageRows == 0 && kStageRows == 32, "stages of 32 rows");
static_assert(kProducerThreads == 4 * kStageRows, "four producer threads per row");
static_assert(kProducerRegs<false> * kProducerThreads + kMathRegs<false> * kMathThreads <= kThreads * 168 &&
                  kProducerRegs<true> * kProducerThreads + kMathRegs<true> * kMathThreads <= kThreads * 168,
              "setmaxnreg.inc only takes registers the producer released");

struct RawStage {
  uint8_t latent[kStageRows][kRawStride];
  uint8_t rope[kStageRows][kRawRopeStride];
  float scale[kStageRows][2];
  int page[kStageRows];                 // pool page of each row, -1 when masked
  int slot[kStageRows];
};

// One work item of the block: a split of one request for one head group. Its
// stages are stages stage_start .. stage_start + stages - 1 of the block's
// pipeline, which runs on across items without draining; the math reloads the
// queries only when the request or the head group changes.
struct ItemInfo {
  int b, split, group;
  int first_tile;   // the split's first tile (64 entries)
  int stages;       // its 32-row stages (0: an empty split)
  int stage_start;
  int seq_len;      // the request's cache length
  int table_row;    // its page-table row
};

struct Smem {
  uint8_t q[kKBlocks][kQBlockBytes];                // queries of the 64 heads, bf16, swizzled
  uint8_t kv[kKvStages][kKBlocks][kKvBlockBytes];   // stages widened to bf16, swizzled
  // P' of stage s (bf16, 64 heads x 32 rows) in columns 32s .. 32s + 31 of
  // one swizzled block of 64 rows of 128 bytes (1024-byte aligned, as q and kv).
  uint8_t pp[kHeadsPerBlock * 128];
  RawStage raw[kRawStages];
  float c_scale[kKvStages][kStageRows]; // usable scale, 0 for masked rows
  float r_scale[kKvStages][kStageRows];
  float bias[kKvStages][kStageRows];    // 0, or -inf for masked rows
  float alpha[kKvStages][kHeadsPerBlock];  // published with P': exp2(previous max - new max)
  float m[kKvStages][kHeadsPerBlock];      // and the running max after the stage (log2 units)
  float l_part[2][kHeadsPerBlock];         // epilogue: each math warpgroup's row sums
  ItemInfo items[kMaxItems];
  int total_stages;
  // Sparse launches: the pool offset of each row's latent codes in raw stage
  // s (0 when masked), computed once by the row's mapping thread, so that the
  // eight copies of a row's chunks cost an add each. Last, so that the dense
  // kernels' layout is that of a kernel without it.
  int64_t latent_offset[kRawStages][kStageRows];
};
constexpr size_t kSmemBytes = sizeof(Smem) + 1024;  // + alignment of the swizzled blocks
static_assert(kBarFull + kKvStages <= 16, "named barrier ids");
// Stage g uses buffer g & 1, and its P' (32 bf16 columns, kPStageUnits 16-byte
// chunks) columns 32 (g & 1) .. of the 128-byte rows of `pp`.
constexpr uint32_t kPStageUnits = kStageRows * 2 / 16;
static_assert(kKvStages == 2 && kKvStages * kPStageUnits * 16 == 128, "two stages, one P' block");
static_assert(offsetof(Smem, kv) % 1024 == 0 && offsetof(Smem, pp) % 1024 == 0, "swizzled atoms");
static_assert(kSmemBytes <= 227 * 1024, "fits one block per SM");

// Work item `flat` of the plan in (head group, work item) order, with
// stage_start = 0.
__device__ __forceinline__ ItemInfo ReadItem(const MlaDecodeParams& p, int flat) {
  ItemInfo it;
  const int* w = p.work + 4 * (flat % p.num_work);
  it.b = w[0];
  it.split = w[1];
  it.group = flat / p.num_work;
  it.first_tile = w[2];
  it.seq_len = p.seq_lens[it.b];
  it.table_row = p.page_row ? p.page_row[it.b] : it.b;
  const int64_t first = static_cast<int64_t>(w[2]) * kTileRows;
  const int64_t limit = p.indices != nullptr ? p.index_stride : it.seq_len;
  const int64_t end = std::min<int64_t>(static_cast<int64_t>(w[3]) * kTileRows, limit);
  it.stages = end > first ? static_cast<int>((end - first + kStageRows - 1) / kStageRows) : 0;
  it.stage_start = 0;
  return it;
}

// Run by the producer's first warp of a block of several items: the items
// it0 .. it0 + n - 1 and where their stages start in the pipeline.
__device__ __forceinline__ void LoadItems(const MlaDecodeParams& p, Smem& sm, int it0, int n, int lane) {
  ItemInfo it = {};
  if (lane < n) it = ReadItem(p, it0 + lane);
  int start = it.stages;  // inclusive scan, then made exclusive
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, start, d);
    if (lane >= d) start += v;
  }
  if (lane == n - 1) sm.total_stages = start;
  it.stage_start = start - it.stages;
  if (lane < n) sm.items[lane] = it;
}

// The producer's view of one item: its stage n covers entries (token
// positions, or index slots) first + 32n ...
struct StageSpan {
  int64_t first;
  int64_t seq_len;     // the request's cache length
  const int* table;    // its page-table row
  const int* indices;  // its index row (sparse), else null
};

__device__ __forceinline__ StageSpan SpanOf(const MlaDecodeParams& p, const ItemInfo& it) {
  StageSpan span;
  span.first = static_cast<int64_t>(it.first_tile) * kTileRows;
  span.seq_len = it.seq_len;
  span.table = p.page_table + static_cast<int64_t>(it.table_row) * p.page_table_stride;
  span.indices = p.indices != nullptr ? p.indices + static_cast<int64_t>(it.b) * p.index_stride : nullptr;
  return span;
}

// Row map of stage `n` of a span (32 producer threads, one row each): the
// pool page of the row (-1 when masked) and its slot.
__device__ __forceinline__ void MapRow(const MlaDecodeParams& p, const StageSpan& span, int n,
                                       int r, int& page, int& slot) {
  const int64_t e = span.first + static_cast<int64_t>(n) * kStageRows + r;
  int64_t pos = e;
  page = -1;
  slot = 0;
  if (span.indices != nullptr) pos = e < p.index_stride ? span.indices[e] : -1;
  if (pos < 0 || pos >= span.seq_len) return;
  slot = static_cast<int>(pos & (kPageTokens - 1));
  page = span.table[pos / kPageTokens];
}

// The producer's mapping threads walk the pipeline's stages in order; the
// cursor holds the item of the stage last mapped. A block of one item sets it
// once.
struct MapCursor {
  int k;  // index in the item table
  ItemInfo it;
};

template <bool kMulti>
__device__ __forceinline__ void MapStage(const MlaDecodeParams& p, const Smem& sm, MapCursor& c, int g,
                                         int r, int& page, int& slot) {
  if constexpr (kMulti) {
    while (g >= c.it.stage_start + c.it.stages) c.it = sm.items[++c.k];  // g only grows
  }
  MapRow(p, SpanOf(p, c.it), g - c.it.stage_start, r, page, slot);
}

// Sparse launches map a row in two halves, an iteration apart: the index
// entry of stage n + 4 is loaded (and not waited for) one iteration before
// its page-table entry, which is loaded one iteration before the row map is
// stored — so that neither dependent load stalls the producer (MapRow does
// both at once).
struct PendingRow {
  int idx;             // indices[e] as loaded, -1 past index_stride
  int seq_len;
  const int* table;
};

template <bool kMulti>
__device__ __forceinline__ void IssueRow(const MlaDecodeParams& p, const Smem& sm, MapCursor& c, int g, int r,
                                         PendingRow& row) {
  if constexpr (kMulti) {
    while (g >= c.it.stage_start + c.it.stages) c.it = sm.items[++c.k];  // g only grows
  }
  const StageSpan span = SpanOf(p, c.it);
  const int64_t e = span.first + static_cast<int64_t>(g - c.it.stage_start) * kStageRows + r;
  row.seq_len = c.it.seq_len;
  row.table = span.table;
  row.idx = e < p.index_stride ? span.indices[e] : -1;
}

__device__ __forceinline__ void ResolveRow(const PendingRow& row, int& page, int& slot) {
  page = -1;
  slot = 0;
  if (row.idx < 0 || row.idx >= row.seq_len) return;
  slot = row.idx & (kPageTokens - 1);
  page = row.table[row.idx / kPageTokens];
}

// Sparse launches: the pool offset of a row's latent codes (0 when masked).
__device__ __forceinline__ int64_t LatentOffset(int page, int slot) {
  return page >= 0 ? static_cast<int64_t>(page) * kPageBytes + kPageLatentOffset + slot * kLatentDim : 0;
}

// Issues the cp.async copies of a stage whose row map is in `st` (and, for
// sparse launches, its rows' latent offsets in `offsets`).
template <bool kSparse>
__device__ __forceinline__ void LoadStage(const MlaDecodeParams& p, RawStage& st, const int64_t* offsets, int pt) {
  if constexpr (kSparse) {
    // Each thread copies chunk pt % 32 of rows pt / 32, + 4, + 8, ...; their
    // maps are all read before the first copy, which would otherwise wait
    // for each row's shared-memory reads in turn.
    constexpr int kRows = kStageRows * 32 / kProducerThreads;
    const uint8_t* base = p.pool + (pt & 31) * 16;
    int64_t off[kRows];
    bool valid[kRows];
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int row = (pt >> 5) + i * (kProducerThreads / 32);
      off[i] = offsets[row];
      valid[i] = st.page[row] >= 0;
    }
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int row = (pt >> 5) + i * (kProducerThreads / 32);
      dev::CpAsync16(&st.latent[row][(pt & 31) * 16], base + off[i], valid[i]);
    }
  } else if (p.indices == nullptr && st.page[0] >= 0) {
    // Dense: the stage is 32 consecutive slots of one page. Rows past the
    // sequence are loaded too and masked by the row map.
    const uint8_t* page = p.pool + static_cast<size_t>(st.page[0]) * kPageBytes;
    const int slot0 = st.slot[0];
#pragma unroll
    for (int i = 0; i < kStageRows * 32 / kProducerThreads; ++i) {
      const int c = pt + i * kProducerThreads;
      dev::CpAsync16(&st.latent[c >> 5][(c & 31) * 16],
                     page + kPageLatentOffset + slot0 * kLatentDim + c * 16, true);
    }
    if (pt < kStageRows * 4)
      dev::CpAsync16(&st.rope[pt >> 2][(pt & 3) * 16], page + kPageRopeOffset + slot0 * kRopeDim + pt * 16,
                     true);
    if (pt < kStageRows)
      dev::CpAsync8(&st.scale[pt][0], page + kPageScaleOffset + (slot0 + pt) * 8, true);
    return;
  } else {
    // Dense, a stage whose first row is masked: row by row.
#pragma unroll
    for (int i = 0; i < kStageRows * 32 / kProducerThreads; ++i) {
      const int c = pt + i * kProducerThreads;
      const int row = c >> 5, part = c & 31;
      const int page = st.page[row];
      const uint8_t* src = page >= 0 ? p.pool + static_cast<size_t>(page) * kPageBytes +
                                           kPageLatentOffset + st.slot[row] * kLatentDim + part * 16
                                     : p.pool;
      dev::CpAsync16(&st.latent[row][part * 16], src, page >= 0);
    }
  }
  if (pt < kStageRows * 4) {
    const int row = pt >> 2, part = pt & 3;
    const int page = st.page[row];
    const uint8_t* src = page >= 0 ? p.pool + static_cast<size_t>(page) * kPageBytes +
                                         kPageRopeOffset + st.slot[row] * kRopeDim + part * 16
                                   : p.pool;
    dev::CpAsync16(&st.rope[row][part * 16], src, page >= 0);
  }
  if (pt < kStageRows) {
    const int page = st.page[pt];
    const uint8_t* src = page >= 0 ? p.pool + static_cast<size_t>(page) * kPageBytes +
                                         kPageScaleOffset + st.slot[pt] * 8
                                   : p.pool;
    dev::CpAsync8(&st.scale[pt][0], src, page >= 0);
  }
}

// Widens a raw stage to bf16 (exactly) in the swizzled layout and publishes
// the per-row scales and mask. Four threads per row, each 8 chunks of 16
// latent codes and one of rope; a warp's 16-byte reads and writes (8 rows x 4
// chunks) are free of bank conflicts.
__device__ __forceinline__ void ConvertStage(Smem& sm, const RawStage& st, int kv, int pt) {
  const int row = ((pt >> 5) << 3) + (pt & 7), sub = (pt >> 3) & 3;
  const uint8_t* src = &st.latent[row][sub * 16];
  uint8_t* dst_lo = sm.kv[kv][0] + wgmma::SwizzledChunk(row, 2 * sub);
  uint8_t* dst_hi = sm.kv[kv][0] + wgmma::SwizzledChunk(row, 2 * sub + 1);
#pragma unroll
  for (int i = 0; i < kKBlocks; ++i) {  // blocks 0..7 latent, block 8 rope
    const uint4 codes = *reinterpret_cast<const uint4*>(
        i < kKBlocks - 1 ? src + i * 64 : &st.rope[row][sub * 16]);
    uint4 lo, hi;
    dev::E4m3x16ToBf16(codes, lo, hi);
    *reinterpret_cast<uint4*>(dst_lo + i * kKvBlockBytes) = lo;
    *reinterpret_cast<uint4*>(dst_hi + i * kKvBlockBytes) = hi;
  }
  if (pt < kStageRows) {
    const bool valid = st.page[pt] >= 0;
    sm.bias[kv][pt] = valid ? 0.0f : -INFINITY;
    sm.c_scale[kv][pt] = valid ? dev::UsableScale(st.scale[pt][0]) : 0.0f;
    sm.r_scale[kv][pt] = valid ? dev::UsableScale(st.scale[pt][1]) : 0.0f;
  }
  wgmma::FenceProxyAsync();
}

// Loads the block's 64 query heads into shared memory as bf16 (zeros past
// `heads`), latent in columns 0..511 and rope in 512..575, swizzled. Run by
// the 256 math threads (t) while the producer starts on the cache: each
// thread's 18 chunks of 8 elements go in two rounds of 9 loads in flight.
__device__ __forceinline__ void LoadQueries(const MlaDecodeParams& p, Smem& sm, int b, int h0, int t) {
  constexpr int kChunks = kRowDim / 8;
  constexpr int kPerThread = kHeadsPerBlock * kChunks / kMathThreads;
  constexpr int kInFlight = 9;
  static_assert(kHeadsPerBlock * kChunks % kMathThreads == 0 && kPerThread % kInFlight == 0,
                "whole rounds of chunks");
#pragma unroll
  for (int round = 0; round < kPerThread / kInFlight; ++round) {
    int64_t at[kInFlight];  // element offset in q_abs or q_pe; -1 past `heads`
    bool latent[kInFlight];
#pragma unroll
    for (int i = 0; i < kInFlight; ++i) {
      const int c = t + (round * kInFlight + i) * kMathThreads;
      const int row = c / kChunks, part = c % kChunks;
      const int64_t bh = static_cast<int64_t>(b) * p.heads + h0 + row;
      latent[i] = part < kLatentDim / 8;
      at[i] = h0 + row >= p.heads ? -1
              : latent[i]         ? bh * kLatentDim + part * 8
                                  : bh * kRopeDim + (part - kLatentDim / 8) * 8;
    }
    uint4 v[kInFlight];
    if (p.q_is_bf16) {
#pragma unroll
      for (int i = 0; i < kInFlight; ++i) {
        const auto* src = static_cast<const __nv_bfloat16*>(latent[i] ? p.q_abs : p.q_pe);
        v[i] = at[i] >= 0 ? *reinterpret_cast<const uint4*>(src + at[i]) : make_uint4(0, 0, 0, 0);
      }
    } else {
      float4 f[kInFlight][2];
#pragma unroll
      for (int i = 0; i < kInFlight; ++i) {
        const auto* src = reinterpret_cast<const float4*>(
            static_cast<const float*>(latent[i] ? p.q_abs : p.q_pe) + (at[i] >= 0 ? at[i] : 0));
        f[i][0] = at[i] >= 0 ? src[0] : make_float4(0.f, 0.f, 0.f, 0.f);
        f[i][1] = at[i] >= 0 ? src[1] : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int i = 0; i < kInFlight; ++i)
        v[i] = make_uint4(dev::PackBf16x2(f[i][0].x, f[i][0].y), dev::PackBf16x2(f[i][0].z, f[i][0].w),
                          dev::PackBf16x2(f[i][1].x, f[i][1].y), dev::PackBf16x2(f[i][1].z, f[i][1].w));
    }
#pragma unroll
    for (int i = 0; i < kInFlight; ++i) {
      const int c = t + (round * kInFlight + i) * kMathThreads;
      const int row = c / kChunks, part = c % kChunks;
      *reinterpret_cast<uint4*>(sm.q[part >> 3] + wgmma::SwizzledChunk(row, part & 7)) = v[i];
    }
  }
}

// The producer warpgroup: row maps, copies and widening, three raw stages
// and two bf16 stages ahead of the math, over the stages of all the block's
// items in turn (`total` of them; `cursor` set for a block of one item).
// kSparse: a separate instantiation, so that the dense producer keeps its
// registers and schedule.
template <bool kMulti, bool kSparse>
__device__ __forceinline__ void Produce(const MlaDecodeParams& p, Smem& sm, int total, MapCursor cursor) {
  const int pt = threadIdx.x - kMathThreads;
  const bool mapper = pt < kStageRows;
  // Stages 0 and 1: maps, then copies (one cp.async group per stage, empty
  // groups included, so that "all but the newest group" is always stage n).
#pragma unroll
  for (int n = 0; n < 2; ++n) {
    if (mapper && n < total) {
      MapStage<kMulti>(p, sm, cursor, n, pt, sm.raw[n].page[pt], sm.raw[n].slot[pt]);
      if constexpr (kSparse) sm.latent_offset[n][pt] = LatentOffset(sm.raw[n].page[pt], sm.raw[n].slot[pt]);
    }
  }
  wgmma::BarSync(kBarProducer, kProducerThreads);
#pragma unroll
  for (int n = 0; n < 2; ++n) {
    if (n < total) LoadStage<kSparse>(p, sm.raw[n], sm.latent_offset[n], pt);
    dev::CpAsyncCommit();
  }
  // The row map of stage n + 3 is loaded into registers one iteration before
  // it is stored. Dense: one page-table load. Sparse: the index entry of
  // stage n + 4 is loaded an iteration earlier still (PendingRow), so that
  // neither dependent load stalls the producer.
  int map_page = -1, map_slot = 0;
  PendingRow pending = {};
  if (mapper && 2 < total) MapStage<kMulti>(p, sm, cursor, 2, pt, map_page, map_slot);
  if (kSparse && mapper && 3 < total) IssueRow<kMulti>(p, sm, cursor, 3, pt, pending);
  for (int n = 0; n < total; ++n) {
    const int next = n + 2;
    dev::CpAsyncWait<1>();                              // my copies of stage n landed
    wgmma::BarSync(kBarProducer, kProducerThreads);     // everyone's; stage n - 1 converted
    RawStage& nst = sm.raw[next % kRawStages];
    if (mapper) {
      nst.page[pt] = map_page;
      nst.slot[pt] = map_slot;
      if constexpr (kSparse) sm.latent_offset[next % kRawStages][pt] = LatentOffset(map_page, map_slot);
      map_page = -1;
      if constexpr (kSparse) {
        if (next + 1 < total) ResolveRow(pending, map_page, map_slot);
        if (next + 2 < total) IssueRow<kMulti>(p, sm, cursor, next + 2, pt, pending);
      } else {
        if (next + 1 < total) MapStage<kMulti>(p, sm, cursor, next + 1, pt, map_page, map_slot);
      }
    }
    wgmma::BarSync(kBarProducer, kProducerThreads);
    if (next < total) LoadStage<kSparse>(p, nst, sm.latent_offset[next % kRawStages], pt);
    dev::CpAsyncCommit();
    const int kv = n & 1;
    if (n >= kKvStages) wgmma::BarSync(kBarEmpty + kv, kThreads);  // the math released it
    ConvertStage(sm, sm.raw[n % kRawStages], kv, pt);
    wgmma::BarArrive(kBarFull + kv, kProducerThreads + kMathThreads / 2);
  }
}

// Descriptors are built once and advanced by adding 16-byte units to the
// start-address field (bits 0..13; shared addresses stay below 256 KB, so the
// sum never carries out of it). Contraction step ks (16 columns) of a
// swizzled K-major operand with blocks of `block_bytes` is at
// (ks / 4) * block_bytes + (ks % 4) * 32 bytes.
constexpr uint32_t KStepUnits(int ks, int block_bytes) {
  return static_cast<uint32_t>(((ks >> 2) * block_bytes + (ks & 3) * 32) >> 4);
}

// O and this thread's row-sum shares times alpha (per head row). Called with
// no wgmma in flight: a warp whose factors are all 1 skips the multiplies
// (they would change nothing).
__device__ __forceinline__ void Rescale(float (&o)[128], float (&l)[2], const float (&alpha)[2]) {
  l[0] *= alpha[0];
  l[1] *= alpha[1];
  if (!__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) return;
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    o[4 * j] *= alpha[0];
    o[4 * j + 1] *= alpha[0];
    o[4 * j + 2] *= alpha[1];
    o[4 * j + 3] *= alpha[1];
  }
}

// kMulti = false: block (x, y) is work item x for head group y (the grid of
// one block per item). kMulti: block x takes items x * items_per_block ... of
// the plan's work items in (head group, work item) order — consecutive splits
// of one request, so that at large batch a block runs several splits through
// one pipeline with the queries loaded once. Each split's result is computed
// exactly as a block of its own computes it (the online softmax restarts per
// item, whose first stage is always math warpgroup 0's), so the bits do not
// depend on the launch. kSparse: p.indices is set (the producer's row maps).
template <bool kMulti, bool kSparse>
__global__ void __launch_bounds__(kThreads, 1)
    MlaDecodeSplitKernel(const MlaDecodeParams p, int items_per_block) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  // (offset arithmetic keeps the shared address space visible to the compiler)
  Smem& sm = *reinterpret_cast<Smem*>(smem_raw + ((1024 - (dev::SmemAddr(smem_raw) & 1023)) & 1023));
  dev::LaunchDependents();  // the merge may be scheduled; it waits for this grid

  const int groups = (p.heads + kHeadsPerBlock - 1) / kHeadsPerBlock;
  const int it0 = kMulti ? blockIdx.x * items_per_block : blockIdx.y * p.num_work + blockIdx.x;
  const int n_items = kMulti ? min(items_per_block, p.num_work * groups - it0) : 1;
  // A block of one item reads it in every thread; a block of several has its
  // producer's first warp write the item table.
  ItemInfo one = {};
  if constexpr (!kMulti) one = ReadItem(p, it0);
  // The producer needs few registers; the math warpgroups hold 128 f32
  // accumulators of O each. The producer starts on the cache at once; the
  // math warpgroups stage the first item's queries meanwhile.
  if (threadIdx.x >= kMathThreads) {
    wgmma::RegDealloc<kProducerRegs<kMulti>>();
    MapCursor cursor = {-1, {}};
    if constexpr (kMulti) {
      if (threadIdx.x < kMathThreads + 32) LoadItems(p, sm, it0, n_items, threadIdx.x & 31);
      wgmma::BarSync(kBarProducer, kProducerThreads);
      wgmma::BarArrive(kBarItems, kThreads);
      Produce<true, kSparse>(p, sm, sm.total_stages, cursor);
    } else {
      cursor = {0, one};
      Produce<false, kSparse>(p, sm, one.stages, cursor);
    }
    return;
  }
  wgmma::RegAlloc<kMathRegs<kMulti>>();
  LoadQueries(p, sm, kMulti ? p.work[4 * (it0 % p.num_work)] : one.b, it0 / p.num_work * kHeadsPerBlock,
              threadIdx.x);
  wgmma::FenceProxyAsync();
  wgmma::BarSync(kBarMath, kMathThreads);
  if constexpr (kMulti) wgmma::BarSync(kBarItems, kThreads);  // the item table

  const int wg = threadIdx.x >> 7, wt = threadIdx.x & 127;  // math warpgroup, thread in it
  const int lane = threadIdx.x & 31;
  const int row0 = ((wt >> 5) << 4) + (lane >> 2);  // heads row0 and row0 + 8 of the block
  const int q = lane & 3;
  const float scale_log2 = p.softmax_scale * kLog2e;
  constexpr uint32_t kKvStageUnits = sizeof(sm.kv[0]) >> 4;
  const uint64_t desc_q = wgmma::SmemDesc(dev::SmemAddr(sm.q[0]), 16, 1024);
  const uint64_t desc_k = wgmma::SmemDesc(dev::SmemAddr(sm.kv[0][0]), 16, 1024);
  const uint64_t desc_q_rope = wgmma::SmemDesc(dev::SmemAddr(sm.q[kKBlocks - 1]), 16, 1024);
  const uint64_t desc_k_rope = wgmma::SmemDesc(dev::SmemAddr(sm.kv[0][kKBlocks - 1]), 16, 1024);
  const uint64_t desc_v = wgmma::SmemDesc(dev::SmemAddr(sm.kv[0][4 * wg]), kKvBlockBytes, 1024);
  const uint64_t desc_p = wgmma::SmemDesc(dev::SmemAddr(sm.pp), 16, 1024);

  for (int k = 0; k < n_items; ++k) {
    const ItemInfo& it = kMulti ? sm.items[k] : one;
    const int b = it.b, group = it.group;
    if (kMulti && k > 0 && (b != sm.items[k - 1].b || group != sm.items[k - 1].group)) {
      wgmma::BarSync(kBarMath, kMathThreads);  // both warpgroups are done with the queries
      LoadQueries(p, sm, b, group * kHeadsPerBlock, threadIdx.x);
      wgmma::FenceProxyAsync();
      wgmma::BarSync(kBarMath, kMathThreads);
    }
    const int h0 = group * kHeadsPerBlock;
    const int n = it.stages, start = it.stage_start;
    // Where this split's result goes (loaded now, used after the last stage).
    const int slot = p.split_offset[b] + it.split;
    const bool single = p.split_offset[b + 1] - p.split_offset[b] == 1;

    float o[128];  // heads row0 (+8) x this warpgroup's 256 dims: o[4j + 2i + c]
#pragma unroll
    for (int j = 0; j < 128; ++j) o[j] = 0.0f;
    float m_run[2] = {-INFINITY, -INFINITY};  // rows row0 and row0 + 8
    float l_run[2] = {0.0f, 0.0f};            // this thread's share of this warpgroup's row sums
    float a[16], r[16];                       // S of the own stage: latent and rope parts

    // Pipeline stage g's S (this warpgroup owns it), issued.
    auto issue_scores = [&](int g) {
      const uint32_t kv_units = (g & 1) * kKvStageUnits;
#pragma unroll
      for (int i = 0; i < kLatentDim / 16; ++i)
        wgmma::M64N32K16SS(a, wgmma::DescAdd(desc_q, KStepUnits(i, kQBlockBytes)),
                           wgmma::DescAdd(desc_k, kv_units + KStepUnits(i, kKvBlockBytes)), i > 0);
#pragma unroll
      for (int i = 0; i < kRopeDim / 16; ++i)
        wgmma::M64N32K16SS(r, wgmma::DescAdd(desc_q_rope, 2 * i), wgmma::DescAdd(desc_k_rope, kv_units + 2 * i),
                           i > 0);
    };
    // The other warpgroup's stage g: wait until it has published P', then
    // take its running max and its factor.
    auto take_other = [&](int g, float (&f)[2]) {
      const int kv = g & 1;
      wgmma::BarSync(kBarReady + kv, kMathThreads);
      f[0] = sm.alpha[kv][row0];
      f[1] = sm.alpha[kv][row0 + 8];
      m_run[0] = sm.m[kv][row0];
      m_run[1] = sm.m[kv][row0 + 8];
    };
    // O += P' V of stage g (P' from shared memory), issued.
    auto issue_other_pv = [&](int g) {
      const int kv = g & 1;
#pragma unroll
      for (int kk = 0; kk < 2; ++kk)
        wgmma::M64N256K16SS(o, wgmma::DescAdd(desc_p, kv * kPStageUnits + 2 * kk),
                            wgmma::DescAdd(desc_v, kv * kKvStageUnits + kk * (2048 >> 4)));
    };
    // The own stage g once its S has landed, part 1 (needs nothing from the
    // other warpgroup): s = (a * c_scale + r * r_scale) * scale + bias (log2
    // units; this thread's columns are t = 8j + 2q + {0, 1}) and the row maxima.
    float s[16], mx[2];
    float2 cs[4];
    auto scores = [&](int g) {
      const int kv = g & 1;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        cs[j] = *reinterpret_cast<const float2*>(&sm.c_scale[kv][8 * j + 2 * q]);
        const float2 rs = *reinterpret_cast<const float2*>(&sm.r_scale[kv][8 * j + 2 * q]);
        const float2 bias = *reinterpret_cast<const float2*>(&sm.bias[kv][8 * j + 2 * q]);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int t = 4 * j + e;
          s[t] = __fmul_rn(__fadd_rn(__fmul_rn(a[t], (e & 1) ? cs[j].y : cs[j].x),
                                     __fmul_rn(r[t], (e & 1) ? rs.y : rs.x)),
                           scale_log2) +
                 ((e & 1) ? bias.y : bias.x);
        }
      }
      mx[0] = mx[1] = -INFINITY;
#pragma unroll
      for (int t = 0; t < 16; ++t) mx[(t >> 1) & 1] = fmaxf(mx[(t >> 1) & 1], s[t]);
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
      }
    };
    // Part 2, with m_run the running max before stage g: the new max and
    // factor, P' = p * c_scale in bf16 (A fragments of the two 16-row steps,
    // and in shared memory with the max and the factor for the other
    // warpgroup, then published) and the row sums.
    uint32_t pa[2][4];
    float alpha[2], lsum[2];
    auto publish = [&](int g) {
      const int kv = g & 1;
      float m_use[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const float m_new = fmaxf(m_run[i], mx[i]);
        m_use[i] = m_new == -INFINITY ? 0.0f : m_new;
        alpha[i] = dev::Exp2Approx(m_run[i] - m_use[i]);
        m_run[i] = m_new;
        lsum[i] = 0.0f;
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float pv[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          pv[e] = dev::Exp2Approx(s[4 * j + e] - m_use[e >> 1]);
          lsum[e >> 1] += pv[e];
        }
        const uint32_t w0 = dev::PackBf16x2(pv[0] * cs[j].x, pv[1] * cs[j].y);
        const uint32_t w1 = dev::PackBf16x2(pv[2] * cs[j].x, pv[3] * cs[j].y);
        pa[j >> 1][(j & 1) * 2] = w0;
        pa[j >> 1][(j & 1) * 2 + 1] = w1;
        *reinterpret_cast<uint32_t*>(sm.pp + wgmma::SwizzledChunk(row0, kPStageUnits * kv + j) + 4 * q) = w0;
        *reinterpret_cast<uint32_t*>(sm.pp + wgmma::SwizzledChunk(row0 + 8, kPStageUnits * kv + j) + 4 * q) = w1;
      }
      // (the four threads of a row store the same values)
      sm.alpha[kv][row0] = alpha[0];
      sm.alpha[kv][row0 + 8] = alpha[1];
      sm.m[kv][row0] = m_run[0];
      sm.m[kv][row0 + 8] = m_run[1];
      wgmma::FenceProxyAsync();
      wgmma::BarArrive(kBarReady + kv, kMathThreads);
    };
    // O += P' V for the own stage g (P' in registers), then its release.
    auto own_pv = [&](int g) {
      const int kv = g & 1;
      Rescale(o, l_run, alpha);
      l_run[0] += lsum[0];
      l_run[1] += lsum[1];
      wgmma::Fence();
#pragma unroll
      for (int kk = 0; kk < 2; ++kk)
        wgmma::M64N256K16RS(o, pa[kk], wgmma::DescAdd(desc_v, kv * kKvStageUnits + kk * (2048 >> 4)));
      wgmma::Commit();
      wgmma::Wait<0>();
      wgmma::BarArrive(kBarEmpty + kv, kThreads);
    };
    // Warpgroup w owns the item's stages i with i % 2 == w (so an item's
    // bits do not depend on where its stages fall in the pipeline). Iteration
    // j: the other's stage j - 1 first (its P' V frees that buffer for the
    // producer soonest: with two buffers that gates the pipeline), with the
    // own stage j's S behind it on the tensor cores; then the softmax of
    // stage j, which the other warpgroup waits for while it runs its own MMAs.
    // (Issuing S before waiting for the other's P', or the other's P' V after
    // the own softmax, measured 14 % slower: bench/RESULTS.md.)
    if (wg == 0 && n > 0) {
      wgmma::BarSync(kBarFull + (start & 1), kProducerThreads + kMathThreads / 2);
      wgmma::Fence();
      issue_scores(start);
      wgmma::Commit();
      wgmma::Wait<0>();
      scores(start);
      publish(start);
      own_pv(start);
    }
    for (int j = wg == 0 ? 2 : 1; j < n; j += 2) {
      const int g = start + j;
      float f[2];
      take_other(g - 1, f);
      Rescale(o, l_run, f);
      wgmma::Fence();
      issue_other_pv(g - 1);
      wgmma::Commit();
      wgmma::BarSync(kBarFull + (g & 1), kProducerThreads + kMathThreads / 2);
      wgmma::Fence();
      issue_scores(g);
      wgmma::Commit();
      wgmma::Wait<1>();  // the other's stage is done with: the producer may refill it
      wgmma::BarArrive(kBarEmpty + ((g - 1) & 1), kThreads);
      wgmma::Wait<0>();
      scores(g);
      publish(g);
      own_pv(g);
    }
    if (n > 0 && ((n - 1) & 1) != wg) {  // the item's last stage is the other's
      const int g = start + n - 1;
      float f[2];
      take_other(g, f);
      Rescale(o, l_run, f);
      wgmma::Fence();
      issue_other_pv(g);
      wgmma::Commit();
      wgmma::Wait<0>();
      wgmma::BarArrive(kBarEmpty + (g & 1), kThreads);
    }

    // ---- epilogue: the row sums of both warpgroups, added in a fixed order ----
    float l_tot[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      l_tot[i] = l_run[i] + __shfl_xor_sync(0xffffffffu, l_run[i], 1);
      l_tot[i] = l_tot[i] + __shfl_xor_sync(0xffffffffu, l_tot[i], 2);
      sm.l_part[wg][row0 + 8 * i] = l_tot[i];
    }
    wgmma::BarSync(kBarMath, kMathThreads);
#pragma unroll
    for (int i = 0; i < 2; ++i) l_tot[i] = sm.l_part[0][row0 + 8 * i] + sm.l_part[1][row0 + 8 * i];
    wgmma::BarSync(kBarMath, kMathThreads);  // read before a next item writes
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int h = h0 + row0 + 8 * i;
      if (h >= p.heads) continue;
      const float inv = single ? (l_tot[i] > 0.0f ? 1.0f / l_tot[i] : 0.0f) : 1.0f;
      if (single) {
        float* const dst = p.out + (static_cast<int64_t>(b) * p.heads + h) * kLatentDim + wg * 256 + 2 * q;
#pragma unroll
        for (int j = 0; j < 32; ++j)
          *reinterpret_cast<float2*>(dst + 8 * j) = make_float2(o[4 * j + 2 * i] * inv, o[4 * j + 2 * i + 1] * inv);
      } else {
        // In the layout of MlaPartialBlock: each of these stores of a warp
        // fills 256 consecutive bytes.
        float* const dst = p.o_partial + MlaPartialBlock(p.heads, slot, h, wg * 256) + 2 * q;
#pragma unroll
        for (int j = 0; j < 32; ++j)
          *reinterpret_cast<float2*>(dst + 8 * kMlaPartialHeads * j) =
              make_float2(o[4 * j + 2 * i], o[4 * j + 2 * i + 1]);
      }
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
}

// One block per (request, group of kMlaPartialHeads heads, eighth of the dims):
// four groups of 128 threads, each thread 4 dims of one head. Group g
// accumulates splits g, g + 4, ... in that order, kUnroll splits' loads in
// flight per thread, then the groups are added in a fixed order, so the bits
// depend on the request's splits only (not on kUnroll). kUnroll 16 reads 64
// splits in one round trip but needs 126 registers (one block per SM);
// kUnroll 2 fits three blocks per SM (40 registers), which large batches
// need: 4 needs 54, and at two blocks per SM batch 64 was 2-8 % slower.
constexpr int kMergeGroups = 4;
constexpr int kMergeThreads = kMergeGroups * kLatentDim / 4;
// Blocks per head group: a group's 128 threads cover 8 heads x 64 dims.
constexpr int kMergeDimParts = kMlaPartialHeads * kLatentDim / 4 / (kMergeThreads / kMergeGroups);
static_assert(kMergeThreads == 64 * kMlaPartialHeads, "the max pass takes 64 threads per head");

template <int kUnroll>
__global__ void __launch_bounds__(kMergeThreads, kUnroll <= 2 ? 3 : 1) MlaDecodeMergeKernel(const MlaDecodeParams p) {
  __shared__ float s_red[kMergeThreads / 32];
  __shared__ float4 s_acc[kMergeGroups - 1][kMergeThreads / kMergeGroups];
  __shared__ float s_l[kMergeGroups][kMlaPartialHeads];
  // Every block waits, also those with nothing to merge: the kernels after
  // this one on the stream must find the split kernel finished.
  dev::GridDependencyWait();
  const int b = blockIdx.x, hg = blockIdx.y, part = blockIdx.z;
  const int first = p.split_offset[b], n = p.split_offset[b + 1] - first;
  if (n <= 1) return;  // written by the split kernel
  const int tid = threadIdx.x, grp = tid / (kMergeThreads / kMergeGroups), col = tid % (kMergeThreads / kMergeGroups);
  // col reads float4 `col` of the block's 8 dim blocks: dims d .. d + 3 of head r.
  const int r = (col >> 1) % kMlaPartialHeads, h = hg * kMlaPartialHeads + r;
  const int d = part * (kLatentDim / kMergeDimParts) + (col / (2 * kMlaPartialHeads)) * 8 + (col & 1) * 4;
  const bool real = h < p.heads;
  const int64_t ml_step = static_cast<int64_t>(p.heads) * 2;

  // The largest running max over the splits of each head (fmaxf: exact,
  // order-free): 64 threads per head.
  {
    const int rh = hg * kMlaPartialHeads + tid / 64;
    float m = -INFINITY;
    if (rh < p.heads) {
      const float* ml = p.ml_partial + (static_cast<int64_t>(first) * p.heads + rh) * 2;
      for (int s = tid % 64; s < n; s += 64) m = fmaxf(m, ml[s * ml_step]);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    if ((tid & 31) == 0) s_red[tid >> 5] = m;
  }
  __syncthreads();
  const float m = fmaxf(s_red[2 * r], s_red[2 * r + 1]);

  // Group sums; an empty split (sum 0) or an all-empty request weighs 0.
  float l = 0.0f;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  const float* ml = p.ml_partial + (static_cast<int64_t>(first) * p.heads + (real ? h : 0)) * 2;
  const float4* o = reinterpret_cast<const float4*>(p.o_partial + MlaPartialBlock(p.heads, first, h, d)) +
                    (col & 1);
  const int64_t o_step = MlaPartialBlock(p.heads, 1, 0, 0) / 4;  // one split's partials, in float4
  for (int s0 = grp; s0 < n && real; s0 += kMergeGroups * kUnroll) {
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
  const bool head_leader = col == 2 * r;  // one thread per head and group
  if (grp > 0) {
    s_acc[grp - 1][col] = acc;
    if (head_leader) s_l[grp][r] = l;
  }
  __syncthreads();
  if (grp != 0 || !real) return;
#pragma unroll
  for (int g = 1; g < kMergeGroups; ++g) {
    const float4 a = s_acc[g - 1][col];
    acc.x += a.x;
    acc.y += a.y;
    acc.z += a.z;
    acc.w += a.w;
    l += s_l[g][r];
  }
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  const int64_t orow = static_cast<int64_t>(b) * p.heads + h;
  *reinterpret_cast<float4*>(p.out + orow * kLatentDim + d) =
      make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
  if (head_leader && part == 0) p.lse[orow] = l > 0.0f ? (m + log2f(l)) * kLn2 : -INFINITY;
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
  int dev = 0, sms = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (err != cudaSuccess) return err;
  // One block per item while they fit the SMs; else one wave of blocks, each
  // taking consecutive items (at most kMaxItems).
  const int64_t items = static_cast<int64_t>(p.num_work) * ((p.heads + kHeadsPerBlock - 1) / kHeadsPerBlock);
  const int per = static_cast<int>(std::min<int64_t>(kMaxItems, std::max<int64_t>(1, (items + sms - 1) / sms)));
  const int64_t blocks = (items + per - 1) / per;
  if (blocks > 0x7FFFFFFF) return cudaErrorInvalidValue;
  const bool sparse = p.indices != nullptr;
  auto* kernel = per > 1 ? (sparse ? MlaDecodeSplitKernel<true, true> : MlaDecodeSplitKernel<true, false>)
                         : (sparse ? MlaDecodeSplitKernel<false, true> : MlaDecodeSplitKernel<false, false>);
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  const dim3 grid = per > 1 ? dim3(static_cast<unsigned>(blocks))
                            : dim3(p.num_work, (p.heads + kHeadsPerBlock - 1) / kHeadsPerBlock);
  kernel<<<grid, kThreads, smem, stream>>>(p, per);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  // Few merge blocks (B = 1): each one's latency counts, so many loads in
  // flight; many blocks: occupancy counts.
  const dim3 merge_grid(p.batch, (p.heads + kMlaPartialHeads - 1) / kMlaPartialHeads, kMergeDimParts);
  if (static_cast<int64_t>(p.batch) * p.heads <= 2 * sms)
    return dev::LaunchAfter(MlaDecodeMergeKernel<16>, merge_grid, dim3(kMergeThreads), stream, p);
  return dev::LaunchAfter(MlaDecodeMergeKernel<2>, merge_grid, dim3(kMergeThreads), stream, p);
}

}  // namespace strata::cuda
