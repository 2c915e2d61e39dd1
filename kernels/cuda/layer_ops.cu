#include "kernels/cuda/layer_ops.h"

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/device_util.cuh"

namespace strata::cuda {
namespace {

constexpr int kThreads = 256;

unsigned Blocks(int64_t n, int per_block = kThreads) {
  return static_cast<unsigned>((n + per_block - 1) / per_block);
}

// Sum of one double per thread over the block (blockDim.x == kThreads):
// warp shuffles, then the warps' sums in a fixed order (a lane's butterfly
// partners are the same pairs in either order, so every lane holds the same
// bits).
__device__ double BlockSum(double v, double* smem /* [kThreads / 32] */) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) smem[threadIdx.x >> 5] = v;
  __syncthreads();
  double total = 0;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) total += smem[w];
  __syncthreads();
  return total;
}

__global__ void EmbedKernel(const void* table, bool bf16, const int* tokens, int hidden, float* out) {
  const int r = blockIdx.y;
  const int64_t base = static_cast<int64_t>(tokens[r]) * hidden;
  for (int i = blockIdx.x * kThreads + threadIdx.x; i < hidden; i += gridDim.x * kThreads) {
    out[static_cast<int64_t>(r) * hidden + i] =
        bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(table)[base + i])
             : static_cast<const float*>(table)[base + i];
  }
}

// RMSNorm of rows whose length, stride and pointers allow 16-byte access: each
// thread keeps up to kNormVec float4 of its row in registers, all loaded at
// once (one memory round trip where the scalar loop below waited for one per
// element it read), and writes the output from them. Rows longer than
// kNormVec * 1024 elements are read again for the output. Same arithmetic as
// RmsNormKernel (squares summed in double; out = w * (x * inv)).
constexpr int kNormVec = 8;

__global__ void RmsNormVecKernel(const float* x, const float* w, int n, int64_t stride, double eps, float* out) {
  __shared__ double red[kThreads / 32];
  const float4* xr = reinterpret_cast<const float4*>(x + blockIdx.x * stride);
  float4* o = reinterpret_cast<float4*>(out + blockIdx.x * stride);
  const float4* w4 = reinterpret_cast<const float4*>(w);
  const int n4 = n / 4;
  constexpr int kChunk = kNormVec * kThreads;
  const bool held = n4 <= kChunk;
  float4 v[kNormVec];
  double ss = 0;
  for (int base = 0; base < n4; base += kChunk) {
#pragma unroll
    for (int j = 0; j < kNormVec; ++j) {
      const int i = base + j * kThreads + static_cast<int>(threadIdx.x);
      v[j] = i < n4 ? xr[i] : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int j = 0; j < kNormVec; ++j) {
      ss += static_cast<double>(v[j].x) * v[j].x;
      ss += static_cast<double>(v[j].y) * v[j].y;
      ss += static_cast<double>(v[j].z) * v[j].z;
      ss += static_cast<double>(v[j].w) * v[j].w;
    }
  }
  ss = BlockSum(ss, red);
  const float inv = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(n) + eps));
  for (int base = 0; base < n4; base += kChunk) {
#pragma unroll
    for (int j = 0; j < kNormVec; ++j) {
      const int i = base + j * kThreads + static_cast<int>(threadIdx.x);
      if (i < n4) {
        const float4 a = held ? v[j] : xr[i];
        const float4 g = w4[i];
        o[i] = make_float4(g.x * (a.x * inv), g.y * (a.y * inv), g.z * (a.z * inv), g.w * (a.w * inv));
      }
    }
  }
}

__global__ void RmsNormKernel(const float* x, const float* w, int n, int64_t stride, double eps, float* out) {
  __shared__ double red[kThreads / 32];
  const float* xr = x + blockIdx.x * stride;
  float* o = out + blockIdx.x * stride;
  double ss = 0;
  for (int i = threadIdx.x; i < n; i += kThreads) ss += static_cast<double>(xr[i]) * xr[i];
  ss = BlockSum(ss, red);
  const float inv = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(n) + eps));
  for (int i = threadIdx.x; i < n; i += kThreads) o[i] = w[i] * (xr[i] * inv);
}

__global__ void LayerNormKernel(const float* x, const float* w, const float* b, int n, int64_t stride,
                                double eps, float* out) {
  __shared__ double red[kThreads / 32];
  const float* xr = x + blockIdx.x * stride;
  float* o = out + blockIdx.x * stride;
  double s = 0;
  for (int i = threadIdx.x; i < n; i += kThreads) s += xr[i];
  const double mean = BlockSum(s, red) / static_cast<double>(n);
  double v = 0;
  for (int i = threadIdx.x; i < n; i += kThreads) {
    const double d = xr[i] - mean;
    v += d * d;
  }
  const double inv = 1.0 / sqrt(BlockSum(v, red) / static_cast<double>(n) + eps);
  for (int i = threadIdx.x; i < n; i += kThreads) {
    o[i] = static_cast<float>((xr[i] - mean) * inv) * w[i] + b[i];
  }
}

