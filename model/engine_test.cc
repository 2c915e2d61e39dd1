#include "model/engine.h"

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/testing/scratch_dir.h"
#include "common/testing/test_seed.h"
#include "gtest/gtest.h"
#include "model/layer_ops.h"
#include "model/random_model.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

// A small DeepSeek-V3-shaped config; {TYPE}, {TOPK} and {EXTRA} are filled in.
constexpr const char* kConfigTemplate = R"({
  "model_type": "{TYPE}", "vocab_size": 97, "hidden_size": 48, "intermediate_size": 64,
  "moe_intermediate_size": 16, "num_hidden_layers": 4, "num_attention_heads": 3,
  "num_key_value_heads": 3, "q_lora_rank": 24, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
  "qk_rope_head_dim": 8, "v_head_dim": 12, "n_routed_experts": 8, "n_shared_experts": 1,
  "num_experts_per_tok": 3, "n_group": 4, "topk_group": 2, "routed_scaling_factor": 2.5,
  "norm_topk_prob": true, "first_k_dense_replace": 1, "rms_norm_eps": 1e-6,
  "max_position_embeddings": 512, "hidden_act": "silu",
  "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128,
                   "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
  "rope_theta": 10000.0, "index_n_heads": 4, "index_head_dim": 16, "index_topk": {TOPK}
  {EXTRA}
})";

std::string Config(const std::string& type, int topk, const std::string& extra = "") {
  return absl::StrReplaceAll(kConfigTemplate,
                             {{"{TYPE}", type}, {"{TOPK}", absl::StrCat(topk)}, {"{EXTRA}", extra}});
}

class EngineTest : public ::testing::Test {
 protected:
  std::string MakeModel(const std::string& name, const std::string& config, uint64_t seed,
                        bool fused = false) {
    const std::string dir = MakeScratchDir(absl::StrCat("engine_test_", name, "_"));
    RandomModelOptions opt;
    opt.seed = seed;
    opt.fused_experts = fused;
    EXPECT_TRUE(WriteRandomModel(dir, config, opt).ok());
    dirs_.push_back(dir);
    return dir;
  }
  void TearDown() override {
    for (const auto& d : dirs_) fs::remove_all(d);
  }
  // Random tokens from the test's generator (one seed per test, printed).
  std::vector<int> RandomTokens(int n, int vocab) {
    std::vector<int> t(n);
    for (auto& x : t) x = static_cast<int>(rng_() % vocab);
    return t;
  }
  // Logits of every position, one token per step (the decode path).
  static std::vector<float> Decode(Engine& e, const std::vector<int>& tokens) {
    auto kv = e.NewSequence();
    std::vector<float> all, step;
    for (int t : tokens) {
      SeqChunk ch{kv.get(), absl::MakeConstSpan(&t, 1)};
      EXPECT_TRUE(e.Forward({ch}, false, &step).ok());
      all.insert(all.end(), step.begin(), step.end());
    }
    return all;
  }
  static std::vector<float> Prefill(Engine& e, const std::vector<int>& tokens) {
    auto kv = e.NewSequence();
    std::vector<float> all;
    SeqChunk ch{kv.get(), tokens};
    EXPECT_TRUE(e.Forward({ch}, true, &all).ok());
    return all;
  }
  std::vector<std::string> dirs_;
  std::mt19937 rng_{strata::testing::TestSeed()};
};

TEST_F(EngineTest, PrefillAndDecodeGiveTheSameBits) {
  for (const std::string type : {"deepseek_v3", "deepseek_v32", "glm_moe_dsa", "glm4_moe_lite"}) {
    for (KvDtype dt : {KvDtype::kF32, KvDtype::kFp8}) {
      const std::string dir = MakeModel(type, Config(type, 5), 7);
      EngineOptions opt;
      opt.kv_dtype = dt;
      opt.num_threads = 2;
      auto e = Engine::Load(dir, opt);
      ASSERT_TRUE(e.ok()) << e.status();
      const auto tokens = RandomTokens(23, 97);
      const auto a = Decode(**e, tokens), b = Prefill(**e, tokens);
      ASSERT_EQ(a.size(), b.size());
      for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << type << " at " << i;
      for (float v : a) ASSERT_TRUE(std::isfinite(v));
    }
  }
}

TEST_F(EngineTest, BatchInvariance) {
  const std::string dir = MakeModel("bi", Config("deepseek_v32", 6), 11);
  EngineOptions opt;
  opt.kv_dtype = KvDtype::kFp8;
  opt.num_threads = 3;
  auto e = Engine::Load(dir, opt);
  ASSERT_TRUE(e.ok()) << e.status();
  const auto ta = RandomTokens(17, 97), tb = RandomTokens(9, 97), tc = RandomTokens(30, 97);
  const auto alone = Prefill(**e, ta);
  // The same sequence beside two others, in a different chunking.
  auto ka = (*e)->NewSequence(), kb = (*e)->NewSequence(), kc = (*e)->NewSequence();
  std::vector<float> got, logits;
  std::vector<int> first(ta.begin(), ta.begin() + 5), rest(ta.begin() + 5, ta.end());
  SeqChunk c1[] = {{kb.get(), tb}, {ka.get(), first}, {kc.get(), tc}};
  ASSERT_TRUE((*e)->Forward(c1, true, &logits).ok());
  got.insert(got.end(), logits.begin() + 9 * 97, logits.begin() + 14 * 97);
  SeqChunk c2[] = {{ka.get(), rest}, {kb.get(), absl::MakeConstSpan(&tb[0], 1)}};
  ASSERT_TRUE((*e)->Forward(c2, true, &logits).ok());
  got.insert(got.end(), logits.begin(), logits.begin() + rest.size() * 97);
  ASSERT_EQ(got.size(), alone.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], alone[i]) << i;
}

