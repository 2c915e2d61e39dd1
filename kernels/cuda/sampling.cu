#include "kernels/cuda/sampling.h"

#include <climits>
#include <cmath>

namespace strata::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kDigitBits = 4;  // radix passes of one 4-bit digit of a logit's key
constexpr int kBuckets = 1 << kDigitBits;
constexpr int kPasses = 32 / kDigitBits;
constexpr int kUnroll = 8;     // loads in flight per thread in the strided loops
constexpr uint64_t kOne = uint64_t{1} << 40;  // fixed-point weight of the largest logit
constexpr float kLog2e = 1.4426950408889634f;

struct Smem {
  // Per-thread bucket sums of a radix pass, [bucket][thread]: each thread
  // adds to its own column (no atomics, no bank conflicts).
  uint64_t hist[kBuckets][kThreads];
  uint64_t part[kWarps];
  uint64_t red[kWarps];
  uint64_t before;
  int chosen;
  int id;
};

// The row being sampled and what is still kept: tokens with weight >= w_min
// ranked at or before (cut_key, cut_id) — a key above cut_key, or equal to
// it with an id <= cut_id. Uniform over the block.
struct Row {
  const float* x;
  int n;
  float m;          // the largest logit
  float scale;      // log2(e) / temperature
  bool inf_mode;    // m is +inf: the +inf logits share the draw
  uint32_t cut_key = 0;
  int cut_id = INT_MAX;
  uint64_t w_min = 1;
};

// NaN reads as -inf and -0 as +0, so that equal values have equal keys.
__device__ __forceinline__ float Clean(float v) { return v != v ? -INFINITY : (v == 0.0f ? 0.0f : v); }

// Order-preserving bits: a larger float has a larger key.
__device__ __forceinline__ uint32_t Key(float v) {
  const uint32_t u = __float_as_uint(v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float FromKey(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k);
}

// Fixed-point weight of a (clean) logit, truncated: in [0, 2^40].
__device__ __forceinline__ uint64_t Weight(const Row& r, float v) {
  if (r.inf_mode) return v == INFINITY ? kOne : 0;
  if (v == r.m) return kOne;  // (also when the scale is +inf)
  float w;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(w) : "f"((v - r.m) * r.scale));
  return static_cast<uint64_t>(w * static_cast<float>(kOne));
}

__device__ __forceinline__ bool Kept(const Row& r, int i, uint32_t key, uint64_t w) {
  return w >= r.w_min && (key > r.cut_key || (key == r.cut_key && i <= r.cut_id));
}

// Calls fn(i, clean logit) for this thread's tokens i = tid, tid + 1024, ...
// with kUnroll loads in flight (a draw reads its row about twenty times,
// mostly from L2).
template <typename Fn>
__device__ __forceinline__ void ForStrided(const Row& r, Fn&& fn) {
  for (int base = 0; base < r.n; base += kThreads * kUnroll) {
    float v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = base + u * kThreads + static_cast<int>(threadIdx.x);
      v[u] = i < r.n ? Clean(__ldg(r.x + i)) : -INFINITY;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = base + u * kThreads + static_cast<int>(threadIdx.x);
      if (i < r.n) fn(i, v[u]);
    }
  }
}

// This thread's contiguous share of the ids, for walks in id order.
__device__ __forceinline__ void ChunkOf(const Row& r, int& lo, int& hi) {
  const int chunk = (r.n + kThreads - 1) / kThreads;
  lo = min(r.n, static_cast<int>(threadIdx.x) * chunk);
  hi = min(r.n, lo + chunk);
}

// Calls fn(i, clean logit) for i in [lo, hi) in order until it returns false.
template <typename Fn>
__device__ __forceinline__ void ForChunk(const Row& r, int lo, int hi, Fn&& fn) {
  for (int base = lo; base < hi; base += kUnroll) {
    float v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = base + u < hi ? Clean(__ldg(r.x + base + u)) : -INFINITY;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (base + u < hi && !fn(base + u, v[u])) return;
    }
  }
}

