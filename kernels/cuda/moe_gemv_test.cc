// LaunchMoeGemv and LaunchMoeGemm against a float64 CPU reference of the
// routed experts on fresh random data: bf16 and f32 weights, experts used by
// no entry, by one and by more entries than one group (or one 64-entry pass),
// a token routed twice to the same expert, an out-of-range id (y = 0), and an
// entry's bits alone equal to its bits in a batch.
#include "kernels/cuda/moe_gemv.h"

#include <cmath>
#include <cstdio>
#include <vector>

#include "common/testing/test_seed.h"
#include "gtest/gtest.h"
#include "kernels/cuda/test_util.h"
#include "kernels/fp8.h"

namespace strata::cuda {
namespace {

using testing::DeviceBuffer;

struct Problem {
  int experts = 12, hidden = 72, inter = 40, rows = 0, k = 0;
  bool bf16 = true;
  std::vector<std::vector<float>> gate_up, down;  // per expert, the values as stored (bf16-rounded when bf16)
  // fp8: per expert the codes and 128×128 block scales of gate_up and down;
  // gate_up and down then hold Decode(code) * scale (f32).
  bool fp8 = false;
  std::vector<std::vector<uint8_t>> gate_up_codes, down_codes;
  std::vector<std::vector<float>> gate_up_scales, down_scales;
  std::vector<float> x;
  std::vector<int> ids;
};

float Stored(float v, bool bf16) { return bf16 ? testing::FromBf16Bits(testing::ToBf16Bits(v)) : v; }

Problem MakeProblem(uint64_t seed, bool bf16, int rows, int k, int hidden = 72, int inter = 40) {
  testing::Rng rng(seed);
  Problem p;
  p.hidden = hidden;
  p.inter = inter;
  p.bf16 = bf16;
  p.rows = rows;
  p.k = k;
  p.gate_up.resize(p.experts);
  p.down.resize(p.experts);
  for (int e = 0; e < p.experts; ++e) {
    p.gate_up[e].resize(static_cast<size_t>(2) * p.inter * p.hidden);
    p.down[e].resize(static_cast<size_t>(p.hidden) * p.inter);
    for (float& v : p.gate_up[e]) v = Stored(rng.Normal() / std::sqrt(static_cast<float>(p.hidden)), bf16);
    for (float& v : p.down[e]) v = Stored(rng.Normal() / std::sqrt(static_cast<float>(p.inter)), bf16);
  }
  p.x.resize(static_cast<size_t>(rows) * p.hidden);
  for (float& v : p.x) v = rng.Normal();
  // Experts 0..2 are never used; expert 3 takes every row's first slot (more
  // entries than one group of four); the rest at random.
  p.ids.resize(static_cast<size_t>(rows) * k);
  for (int r = 0; r < rows; ++r) {
    for (int j = 0; j < k; ++j) p.ids[r * k + j] = j == 0 ? 3 : 3 + static_cast<int>(rng.Below(p.experts - 3));
  }
  return p;
}

// The same experts with fp8 weights: random codes (NaN codes included: they
// read as 0) and block scales over several binades, for [rows][cols]
// matrices whose blocks are partial (72 and 40 columns, 80 and 72 rows).
void MakeFp8(uint64_t seed, Problem& p) {
  testing::Rng rng(seed ^ 0xF8F8F8F8ull);
  p.fp8 = true;
  p.bf16 = false;
  auto make = [&](int rows, int cols, std::vector<uint8_t>& codes, std::vector<float>& scales, std::vector<float>& v) {
    const int bk = (cols + 127) / 128;
    codes.resize(static_cast<size_t>(rows) * cols);
    for (uint8_t& c : codes) c = static_cast<uint8_t>(rng.Next());
    scales.resize(static_cast<size_t>((rows + 127) / 128) * bk);
    for (float& s : scales) s = std::ldexp(1.0f + static_cast<float>(rng.Uniform()), -9 - static_cast<int>(rng.Below(4)));
    v.resize(codes.size());
    for (size_t i = 0; i < codes.size(); ++i) {
      const size_t r = i / cols, c = i % cols;
      v[i] = fp8::Decode(codes[i]) * scales[(r / 128) * bk + c / 128];
    }
  };
  p.gate_up_codes.resize(p.experts);
  p.down_codes.resize(p.experts);
  p.gate_up_scales.resize(p.experts);
  p.down_scales.resize(p.experts);
  for (int e = 0; e < p.experts; ++e) {
    make(2 * p.inter, p.hidden, p.gate_up_codes[e], p.gate_up_scales[e], p.gate_up[e]);
    make(p.hidden, p.inter, p.down_codes[e], p.down_scales[e], p.down[e]);
  }
}

// y[entry][hidden] in float64; entries with an invalid id are zero. With
// `hybrid` (LaunchMoeGemm), the entries of experts with more than four
// entries have x and act rounded to bf16 first, as the tensor-core kernels'
// operands are; with `act_in` ([entry][inter]) the down product takes those
// act values instead of its own (act_out gets its own).
std::vector<double> Reference(const Problem& p, bool hybrid = false, const std::vector<float>* act_in = nullptr,
                              std::vector<double>* act_out = nullptr) {
  if (act_out != nullptr) act_out->assign(static_cast<size_t>(p.rows) * p.k * p.inter, 0.0);
  std::vector<int> count(p.experts, 0);
  for (int e : p.ids) {
    if (e >= 0 && e < p.experts) ++count[e];
  }
  std::vector<double> y(static_cast<size_t>(p.rows) * p.k * p.hidden, 0.0);
  for (int i = 0; i < p.rows * p.k; ++i) {
    const int e = p.ids[i];
    if (e < 0 || e >= p.experts) continue;
    const bool bf16_inputs = hybrid && count[e] > 4;
    std::vector<float> x(p.x.begin() + static_cast<size_t>(i / p.k) * p.hidden,
                         p.x.begin() + static_cast<size_t>(i / p.k + 1) * p.hidden);
    if (bf16_inputs) {
      for (float& v : x) v = Stored(v, true);
    }
    std::vector<double> act(p.inter);
    for (int j = 0; j < p.inter; ++j) {
      double g = 0, u = 0;
      for (int c = 0; c < p.hidden; ++c) {
        g += double{p.gate_up[e][static_cast<size_t>(j) * p.hidden + c]} * x[c];
        u += double{p.gate_up[e][static_cast<size_t>(p.inter + j) * p.hidden + c]} * x[c];
      }
      act[j] = g / (1.0 + std::exp(-g)) * u;
      if (act_out != nullptr) (*act_out)[static_cast<size_t>(i) * p.inter + j] = act[j];
      if (act_in != nullptr) act[j] = (*act_in)[static_cast<size_t>(i) * p.inter + j];
      if (bf16_inputs) act[j] = Stored(static_cast<float>(act[j]), true);
    }
    for (int r = 0; r < p.hidden; ++r) {
      double s = 0;
      for (int j = 0; j < p.inter; ++j) s += double{p.down[e][static_cast<size_t>(r) * p.inter + j]} * act[j];
      y[static_cast<size_t>(i) * p.hidden + r] = s;
    }
  }
  return y;
}

// Runs the kernels (LaunchMoeGemv, or LaunchMoeGemm); returns y (and act).
std::vector<float> RunKernel(const Problem& p, bool tensor_cores = false, std::vector<float>* act_out = nullptr) {
  std::vector<DeviceBuffer> weights;
  std::vector<const void*> ptrs(4 * p.experts);  // gate_up, down, and with fp8 their scales
  for (int t = 0; t < 2; ++t) {
    for (int e = 0; e < p.experts; ++e) {
      const std::vector<float>& m = t == 0 ? p.gate_up[e] : p.down[e];
      if (p.fp8) {
        const std::vector<uint8_t>& codes = t == 0 ? p.gate_up_codes[e] : p.down_codes[e];
        const std::vector<float>& scales = t == 0 ? p.gate_up_scales[e] : p.down_scales[e];
        weights.emplace_back(codes.size());
        weights.back().Upload(codes.data(), codes.size());
        ptrs[t * p.experts + e] = weights.back().as<void>();
        weights.emplace_back(scales.size() * 4);
        weights.back().Upload(scales.data(), scales.size() * 4);
        ptrs[(2 + t) * p.experts + e] = weights.back().as<void>();
        continue;
      }
      if (p.bf16) {
        std::vector<uint16_t> b(m.size());
        for (size_t i = 0; i < m.size(); ++i) b[i] = testing::ToBf16Bits(m[i]);
        weights.emplace_back(b.size() * 2);
        weights.back().Upload(b.data(), b.size() * 2);
      } else {
        weights.emplace_back(m.size() * 4);
        weights.back().Upload(m.data(), m.size() * 4);
      }
      ptrs[t * p.experts + e] = weights.back().as<void>();
    }
  }
  const int n = p.rows * p.k;
  DeviceBuffer table(ptrs.size() * sizeof(void*)), x(p.x.size() * 4), ids(p.ids.size() * 4);
  DeviceBuffer offsets((p.experts + 1) * 4), used((p.experts + 1) * 4), list(n * 4), act(static_cast<size_t>(n) * p.inter * 4),
      y(static_cast<size_t>(n) * p.hidden * 4);
  table.Upload(ptrs.data(), table.bytes());
  x.Upload(p.x.data(), x.bytes());
  ids.Upload(p.ids.data(), ids.bytes());
  y.Poison();
  MoeGemvParams mp;
  mp.type = p.bf16 ? GemmType::kBF16 : GemmType::kF32;
  mp.gate_up = table.as<const void*>();
  mp.down = table.as<const void*>() + p.experts;
  mp.fp8 = p.fp8;
  if (p.fp8) {
    mp.gate_up_scale = reinterpret_cast<const float* const*>(table.as<const void*>() + 2 * p.experts);
    mp.down_scale = reinterpret_cast<const float* const*>(table.as<const void*>() + 3 * p.experts);
  }
  mp.experts = p.experts;
  mp.hidden = p.hidden;
  mp.inter = p.inter;
  mp.x = x.as<float>();
  mp.expert_ids = ids.as<int>();
  mp.rows = p.rows;
  mp.k = p.k;
  mp.offsets = offsets.as<int>();
  mp.used = used.as<int>();
  mp.list = list.as<int>();
  mp.act = act.as<float>();
  mp.y = y.as<float>();
  STRATA_CUDA_OK(tensor_cores ? LaunchMoeGemm(mp, nullptr) : LaunchMoeGemv(mp, nullptr));
  STRATA_CUDA_OK(cudaDeviceSynchronize());
  std::vector<float> out(static_cast<size_t>(n) * p.hidden);
  y.Download(out.data(), y.bytes());
  if (act_out != nullptr) {
    act_out->resize(static_cast<size_t>(n) * p.inter);
    act.Download(act_out->data(), act.bytes());
  }
  return out;
}

class MoeGemvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = strata::testing::TestSeed();
  }
  uint64_t seed_ = 0;
};