__global__ void RopeKernel(float* x, int64_t row_stride, int heads, int64_t head_stride, int dim,
                           const int64_t* positions, const float* inv_freq, float attention_factor,
                           bool interleave) {
  // The angles depend on the position and the pair only: their cos and sin
  // (in double, as on the CPU) are computed once per row, not once per head.
  extern __shared__ float rope_cs[];  // [dim / 2] cos, then [dim / 2] sin
  const int r = blockIdx.x;
  const int half = dim / 2;
  const float p = static_cast<float>(positions[r]);
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const float angle = inv_freq[i] * p;
    rope_cs[i] = static_cast<float>(cos(static_cast<double>(angle))) * attention_factor;
    rope_cs[half + i] = static_cast<float>(sin(static_cast<double>(angle))) * attention_factor;
  }
  __syncthreads();
  // Eight pairs per thread are loaded before any is written: the compiler
  // cannot move a later pair's loads above an earlier pair's stores (same
  // array), so a plain loop waited one memory round trip per pair.
  constexpr int kPairs = 8;
  const int total = heads * half;
  for (int t0 = threadIdx.x; t0 < total; t0 += kPairs * blockDim.x) {
    float* a[kPairs];
    float* b[kPairs];
    float x0[kPairs], x1[kPairs];
#pragma unroll
    for (int k = 0; k < kPairs; ++k) {
      const int t = t0 + k * blockDim.x;
      const int h = t / half, i = t % half;
      float* base = x + r * row_stride + static_cast<int64_t>(h) * head_stride;
      a[k] = interleave ? base + 2 * i : base + i;
      b[k] = interleave ? base + 2 * i + 1 : base + i + half;
      if (t < total) {
        x0[k] = *a[k];
        x1[k] = *b[k];
      }
    }
#pragma unroll
    for (int k = 0; k < kPairs; ++k) {
      const int t = t0 + k * blockDim.x;
      if (t >= total) continue;
      const int i = t % half;
      const float cs = rope_cs[i];
      const float sn = rope_cs[half + i];
      *a[k] = x0[k] * cs - x1[k] * sn;
      *b[k] = x1[k] * cs + x0[k] * sn;
    }
  }
}

__global__ void SiluMulKernel(const float* g, const float* u, int n, int64_t in_stride, float* out) {
  const int r = blockIdx.y;
  for (int i = blockIdx.x * kThreads + threadIdx.x; i < n; i += gridDim.x * kThreads) {
    const float a = g[r * in_stride + i];
    out[static_cast<int64_t>(r) * n + i] = a / (1.0f + expf(-a)) * u[r * in_stride + i];
  }
}

__global__ void AddKernel(float* acc, const float* d, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i < n) acc[i] += d[i];
}

__global__ void AddBiasKernel(float* y, const float* b, int n, int64_t total) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i < total) y[i] += b[i % n];
}

__global__ void ScaleKernel(float* x, int64_t n, float s) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i < n) x[i] *= s;
}

__global__ void ToBf16Kernel(const float* x, int64_t n, __nv_bfloat16* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i < n) out[i] = __float2bfloat16_rn(x[i]);
}

// Element e of a (batch, m, cols) view, in row-major order.
struct BatchRowCol {
  int64_t b;
  int i, col;
};
__device__ __forceinline__ BatchRowCol ElementOf(int64_t e, int m, int cols) {
  const int64_t r = e / cols;
  const int64_t b = r / m;
  return {b, static_cast<int>(r - b * m), static_cast<int>(e - r * cols)};
}

// Row r = b * m + i of the (batch, m, k) view: hi rows at out[b][i], lo rows
// at out[b][m + i].
__global__ void SplitBf16Kernel(const float* x, int m, int k, int64_t ldx, int64_t stride_x, int64_t total,
                                __nv_bfloat16* out) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (e >= total) return;
  const auto [b, i, l] = ElementOf(e, m, k);
  const float v = x[b * stride_x + i * ldx + l];
  const __nv_bfloat16 hi = __float2bfloat16_rn(v);
  __nv_bfloat16* o = out + (b * 2 * m + i) * k + l;
  o[0] = hi;
  o[static_cast<int64_t>(m) * k] = __float2bfloat16_rn(v - __bfloat162float(hi));  // v - hi is exact
}

__global__ void AddSplitHalvesKernel(const float* y2, int m, int n, int64_t ldy, int64_t stride_y, int64_t total,
                                     float* y) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (e >= total) return;
  const auto [b, i, j] = ElementOf(e, m, n);
  const float* h = y2 + (b * 2 * m + i) * n + j;
  y[b * stride_y + i * ldy + j] = h[0] + h[static_cast<int64_t>(m) * n];
}

__global__ void GatherRowsKernel(const float* src, const int* idx, int cols, float* dst) {
  const int r = blockIdx.y;
  const int64_t s = static_cast<int64_t>(idx[r]) * cols;
  for (int i = blockIdx.x * kThreads + threadIdx.x; i < cols; i += gridDim.x * kThreads) {
    dst[static_cast<int64_t>(r) * cols + i] = src[s + i];
  }
}