// Sum over the block, the same on every thread.
__device__ uint64_t BlockSum(uint64_t v, Smem& sm) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) sm.red[threadIdx.x >> 5] = v;
  __syncthreads();
  uint64_t t = 0;
  for (int w = 0; w < kWarps; ++w) t += sm.red[w];
  __syncthreads();
  return t;
}

// Exclusive prefix sum over the threads in index order.
__device__ uint64_t BlockExclusiveScan(uint64_t v, Smem& sm) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint64_t inc = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const uint64_t y = __shfl_up_sync(0xffffffffu, inc, o);
    if (lane >= o) inc += y;
  }
  if (lane == 31) sm.red[warp] = inc;
  __syncthreads();
  uint64_t base = 0;
  for (int w = 0; w < warp; ++w) base += sm.red[w];
  __syncthreads();
  return base + inc - v;
}

// The kept token at which the running sum, in ranking order, first exceeds
// `target`: each token adds 1 (by_count) or its weight. False when the kept
// tokens sum to at most `target`.
__device__ bool RankSelect(const Row& r, bool by_count, uint64_t target, Smem& sm, uint32_t& out_key,
                           int& out_id) {
  const int tid = threadIdx.x, lane = tid & 31;
  uint32_t prefix = 0;
  uint64_t before = 0;  // kept tokens ranked above the current bucket
  for (int pass = 0; pass < kPasses; ++pass) {
    const int shift = 32 - kDigitBits * (pass + 1);
#pragma unroll
    for (int b = 0; b < kBuckets; ++b) sm.hist[b][tid] = 0;
    ForStrided(r, [&](int i, float v) {
      const uint32_t key = Key(v);
      if (pass > 0 && (key >> (shift + kDigitBits)) != (prefix >> (shift + kDigitBits))) return;
      const uint64_t w = Weight(r, v);
      if (Kept(r, i, key, w)) sm.hist[(key >> shift) & (kBuckets - 1)][tid] += by_count ? 1 : w;
    });
    __syncthreads();
    // Bucket totals: warps 2b and 2b + 1 sum bucket b's 1024 columns.
    {
      const int b = tid / (kThreads / kBuckets), part = tid % (kThreads / kBuckets);
      uint64_t t = 0;
#pragma unroll
      for (int j = 0; j < kBuckets; ++j) t += sm.hist[b][j * (kThreads / kBuckets) + part];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
      if (lane == 0) sm.part[tid >> 5] = t;
    }
    __syncthreads();
    if (tid == 0) {
      constexpr int kWarpsPerBucket = kWarps / kBuckets;
      int chosen = -1;
      for (int b = kBuckets - 1; b >= 0; --b) {
        uint64_t sum = 0;
        for (int w = 0; w < kWarpsPerBucket; ++w) sum += sm.part[b * kWarpsPerBucket + w];
        if (before + sum > target) {
          chosen = b;
          break;
        }
        before += sum;
      }
      sm.chosen = chosen;
      sm.before = before;
    }
    __syncthreads();
    const int chosen = sm.chosen;
    before = sm.before;
    __syncthreads();
    if (chosen < 0) return false;
    prefix |= static_cast<uint32_t>(chosen) << shift;
  }
  // Tokens with key == prefix all weigh the same; skip those the target
  // passes entirely, then take the next one in id order.
  const uint64_t unit = by_count ? 1 : Weight(r, FromKey(prefix));
  const uint64_t skip = (target - before) / unit;
  int lo, hi;
  ChunkOf(r, lo, hi);
  auto tied = [&](int i, float v) { return Key(v) == prefix && Kept(r, i, prefix, Weight(r, v)); };
  uint64_t count = 0;
  ForChunk(r, lo, hi, [&](int i, float v) {
    count += tied(i, v);
    return true;
  });
  const uint64_t first = BlockExclusiveScan(count, sm);
  if (skip >= first && skip < first + count) {
    uint64_t seen = first;
    ForChunk(r, lo, hi, [&](int i, float v) {
      if (!tied(i, v) || seen++ != skip) return true;
      sm.id = i;
      return false;
    });
  }
  __syncthreads();
  out_key = prefix;
  out_id = sm.id;
  __syncthreads();
  return true;
}