TEST_F(MoeGemvTest, MatchesFloat64ReferenceForBf16AndF32Weights) {
  for (bool bf16 : {true, false}) {
    for (int rows : {1, 3, 9}) {
      SCOPED_TRACE(::testing::Message() << "seed " << seed_ << " bf16 " << bf16 << " rows " << rows);
      Problem p = MakeProblem(seed_ + rows, bf16, rows, 4);
      if (rows == 9) {
        p.ids[5] = p.ids[4];  // one token routed twice to one expert
        p.ids[7] = p.experts + 5;  // out of range: y = 0
      }
      const std::vector<double> ref = Reference(p);
      const std::vector<float> got = RunKernel(p);
      double max_abs = 0, max_err = 0;
      int nonfinite = 0;
      for (size_t i = 0; i < ref.size(); ++i) {
        max_abs = std::max(max_abs, std::fabs(ref[i]));
        max_err = std::max(max_err, std::fabs(got[i] - ref[i]));
        nonfinite += std::isfinite(got[i]) ? 0 : 1;
      }
      std::printf("  bf16 %d rows %d: max |y - ref| / max |ref| = %.2e\n", bf16, rows, max_err / max_abs);
      EXPECT_EQ(nonfinite, 0);
      // f32 sums of 72 and 40 products of unit-scale values: rounding bounded
      // by ~2e-5 of max |y| in the worst case; a wrong row, expert or entry
      // is off by O(max |y|).
      EXPECT_LE(max_err, 1e-4 * max_abs);
      if (rows == 9) {
        for (int c = 0; c < p.hidden; ++c) EXPECT_EQ(got[static_cast<size_t>(7) * p.hidden + c], 0.0f);
      }
    }
  }
}

