// Checks the engine against the transformers oracle fixtures in
// tests/data/models (made by tools/make_fixtures.py): teacher-forced logits
// within 1e-3 * max|ref| at every position, identical greedy continuations,
// for float32 KV and for fp8 KV (against the fp8-simulating reference).
#include <algorithm>
#include <cstring>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "model/engine.h"
#include "model/safetensors.h"
#include "nlohmann/json.hpp"

namespace strata {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> FixtureDirs() {
  std::vector<std::string> dirs;
  const fs::path root = fs::path(STRATA_SOURCE_DIR) / "tests" / "data" / "models";
  if (!fs::exists(root)) return dirs;
  for (const auto& e : fs::directory_iterator(root)) {
    if (!fs::exists(e.path() / "reference.json")) continue;
    // DeepSeek-V4 has its own engine and fixture test (model/v4/fixture_test.cc).
    std::ifstream cfg(e.path() / "config.json");
    const auto j = nlohmann::json::parse(cfg, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.value("model_type", "") == "deepseek_v4") continue;
    dirs.push_back(e.path().string());
  }
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

int Argmax(const float* v, int n) {
  return static_cast<int>(std::max_element(v, v + n) - v);
}

struct Reference {
  nlohmann::json meta;
  std::vector<float> logits_f32, logits_fp8;
};

Reference LoadReference(const std::string& dir) {
  Reference r;
  std::ifstream in(dir + "/reference.json");
  std::stringstream ss;
  ss << in.rdbuf();
  r.meta = nlohmann::json::parse(ss.str());
  auto f = SafetensorsFile::Open(dir + "/reference.safetensors");
  EXPECT_TRUE(f.ok()) << f.status();
  auto read = [&](const char* name) {
    const TensorInfo* t = (*f)->Find(name);
    EXPECT_NE(t, nullptr) << name;
    auto d = (*f)->Data(*t);
    std::vector<float> v(d.size() / 4);
    std::memcpy(v.data(), d.data(), d.size());
    return v;
  };
  r.logits_f32 = read("logits_f32");
  r.logits_fp8 = read("logits_fp8kv");
  return r;
}

class FixtureTest : public ::testing::TestWithParam<std::string> {};

TEST(FixtureSetTest, FixturesArePresent) {
  // Eight models: four types and an unseen variant of each, plus the fp8 one.
  EXPECT_GE(FixtureDirs().size(), 9u);
}

TEST_P(FixtureTest, MatchesTransformers) {
  const std::string dir = GetParam();
  const Reference ref = LoadReference(dir);
  const std::vector<int> tokens = ref.meta["tokens"].get<std::vector<int>>();
  const int T = static_cast<int>(tokens.size());
  for (KvDtype dt : {KvDtype::kF32, KvDtype::kFp8}) {
    EngineOptions opt;
    opt.kv_dtype = dt;
    auto engine = Engine::Load(dir, opt);
    ASSERT_TRUE(engine.ok()) << engine.status();
    Engine& e = **engine;
    const int V = e.config().vocab_size;
    const std::vector<float>& want = dt == KvDtype::kF32 ? ref.logits_f32 : ref.logits_fp8;
    ASSERT_EQ(want.size(), static_cast<size_t>(T) * V);
    // Decode path: one token per step.
    auto kv = e.NewSequence();
    std::vector<float> got, step;
    for (int t : tokens) {
      SeqChunk ch{kv.get(), absl::MakeConstSpan(&t, 1)};
      ASSERT_TRUE(e.Forward({ch}, false, &step).ok());
      got.insert(got.end(), step.begin(), step.end());
    }
    float max_ref = 0, max_err = 0;
    for (float v : want) max_ref = std::max(max_ref, std::fabs(v));
    int agree_f32 = 0;
    for (int p = 0; p < T; ++p) {
      float row_err = 0;
      for (int v = 0; v < V; ++v) row_err = std::max(row_err, std::fabs(got[p * V + v] - want[p * V + v]));
      max_err = std::max(max_err, row_err);
      EXPECT_LE(row_err, 1e-3f * max_ref) << dir << " position " << p;
      agree_f32 += Argmax(&got[p * V], V) == Argmax(&ref.logits_f32[p * V], V);
    }
    // Prefill path: the same bits.
    auto kv2 = e.NewSequence();
    std::vector<float> pre;
    SeqChunk all{kv2.get(), tokens};
    ASSERT_TRUE(e.Forward({all}, true, &pre).ok());
    ASSERT_EQ(pre, got) << dir;
    // Greedy continuation.
    std::vector<int> gen = ref.meta["greedy_prompt"].get<std::vector<int>>();
    const std::vector<int> expect =
        ref.meta[dt == KvDtype::kF32 ? "greedy_f32" : "greedy_fp8kv"].get<std::vector<int>>();
    auto kv3 = e.NewSequence();
    std::vector<int> next_in = gen, out;
    for (size_t i = 0; i < expect.size(); ++i) {
      SeqChunk ch{kv3.get(), next_in};
      ASSERT_TRUE(e.Forward({ch}, false, &step).ok());
      const int tok = Argmax(step.data(), V);
      out.push_back(tok);
      next_in = {tok};
    }
    EXPECT_EQ(out, expect) << dir << (dt == KvDtype::kF32 ? " f32" : " fp8");
    std::printf("%s kv=%s max|err|=%.3g max|ref|=%.3g ratio=%.2e top1-vs-f32-ref=%d/%d\n",
                fs::path(dir).filename().c_str(), dt == KvDtype::kF32 ? "f32" : "fp8", max_err, max_ref,
                max_err / max_ref, agree_f32, T);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, FixtureTest, ::testing::ValuesIn(FixtureDirs()),
                         [](const auto& info) {
                           std::string n = fs::path(info.param).filename().string();
                           for (char& ch : n) if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(FixtureTest);

}  // namespace
}  // namespace strata

namespace strata {
namespace {

// The demo model's held-out perplexity equals transformers' (float32, DSA on)
// within 1 %, on the 512-token slice made by tools/train_demo.py.
TEST(DemoModelTest, HeldOutNllMatchesTransformers) {
  const std::string root = std::string(STRATA_SOURCE_DIR);
  std::ifstream in(root + "/tests/data/demo_heldout.json");
  ASSERT_TRUE(in) << "tests/data/demo_heldout.json missing";
  std::stringstream ss;
  ss << in.rdbuf();
  auto meta = nlohmann::json::parse(ss.str());
  const std::vector<int> tokens = meta["tokens"].get<std::vector<int>>();
  const double want = meta["mean_nll_f32"].get<double>();
  for (KvDtype dt : {KvDtype::kF32, KvDtype::kFp8}) {
    EngineOptions opt;
    opt.kv_dtype = dt;
    auto engine = Engine::Load(root + "/models/demo", opt);
    ASSERT_TRUE(engine.ok()) << engine.status();
    Engine& e = **engine;
    const int V = e.config().vocab_size;
    auto kv = e.NewSequence();
    std::vector<float> logits;
    SeqChunk all{kv.get(), tokens};
    ASSERT_TRUE(e.Forward({all}, true, &logits).ok());
    double nll = 0;
    for (size_t p = 0; p + 1 < tokens.size(); ++p) {
      const float* row = &logits[p * V];
      double m = -INFINITY, s = 0;
      for (int v = 0; v < V; ++v) m = std::max(m, static_cast<double>(row[v]));
      for (int v = 0; v < V; ++v) s += std::exp(row[v] - m);
      nll -= row[tokens[p + 1]] - m - std::log(s);
    }
    nll /= static_cast<double>(tokens.size() - 1);
    std::printf("demo held-out mean NLL kv=%s: %.7f (transformers f32 %.7f, ratio %.2e)\n",
                dt == KvDtype::kF32 ? "f32" : "fp8", nll, want, std::fabs(nll - want) / want);
    if (dt == KvDtype::kF32) {
      EXPECT_LE(std::fabs(std::exp(nll) - std::exp(want)) / std::exp(want), 0.01);
    } else {
      EXPECT_LE(std::fabs(std::exp(nll) - std::exp(want)) / std::exp(want), 0.05);
    }
  }
}

}  // namespace
}  // namespace strata
