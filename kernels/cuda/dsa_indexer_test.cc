// DSA indexer scores against the float64 reference, and top-k against an
// exact CPU selection on the same scores (ties to the lower position).
#include "kernels/cuda/dsa_indexer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "common/testing/test_seed.h"
#include "kernels/cuda/reference.h"
#include "kernels/cuda/test_util.h"

namespace strata::cuda {
namespace {

using testing::DeviceBuffer;
namespace ref = reference;

class DsaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = strata::testing::TestSeed();
  }

  // Runs top-k on the device over host scores; returns [batch][k]. Runs the
  // single-block kernel and the multi-block one (twice on one workspace, which
  // must be left ready for reuse) and expects the same selection from all three.
  std::vector<int> DeviceTopk(const std::vector<float>& scores, int64_t stride,
                              const std::vector<int>& lens, int k) {
    const int batch = static_cast<int>(lens.size());
    DeviceBuffer ds(scores.size() * 4), dl(batch * 4), di(static_cast<size_t>(batch) * k * 4);
    DeviceBuffer ws(TopkWorkspaceBytes(batch, stride));
    ds.Upload(scores.data(), scores.size() * 4);
    dl.Upload(lens.data(), batch * 4);
    STRATA_CUDA_OK(cudaMemset(ws.as<void>(), 0, ws.bytes()));
    std::vector<int> runs[3];
    for (int run = 0; run < 3; ++run) {
      di.Poison(0x7E);
      TopkParams p{ds.as<float>(), stride, dl.as<int>(), batch, k, di.as<int>()};
      p.workspace = run == 0 ? nullptr : ws.as<void>();
      STRATA_CUDA_OK(LaunchTopk(p, nullptr));
      STRATA_CUDA_OK(cudaDeviceSynchronize());
      runs[run].resize(static_cast<size_t>(batch) * k);
      di.Download(runs[run].data(), runs[run].size() * 4);
    }
    EXPECT_TRUE(runs[1] == runs[0]) << "multi-block top-k differs from the single-block kernel, k " << k;
    EXPECT_TRUE(runs[2] == runs[1]) << "multi-block top-k differs on a reused workspace, k " << k;
    return runs[1];
  }

  uint64_t seed_ = 0;
};