// fp8 weights with block scales: the kernels decode each weight to the f32
// value the CPU loader gives (Decode(code) * scale), so the bound is the f32
// one above; the tensor-core kernel refuses them.
TEST_F(MoeGemvTest, Fp8WeightsMatchFloat64Reference) {
  for (int rows : {1, 9}) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed_ << " rows " << rows);
    Problem p = MakeProblem(seed_ + rows, false, rows, 4);
    MakeFp8(seed_ + rows, p);
    const std::vector<double> ref = Reference(p);
    const std::vector<float> got = RunKernel(p);
    double max_abs = 0, max_err = 0;
    int nonfinite = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      max_abs = std::max(max_abs, std::fabs(ref[i]));
      max_err = std::max(max_err, std::fabs(got[i] - ref[i]));
      nonfinite += std::isfinite(got[i]) ? 0 : 1;
    }
    std::printf("  fp8 rows %d: max |y - ref| / max |ref| = %.2e\n", rows, max_err / max_abs);
    EXPECT_EQ(nonfinite, 0);
    EXPECT_LE(max_err, 1e-4 * max_abs);
  }
  Problem p = MakeProblem(seed_, false, 2, 4, 256, 256);
  MoeGemvParams mp;
  mp.fp8 = true;
  mp.hidden = 256, mp.inter = 256, mp.experts = p.experts, mp.rows = 2, mp.k = 4;
  EXPECT_EQ(LaunchMoeGemm(mp, nullptr), cudaErrorInvalidValue);
}

