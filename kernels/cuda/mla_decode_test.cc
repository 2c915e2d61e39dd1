// Absorbed MLA decode (dense and sparse) on the GPU against the float64 CPU
// reference, on fresh random caches: error, cosine similarity and NaN counts;
// batch invariance and determinism.
#include "kernels/cuda/mla_decode.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/testing/test_seed.h"
#include "kernels/cuda/kv_layout.h"
#include "kernels/cuda/reference.h"
#include "kernels/cuda/test_util.h"

namespace strata::cuda {
namespace {

using testing::DeviceBuffer;
namespace ref = reference;

constexpr int kThreads = 16;
// bf16 unit roundoff: the kernel rounds P' = p * c_scale (and f32 queries) to bf16.
constexpr double kBf16Eps = 1.0 / 256;

struct Inputs {
  int heads = 0;
  std::vector<int64_t> lens;
  bool q_bf16 = true;
  bool q_exact = true;       // queries representable in bf16 (else the kernel rounds them)
  std::vector<int> indices;  // sparse: batch * index_stride, else empty
  int64_t index_stride = 0;
  // Sparse: plan min(length, index_stride) entries per request, as the GPU
  // engine does (a selection of a short context ends in -1s), not all of them.
  bool plan_short_selections = false;
  double softmax_scale = 0;
  bool nan_codes = false;    // some cache codes are NaN codes (read as 0)
};

struct Outputs {
  std::vector<float> out, lse;
};

class MlaDecodeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = strata::testing::TestSeed();
    int dev = 0;
    STRATA_CUDA_OK(cudaGetDevice(&dev));
    STRATA_CUDA_OK(cudaDeviceGetAttribute(&policy_.num_sms, cudaDevAttrMultiProcessorCount, dev));
  }

  // Random queries (normal, scaled so that scores have a spread of a few units).
  void MakeQueries(const Inputs& in, uint64_t seed) {
    testing::Rng rng(seed);
    const size_t b = in.lens.size();
    q_abs_.resize(b * in.heads * kLatentDim);
    q_pe_.resize(b * in.heads * kRopeDim);
    for (auto* v : {&q_abs_, &q_pe_})
      for (float& x : *v) {
        x = rng.Normal() * 2.0f;
        if (in.q_exact) x = testing::FromBf16Bits(testing::ToBf16Bits(x));
      }
  }

  Outputs Run(const ref::PagedKv& kv, const Inputs& in) {
    const int batch = static_cast<int>(in.lens.size());
    DeviceBuffer pool(kv.pool.size()), table(kv.page_table.size() * 4), lens(batch * 4);
    pool.Upload(kv.pool.data(), kv.pool.size());
    table.Upload(kv.page_table.data(), kv.page_table.size() * 4);
    lens.Upload(kv.seq_lens.data(), batch * 4);
    const size_t qa_n = q_abs_.size(), qp_n = q_pe_.size();
    const size_t esz = in.q_bf16 ? 2 : 4;
    DeviceBuffer qa(qa_n * esz), qp(qp_n * esz);
    if (in.q_bf16) {
      std::vector<uint16_t> a(qa_n), p(qp_n);
      for (size_t i = 0; i < qa_n; ++i) a[i] = testing::ToBf16Bits(q_abs_[i]);
      for (size_t i = 0; i < qp_n; ++i) p[i] = testing::ToBf16Bits(q_pe_[i]);
      qa.Upload(a.data(), qa_n * 2);
      qp.Upload(p.data(), qp_n * 2);
    } else {
      qa.Upload(q_abs_.data(), qa_n * 4);
      qp.Upload(q_pe_.data(), qp_n * 4);
    }
    DeviceBuffer idx(std::max<size_t>(4, in.indices.size() * 4));
    if (!in.indices.empty()) idx.Upload(in.indices.data(), in.indices.size() * 4);
    std::vector<int64_t> plan_lens(batch);
    for (int b = 0; b < batch; ++b)
      plan_lens[b] = in.indices.empty()           ? in.lens[b]
                     : in.plan_short_selections ? std::min(in.lens[b], in.index_stride)
                                                : in.index_stride;
    const MlaDecodePlan plan = PlanMlaDecode(plan_lens.data(), batch, in.heads, policy_, !in.indices.empty());
    DeviceBuffer work(plan.work.size() * 4), offs(plan.split_offset.size() * 4);
    work.Upload(plan.work.data(), plan.work.size() * 4);
    offs.Upload(plan.split_offset.data(), plan.split_offset.size() * 4);
    DeviceBuffer op(MlaPartialFloats(plan.total_splits, in.heads) * 4 + 4),
        ml(static_cast<size_t>(plan.total_splits) * in.heads * 8 + 4);
    DeviceBuffer out(static_cast<size_t>(batch) * in.heads * kLatentDim * 4), lse(static_cast<size_t>(batch) * in.heads * 4);
    op.Poison();
    ml.Poison();
    out.Poison();
    lse.Poison();
    MlaDecodeParams p;
    p.q_abs = qa.as<void>();
    p.q_pe = qp.as<void>();
    p.q_is_bf16 = in.q_bf16;
    p.batch = batch;
    p.heads = in.heads;
    p.softmax_scale = static_cast<float>(in.softmax_scale);
    p.pool = pool.as<uint8_t>();
    p.page_table = table.as<int>();
    p.page_table_stride = kv.stride;
    p.seq_lens = lens.as<int>();
    p.indices = in.indices.empty() ? nullptr : idx.as<int>();
    p.index_stride = in.index_stride;
    p.work = work.as<int>();
    p.num_work = plan.num_work;
    p.split_offset = offs.as<int>();
    p.o_partial = op.as<float>();
    p.ml_partial = ml.as<float>();
    p.out = out.as<float>();
    p.lse = lse.as<float>();
    STRATA_CUDA_OK(LaunchMlaDecode(p, nullptr));
    STRATA_CUDA_OK(cudaDeviceSynchronize());
    Outputs o;
    o.out.resize(out.bytes() / 4);
    o.lse.resize(lse.bytes() / 4);
    out.Download(o.out.data(), out.bytes());
    lse.Download(o.lse.data(), lse.bytes());
    return o;
  }