__global__ void ScatterRowsKernel(const float* src, const int* idx, int cols, float* dst) {
  const int r = blockIdx.y;
  const int64_t d = static_cast<int64_t>(idx[r]) * cols;
  for (int i = blockIdx.x * kThreads + threadIdx.x; i < cols; i += gridDim.x * kThreads) {
    dst[d + i] = src[static_cast<int64_t>(r) * cols + i];
  }
}

__device__ uint8_t* PageOf(const RowPages& w, int row, size_t page_bytes, uint8_t* pool, int* slot) {
  const int64_t pos = w.positions[row];
  const int page = w.page_table[w.page_row[row] * w.page_table_stride + pos / 64];
  *slot = static_cast<int>(pos % 64);
  return pool + static_cast<size_t>(page) * page_bytes;
}

constexpr int kWarps = 8;

__global__ void AppendMlaKernel(const float* latent, const float* rope, int64_t stride, int rows,
                                RowPages where, MlaPageLayout layout, uint8_t* pool) {
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * kWarps + (threadIdx.x >> 5);
  if (row >= rows) return;
  int slot;
  uint8_t* page = PageOf(where, row, layout.page_bytes(), pool, &slot);
  const int L = layout.latent_dim, R = layout.rope_dim;
  const float cs = dev::QuantizeRowWarp(latent + row * stride, L, page + static_cast<size_t>(slot) * L, lane);
  const float rs = dev::QuantizeRowWarp(rope + row * stride, R, page + layout.rope_offset() + slot * R, lane);
  if (lane == 0) {
    float* sc = reinterpret_cast<float*>(page + layout.scale_offset()) + 2 * slot;
    sc[0] = cs;
    sc[1] = rs;
  }
}

__global__ void AppendIndexKernel(const float* k, int64_t stride, int rows, RowPages where,
                                  IndexPageLayout layout, uint8_t* pool) {
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * kWarps + (threadIdx.x >> 5);
  if (row >= rows) return;
  int slot;
  uint8_t* page = PageOf(where, row, layout.page_bytes(), pool, &slot);
  const float s = dev::QuantizeRowWarp(k + row * stride, layout.dim, page + static_cast<size_t>(slot) * layout.dim,
                                       lane);
  if (lane == 0) reinterpret_cast<float*>(page + layout.scale_offset())[slot] = s;
}

__global__ void StoreV2RowsKernel(const uint8_t* rows, int64_t n, int64_t first_pos, const int* pages,
                                  MlaPageLayout layout, uint8_t* pool) {
  const int64_t i = blockIdx.x;
  const int L = layout.latent_dim, R = layout.rope_dim;
  const uint8_t* row = rows + i * (L + 4 + R + 4);
  const int64_t pos = first_pos + i;
  uint8_t* page = pool + static_cast<size_t>(pages[pos / 64]) * layout.page_bytes();
  const int slot = static_cast<int>(pos % 64);
  for (int j = threadIdx.x; j < L + R + 8; j += blockDim.x) {
    if (j < L) {
      page[static_cast<size_t>(slot) * L + j] = row[j];
    } else if (j < L + R) {
      page[layout.rope_offset() + static_cast<size_t>(slot) * R + (j - L)] = row[L + 4 + (j - L)];
    } else if (j < L + R + 4) {  // c_scale bytes
      page[layout.scale_offset() + 8 * slot + (j - L - R)] = row[L + (j - L - R)];
    } else {                     // r_scale bytes
      page[layout.scale_offset() + 8 * slot + 4 + (j - L - R - 4)] = row[L + 4 + R + (j - L - R - 4)];
    }
  }
}

__global__ void LoadIndexKeysKernel(const uint8_t* pool, const int* pages, int64_t first_pos,
                                    IndexPageLayout layout, float* out) {
  const int64_t i = blockIdx.x;
  const int64_t pos = first_pos + i;
  const uint8_t* page = pool + static_cast<size_t>(pages[pos / 64]) * layout.page_bytes();
  const int slot = static_cast<int>(pos % 64);
  const float s = dev::UsableScale(reinterpret_cast<const float*>(page + layout.scale_offset())[slot]);
  for (int j = threadIdx.x; j < layout.dim; j += blockDim.x) {
    out[i * layout.dim + j] = dev::DecodeE4m3(page[static_cast<size_t>(slot) * layout.dim + j]) * s;
  }
}

// MLA attention: one block per (head, row), kAttThreads tokens per tile; each
// thread owns latent dims d = tid + i*kAttThreads of the running output.
constexpr int kAttThreads = 128;
constexpr int kMaxLatentPerThread = 8;  // latent_dim <= 1024