TEST_F(MoeGemvTest, AnEntrysBitsDoNotDependOnTheBatch) {
  Problem batch = MakeProblem(seed_, true, 11, 4);
  const std::vector<float> all = RunKernel(batch);
  for (int r : {0, 6, 10}) {
    Problem one = batch;
    one.rows = 1;
    one.x.assign(batch.x.begin() + static_cast<size_t>(r) * batch.hidden,
                 batch.x.begin() + static_cast<size_t>(r + 1) * batch.hidden);
    one.ids.assign(batch.ids.begin() + r * batch.k, batch.ids.begin() + (r + 1) * batch.k);
    const std::vector<float> alone = RunKernel(one);
    for (size_t i = 0; i < alone.size(); ++i) {
      ASSERT_EQ(alone[i], all[static_cast<size_t>(r) * batch.k * batch.hidden + i]) << "row " << r << " at " << i;
    }
  }
}

// LaunchMoeGemm: up to 80 entries on one expert (three passes of 32 on
// tensor cores), experts with at most four entries (matrix-vector), a
// repeated token, an out-of-range id.
TEST_F(MoeGemvTest, TensorCoreProductsMatchFloat64Reference) {
  for (int rows : {5, 80}) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed_ << " rows " << rows);
    Problem p = MakeProblem(seed_ + rows, /*bf16=*/true, rows, 4, /*hidden=*/256, /*inter=*/256);
    p.ids[5] = p.ids[4];
    p.ids[7] = p.experts + 5;
    // Each product on its own: act against float64 from the bf16-rounded x,
    // then y against float64 from the kernel's own act rounded to bf16 (an
    // act value near a bf16 rounding midpoint may round either way in f32
    // and float64; comparing y with the reference's act would count that).
    std::vector<float> act;
    const std::vector<float> got = RunKernel(p, /*tensor_cores=*/true, &act);
    std::vector<double> ref_act;
    Reference(p, /*hybrid=*/true, nullptr, &ref_act);
    const std::vector<double> ref = Reference(p, /*hybrid=*/true, &act);
    auto worst = [](const auto& a, const auto& b, int n_valid_check) {
      double max_abs = 0, max_err = 0;
      int nonfinite = 0;
      for (size_t i = 0; i < b.size(); ++i) {
        max_abs = std::max(max_abs, std::fabs(double{b[i]}));
        max_err = std::max(max_err, std::fabs(double{a[i]} - double{b[i]}));
        nonfinite += std::isfinite(a[i]) ? 0 : 1;
      }
      EXPECT_EQ(nonfinite, n_valid_check);
      return max_err / max_abs;
    };
    // (act of the out-of-range entry is never written: it stays poisoned
    // only in y's buffer, which the kernel zeroes)
    std::vector<float> act_valid = act;
    std::vector<double> ref_act_valid = ref_act;
    for (int j = 0; j < p.inter; ++j) act_valid[static_cast<size_t>(7) * p.inter + j] = 0.0f;
    const double act_err = worst(act_valid, ref_act_valid, 0), y_err = worst(got, ref, 0);
    std::printf("  tensor cores, rows %d: act %.2e, y %.2e of their max |ref|\n", rows, act_err, y_err);
    // f32 sums of 256 products whose |terms| add up to ~10x the largest
    // value: rounding errors of 2^-24 each, as a random walk ~sqrt(256) *
    // 2^-24 * 10 ~ 1e-5 (measured ~2e-7). A wrong row, tile or entry is off
    // by O(1).
    EXPECT_LE(act_err, 2e-5);
    EXPECT_LE(y_err, 2e-5);
    for (int c = 0; c < p.hidden; ++c) EXPECT_EQ(got[static_cast<size_t>(7) * p.hidden + c], 0.0f);
  }
}