  // Checks every request against the reference on `sampled` heads (all when 0).
  void Check(const ref::PagedKv& kv, const Inputs& in, const Outputs& o, int sampled) {
    const int batch = static_cast<int>(in.lens.size());
    int64_t nonfinite = 0;
    for (float v : o.out) nonfinite += std::isfinite(v) ? 0 : 1;
    for (float v : o.lse) nonfinite += std::isfinite(v) ? 0 : 1;
    EXPECT_EQ(nonfinite, 0) << "NaN/inf (or unwritten) outputs";
    testing::Rng rng(seed_ ^ 0x1234);
    for (int b = 0; b < batch; ++b) {
      std::vector<int> heads;
      if (sampled == 0 || sampled >= in.heads) {
        for (int h = 0; h < in.heads; ++h) heads.push_back(h);
      } else {
        heads = {0, in.heads - 1};
        while (static_cast<int>(heads.size()) < sampled) heads.push_back(static_cast<int>(rng.Below(in.heads)));
      }
      std::vector<double> ctx, lse;
      const int* entries = in.indices.empty() ? nullptr : in.indices.data() + b * in.index_stride;
      ref::MlaDecode(kv, b, q_abs_.data() + static_cast<size_t>(b) * in.heads * kLatentDim,
                     q_pe_.data() + static_cast<size_t>(b) * in.heads * kRopeDim, heads,
                     in.softmax_scale, entries, in.index_stride, kThreads, &ctx, &lse);
      std::vector<float> got(heads.size() * kLatentDim);
      double lse_err = 0;
      for (size_t i = 0; i < heads.size(); ++i) {
        const size_t row = static_cast<size_t>(b) * in.heads + heads[i];
        std::memcpy(&got[i * kLatentDim], &o.out[row * kLatentDim], kLatentDim * 4);
        lse_err = std::max(lse_err, std::fabs(o.lse[row] - lse[i]) / (1.0 + std::fabs(lse[i])));
      }
      const ref::ErrorStats s = ref::Compare(got.data(), ctx.data(), static_cast<int64_t>(got.size()));
      SCOPED_TRACE(::testing::Message() << "seed " << seed_ << " request " << b << " T " << in.lens[b]
                                        << " heads " << in.heads);
      EXPECT_EQ(s.nonfinite, 0);
      EXPECT_GE(s.cosine, 0.9995);
      EXPECT_LE(s.MaxRel(), 2e-2);
      EXPECT_LE(s.rel_l2, 2 * kBf16Eps);
      EXPECT_LE(lse_err, 2 * kBf16Eps);
      worst_cos_ = std::min(worst_cos_, s.cosine);
      worst_rel_ = std::max(worst_rel_, s.MaxRel());
    }
  }

