// Save and resume of DeepSeek-V4 sequences through `.coli_kv` v3 files, on the
// transformers fixtures of tests/data/models: a sequence saved after any
// number of tokens — mid-block, before and after the window fills, through
// appends of one token and of many — loads back with the saved state's bits,
// and continuing it gives the logits of an uninterrupted run bit for bit.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/testing/scratch_dir.h"
#include "common/testing/test_seed.h"
#include "gtest/gtest.h"
#include "kvstore/env.h"
#include "kvstore/coli_kv3_file.h"
#include "kvstore/fault_injection_env.h"
#include "model/v4/config.h"
#include "model/v4/engine.h"
#include "model/v4/kv_state.h"
#include "nlohmann/json.hpp"

namespace strata::v4 {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> V4FixtureDirs() {
  std::vector<std::string> dirs;
  const fs::path root = fs::path(STRATA_SOURCE_DIR) / "tests" / "data" / "models";
  if (!fs::exists(root)) return dirs;
  for (const auto& e : fs::directory_iterator(root)) {
    if (!fs::exists(e.path() / "reference.json")) continue;
    auto type = ReadModelType(e.path().string());
    if (type.ok() && *type == "deepseek_v4") dirs.push_back(e.path().string());
  }
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

std::vector<int> FixtureTokens(const std::string& dir) {
  std::ifstream in(dir + "/reference.json");
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str())["tokens"].get<std::vector<int>>();
}

// Every part of the state the next step can read is bitwise equal (stale
// window slots are not state, docs/deepseek-v4.md §4.4).
void ExpectSameState(const V4Config& c, const V4Sequence& a, const V4Sequence& b) {
  ASSERT_EQ(a.num_tokens(), b.num_tokens());
  const int t = a.num_tokens(), S = c.sliding_window - 1;
  for (int l = 0; l < c.num_layers; ++l) {
    SCOPED_TRACE(::testing::Message() << "layer " << l << ", " << t << " tokens");
    for (int u = std::max(0, t - S); u < t; ++u) {
      ASSERT_TRUE(std::equal(a.WindowRow(l, u), a.WindowRow(l, u) + c.head_dim, b.WindowRow(l, u))) << "window row " << u;
    }
    for (const auto& [x, y] : {std::pair(&a.layer(l).compressor, &b.layer(l).compressor),
                               std::pair(&a.layer(l).indexer, &b.layer(l).indexer)}) {
      EXPECT_EQ(x->rows, y->rows);
      EXPECT_EQ(x->open_kv, y->open_kv);
      EXPECT_EQ(x->open_gate, y->open_gate);
      EXPECT_EQ(x->overlap_kv, y->overlap_kv);
      EXPECT_EQ(x->overlap_gate, y->overlap_gate);
    }
  }
}

class V4KvStateTest : public ::testing::TestWithParam<std::string> {};

TEST_P(V4KvStateTest, ResumeAfterEveryAppendIsExact) {
  const std::string dir = GetParam();
  auto engine = V4Engine::Load(dir, {});
  ASSERT_TRUE(engine.ok()) << engine.status();
  V4Engine& e = **engine;
  const V4Config& c = e.config();
  const std::vector<int> tokens = FixtureTokens(dir);
  const int T = static_cast<int>(tokens.size());
  const size_t V = static_cast<size_t>(c.vocab_size);

  // The uninterrupted run: every position's logits.
  std::vector<float> full;
  {
    auto seq = e.NewSequence();
    ASSERT_TRUE(e.Forward({V4Chunk{seq.get(), tokens}}, true, &full).ok());
  }

  kv::FaultInjectionEnv env;
  ASSERT_TRUE(env.CreateDir("/kv").ok());
  const std::string path = "/kv/s.coli_kv";
  auto w = kv::ColiKv3Writer::Create(&env, path, V4KvHeader(c, kv::V3RowFormat::kF32));
  ASSERT_TRUE(w.ok()) << w.status();

  // Appends of one token and of many, so that saves land mid-block, in the
  // first window, and after chunks longer than the ring's live span.
  const std::vector<int> sizes = {1, 2, 1, 5, 1, 1, 3, 17, 1, 2, 40, 1, 6, 9, 1, 130};
  auto seq = e.NewSequence();
  std::vector<float> step;
  int at = 0, resumed = 0, saves = 0;
  for (size_t k = 0; at < T; ++k) {
    const int n = std::min(sizes[k % sizes.size()], T - at);
    const auto chunk = absl::MakeConstSpan(&tokens[at], static_cast<size_t>(n));
    ASSERT_TRUE(e.Forward({V4Chunk{seq.get(), chunk}}, false, &step).ok());
    ASSERT_TRUE(SaveV4Sequence(c, *seq, chunk, w->get()).ok());
    at += n;
    ++saves;
    ASSERT_EQ((*w)->num_tokens(), at);

    auto r = kv::ColiKv3Reader::Open(&env, path);
    ASSERT_TRUE(r.ok()) << r.status();
    auto loaded = LoadV4Sequence(c, **r);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    ExpectSameState(c, *seq, **loaded);
    if (at == T || k % 3 != 0) continue;
    // Continue the loaded sequence to the end: the uninterrupted run's bits.
    std::vector<float> rest;
    ASSERT_TRUE(e.Forward({V4Chunk{loaded->get(), absl::MakeConstSpan(&tokens[at], T - at)}}, true, &rest).ok());
    ASSERT_EQ(rest.size(), (T - at) * V);
    EXPECT_TRUE(std::equal(rest.begin(), rest.end(), full.begin() + at * V))
        << fs::path(dir).filename() << ": resuming after " << at << " tokens changed the logits";
    ++resumed;
  }
  EXPECT_GE(resumed, 3);
  std::printf("%s: %d saves, %d resumed runs, file %llu bytes for %d tokens\n", fs::path(dir).filename().c_str(), saves, resumed, static_cast<unsigned long long>(*env.FileSize(path)), T);
}

// A decode that saves after every token (the commit pattern of a served
// session) and resumes at positions of every phase of the blocks.
TEST_P(V4KvStateTest, TokenByTokenSavesResumeMidBlock) {
  const std::string dir = GetParam();
  auto engine = V4Engine::Load(dir, {});
  ASSERT_TRUE(engine.ok()) << engine.status();
  V4Engine& e = **engine;
  const V4Config& c = e.config();
  std::vector<int> tokens = FixtureTokens(dir);
  tokens.resize(std::min<size_t>(tokens.size(), 48));
  const int T = static_cast<int>(tokens.size());
  std::vector<float> full;
  {
    auto seq = e.NewSequence();
    ASSERT_TRUE(e.Forward({V4Chunk{seq.get(), tokens}}, true, &full).ok());
  }
  kv::FaultInjectionEnv env;
  ASSERT_TRUE(env.CreateDir("/kv").ok());
  auto w = kv::ColiKv3Writer::Create(&env, "/kv/s.coli_kv", V4KvHeader(c, kv::V3RowFormat::kF32));
  ASSERT_TRUE(w.ok()) << w.status();
  auto seq = e.NewSequence();
  std::vector<float> step;
  for (int p = 0; p < T; ++p) {
    const auto one = absl::MakeConstSpan(&tokens[p], 1);
    ASSERT_TRUE(e.Forward({V4Chunk{seq.get(), one}}, false, &step).ok());
    ASSERT_TRUE(SaveV4Sequence(c, *seq, one, w->get()).ok());
    if ((p + 1) % 5 != 0) continue;  // 5, 10, 15, ...: every phase of rates 4 and 16
    auto r = kv::ColiKv3Reader::Open(&env, "/kv/s.coli_kv");
    ASSERT_TRUE(r.ok()) << r.status();
    auto loaded = LoadV4Sequence(c, **r);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    std::vector<float> rest;
    ASSERT_TRUE(e.Forward({V4Chunk{loaded->get(), absl::MakeConstSpan(&tokens[p + 1], T - p - 1)}}, true, &rest).ok());
    EXPECT_TRUE(std::equal(rest.begin(), rest.end(), full.begin() + (p + 1) * c.vocab_size))
        << "resumed after " << p + 1 << " tokens";
  }
  // Token by token the ring uses one slot more than the live span.
  EXPECT_EQ((*w)->commit().slots.size(), static_cast<size_t>(std::min<int>(T, (*w)->layout().live_tokens())));
}

TEST_P(V4KvStateTest, RefusesAnotherModelsFileAndWrongTokenCounts) {
  auto engine = V4Engine::Load(GetParam(), {});
  ASSERT_TRUE(engine.ok()) << engine.status();
  const V4Config& c = (*engine)->config();
  V4Config other = c;
  other.sliding_window += 1;
  kv::FaultInjectionEnv env;
  ASSERT_TRUE(env.CreateDir("/kv").ok());
  auto w = kv::ColiKv3Writer::Create(&env, "/kv/s.coli_kv", V4KvHeader(other, kv::V3RowFormat::kF32));
  ASSERT_TRUE(w.ok()) << w.status();
  auto seq = (*engine)->NewSequence();
  const std::vector<int> toks = {1, 2, 3};
  std::vector<float> logits;
  ASSERT_TRUE((*engine)->Forward({V4Chunk{seq.get(), toks}}, false, &logits).ok());
  EXPECT_EQ(SaveV4Sequence(c, *seq, toks, w->get()).code(), absl::StatusCode::kFailedPrecondition);
  auto r = kv::ColiKv3Reader::Open(&env, "/kv/s.coli_kv");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(LoadV4Sequence(c, **r).status().code(), absl::StatusCode::kFailedPrecondition);

  auto w2 = kv::ColiKv3Writer::Create(&env, "/kv/t.coli_kv", V4KvHeader(c, kv::V3RowFormat::kF32));
  ASSERT_TRUE(w2.ok());
  EXPECT_EQ(SaveV4Sequence(c, *seq, {1, 2}, w2->get()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*w2)->num_tokens(), 0);
  ASSERT_TRUE(SaveV4Sequence(c, *seq, toks, w2->get()).ok());
  EXPECT_TRUE(SaveV4Sequence(c, *seq, {}, w2->get()).ok());  // nothing new
  auto fresh = (*engine)->NewSequence();
  EXPECT_EQ(SaveV4Sequence(c, *fresh, {}, w2->get()).code(), absl::StatusCode::kFailedPrecondition);
}

// fp8 rows (docs/coli-kv.md, "Rows"): the raw projections come back exact,
// every window and compressed row within the codec's error (a nope value
// within 1/14 of its 64-value tile's amax — half an e4m3 step at the top is 16,
// and a power-of-two scale 2^e is below amax / 224 —
// and a rope value within 2^-8 relative, bf16), and the resumed run's logits
// are reported against the uninterrupted f32 run.
TEST_P(V4KvStateTest, Fp8RowsResumeClose) {
  const std::string dir = GetParam();
  auto engine = V4Engine::Load(dir, {});
  ASSERT_TRUE(engine.ok()) << engine.status();
  V4Engine& e = **engine;
  const V4Config& c = e.config();
  const std::vector<int> tokens = FixtureTokens(dir);
  const int T = static_cast<int>(tokens.size()), cut = T / 2 + 1;
  const size_t V = static_cast<size_t>(c.vocab_size);
  std::vector<float> full;
  auto seq = e.NewSequence();
  ASSERT_TRUE(e.Forward({V4Chunk{seq.get(), tokens}}, true, &full).ok());
  auto half = e.NewSequence();
  std::vector<float> step;
  ASSERT_TRUE(e.Forward({V4Chunk{half.get(), absl::MakeConstSpan(tokens.data(), cut)}}, false, &step).ok());

  kv::FaultInjectionEnv env;
  ASSERT_TRUE(env.CreateDir("/kv").ok());
  auto w = kv::ColiKv3Writer::Create(&env, "/kv/s.coli_kv", V4KvHeader(c, kv::V3RowFormat::kFp8));
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE(SaveV4Sequence(c, *half, absl::MakeConstSpan(tokens.data(), cut), w->get()).ok());
  auto r = kv::ColiKv3Reader::Open(&env, "/kv/s.coli_kv");
  ASSERT_TRUE(r.ok()) << r.status();
  auto loaded = LoadV4Sequence(c, **r);
  ASSERT_TRUE(loaded.ok()) << loaded.status();

  const int nope = c.head_dim - c.rope_dim;
  auto expect_close = [&](const float* x, const float* y, const char* what) {
    for (int t0 = 0; t0 < nope; t0 += 64) {
      float amax = 0;
      for (int i = t0; i < std::min(nope, t0 + 64); ++i) amax = std::max(amax, std::fabs(x[i]));
      for (int i = t0; i < std::min(nope, t0 + 64); ++i) ASSERT_LE(std::fabs(x[i] - y[i]), amax / 14) << what << " " << i;
    }
    for (int i = nope; i < c.head_dim; ++i) ASSERT_LE(std::fabs(x[i] - y[i]), std::ldexp(std::fabs(x[i]), -8)) << what;
  };
  const int S = c.sliding_window - 1;
  for (int l = 0; l < c.num_layers; ++l) {
    for (int u = std::max(0, cut - S); u < cut; ++u) expect_close(half->WindowRow(l, u), (*loaded)->WindowRow(l, u), "window");
    const CompressorState& a = half->layer(l).compressor;
    const CompressorState& b = (*loaded)->layer(l).compressor;
    ASSERT_EQ(a.num_rows(), b.num_rows());
    for (int k = 0; k < a.num_rows(); ++k) expect_close(a.row(k), b.row(k), "compressed row");
    EXPECT_EQ(a.open_kv, b.open_kv);
    EXPECT_EQ(a.open_gate, b.open_gate);
    EXPECT_EQ(a.overlap_gate, b.overlap_gate);
    EXPECT_EQ(half->layer(l).indexer.rows, (*loaded)->layer(l).indexer.rows);  // index keys stay f32
  }
  std::vector<float> rest;
  ASSERT_TRUE(e.Forward({V4Chunk{loaded->get(), absl::MakeConstSpan(&tokens[cut], T - cut)}}, true, &rest).ok());
  float max_ref = 0, max_err = 0;
  int agree = 0;
  for (int p = 0; p < T - cut; ++p) {
    const float* ref = &full[(cut + p) * V];
    const float* got = &rest[p * V];
    for (size_t v = 0; v < V; ++v) {
      ASSERT_TRUE(std::isfinite(got[v]));
      max_ref = std::max(max_ref, std::fabs(ref[v]));
      max_err = std::max(max_err, std::fabs(got[v] - ref[v]));
    }
    agree += std::max_element(ref, ref + V) - ref == std::max_element(got, got + V) - got;
  }
  std::printf("%s: fp8 rows, resumed after %d tokens: max|dlogit| %.3g (%.2e of max|logit|), top-1 %d/%d\n",
              fs::path(dir).filename().c_str(), cut, max_err, max_err / max_ref, agree, T - cut);
  EXPECT_GE(agree * 10, (T - cut) * 8);  // loose: tiny random models flip near-ties, the indexer reselects
}

// The file sizes docs/coli-kv.md ("Version 3", "Size, and bytes per token")
// gives for the released configs: the layout's sizes equal the table's, and a
// file filled with the real dimensions (a synthetic state of 300 tokens, so
// that blocks of both rates have closed) is exactly as large as the formula
// says and loads back with the saved bits.
TEST(V4KvStateSizeTest, FileSizeOfTheReleasedConfigs) {
  struct Row {
    const char* config;
    kv::V3RowFormat format;
    int64_t token_bytes, ring_bytes, csa_block, hca_block, file_128k, file_1m;
    bool fill;
  };
  const Row rows[] = {
      {"deepseek_v4_flash", kv::V3RowFormat::kF32, 385036, 97799144, 2572, 2060, 1909865448, 14594243560, true},
      {"deepseek_v4_flash", kv::V3RowFormat::kFp8, 322084, 81809336, 1108, 596, 856473528, 6279036856, false},
      {"deepseek_v4_pro", kv::V3RowFormat::kF32, 559116, 142015464, 2572, 2060, 2735799272, 20892199912, false},
      {"deepseek_v4_pro", kv::V3RowFormat::kFp8, 469812, 119332248, 1108, 596, 1227472280, 8984366488, true},
  };
  std::mt19937_64 rng(strata::testing::TestSeed());
  const ScratchDir scratch("v4_kv_size_");
  for (const Row& row : rows) {
    SCOPED_TRACE(::testing::Message() << row.config << " format " << static_cast<int>(row.format));
    std::ifstream in(std::string(STRATA_SOURCE_DIR) + "/tests/data/configs/" + row.config + ".config.json");
    std::stringstream ss;
    ss << in.rdbuf();
    auto c = ParseV4Config(ss.str());
    ASSERT_TRUE(c.ok()) << c.status();
    const kv::V3Layout L(V4KvHeader(*c, row.format));
    int csa = -1, hca = -1;
    for (int l = 0; l < c->num_layers; ++l) {
      if (c->layers[l].attention == AttentionKind::kCsa) csa = l;
      if (c->layers[l].attention == AttentionKind::kHca) hca = l;
    }
    EXPECT_EQ(L.live_tokens(), 127);
    EXPECT_EQ(L.token_bytes(), row.token_bytes);
    EXPECT_EQ(L.ring_slots() * L.token_bytes(), row.ring_bytes);
    EXPECT_EQ(L.block_bytes(csa), row.csa_block);
    EXPECT_EQ(L.block_bytes(hca), row.hca_block);
    EXPECT_EQ(L.log_offset() + static_cast<int64_t>(L.LogBytes(131072)), row.file_128k);
    EXPECT_EQ(L.log_offset() + static_cast<int64_t>(L.LogBytes(1048576)), row.file_1m);
    std::printf("%s %s: %.0f B per token at 128k, %.0f B at 1M\n", row.config,
                row.format == kv::V3RowFormat::kF32 ? "f32" : "fp8", row.file_128k / 131072.0, row.file_1m / 1048576.0);
    if (!row.fill) continue;

    // A state of T tokens with the sizes of docs/deepseek-v4.md §4.4.
    const int T = 300;
    V4Sequence seq(*c);
    std::normal_distribution<float> nd;
    auto fill = [&](std::vector<float>* v, size_t n) {
      v->resize(n);
      for (float& x : *v) x = nd(rng);
    };
    for (int l = 0; l < c->num_layers; ++l) {
      V4LayerState& st = seq.layer(l);
      fill(&st.window, st.window.size());
      for (CompressorState* cs : {&st.compressor, &st.indexer}) {
        if (cs->width == 0) continue;
        const size_t m = static_cast<size_t>(cs->rate), w = static_cast<size_t>(cs->width);
        fill(&cs->rows, T / m * w);
        fill(&cs->open_kv, T % m * cs->coff * w);
        fill(&cs->open_gate, T % m * cs->coff * w);
        if (cs->coff == 2) {
          fill(&cs->overlap_kv, m * w);
          fill(&cs->overlap_gate, m * w);
        }
      }
    }
    seq.Commit(T);
    std::vector<int> tokens(T);
    for (int& t : tokens) t = static_cast<int>(rng() % static_cast<uint64_t>(c->vocab_size));
    const std::string path = scratch.path() + "/" + row.config + ".coli_kv";
    auto w = kv::ColiKv3Writer::Create(kv::Env::Default(), path, V4KvHeader(*c, row.format));
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE(SaveV4Sequence(*c, seq, tokens, w->get()).ok());
    auto size = kv::Env::Default()->FileSize(path);
    ASSERT_TRUE(size.ok());
    EXPECT_EQ(static_cast<int64_t>(*size), L.log_offset() + static_cast<int64_t>(L.LogBytes(T)));
    auto r = kv::ColiKv3Reader::Open(kv::Env::Default(), path);
    ASSERT_TRUE(r.ok()) << r.status();
    auto loaded = LoadV4Sequence(*c, **r);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    if (row.format == kv::V3RowFormat::kF32) {
      ExpectSameState(*c, seq, **loaded);
    } else {
      EXPECT_EQ((*loaded)->layer(csa).compressor.open_kv, seq.layer(csa).compressor.open_kv);  // raw: f32
      EXPECT_EQ((*loaded)->layer(hca).compressor.rows.size(), seq.layer(hca).compressor.rows.size());
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, V4KvStateTest, ::testing::ValuesIn(V4FixtureDirs()), [](const auto& info) {
  std::string n = fs::path(info.param).filename().string();
  for (char& ch : n) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return n;
});
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(V4KvStateTest);

}  // namespace
}  // namespace strata::v4