__global__ void MlaAttendKernel(MlaAttendParams p) {
  extern __shared__ float smem[];
  const int h = blockIdx.x, r = blockIdx.y, tid = threadIdx.x;
  const int L = p.layout.latent_dim, R = p.layout.rope_dim;
  float* q_abs = smem;                      // [L]
  float* q_pe = q_abs + L;                  // [R]
  float* prob = q_pe + R;                   // [kAttThreads]
  float* red = prob + kAttThreads;          // [kAttThreads]
  __shared__ const uint8_t* page_of[kAttThreads];
  __shared__ float cscale_of[kAttThreads];

  const float* qa = p.q_abs + (static_cast<int64_t>(r) * p.heads + h) * L;
  const float* qp = p.q_pe + r * p.q_pe_row_stride + h * p.q_pe_head_stride;
  for (int i = tid; i < L; i += kAttThreads) q_abs[i] = qa[i];
  for (int i = tid; i < R; i += kAttThreads) q_pe[i] = qp[i];
  __syncthreads();

  const int seq_len = p.seq_lens[r];
  const int64_t n = p.indices ? p.index_stride : seq_len;
  const int* pages = p.page_table + p.page_row[r] * p.page_table_stride;
  const size_t page_bytes = p.layout.page_bytes();
  float acc[kMaxLatentPerThread];
#pragma unroll
  for (int i = 0; i < kMaxLatentPerThread; ++i) acc[i] = 0.0f;
  float m = -INFINITY, sum = 0.0f;

  for (int64_t j0 = 0; j0 < n; j0 += kAttThreads) {
    const int64_t j = j0 + tid;
    float s = -INFINITY;
    page_of[tid] = nullptr;
    if (j < n) {
      const int64_t t = p.indices ? p.indices[r * p.index_stride + j] : j;
      if (t >= 0 && t < seq_len) {
        const uint8_t* page = p.pool + static_cast<size_t>(pages[t / 64]) * page_bytes;
        const int slot = static_cast<int>(t % 64);
        const float* sc = reinterpret_cast<const float*>(page + p.layout.scale_offset()) + 2 * slot;
        const float cs = dev::UsableScale(sc[0]), rs = dev::UsableScale(sc[1]);
        const uint8_t* c = page + static_cast<size_t>(slot) * L;
        const uint8_t* rr = page + p.layout.rope_offset() + slot * R;
        float dc = 0.0f, dr = 0.0f;
        for (int i = 0; i < L; ++i) dc += q_abs[i] * (dev::DecodeE4m3(c[i]) * cs);
        for (int i = 0; i < R; ++i) dr += q_pe[i] * (dev::DecodeE4m3(rr[i]) * rs);
        s = (dc + dr) * p.softmax_scale;
        page_of[tid] = c;
        cscale_of[tid] = cs;
      }
    }
    red[tid] = s;
    __syncthreads();
    for (int k = kAttThreads / 2; k > 0; k >>= 1) {
      if (tid < k) red[tid] = fmaxf(red[tid], red[tid + k]);
      __syncthreads();
    }
    const float tile_max = red[0];
    __syncthreads();
    if (tile_max != -INFINITY) {
      const float m_new = fmaxf(m, tile_max);
      const float corr = expf(m - m_new);  // 0 when m is -inf
      const float e = (s == -INFINITY) ? 0.0f : expf(s - m_new);
      prob[tid] = e;
      red[tid] = e;
      __syncthreads();
      for (int k = kAttThreads / 2; k > 0; k >>= 1) {
        if (tid < k) red[tid] += red[tid + k];
        __syncthreads();
      }
      sum = sum * corr + red[0];
      m = m_new;
#pragma unroll
      for (int i = 0; i < kMaxLatentPerThread; ++i) acc[i] *= corr;
      const int count = static_cast<int>(n - j0 < kAttThreads ? n - j0 : kAttThreads);
      for (int jj = 0; jj < count; ++jj) {
        const uint8_t* c = page_of[jj];
        if (c == nullptr) continue;
        const float pw = prob[jj], cs = cscale_of[jj];
#pragma unroll
        for (int i = 0; i < kMaxLatentPerThread; ++i) {
          const int d = tid + i * kAttThreads;
          if (d < L) acc[i] += pw * (dev::DecodeE4m3(c[d]) * cs);
        }
      }
    }
    __syncthreads();
  }
  float* o = p.out + (static_cast<int64_t>(r) * p.heads + h) * L;
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
#pragma unroll
  for (int i = 0; i < kMaxLatentPerThread; ++i) {
    const int d = tid + i * kAttThreads;
    if (d < L) o[d] = acc[i] * inv;
  }
}

__global__ void IndexerScoresKernel(IndexerScoreParams p) {
  extern __shared__ float sq[];  // [heads][dim] then [heads] weights
  const int r = blockIdx.y, D = p.layout.dim;
  const int seq_len = p.seq_lens[r];
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (static_cast<int64_t>(blockIdx.x) * blockDim.x >= seq_len) return;
  float* sw = sq + p.heads * D;
  for (int i = threadIdx.x; i < p.heads * D; i += blockDim.x) sq[i] = p.q[static_cast<int64_t>(r) * p.heads * D + i];
  for (int i = threadIdx.x; i < p.heads; i += blockDim.x) sw[i] = p.weights[static_cast<int64_t>(r) * p.heads + i];
  __syncthreads();
  if (t >= seq_len) return;
  const int* pages = p.page_table + p.page_row[r] * p.page_table_stride;
  const uint8_t* page = p.pool + static_cast<size_t>(pages[t / 64]) * p.layout.page_bytes();
  const int slot = static_cast<int>(t % 64);
  const float ks = dev::UsableScale(reinterpret_cast<const float*>(page + p.layout.scale_offset())[slot]);
  const uint8_t* kc = page + static_cast<size_t>(slot) * D;
  float s = 0.0f;
  for (int h = 0; h < p.heads; ++h) {
    float d = 0.0f;
    for (int i = 0; i < D; ++i) d += sq[h * D + i] * (dev::DecodeE4m3(kc[i]) * ks);
    s += sw[h] * fmaxf(d * p.score_scale, 0.0f);
  }
  p.scores[r * p.score_stride + t] = s;
}