TEST_F(EngineTest, DsaWithTopkAtLeastTEqualsDenseExactly) {
  // Same weights; deepseek_v3 ignores the indexer tensors and attends densely.
  const std::string dense_dir = MakeModel("dense", Config("deepseek_v3", 64), 5);
  const std::string dsa_dir = MakeModel("dsa", Config("deepseek_v32", 64), 5);
  const std::string sparse_dir = MakeModel("sparse", Config("deepseek_v32", 4), 5);
  EngineOptions opt;
  opt.num_threads = 2;
  auto dense = Engine::Load(dense_dir, opt);
  auto dsa = Engine::Load(dsa_dir, opt);
  auto sparse = Engine::Load(sparse_dir, opt);
  ASSERT_TRUE(dense.ok() && dsa.ok() && sparse.ok());
  const auto tokens = RandomTokens(40, 97);
  const auto a = Prefill(**dense, tokens), b = Prefill(**dsa, tokens), s = Prefill(**sparse, tokens);
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << i;
  // With index_topk 4 < T the selection changes later positions (sparsity is live)
  // but not the first 4, which see at most 4 rows.
  for (size_t i = 0; i < 4 * 97; ++i) ASSERT_EQ(a[i], s[i]) << i;
  double diff = 0;
  for (size_t i = 4 * 97; i < a.size(); ++i) diff += std::fabs(a[i] - s[i]);
  EXPECT_GT(diff, 1e-3);
}

TEST_F(EngineTest, FusedAndPerExpertLayoutsAgree) {
  const std::string cfg = Config("glm4_moe_lite", 1);
  const std::string a = MakeModel("per_expert", cfg, 3, false), b = MakeModel("fused", cfg, 3, true);
  // Both files hold the same expert values; the fused one packed [E, 2I, H].
  EngineOptions opt;
  auto ea = Engine::Load(a, opt);
  auto eb = Engine::Load(b, opt);
  ASSERT_TRUE(ea.ok()) << ea.status();
  ASSERT_TRUE(eb.ok()) << eb.status();
  const auto t = RandomTokens(12, 97);
  EXPECT_EQ(Prefill(**ea, t), Prefill(**eb, t));
}

TEST_F(EngineTest, PipelineStagesGiveTheSameBits) {
  const std::string cfg = Config("glm_moe_dsa", 6, R"(, "indexer_types": ["full", "shared", "full", "shared"])");
  const std::string dir = MakeModel("stages", cfg, 21);
  EngineOptions whole_opt, s0, s1;
  s0.layer_end = 2;
  s1.layer_begin = 2;
  auto whole = Engine::Load(dir, whole_opt);
  auto e0 = Engine::Load(dir, s0);
  auto e1 = Engine::Load(dir, s1);
  ASSERT_TRUE(whole.ok() && e0.ok() && e1.ok());
  const auto tokens = RandomTokens(20, 97);
  const auto ref = Prefill(**whole, tokens);
  auto k0 = (*e0)->NewSequence(), k1 = (*e1)->NewSequence();
  std::vector<float> hidden(tokens.size() * 48), logits(tokens.size() * 97);
  ASSERT_TRUE((*e0)->Embed(tokens, hidden.data()).ok());
  SeqChunk c0{k0.get(), tokens}, c1{k1.get(), tokens};
  ASSERT_TRUE((*e0)->RunLayers({c0}, hidden.data()).ok());
  ASSERT_TRUE((*e1)->RunLayers({c1}, hidden.data()).ok());
  ASSERT_TRUE((*e1)->Logits(hidden.data(), static_cast<int>(tokens.size()), logits.data()).ok());
  for (size_t i = 0; i < ref.size(); ++i) ASSERT_EQ(ref[i], logits[i]) << i;
  // A stage may not start at a shared layer.
  EngineOptions bad;
  bad.layer_begin = 1;
  auto e = Engine::Load(dir, bad);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(EngineTest, BadTokensAreInvalidArgument) {
  const std::string dir = MakeModel("bad", Config("deepseek_v3", 1), 2);
  auto e = Engine::Load(dir, {});
  ASSERT_TRUE(e.ok());
  auto kv = (*e)->NewSequence();
  std::vector<int> toks = {1, 97};
  std::vector<float> logits;
  SeqChunk ch{kv.get(), toks};
  EXPECT_EQ((*e)->Forward({ch}, false, &logits).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(kv->num_tokens(), 0);
  toks = {-1};
  EXPECT_EQ((*e)->Forward({ch}, false, &logits).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(EngineTest, MissingModelIsNotFound) {
  auto e = Engine::Load("/nonexistent/model/dir", {});
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), absl::StatusCode::kNotFound);
}

TEST(TopKPositionsTest, TiesGoToTheLowerPosition) {
  const float s[] = {1, 3, 3, 2, 3, NAN, 0};
  EXPECT_EQ(internal::TopKPositions(s, 7, 2), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(internal::TopKPositions(s, 7, 4), (std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_EQ(internal::TopKPositions(s, 7, 6), (std::vector<int32_t>{0, 1, 2, 3, 4, 6}));
  EXPECT_EQ(internal::TopKPositions(s, 7, 100).size(), 7u);
  const float z[] = {0, 0, 0, 0};
  EXPECT_EQ(internal::TopKPositions(z, 4, 2), (std::vector<int32_t>{0, 1}));
}

}  // namespace
}  // namespace strata