TEST_F(DsaTest, IndexerScoresAndSelection) {
  SCOPED_TRACE(seed_);
  testing::Rng rng(seed_);
  const int k = 2048;
  for (int heads : {64, 32}) {
    for (bool q_bf16 : {true, false}) {
      const std::vector<int64_t> lens = heads == 64 && q_bf16
                                            ? std::vector<int64_t>{131072, 1, 4097}
                                            : std::vector<int64_t>{63, 64, 65, 2048, 2049, 4095};
      const int batch = static_cast<int>(lens.size());
      ref::PagedKv keys = ref::MakeRandomIndexKeys(lens, seed_ + heads + q_bf16, 16);
      if (heads == 32) ref::SprinkleNanCodes(&keys, kIndexPageBytes, kIndexPageScaleOffset, 50, seed_ + 9);
      std::vector<float> q(static_cast<size_t>(batch) * heads * kIndexDim), w(static_cast<size_t>(batch) * heads);
      for (float& x : q) x = testing::FromBf16Bits(testing::ToBf16Bits(rng.Normal()));
      for (float& x : w) x = rng.Normal() * 0.1f;
      DeviceBuffer dq(q.size() * (q_bf16 ? 2 : 4)), dw(w.size() * 4), dpool(keys.pool.size()),
          dtab(keys.page_table.size() * 4), dlens(batch * 4);
      if (q_bf16) {
        std::vector<uint16_t> qb(q.size());
        for (size_t i = 0; i < q.size(); ++i) qb[i] = testing::ToBf16Bits(q[i]);
        dq.Upload(qb.data(), qb.size() * 2);
      } else {
        dq.Upload(q.data(), q.size() * 4);
      }
      dw.Upload(w.data(), w.size() * 4);
      dpool.Upload(keys.pool.data(), keys.pool.size());
      dtab.Upload(keys.page_table.data(), keys.page_table.size() * 4);
      dlens.Upload(keys.seq_lens.data(), batch * 4);
      const int64_t max_len = *std::max_element(lens.begin(), lens.end());
      DeviceBuffer dscores(static_cast<size_t>(batch) * max_len * 4);
      dscores.Poison();
      DsaIndexerParams p;
      p.q = dq.as<void>();
      p.q_is_bf16 = q_bf16;
      p.weights = dw.as<float>();
      p.batch = batch;
      p.index_heads = heads;
      p.pool = dpool.as<uint8_t>();
      p.page_table = dtab.as<int>();
      p.page_table_stride = keys.stride;
      p.seq_lens = dlens.as<int>();
      p.max_seq_len = max_len;
      p.scores = dscores.as<float>();
      p.score_stride = max_len;
      STRATA_CUDA_OK(LaunchDsaIndexer(p, nullptr));
      STRATA_CUDA_OK(cudaDeviceSynchronize());
      std::vector<float> scores(static_cast<size_t>(batch) * max_len);
      dscores.Download(scores.data(), scores.size() * 4);
      // The kernel scores the queries' e4m3 pairs (dsa_indexer.h); each pair
      // is within 2^-8 |q| + 2^-17 max|q_h| of its element.
      std::vector<float> q_scored(q.size());
      ref::IndexerQueryAsScored(q.data(), batch * heads, q_scored.data());
      int64_t far = 0;
      for (int bh = 0; bh < batch * heads; ++bh) {
        const float* x = q.data() + static_cast<size_t>(bh) * kIndexDim;
        double m = 0;
        for (int d = 0; d < kIndexDim; ++d) m = std::max(m, std::fabs(static_cast<double>(x[d])));
        for (int d = 0; d < kIndexDim; ++d) {
          const double err = std::fabs(static_cast<double>(q_scored[static_cast<size_t>(bh) * kIndexDim + d]) - x[d]);
          if (err > 0x1.0p-8 * std::fabs(x[d]) + 0x1.0p-17 * m) ++far;
        }
      }
      EXPECT_EQ(far, 0) << "query pairs farther from the queries than the header says";
      for (int b = 0; b < batch; ++b) {
        SCOPED_TRACE(::testing::Message() << "heads " << heads << " bf16 " << q_bf16 << " T " << lens[b]);
        std::vector<double> want, bound;
        ref::IndexerScores(keys, b, q_scored.data() + static_cast<size_t>(b) * heads * kIndexDim,
                           w.data() + static_cast<size_t>(b) * heads, heads, &want, &bound);
        // e4m3 wgmma adds its products into the f32 accumulator keeping
        // about 14 bits (reported for fp8 GEMMs on Hopper), so each of the
        // eight instructions per dot may lose up to 2^-13 of the head's
        // absolute sum: 2^-10 of `bound` in all (the f32 epilogue adds far
        // less). The worst ratio seen is printed.
        int64_t bad = 0, nonfinite = 0;
        double worst = 0;
        for (int64_t t = 0; t < lens[b]; ++t) {
          const float g = scores[b * max_len + t];
          if (!std::isfinite(g)) {
            ++nonfinite;
            continue;
          }
          const double err = std::fabs(g - want[t]);
          if (bound[t] > 0) worst = std::max(worst, err / bound[t]);
          if (err > 0x1.0p-10 * bound[t] + 1e-30) ++bad;
        }
        std::printf("heads %d, %s queries, T %lld: worst |score - reference| / bound = 2^%.1f\n", heads,
                    q_bf16 ? "bf16" : "f32", static_cast<long long>(lens[b]), worst > 0 ? std::log2(worst) : -999.0);
        EXPECT_EQ(nonfinite, 0);
        EXPECT_EQ(bad, 0);
      }
      // Selection on the device equals the CPU selection on the same scores.
      std::vector<int> ilens(lens.begin(), lens.end());
      const std::vector<int> got = DeviceTopk(scores, max_len, ilens, k);
      for (int b = 0; b < batch; ++b) {
        const std::vector<int> want = ref::Topk(scores.data() + b * max_len, lens[b], k);
        EXPECT_TRUE(std::equal(want.begin(), want.end(), got.begin() + static_cast<size_t>(b) * k))
            << "top-k differs, T " << lens[b];
      }

      // The fused launch (histogram in the indexer, requests of T <= k not
      // scored), twice on one workspace: the same scores where T > k and the
      // same selection everywhere.
      DeviceBuffer ws(TopkWorkspaceBytes(batch, max_len)), di(static_cast<size_t>(batch) * k * 4);
      STRATA_CUDA_OK(cudaMemset(ws.as<void>(), 0, ws.bytes()));
      for (int run = 0; run < 2; ++run) {
        SCOPED_TRACE(::testing::Message() << "fused, run " << run << ", heads " << heads << " bf16 " << q_bf16);
        dscores.Poison();
        di.Poison(0x7E);
        TopkParams t{dscores.as<float>(), max_len, dlens.as<int>(), batch, k, di.as<int>()};
        t.workspace = ws.as<void>();
        STRATA_CUDA_OK(LaunchDsaIndexerTopk(p, t, nullptr));
        STRATA_CUDA_OK(cudaDeviceSynchronize());
        std::vector<float> fused_scores(scores.size());
        std::vector<int> fused(static_cast<size_t>(batch) * k);
        dscores.Download(fused_scores.data(), fused_scores.size() * 4);
        di.Download(fused.data(), fused.size() * 4);
        EXPECT_TRUE(fused == got) << "fused selection differs";
        for (int b = 0; b < batch; ++b) {
          if (lens[b] <= k) continue;
          EXPECT_EQ(0, std::memcmp(fused_scores.data() + b * max_len, scores.data() + b * max_len, lens[b] * 4))
              << "fused scores differ, T " << lens[b];
        }
      }
      // Batch invariance: the longest request scored alone (another grid,
      // other blocks over its pages) gets the same bits.
      {
        const int bl = static_cast<int>(std::max_element(lens.begin(), lens.end()) - lens.begin());
        const size_t esz = q_bf16 ? 2 : 4;
        DsaIndexerParams one = p;
        one.q = static_cast<const uint8_t*>(p.q) + static_cast<size_t>(bl) * heads * kIndexDim * esz;
        one.weights = p.weights + static_cast<size_t>(bl) * heads;
        one.batch = 1;
        one.page_table = p.page_table + static_cast<size_t>(bl) * keys.stride;
        one.seq_lens = p.seq_lens + bl;
        one.max_seq_len = lens[bl];
        dscores.Poison();
        STRATA_CUDA_OK(LaunchDsaIndexer(one, nullptr));
        STRATA_CUDA_OK(cudaDeviceSynchronize());
        std::vector<float> alone(lens[bl]);
        dscores.Download(alone.data(), alone.size() * 4);
        EXPECT_EQ(0, std::memcmp(alone.data(), scores.data() + bl * max_len, lens[bl] * 4))
            << "scores of T " << lens[bl] << " depend on the batch";
      }
      TopkParams bad{dscores.as<float>(), max_len + 1, dlens.as<int>(), batch, k, di.as<int>()};
      bad.workspace = ws.as<void>();
      EXPECT_EQ(LaunchDsaIndexerTopk(p, bad, nullptr), cudaErrorInvalidValue);
    }
  }
}

