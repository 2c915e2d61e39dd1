#include "kernels/cuda/reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <thread>

#include "kernels/cuda/dsa_indexer.h"
#include "kernels/cuda/kv_layout.h"
#include "kernels/cuda/test_util.h"
#include "kernels/fp8.h"

namespace strata::cuda::reference {
namespace {

template <typename F>
void ParallelFor(int64_t n, int threads, F&& f) {  // f(begin, end, worker)
  threads = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, n)));
  std::vector<std::thread> pool;
  const int64_t per = (n + threads - 1) / threads;
  for (int w = 0; w < threads; ++w) {
    const int64_t b = w * per, e = std::min(n, b + per);
    if (b >= e) break;
    pool.emplace_back([&f, b, e, w] { f(b, e, w); });
  }
  for (auto& t : pool) t.join();
}

// Lays out pages for `lens`: shuffled pool ids plus spare pages, a page table,
// and fills every byte of the pool with random garbage first.
PagedKv LayoutPages(const std::vector<int64_t>& lens, size_t page_bytes, testing::Rng& rng) {
  PagedKv kv;
  int64_t max_pages = 1, total = 0;
  for (int64_t t : lens) {
    const int64_t p = (t + 63) / 64;
    max_pages = std::max(max_pages, p);
    total += p;
  }
  kv.n_pages = total + 3;  // spare pages nobody references
  kv.stride = max_pages;
  kv.seq_lens.assign(lens.begin(), lens.end());
  std::vector<int> ids(kv.n_pages);
  std::iota(ids.begin(), ids.end(), 0);
  for (int64_t i = kv.n_pages - 1; i > 0; --i) std::swap(ids[i], ids[rng.Below(i + 1)]);
  kv.page_table.assign(lens.size() * max_pages, -1);
  int64_t next = 0;
  for (size_t b = 0; b < lens.size(); ++b)
    for (int64_t p = 0; p < (lens[b] + 63) / 64; ++p) kv.page_table[b * max_pages + p] = ids[next++];
  kv.pool.resize(static_cast<size_t>(kv.n_pages) * page_bytes);
  return kv;
}

void FillGarbage(std::vector<uint8_t>& pool, uint64_t seed, int threads) {
  const int64_t words = static_cast<int64_t>(pool.size() / 8);
  ParallelFor(words, threads, [&](int64_t b, int64_t e, int w) {
    testing::Rng rng(seed ^ (0x51ED27ull * (w + 1)));
    for (int64_t i = b; i < e; ++i) {
      const uint64_t v = rng.Next();
      std::memcpy(pool.data() + i * 8, &v, 8);
    }
  });
}

void RandomRow(testing::Rng& rng, float* x, int n) {
  const float mag = static_cast<float>(std::exp(rng.Normal() * 0.7));
  for (int i = 0; i < n; ++i) x[i] = rng.Normal() * mag;
}

double Dequant(uint8_t code, float scale) {
  return fp8::ScaleIsUsable(scale) ? static_cast<double>(fp8::Decode(code)) * scale : 0.0;
}

}  // namespace

PagedKv MakeRandomKv(const std::vector<int64_t>& lens, uint64_t seed, int threads) {
  testing::Rng rng(seed);
  PagedKv kv = LayoutPages(lens, kPageBytes, rng);
  FillGarbage(kv.pool, seed * 31 + 7, threads);
  // Rows: (request, position) flattened, generated in parallel.
  std::vector<int64_t> start(lens.size() + 1, 0);
  for (size_t b = 0; b < lens.size(); ++b) start[b + 1] = start[b] + lens[b];
  ParallelFor(start.back(), threads, [&](int64_t lo, int64_t hi, int w) {
    testing::Rng r(seed ^ (0xA5A5ull + 977ull * w));
    float c[kLatentDim], rope[kRopeDim];
    uint8_t row[kV2RowBytes];
    size_t b = std::upper_bound(start.begin(), start.end(), lo) - start.begin() - 1;
    for (int64_t i = lo; i < hi; ++i) {
      while (i >= start[b + 1]) ++b;
      const int64_t pos = i - start[b];
      RandomRow(r, c, kLatentDim);
      RandomRow(r, rope, kRopeDim);
      const float cs = fp8::QuantizeRow(c, kLatentDim, row);
      std::memcpy(row + kLatentDim, &cs, 4);
      const float rs = fp8::QuantizeRow(rope, kRopeDim, row + kLatentDim + 4);
      std::memcpy(row + kLatentDim + 4 + kRopeDim, &rs, 4);
      const int page = kv.page_table[b * kv.stride + pos / 64];
      PackV2Row(row, static_cast<int>(pos % 64), kv.pool.data() + static_cast<size_t>(page) * kPageBytes);
    }
  });
  return kv;
}