// Tokens whose float64 weight exp((x - max) / T) is above 0, as the host
// Sampler counts its candidates (top-k applies only when k is below that).
__device__ uint64_t CountPositive(const Row& r, Smem& sm) {
  const float inv_t = r.scale / kLog2e;
  uint64_t t = 0;
  ForStrided(r, [&](int, float v) { t += r.inf_mode ? v == INFINITY : (v == r.m || (v - r.m) * inv_t > -745.13f); });
  return BlockSum(t, sm);
}

// Sum of the kept weights (or the kept count).
__device__ uint64_t SumKept(const Row& r, bool by_count, Smem& sm) {
  uint64_t t = 0;
  ForStrided(r, [&](int i, float v) {
    const uint64_t w = Weight(r, v);
    if (Kept(r, i, Key(v), w)) t += by_count ? 1 : w;
  });
  return BlockSum(t, sm);
}

// The kept token at which the running weight, in id order, first exceeds
// `target` (< the kept total).
__device__ int IdOrderDraw(const Row& r, uint64_t target, Smem& sm) {
  int lo, hi;
  ChunkOf(r, lo, hi);
  auto kept_weight = [&](int i, float v) {
    const uint64_t w = Weight(r, v);
    return Kept(r, i, Key(v), w) ? w : 0;
  };
  uint64_t mine = 0;
  ForChunk(r, lo, hi, [&](int i, float v) {
    mine += kept_weight(i, v);
    return true;
  });
  const uint64_t first = BlockExclusiveScan(mine, sm);
  if (threadIdx.x == 0) sm.id = -1;
  __syncthreads();
  if (target >= first && target < first + mine) {
    uint64_t cum = first;
    ForChunk(r, lo, hi, [&](int i, float v) {
      cum += kept_weight(i, v);
      if (cum <= target) return true;
      sm.id = i;
      return false;
    });
  }
  __syncthreads();
  return sm.id;
}

// The Sampler's penalties on the row's listed tokens (each listed once), in
// place: repetition for every listed token, frequency and presence for the
// generated ones.
__global__ void ApplyPenaltiesKernel(const SampleParams p) {
  const SampleRow rp = p.row[blockIdx.x];
  float* x = p.logits + static_cast<int64_t>(blockIdx.x) * p.ld;
  for (int j = threadIdx.x; j < rp.penalty_count; j += blockDim.x) {
    const PenaltyEntry e = p.penalties[rp.penalty_begin + j];
    if (e.token < 0 || e.token >= p.vocab) continue;
    // One rounding per operation and no FMA: the host Sampler's arithmetic.
    float v = x[e.token];
    if (rp.repetition != 1.0f) v = v > 0.0f ? __fdiv_rn(v, rp.repetition) : __fmul_rn(v, rp.repetition);
    if (e.output > 0)
      v = __fsub_rn(v, __fadd_rn(__fmul_rn(rp.frequency, static_cast<float>(e.output)), rp.presence));
    x[e.token] = v;
  }
}