// Warp-wide (value, index) argmax, the result in every lane: the larger value
// wins, ties go to the lower index, and index `none` marks a lane without a
// candidate, which loses to any other.
__device__ __forceinline__ void WarpArgmax(float& v, int& i, int none) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, off);
    const int oi = __shfl_xor_sync(0xffffffffu, i, off);
    if (oi != none && (i == none || ov > v || (ov == v && oi < i))) {
      v = ov;
      i = oi;
    }
  }
}

// One warp per row. The scores and per-group sums are spread over the lanes;
// lane 0 keeps the best groups; each of the k picks is a warp-wide argmax
// (ties to the lower id) over the experts of the kept groups not yet taken;
// lane 0 sorts the ids and writes the weights. Everything lives in shared
// memory or registers (a first version kept the picks in global memory and
// took ~430 us per row).
__global__ void MoeRouteKernel(MoeRouteParams p) {
  extern __shared__ float rs[];  // score[E], choice[E], group[G], then flags[E] and picks[k] as ints
  const int r = blockIdx.x, E = p.experts, G = p.groups, per = E / G, lane = threadIdx.x;
  float* score = rs;
  float* choice = rs + E;
  float* gscore = choice + E;
  int* taken = reinterpret_cast<int*>(gscore + G);  // 1: not eligible (group off, or picked)
  int* picks = taken + E;
  const float* lg = p.logits + static_cast<int64_t>(r) * E;
  constexpr int kLoads = 8;  // a lane's logits and biases loaded at once, then used
  for (int e0 = 0; e0 < E; e0 += 32 * kLoads) {
    float lv[kLoads], bv[kLoads];
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int e = e0 + u * 32 + lane;
      lv[u] = e < E ? lg[e] : 0.0f;
      bv[u] = e < E ? p.bias[e] : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int e = e0 + u * 32 + lane;
      if (e >= E) break;
      score[e] = 1.0f / (1.0f + expf(-lv[u]));
      choice[e] = score[e] + bv[u];
    }
  }
  __syncwarp();
  for (int g = lane; g < G; g += 32) {
    float a = -INFINITY, b = -INFINITY;
    for (int e = g * per; e < (g + 1) * per; ++e) {
      const float v = choice[e];
      if (v > a) {
        b = a;
        a = v;
      } else if (v > b) {
        b = v;
      }
    }
    gscore[g] = a + b;
  }
  __syncwarp();
  if (lane == 0) {
    // Keep the topk_groups best groups (ties to the lower group).
    uint64_t on_lo = 0, on_hi = 0;  // up to 128 groups
    for (int i = 0; i < p.topk_groups; ++i) {
      int best = -1;
      for (int g = 0; g < G; ++g) {
        const bool on = g < 64 ? (on_lo >> g) & 1 : (on_hi >> (g - 64)) & 1;
        if (on) continue;
        if (best < 0 || gscore[g] > gscore[best]) best = g;
      }
      if (best < 64) on_lo |= 1ull << best; else on_hi |= 1ull << (best - 64);
    }
    for (int g = 0; g < G; ++g) gscore[g] = (g < 64 ? (on_lo >> g) & 1 : (on_hi >> (g - 64)) & 1) ? 1.0f : 0.0f;
  }
  __syncwarp();
  for (int e = lane; e < E; e += 32) taken[e] = gscore[e / per] == 0.0f;
  __syncwarp();
  for (int i = 0; i < p.k; ++i) {
    float bv = -INFINITY;
    int be = E;  // none yet
    for (int e = lane; e < E; e += 32) {
      if (taken[e]) continue;
      const float v = choice[e];
      if (be == E || v > bv) {  // the lowest eligible id first, then strictly greater
        bv = v;
        be = e;
      }
    }
    WarpArgmax(bv, be, E);
    if (lane == 0) {
      picks[i] = be;
      if (be < E) taken[be] = 1;
    }
    __syncwarp();
  }
  if (lane != 0) return;
  int* ids = p.expert_ids + static_cast<int64_t>(r) * p.k;
  float* wts = p.expert_weights + static_cast<int64_t>(r) * p.k;
  for (int i = 1; i < p.k; ++i) {  // insertion sort, k is small
    const int v = picks[i];
    int j = i - 1;
    while (j >= 0 && picks[j] > v) {
      picks[j + 1] = picks[j];
      --j;
    }
    picks[j + 1] = v;
  }
  float sum = 0.0f;
  float w[64];
  for (int i = 0; i < p.k; ++i) {
    ids[i] = picks[i];
    w[i] = picks[i] < E ? score[picks[i]] : 0.0f;
    sum += w[i];
  }
  for (int i = 0; i < p.k; ++i) {
    float v = w[i];
    if (p.normalize) v /= (sum + 1e-20f);
    wts[i] = v * p.routed_scale;
  }
}