void SprinkleNanCodes(PagedKv* kv, size_t page_bytes, size_t code_bytes, int one_in, uint64_t seed) {
  testing::Rng rng(seed);
  for (int64_t p = 0; p < kv->n_pages; ++p) {
    uint8_t* page = kv->pool.data() + static_cast<size_t>(p) * page_bytes;
    for (size_t i = 0; i < code_bytes; ++i)
      if (rng.Below(one_in) == 0) page[i] = rng.Below(2) ? 0x7F : 0xFF;
  }
}

PagedKv MakeRandomIndexKeys(const std::vector<int64_t>& lens, uint64_t seed, int threads) {
  testing::Rng rng(seed);
  PagedKv kv = LayoutPages(lens, kIndexPageBytes, rng);
  FillGarbage(kv.pool, seed * 17 + 3, threads);
  for (size_t b = 0; b < lens.size(); ++b) {
    ParallelFor(lens[b], threads, [&](int64_t lo, int64_t hi, int w) {
      testing::Rng r(seed ^ (0x7777ull * (w + 1)) ^ (b << 40));
      float k[kIndexDim];
      for (int64_t pos = lo; pos < hi; ++pos) {
        RandomRow(r, k, kIndexDim);
        uint8_t* page = kv.pool.data() + static_cast<size_t>(kv.page_table[b * kv.stride + pos / 64]) * kIndexPageBytes;
        const float s = fp8::QuantizeRow(k, kIndexDim, page + (pos % 64) * kIndexDim);
        std::memcpy(page + kIndexPageScaleOffset + (pos % 64) * 4, &s, 4);
      }
    });
  }
  return kv;
}

void MlaDecode(const PagedKv& kv, int b, const float* q_abs, const float* q_pe,
               const std::vector<int>& head_list, double softmax_scale, const int* entries,
               int64_t n_entries, int threads, std::vector<double>* ctx, std::vector<double>* lse) {
  const int nh = static_cast<int>(head_list.size());
  const int64_t seq = kv.seq_lens[b];
  if (entries == nullptr) n_entries = seq;
  struct Part {
    std::vector<double> m, l, o;
  };
  const int workers = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, n_entries)));
  std::vector<Part> parts(workers);
  ParallelFor(n_entries, workers, [&](int64_t lo, int64_t hi, int w) {
    Part& pt = parts[w];
    pt.m.assign(nh, -INFINITY);
    pt.l.assign(nh, 0.0);
    pt.o.assign(static_cast<size_t>(nh) * kLatentDim, 0.0);
    double c[kLatentDim], r[kRopeDim];
    for (int64_t e = lo; e < hi; ++e) {
      const int64_t pos = entries ? entries[e] : e;
      if (pos < 0 || pos >= seq) continue;
      const uint8_t* page = kv.pool.data() + static_cast<size_t>(kv.page_table[b * kv.stride + pos / 64]) * kPageBytes;
      const int slot = static_cast<int>(pos % 64);
      float sc[2];
      std::memcpy(sc, page + kPageScaleOffset + slot * 8, 8);
      for (int d = 0; d < kLatentDim; ++d) c[d] = Dequant(page[kPageLatentOffset + slot * kLatentDim + d], sc[0]);
      for (int d = 0; d < kRopeDim; ++d) r[d] = Dequant(page[kPageRopeOffset + slot * kRopeDim + d], sc[1]);
      for (int i = 0; i < nh; ++i) {
        const float* qa = q_abs + static_cast<size_t>(head_list[i]) * kLatentDim;
        const float* qp = q_pe + static_cast<size_t>(head_list[i]) * kRopeDim;
        double s = 0;
        for (int d = 0; d < kLatentDim; ++d) s += static_cast<double>(qa[d]) * c[d];
        for (int d = 0; d < kRopeDim; ++d) s += static_cast<double>(qp[d]) * r[d];
        s *= softmax_scale;
        double* o = pt.o.data() + static_cast<size_t>(i) * kLatentDim;
        if (s > pt.m[i]) {
          const double a = std::exp(pt.m[i] - s);
          pt.l[i] *= a;
          for (int d = 0; d < kLatentDim; ++d) o[d] *= a;
          pt.m[i] = s;
        }
        const double p = std::exp(s - pt.m[i]);
        pt.l[i] += p;
        for (int d = 0; d < kLatentDim; ++d) o[d] += p * c[d];
      }
    }
  });
  ctx->assign(static_cast<size_t>(nh) * kLatentDim, 0.0);
  lse->assign(nh, -INFINITY);
  for (int i = 0; i < nh; ++i) {
    double m = -INFINITY;
    for (const Part& pt : parts) if (!pt.m.empty()) m = std::max(m, pt.m[i]);
    if (m == -INFINITY) continue;
    double l = 0;
    std::vector<double> o(kLatentDim, 0.0);
    for (const Part& pt : parts) {
      if (pt.m.empty() || pt.m[i] == -INFINITY) continue;
      const double a = std::exp(pt.m[i] - m);
      l += a * pt.l[i];
      for (int d = 0; d < kLatentDim; ++d) o[d] += a * pt.o[static_cast<size_t>(i) * kLatentDim + d];
    }
    for (int d = 0; d < kLatentDim; ++d) (*ctx)[static_cast<size_t>(i) * kLatentDim + d] = o[d] / l;
    (*lse)[i] = m + std::log(l);
  }
}