  void RunAndCheck(const Inputs& in, int sampled) {
    ref::PagedKv kv = ref::MakeRandomKv(in.lens, seed_, kThreads);
    if (in.nan_codes) ref::SprinkleNanCodes(&kv, kPageBytes, kPageScaleOffset, 50, seed_ + 5);
    MakeQueries(in, seed_ + 1);
    const Outputs o = Run(kv, in);
    if (in.q_exact) {
      Check(kv, in, o, sampled);
      return;
    }
    // f32 queries: the kernel's contract is to round them to bf16 on load
    // (mla_decode.h), so the gates apply against the reference of the
    // rounded queries. What the rounding itself costs against the f32
    // queries is printed (max-rel ~1-3e-2, rel-l2 ~2 bf16 eps: the
    // rounding, not the kernel's arithmetic).
    const std::vector<float> qa = q_abs_, qp = q_pe_;
    for (auto* v : {&q_abs_, &q_pe_}) {
      for (float& x : *v) x = testing::FromBf16Bits(testing::ToBf16Bits(x));
    }
    Check(kv, in, o, sampled);
    q_abs_ = qa;
    q_pe_ = qp;
    const ref::ErrorStats s = CompareOne(kv, in, o, 0);
    std::printf("  against the unrounded f32 queries: cosine %.7f, max-rel %.3e, rel-l2 %.3e\n", s.cosine,
                s.MaxRel(), s.rel_l2);
    EXPECT_GE(s.cosine, 0.9995);
  }

  // Request b's error on every head against the reference of the current
  // queries.
  ref::ErrorStats CompareOne(const ref::PagedKv& kv, const Inputs& in, const Outputs& o, int b) {
    std::vector<int> heads;
    for (int h = 0; h < in.heads; ++h) heads.push_back(h);
    std::vector<double> ctx, lse;
    const int* entries = in.indices.empty() ? nullptr : in.indices.data() + b * in.index_stride;
    ref::MlaDecode(kv, b, q_abs_.data() + static_cast<size_t>(b) * in.heads * kLatentDim,
                   q_pe_.data() + static_cast<size_t>(b) * in.heads * kRopeDim, heads, in.softmax_scale, entries,
                   in.index_stride, kThreads, &ctx, &lse);
    const float* got = o.out.data() + static_cast<size_t>(b) * in.heads * kLatentDim;
    return ref::Compare(got, ctx.data(), static_cast<int64_t>(ctx.size()));
  }

  void TearDown() override {
    if (worst_cos_ < 2) std::printf("  worst cosine %.7f, worst max-rel %.3e (seed %llu)\n", worst_cos_,
                                    worst_rel_, static_cast<unsigned long long>(seed_));
  }

  uint64_t seed_ = 0;
  MlaSplitPolicy policy_;
  std::vector<float> q_abs_, q_pe_;
  double worst_cos_ = 2, worst_rel_ = 0;
};

const int64_t kLens[] = {1, 63, 64, 65, 4095, 4097};

double ScaleFor() { return 1.0 / std::sqrt(192.0); }

TEST_F(MlaDecodeTest, SingleRequestEveryLengthAndHeadCount) {
  // 20: a head count that is not a multiple of the partials' groups of 8.
  for (int heads : {16, 20, 64, 128})
    for (int64_t t : kLens) {
      Inputs in;
      in.heads = heads;
      in.lens = {t};
      in.softmax_scale = ScaleFor();
      RunAndCheck(in, heads == 128 ? 32 : 0);
    }
}

TEST_F(MlaDecodeTest, MixedBatchesOfThree) {
  testing::Rng rng(seed_);
  for (int heads : {16, 64, 128}) {
    Inputs in;
    in.heads = heads;
    for (int i = 0; i < 3; ++i) in.lens.push_back(kLens[rng.Below(6)]);
    in.softmax_scale = ScaleFor();
    in.q_bf16 = heads != 64;  // one f32-query case
    in.nan_codes = true;
    RunAndCheck(in, 16);
  }
}

TEST_F(MlaDecodeTest, MixedBatchOfSixtyFour) {
  testing::Rng rng(seed_);
  for (int heads : {16, 128}) {
    Inputs in;
    in.heads = heads;
    for (int i = 0; i < 64; ++i) in.lens.push_back(kLens[rng.Below(6)]);
    in.softmax_scale = ScaleFor();
    RunAndCheck(in, 8);
  }
}