TEST_F(DsaTest, TopkBreaksTiesTowardLowerPositions) {
  SCOPED_TRACE(seed_);
  testing::Rng rng(seed_);
  const std::vector<int> lens = {1, 100, 2048, 2049, 5000, 131072, 300000};
  const int64_t stride = 300000;
  for (int k : {2048, 1, 777}) {
    for (int levels : {3, 1000, 0}) {  // few distinct values, many, continuous
      std::vector<float> scores(lens.size() * stride);
      for (float& x : scores) {
        if (levels == 0) {
          x = rng.Normal();
        } else {
          x = static_cast<float>(rng.Below(levels)) - levels / 2;
          if (rng.Below(50) == 0) x = -0.0f;  // -0 orders just below +0
        }
      }
      const std::vector<int> got = DeviceTopk(scores, stride, lens, k);
      for (size_t b = 0; b < lens.size(); ++b) {
        const std::vector<int> want = ref::Topk(scores.data() + b * stride, lens[b], k);
        EXPECT_TRUE(std::equal(want.begin(), want.end(), got.begin() + b * k))
            << "k " << k << " levels " << levels << " T " << lens[b];
      }
    }
  }
}

// Past 1024 chunks of 2048 scores the multi-block top-k's last block counts
// per chunk in its workspace instead of shared memory; past 4096 candidates
// it reads them twice from the workspace (few distinct values).
TEST_F(DsaTest, TopkOverMoreChunksThanSharedCounters) {
  SCOPED_TRACE(seed_);
  testing::Rng rng(seed_);
  const std::vector<int> lens = {1025 * 2048 + 1, 1000};
  const int64_t stride = lens[0];
  for (int levels : {0, 50}) {
    std::vector<float> scores(lens.size() * stride);
    for (float& x : scores) x = levels == 0 ? rng.Normal() : static_cast<float>(rng.Below(levels));
    const int k = 2048;
    const std::vector<int> got = DeviceTopk(scores, stride, lens, k);
    for (size_t b = 0; b < lens.size(); ++b) {
      const std::vector<int> want = ref::Topk(scores.data() + b * stride, lens[b], k);
      EXPECT_TRUE(std::equal(want.begin(), want.end(), got.begin() + b * k)) << "levels " << levels << " T " << lens[b];
    }
  }
}

}  // namespace
}  // namespace strata::cuda