void IndexerQueryAsScored(const float* q, int heads, float* out) {
  for (int h = 0; h < heads; ++h) {
    const float* x = q + static_cast<size_t>(h) * kIndexDim;
    float m = 0.0f;
    for (int d = 0; d < kIndexDim; ++d) m = std::fmax(m, std::fabs(x[d]));
    uint32_t bits;
    std::memcpy(&bits, &m, 4);
    const uint32_t e = bits >> 23;  // m >= 0: the biased exponent
    const bool scaled = e >= 8 && e < 255;
    const float s = scaled ? std::ldexp(1.0f, 134 - static_cast<int>(e)) : 1.0f;
    const float inv = scaled ? std::ldexp(1.0f, static_cast<int>(e) - 134) : 1.0f;
    for (int d = 0; d < kIndexDim; ++d) {
      const float v = x[d] * s;
      const float hi = fp8::Decode(fp8::Encode(v));
      const float lo = fp8::Decode(fp8::Encode(v - hi));
      out[static_cast<size_t>(h) * kIndexDim + d] = (hi + lo) * inv;
    }
  }
}

void IndexerScores(const PagedKv& keys, int b, const float* q, const float* w, int heads,
                   std::vector<double>* score, std::vector<double>* bound) {
  const int64_t seq = keys.seq_lens[b];
  score->assign(seq, 0.0);
  bound->assign(seq, 0.0);
  ParallelFor(seq, 16, [&](int64_t lo, int64_t hi, int) {
    double k[kIndexDim];
    for (int64_t t = lo; t < hi; ++t) {
      const uint8_t* page = keys.pool.data() + static_cast<size_t>(keys.page_table[b * keys.stride + t / 64]) * kIndexPageBytes;
      float s;
      std::memcpy(&s, page + kIndexPageScaleOffset + (t % 64) * 4, 4);
      for (int d = 0; d < kIndexDim; ++d) k[d] = Dequant(page[(t % 64) * kIndexDim + d], s);
      double acc = 0, bnd = 0;
      for (int h = 0; h < heads; ++h) {
        double dot = 0, adot = 0;
        for (int d = 0; d < kIndexDim; ++d) {
          const double v = static_cast<double>(q[h * kIndexDim + d]) * k[d];
          dot += v;
          adot += std::fabs(v);
        }
        acc += static_cast<double>(w[h]) * std::max(dot, 0.0);
        bnd += std::fabs(static_cast<double>(w[h])) * adot;
      }
      (*score)[t] = acc;
      (*bound)[t] = bnd;
    }
  });
}

std::vector<int> Topk(const float* scores, int64_t n, int k) {
  std::vector<int> out(k, -1);
  if (n <= k) {
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<int>(i);
    return out;
  }
  std::vector<int> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int a, int c) {
    const uint32_t ka = TopkKey(scores[a]), kc = TopkKey(scores[c]);
    return ka != kc ? ka > kc : a < c;
  });
  std::sort(idx.begin(), idx.begin() + k);
  std::copy(idx.begin(), idx.begin() + k, out.begin());
  return out;
}

ErrorStats Compare(const float* got, const double* ref, int64_t n) {
  ErrorStats s;
  double err2 = 0, ref2 = 0, got2 = 0, dot = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double g = got[i], r = ref[i];
    if (!std::isfinite(g)) {
      ++s.nonfinite;
      continue;
    }
    s.max_abs_err = std::max(s.max_abs_err, std::fabs(g - r));
    s.max_abs_ref = std::max(s.max_abs_ref, std::fabs(r));
    err2 += (g - r) * (g - r);
    ref2 += r * r;
    got2 += g * g;
    dot += g * r;
  }
  s.rel_l2 = ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
  s.cosine = (ref2 > 0 && got2 > 0) ? dot / std::sqrt(ref2 * got2) : (ref2 == got2 ? 1.0 : 0.0);
  return s;
}

}  // namespace strata::cuda::reference