// An entry's bits depend on which kernel its expert gets, nothing else:
// expert 3 takes every row's first slot, so in any batch of 5 or more rows
// it runs on tensor cores, and its entries must not see their neighbours.
TEST_F(MoeGemvTest, TensorCoreEntrysBitsDoNotDependOnTheBatch) {
  Problem batch = MakeProblem(seed_, true, 40, 4, 256, 256);
  const std::vector<float> all = RunKernel(batch, true);
  for (int r : {0, 17, 39}) {
    Problem few = batch;
    few.rows = 5;
    few.x.clear();
    few.ids.clear();
    for (int i = 0; i < 5; ++i) {
      const int src = (r + 7 * i) % batch.rows;  // row r first, then four others
      few.x.insert(few.x.end(), batch.x.begin() + static_cast<size_t>(src) * batch.hidden,
                   batch.x.begin() + static_cast<size_t>(src + 1) * batch.hidden);
      few.ids.insert(few.ids.end(), batch.ids.begin() + src * batch.k, batch.ids.begin() + (src + 1) * batch.k);
    }
    ASSERT_EQ(few.ids[0], 3);
    const std::vector<float> some = RunKernel(few, true);
    for (int c = 0; c < batch.hidden; ++c) {
      ASSERT_EQ(some[c], all[static_cast<size_t>(r) * batch.k * batch.hidden + c]) << "row " << r << " at " << c;
    }
  }
}

// The shape checks come before any CUDA call: they run without a device.
TEST(MoeGemvHostTest, TensorCoreKernelRejectsUnsupportedShapes) {
  MoeGemvParams p;
  p.rows = 1;
  p.k = 1;
  p.experts = 4;
  p.hidden = 128;  // not a multiple of 256
  p.inter = 256;
  EXPECT_EQ(LaunchMoeGemm(p, nullptr), cudaErrorInvalidValue);
  p.hidden = 256;
  p.inter = 128;  // not a multiple of 256
  EXPECT_EQ(LaunchMoeGemm(p, nullptr), cudaErrorInvalidValue);
  p.inter = 256;
  p.type = GemmType::kF32;
  EXPECT_EQ(LaunchMoeGemm(p, nullptr), cudaErrorInvalidValue);
}

TEST(MoeGemvHostTest, RejectsWidthsThatAreNotMultiplesOfEight) {
  MoeGemvParams p;
  p.rows = 1;
  p.k = 1;
  p.experts = 4;
  p.hidden = 36;
  p.inter = 16;
  EXPECT_EQ(LaunchMoeGemv(p, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace strata::cuda