TEST_F(MlaDecodeTest, FloatQueriesNotRepresentableInBf16) {
  Inputs in;
  in.heads = 64;
  in.lens = {4097, 65};
  in.q_bf16 = false;
  in.q_exact = false;
  in.softmax_scale = ScaleFor();
  RunAndCheck(in, 0);
}

TEST_F(MlaDecodeTest, LongContexts) {
  for (int64_t t : {int64_t{100000}, int64_t{1048576}}) {
    Inputs in;
    in.heads = 128;
    in.lens = {t};
    in.softmax_scale = ScaleFor();
    RunAndCheck(in, 8);
  }
}

TEST_F(MlaDecodeTest, SparseSelectionsIncludingMaskedEntries) {
  testing::Rng rng(seed_);
  const int k = 2048;
  Inputs in;
  in.heads = 128;
  in.lens = {1000, 5000, 70000};
  in.index_stride = k;
  in.softmax_scale = ScaleFor();
  for (int64_t t : in.lens) {
    std::vector<int> sel;
    if (t <= k) {  // the selection of a short context: everything, -1 padded
      for (int i = 0; i < k; ++i) sel.push_back(i < t ? i : -1);
    } else {  // distinct random positions in random order, a few -1 holes
      std::vector<int> all(t);
      for (int i = 0; i < t; ++i) all[i] = i;
      for (int i = 0; i < k; ++i) std::swap(all[i], all[i + rng.Below(t - i)]);
      sel.assign(all.begin(), all.begin() + k);
      for (int i = 0; i < 40; ++i) sel[rng.Below(k)] = -1;
    }
    in.indices.insert(in.indices.end(), sel.begin(), sel.end());
  }
  for (int tiles_per_split : {1, 2, 8}) {  // 32, 16 and 4 splits of k = 2048
    for (bool short_plan : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "sparse tiles per split " << tiles_per_split << ", short plan "
                                        << short_plan);
      policy_.sparse_min_tiles_per_split = tiles_per_split;
      in.plan_short_selections = short_plan;
      RunAndCheck(in, 8);
    }
  }
}

TEST_F(MlaDecodeTest, BatchInvariantAndDeterministic) {
  Inputs alone;
  alone.heads = 128;
  alone.lens = {4097};
  alone.softmax_scale = ScaleFor();
  Inputs batch = alone;
  // On a 132-SM device the batch's 158 (split x head group) items exceed the
  // SMs and take the several-items-per-block launch, while the request alone
  // (18 items) takes the one-item launch: the bits are compared across both.
  batch.lens = {65, 100000, 4097, 1, 777};
  const int at = 2;
  // The request under test uses the same cache rows and queries in both runs.
  ref::PagedKv kv_batch = ref::MakeRandomKv(batch.lens, seed_, kThreads);
  MakeQueries(batch, seed_ + 1);
  const std::vector<float> qa_all = q_abs_, qp_all = q_pe_;
  const Outputs ob = Run(kv_batch, batch);
  const Outputs ob2 = Run(kv_batch, batch);
  EXPECT_EQ(0, std::memcmp(ob.out.data(), ob2.out.data(), ob.out.size() * 4)) << "not deterministic";
  EXPECT_EQ(0, std::memcmp(ob.lse.data(), ob2.lse.data(), ob.lse.size() * 4)) << "not deterministic";

  ref::PagedKv kv_alone;
  kv_alone.pool = kv_batch.pool;
  kv_alone.n_pages = kv_batch.n_pages;
  kv_alone.stride = kv_batch.stride;
  kv_alone.seq_lens = {kv_batch.seq_lens[at]};
  kv_alone.page_table.assign(kv_batch.page_table.begin() + at * kv_batch.stride,
                             kv_batch.page_table.begin() + (at + 1) * kv_batch.stride);
  const size_t qa_n = static_cast<size_t>(alone.heads) * kLatentDim, qp_n = static_cast<size_t>(alone.heads) * kRopeDim;
  q_abs_.assign(qa_all.begin() + at * qa_n, qa_all.begin() + (at + 1) * qa_n);
  q_pe_.assign(qp_all.begin() + at * qp_n, qp_all.begin() + (at + 1) * qp_n);
  const Outputs oa = Run(kv_alone, alone);
  EXPECT_EQ(0, std::memcmp(oa.out.data(), ob.out.data() + at * qa_n, qa_n * 4)) << "output bits depend on the batch";
  EXPECT_EQ(0, std::memcmp(oa.lse.data(), ob.lse.data() + at * alone.heads, alone.heads * 4));
  Check(kv_alone, alone, oa, 8);
}