__global__ void __launch_bounds__(kThreads) SampleRowsKernel(const SampleParams p) {
  extern __shared__ __align__(16) uint8_t smem_raw[];
  Smem& sm = *reinterpret_cast<Smem*>(smem_raw);
  const SampleRow rp = p.row[blockIdx.x];
  Row r;
  r.x = p.logits + static_cast<int64_t>(blockIdx.x) * p.ld;
  r.n = p.vocab;

  float m = -INFINITY;
  ForStrided(r, [&](int, float v) { m = fmaxf(m, v); });
  {
    uint32_t key = Key(m);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) key = umax(key, __shfl_xor_sync(0xffffffffu, key, o));
    if ((threadIdx.x & 31) == 0) sm.red[threadIdx.x >> 5] = key;
    __syncthreads();
    for (int w = 0; w < kWarps; ++w) key = umax(key, static_cast<uint32_t>(sm.red[w]));
    __syncthreads();
    m = FromKey(key);
  }
  if (rp.temperature == 0.0f || m == -INFINITY) {
    // Greedy (or nothing above -inf): the lowest id holding the maximum.
    int best = INT_MAX;
    ForStrided(r, [&](int i, float v) {
      if (v == m) best = min(best, i);
    });
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) best = min(best, __shfl_xor_sync(0xffffffffu, best, o));
    if ((threadIdx.x & 31) == 0) sm.red[threadIdx.x >> 5] = static_cast<uint64_t>(best);
    __syncthreads();
    if (threadIdx.x == 0) {
      uint64_t b = sm.red[0];
      for (int w = 1; w < kWarps; ++w) b = sm.red[w] < b ? sm.red[w] : b;
      p.tokens[blockIdx.x] = b == INT_MAX ? 0 : static_cast<int>(b);
    }
    return;
  }
  r.m = m;
  r.inf_mode = m == INFINITY;
  r.scale = kLog2e / rp.temperature;

  bool ranked = false;  // the kept tokens are walked in ranking order
  uint32_t key;
  int id;
  if (rp.top_k > 0 && static_cast<uint64_t>(rp.top_k) < CountPositive(r, sm)) {
    // (fewer than k tokens may have a fixed-point weight: then all stay)
    if (RankSelect(r, true, static_cast<uint64_t>(rp.top_k) - 1, sm, key, id)) {
      r.cut_key = key;
      r.cut_id = id;
    }
    ranked = true;
  }
  if (rp.top_p < 1.0f) {
    // The shortest ranked prefix whose weight reaches top_p of the kept
    // total: the first token whose running sum is > ceil(top_p * total) - 1.
    const double target = ceil(static_cast<double>(rp.top_p) * static_cast<double>(SumKept(r, false, sm)));
    if (target >= 1.0 && RankSelect(r, false, static_cast<uint64_t>(target) - 1, sm, key, id)) {
      r.cut_key = key;
      r.cut_id = id;
    }
    ranked = true;
  }
  if (rp.min_p > 0.0f) {
    // The largest kept weight is always 2^40 (the maximum logit's).
    const double t = ceil(static_cast<double>(rp.min_p) * static_cast<double>(kOne));
    r.w_min = t > 1.0 ? static_cast<uint64_t>(t) : 1;
  }
  const uint64_t total = SumKept(r, false, sm);
  uint64_t target = static_cast<uint64_t>(floor(rp.u * static_cast<double>(total)));
  if (target >= total) target = total - 1;  // (u just below 1, rounded up)
  int token;
  if (ranked) {
    RankSelect(r, false, target, sm, key, token);
  } else {
    token = IdOrderDraw(r, target, sm);
  }
  if (threadIdx.x == 0) p.tokens[blockIdx.x] = token;
}

// A token's place in the ranking as one number: larger logit, then lower
// id, first.
__device__ __forceinline__ uint64_t RankValue(int i, float v) {
  return (static_cast<uint64_t>(Key(v)) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(i));
}

__device__ uint64_t BlockMaxU64(uint64_t v, uint64_t* red) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const uint64_t y = __shfl_xor_sync(0xffffffffu, v, o);
    v = y > v ? y : v;
  }
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  uint64_t t = red[0];
  for (int w = 1; w < kWarps; ++w) t = red[w] > t ? red[w] : t;
  __syncthreads();
  return t;
}