__global__ void MoeCombineKernel(const float* y, const float* w, const float* shared, int k, int cols, float* out) {
  const int r = blockIdx.y;
  for (int i = blockIdx.x * kThreads + threadIdx.x; i < cols; i += gridDim.x * kThreads) {
    float o = 0.0f;
    for (int j = 0; j < k; ++j) o += y[(static_cast<int64_t>(r) * k + j) * cols + i] * w[r * k + j];
    if (shared != nullptr) o += shared[static_cast<int64_t>(r) * cols + i];
    out[static_cast<int64_t>(r) * cols + i] = o;
  }
}

__device__ uint64_t Mix64(uint64_t x) {  // splitmix64 finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

__global__ void FillUniformKernel(void* dst, bool bf16, int64_t n, uint64_t seed, float offset, float scale) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const uint64_t h = Mix64(seed ^ Mix64(static_cast<uint64_t>(i)));
    const float u = static_cast<float>(h >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    const float v = offset + (2.0f * u - 1.0f) * scale;
    if (bf16) static_cast<__nv_bfloat16*>(dst)[i] = __float2bfloat16_rn(v);
    else static_cast<float*>(dst)[i] = v;
  }
}

__global__ void FillRandomPagesKernel(uint8_t* pool, int64_t bytes, size_t page_bytes, size_t scale_offset,
                                      int scales_per_page, uint64_t seed) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < bytes / 4;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t off = i * 4;
    const size_t in_page = static_cast<size_t>(off) % page_bytes;
    const uint64_t h = Mix64(seed ^ Mix64(static_cast<uint64_t>(i)));
    uint32_t word;
    if (in_page >= scale_offset) {
      if (in_page >= scale_offset + 4 * static_cast<size_t>(scales_per_page)) continue;
      const float s = (0.5f + 0.5f * static_cast<float>(h >> 40) * (1.0f / 16777216.0f)) / 448.0f;
      word = __float_as_uint(s);
    } else {
      word = static_cast<uint32_t>(h) & 0xF7F7F7F7u;  // no byte is 0x7F or 0xFF
    }
    reinterpret_cast<uint32_t*>(pool)[i] = word;
  }
}

__global__ void PlainGemmKernel(GemmArgs a) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  const int i = blockIdx.y;
  const int b = blockIdx.z;
  if (j >= a.n) return;
  float acc = 0.0f;
  const int64_t xo = b * a.stride_x + static_cast<int64_t>(i) * a.ldx;
  const int64_t wo = b * a.stride_w;
  for (int l = 0; l < a.k; ++l) {
    const int64_t wi = wo + (a.w_is_kn ? static_cast<int64_t>(l) * a.ldw + j : static_cast<int64_t>(j) * a.ldw + l);
    float xv, wv;
    if (a.type == GemmType::kBF16) {
      xv = __bfloat162float(static_cast<const __nv_bfloat16*>(a.x)[xo + l]);
      wv = __bfloat162float(static_cast<const __nv_bfloat16*>(a.w)[wi]);
    } else {
      xv = static_cast<const float*>(a.x)[xo + l];
      wv = static_cast<const float*>(a.w)[wi];
    }
    acc = fmaf(xv, wv, acc);
  }
  float& y = a.y[b * a.stride_y + static_cast<int64_t>(i) * a.ldy + j];
  y = a.accumulate ? y + acc : acc;
}

unsigned GridFor(int64_t n) { return static_cast<unsigned>(n < 1 ? 1 : (n > 65535 * 4 ? 65535 * 4 : n)); }

}  // namespace

cudaError_t LaunchEmbed(const void* table, bool table_bf16, const int* tokens, int rows, int hidden, float* out,
                        cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  EmbedKernel<<<dim3(Blocks(hidden), rows), kThreads, 0, stream>>>(table, table_bf16, tokens, hidden, out);
  return cudaGetLastError();
}

cudaError_t LaunchRmsNorm(const float* x, const float* w, int rows, int n, int64_t stride, double eps, float* out,
                          cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  auto aligned = [](const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15) == 0; };
  if (n % 4 == 0 && stride % 4 == 0 && aligned(x) && aligned(w) && aligned(out)) {
    RmsNormVecKernel<<<rows, kThreads, 0, stream>>>(x, w, n, stride, eps, out);
  } else {
    RmsNormKernel<<<rows, kThreads, 0, stream>>>(x, w, n, stride, eps, out);
  }
  return cudaGetLastError();
}

cudaError_t LaunchLayerNorm(const float* x, const float* w, const float* b, int rows, int n, int64_t stride,
                            double eps, float* out, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  LayerNormKernel<<<rows, kThreads, 0, stream>>>(x, w, b, n, stride, eps, out);
  return cudaGetLastError();
}