TEST(MlaSplitPolicyHostTest, SplitsDependOnLengthOnly) {
  MlaSplitPolicy pol;
  pol.num_sms = 132;
  EXPECT_EQ(MlaSplitCount(0, 128, pol), 1);
  EXPECT_EQ(MlaSplitCount(1, 128, pol), 1);
  EXPECT_EQ(MlaSplitCount(64 * 8, 128, pol), 1);
  EXPECT_EQ(MlaSplitCount(64 * 8 + 1, 128, pol), 2);
  EXPECT_LE(MlaSplitCount(int64_t{1} << 20, 128, pol), 66);
  pol.sparse_min_tiles_per_split = 1;
  EXPECT_EQ(MlaSplitCount(2048, 128, pol, /*sparse=*/true), 32);
  pol.sparse_min_tiles_per_split = 2;
  EXPECT_EQ(MlaSplitCount(2048, 128, pol, /*sparse=*/true), 16);
  EXPECT_EQ(MlaSplitCount(2048, 128, pol), 4);  // dense: 8 tiles minimum
  const int64_t lens[] = {5, 4097, 131072};
  const MlaDecodePlan a = PlanMlaDecode(lens, 3, 128, pol);
  const MlaDecodePlan b = PlanMlaDecode(lens + 2, 1, 128, pol);
  EXPECT_EQ(a.split_offset[3] - a.split_offset[2], b.total_splits);
  // Every tile of every request is covered exactly once, in order.
  for (int r = 0; r < 3; ++r) {
    int64_t next = 0;
    for (int i = 0; i < a.num_work; ++i)
      if (a.work[4 * i] == r) {
        EXPECT_EQ(a.work[4 * i + 2], next);
        next = a.work[4 * i + 3];
      }
    EXPECT_EQ(next, (lens[r] + 63) / 64);
  }
}

// The split partials' layout: every (split, head, dim) has a float of its own
// inside MlaPartialFloats, a warp's stores of one dim block (8 heads x 8 dims,
// lane 4r + q holding dims 2q, 2q + 1 of head r) are one run of 64 floats, and
// so is what a merge group reads of a split (col: 4 dims of head (col / 2) % 8,
// dims 8 (col / 16) + 4 (col % 2) of its block's eighth).
TEST(MlaPartialLayoutHostTest, EveryFloatIsOwnedAndTheKernelsAccessesAreContiguous) {
  constexpr int kSlots = 3;
  for (int heads : {1, 16, 20, 128}) {
    std::vector<int> owners(MlaPartialFloats(kSlots, heads), 0);
    for (int slot = 0; slot < kSlots; ++slot)
      for (int h = 0; h < heads; ++h)
        for (int d = 0; d < kLatentDim; ++d) {
          const int64_t i = MlaPartialIndex(heads, slot, h, d);
          ASSERT_GE(i, 0);
          ASSERT_LT(i, static_cast<int64_t>(owners.size())) << "heads " << heads;
          ASSERT_EQ(++owners[i], 1) << "heads " << heads << " slot " << slot << " head " << h << " dim " << d;
        }
  }
  const int heads = 128;
  for (int h8 = 0; h8 < heads; h8 += kMlaPartialHeads)
    for (int block = 0; block < kLatentDim / 8; ++block) {
      std::vector<int64_t> idx;
      for (int lane = 0; lane < 32; ++lane)
        for (int c = 0; c < 2; ++c)
          idx.push_back(MlaPartialIndex(heads, 1, h8 + lane / 4, block * 8 + 2 * (lane % 4) + c));
      std::sort(idx.begin(), idx.end());
      EXPECT_EQ(idx.back() - idx.front(), 63) << "store of heads " << h8 << " block " << block;
    }
  for (int hg = 0; hg < heads / kMlaPartialHeads; ++hg)
    for (int part = 0; part < 8; ++part) {
      const int64_t base = MlaPartialIndex(heads, 2, hg * kMlaPartialHeads, part * 64);
      for (int col = 0; col < 128; ++col)
        for (int e = 0; e < 4; ++e) {
          const int h = hg * kMlaPartialHeads + (col / 2) % kMlaPartialHeads;
          const int d = part * 64 + (col / 16) * 8 + (col % 2) * 4 + e;
          EXPECT_EQ(MlaPartialIndex(heads, 2, h, d), base + 4 * col + e) << "merge read, col " << col;
        }
    }
}

}  // namespace
}  // namespace strata::cuda