// The logprobs of a row that asks for them, after its token is chosen: the
// Sampler's SampleLogprobs over the penalised logits (NaN as -inf; when some
// logits are +inf they share the mass; when all are -inf every logprob is
// -inf).
__global__ void __launch_bounds__(kThreads) LogprobsKernel(const SampleParams p) {
  __shared__ uint64_t red[kWarps];
  __shared__ double dred[kWarps];
  const SampleRow rp = p.row[blockIdx.x];
  if (rp.logprobs < 0) return;
  Row r;
  r.x = p.logits + static_cast<int64_t>(blockIdx.x) * p.ld;
  r.n = p.vocab;
  uint64_t top = 0;
  ForStrided(r, [&](int i, float v) {
    const uint64_t k = RankValue(i, v);
    top = k > top ? k : top;
  });
  top = BlockMaxU64(top, red);
  const float m = FromKey(static_cast<uint32_t>(top >> 32));
  // log-sum-exp in float64 (a fixed order: threads' strided sums, then warps
  // in order), or the count of +inf logits.
  double acc = 0;
  ForStrided(r, [&](int, float v) {
    if (m == INFINITY) {
      acc += v == INFINITY ? 1.0 : 0.0;
    } else if (m != -INFINITY) {
      acc += exp(static_cast<double>(v) - static_cast<double>(m));
    }
  });
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if ((threadIdx.x & 31) == 0) dred[threadIdx.x >> 5] = acc;
  __syncthreads();
  double total = 0;
  for (int w = 0; w < kWarps; ++w) total += dred[w];
  const double lse = m == INFINITY || m == -INFINITY ? static_cast<double>(m) : m + log(total);
  auto logprob = [&](float v) -> float {
    if (lse == INFINITY) return v == INFINITY ? static_cast<float>(-log(total)) : -INFINITY;
    if (lse == -INFINITY) return -INFINITY;
    return static_cast<float>(static_cast<double>(v) - lse);
  };
  SampleLogprobsOut* out = p.logprobs + blockIdx.x;
  const int token = p.tokens[blockIdx.x];
  const float zt = Clean(r.x[token]);
  uint64_t above = 0;
  ForStrided(r, [&](int, float v) { above += v > zt; });
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) above += __shfl_xor_sync(0xffffffffu, above, o);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = above;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint64_t a = 0;
    for (int w = 0; w < kWarps; ++w) a += red[w];
    out->logprob = logprob(zt);
    out->rank = 1 + static_cast<int>(a);
  }
  __syncthreads();
  // The k most likely, one block-wide maximum each below the previous one.
  const int k = min(min(rp.logprobs, kSampleMaxLogprobs), r.n);
  uint64_t prev = top;
  for (int j = 0; j < k; ++j) {
    if (j > 0) {
      uint64_t best = 0;
      ForStrided(r, [&](int i, float v) {
        const uint64_t rv = RankValue(i, v);
        if (rv < prev && rv > best) best = rv;
      });
      prev = BlockMaxU64(best, red);
    }
    if (threadIdx.x == 0) {
      out->token[j] = static_cast<int>(0xFFFFFFFFu - static_cast<uint32_t>(prev));
      out->value[j] = logprob(FromKey(static_cast<uint32_t>(prev >> 32)));
    }
  }
  if (threadIdx.x == 0) out->count = k;
}

}  // namespace

cudaError_t LaunchSampleRows(const SampleParams& p, cudaStream_t stream) {
  if (p.rows <= 0) return cudaSuccess;
  if (p.vocab <= 0 || p.vocab > kSampleMaxVocab || p.ld < p.vocab) return cudaErrorInvalidValue;
  const int smem = static_cast<int>(sizeof(Smem));
  cudaError_t err = cudaFuncSetAttribute(SampleRowsKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  if (p.penalties != nullptr) {
    ApplyPenaltiesKernel<<<p.rows, 128, 0, stream>>>(p);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  SampleRowsKernel<<<p.rows, kThreads, smem, stream>>>(p);
  err = cudaGetLastError();
  if (err != cudaSuccess || p.logprobs == nullptr) return err;
  LogprobsKernel<<<p.rows, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace strata::cuda