cudaError_t LaunchRope(float* x, int rows, int64_t row_stride, int heads, int64_t head_stride, int dim,
                       const int64_t* positions, const float* inv_freq, float attention_factor, bool interleave,
                       cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (dim <= 0 || dim % 2 != 0 || dim > 8192) return cudaErrorInvalidValue;
  RopeKernel<<<rows, kThreads, dim * sizeof(float), stream>>>(x, row_stride, heads, head_stride, dim, positions,
                                                              inv_freq, attention_factor, interleave);
  return cudaGetLastError();
}

cudaError_t LaunchSiluMul(const float* g, const float* u, int rows, int n, int64_t in_stride, float* out,
                          cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  SiluMulKernel<<<dim3(Blocks(n), rows), kThreads, 0, stream>>>(g, u, n, in_stride, out);
  return cudaGetLastError();
}

cudaError_t LaunchAdd(float* acc, const float* d, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  AddKernel<<<Blocks(n), kThreads, 0, stream>>>(acc, d, n);
  return cudaGetLastError();
}

cudaError_t LaunchAddBias(float* y, const float* b, int rows, int n, cudaStream_t stream) {
  const int64_t total = static_cast<int64_t>(rows) * n;
  if (total <= 0) return cudaSuccess;
  AddBiasKernel<<<Blocks(total), kThreads, 0, stream>>>(y, b, n, total);
  return cudaGetLastError();
}

cudaError_t LaunchScale(float* x, int64_t n, float s, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  ScaleKernel<<<Blocks(n), kThreads, 0, stream>>>(x, n, s);
  return cudaGetLastError();
}

cudaError_t LaunchToBf16(const float* x, int64_t n, void* out, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  ToBf16Kernel<<<Blocks(n), kThreads, 0, stream>>>(x, n, static_cast<__nv_bfloat16*>(out));
  return cudaGetLastError();
}

cudaError_t LaunchSplitBf16(const float* x, int batch, int m, int k, int64_t ldx, int64_t stride_x, void* out,
                            cudaStream_t stream) {
  const int64_t total = int64_t{batch} * m * k;
  if (total <= 0) return cudaSuccess;
  SplitBf16Kernel<<<Blocks(total), kThreads, 0, stream>>>(x, m, k, ldx, stride_x, total,
                                                          static_cast<__nv_bfloat16*>(out));
  return cudaGetLastError();
}

cudaError_t LaunchAddSplitHalves(const float* y2, int batch, int m, int n, float* y, int64_t ldy, int64_t stride_y,
                                 cudaStream_t stream) {
  const int64_t total = int64_t{batch} * m * n;
  if (total <= 0) return cudaSuccess;
  AddSplitHalvesKernel<<<Blocks(total), kThreads, 0, stream>>>(y2, m, n, ldy, stride_y, total, y);
  return cudaGetLastError();
}

cudaError_t LaunchGatherRows(const float* src, const int* idx, int n, int cols, float* dst, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  GatherRowsKernel<<<dim3(Blocks(cols), n), kThreads, 0, stream>>>(src, idx, cols, dst);
  return cudaGetLastError();
}

cudaError_t LaunchScatterRows(const float* src, const int* idx, int n, int cols, float* dst, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  ScatterRowsKernel<<<dim3(Blocks(cols), n), kThreads, 0, stream>>>(src, idx, cols, dst);
  return cudaGetLastError();
}

cudaError_t LaunchAppendMlaRows(const float* latent, const float* rope, int64_t stride, int rows,
                                const RowPages& where, const MlaPageLayout& layout, uint8_t* pool,
                                cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  AppendMlaKernel<<<Blocks(rows, kWarps), kWarps * 32, 0, stream>>>(latent, rope, stride, rows, where, layout, pool);
  return cudaGetLastError();
}

cudaError_t LaunchAppendIndexKeys(const float* k, int64_t stride, int rows, const RowPages& where,
                                  const IndexPageLayout& layout, uint8_t* pool, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  AppendIndexKernel<<<Blocks(rows, kWarps), kWarps * 32, 0, stream>>>(k, stride, rows, where, layout, pool);
  return cudaGetLastError();
}

cudaError_t LaunchStoreV2Rows(const uint8_t* rows, int64_t n, int64_t first_pos, const int* pages,
                              const MlaPageLayout& layout, uint8_t* pool, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (n > 0x7FFFFFFF) return cudaErrorInvalidValue;
  StoreV2RowsKernel<<<static_cast<unsigned>(n), 128, 0, stream>>>(rows, n, first_pos, pages, layout, pool);
  return cudaGetLastError();
}

cudaError_t LaunchLoadIndexKeys(const uint8_t* pool, const int* pages, int64_t first_pos, int64_t n,
                                const IndexPageLayout& layout, float* out, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (n > 0x7FFFFFFF) return cudaErrorInvalidValue;
  LoadIndexKeysKernel<<<static_cast<unsigned>(n), 128, 0, stream>>>(pool, pages, first_pos, layout, out);
  return cudaGetLastError();
}

cudaError_t LaunchMlaAttend(const MlaAttendParams& p, cudaStream_t stream) {
  if (p.rows <= 0 || p.heads <= 0) return cudaSuccess;
  if (p.layout.latent_dim > kAttThreads * kMaxLatentPerThread || p.rows > 65535) return cudaErrorInvalidValue;
  const size_t smem = (p.layout.latent_dim + p.layout.rope_dim + 2 * kAttThreads) * sizeof(float);
  MlaAttendKernel<<<dim3(p.heads, p.rows), kAttThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t LaunchIndexerScores(const IndexerScoreParams& p, cudaStream_t stream) {
  if (p.rows <= 0 || p.max_seq_len <= 0) return cudaSuccess;
  const size_t smem = (static_cast<size_t>(p.heads) * p.layout.dim + p.heads) * sizeof(float);
  if (smem > 48 * 1024 || p.rows > 65535) return cudaErrorInvalidValue;
  IndexerScoresKernel<<<dim3(Blocks(p.max_seq_len, 128), p.rows), 128, smem, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t LaunchMoeRoute(const MoeRouteParams& p, cudaStream_t stream) {
  if (p.rows <= 0) return cudaSuccess;
  if (p.groups < 1 || p.groups > 128 || p.experts % p.groups != 0 || p.k > p.experts) return cudaErrorInvalidValue;
  if (p.k > 64) return cudaErrorInvalidValue;
  const size_t smem = (2 * p.experts + p.groups) * sizeof(float) + (p.experts + p.k) * sizeof(int);
  MoeRouteKernel<<<p.rows, 32, smem, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t LaunchMoeCombine(const float* y, const float* w, const float* shared, int rows, int k, int cols,
                             float* out, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  MoeCombineKernel<<<dim3(Blocks(cols), rows), kThreads, 0, stream>>>(y, w, shared, k, cols, out);
  return cudaGetLastError();
}

cudaError_t LaunchPlainGemm(const GemmArgs& a, cudaStream_t stream) {
  if (a.m <= 0 || a.n <= 0 || a.batch <= 0) return cudaSuccess;
  if (a.m > 65535 || a.batch > 65535) return cudaErrorInvalidValue;
  PlainGemmKernel<<<dim3(Blocks(a.n, 128), a.m, a.batch), 128, 0, stream>>>(a);
  return cudaGetLastError();
}

// One block per row; each thread keeps its best (value, index) over a strided
// scan (strictly greater, so its lowest index among equals), then a tree of
// (value, index) comparisons over the block.
constexpr int kArgmaxThreads = 512;

__global__ void __launch_bounds__(kArgmaxThreads) ArgmaxRowsKernel(const float* x, int n, int* out) {
  __shared__ float s_v[kArgmaxThreads / 32];
  __shared__ int s_i[kArgmaxThreads / 32];
  const float* row = x + static_cast<int64_t>(blockIdx.x) * n;
  float bv = -INFINITY;
  int bi = n;  // none yet
  for (int i = threadIdx.x; i < n; i += kArgmaxThreads) {
    const float v = row[i];
    if (v > bv) {  // false for NaN
      bv = v;
      bi = i;
    }
  }
  WarpArgmax(bv, bi, n);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) s_v[warp] = bv, s_i[warp] = bi;
  __syncthreads();
  if (warp != 0) return;
  bv = lane < kArgmaxThreads / 32 ? s_v[lane] : -INFINITY;
  bi = lane < kArgmaxThreads / 32 ? s_i[lane] : n;
  WarpArgmax(bv, bi, n);
  if (lane == 0) out[blockIdx.x] = bi < n && bv > -INFINITY ? bi : 0;
}

cudaError_t LaunchArgmaxRows(const float* x, int rows, int n, int* out, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (n <= 0) return cudaErrorInvalidValue;
  ArgmaxRowsKernel<<<rows, kArgmaxThreads, 0, stream>>>(x, n, out);
  return cudaGetLastError();
}

cudaError_t LaunchFillUniform(void* dst, bool bf16, int64_t n, uint64_t seed, float offset, float scale,
                              cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  FillUniformKernel<<<GridFor(Blocks(n)), kThreads, 0, stream>>>(dst, bf16, n, seed, offset, scale);
  return cudaGetLastError();
}

cudaError_t LaunchFillRandomPages(uint8_t* pool, int64_t pages, size_t page_bytes, size_t scale_offset,
                                  int scales_per_page, uint64_t seed, cudaStream_t stream) {
  if (pages <= 0) return cudaSuccess;
  if (page_bytes % 4 != 0 || scale_offset % 4 != 0) return cudaErrorInvalidValue;
  const int64_t bytes = pages * static_cast<int64_t>(page_bytes);
  FillRandomPagesKernel<<<GridFor(Blocks(bytes / 4)), kThreads, 0, stream>>>(pool, bytes, page_bytes, scale_offset,
                                                                           scales_per_page, seed);
  return cudaGetLastError();
}

}  // namespace strata::cuda
