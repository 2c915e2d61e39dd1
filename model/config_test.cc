#include "model/config.h"

#include <cmath>
#include <string>

#include "absl/strings/str_replace.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

constexpr const char* kBase = R"({
  "model_type": "glm_moe_dsa", "vocab_size": 100, "hidden_size": 64, "intermediate_size": 96,
  "moe_intermediate_size": 32, "num_hidden_layers": 8, "num_attention_heads": 4,
  "q_lora_rank": 32, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
  "v_head_dim": 16, "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2,
  "n_group": 1, "topk_group": 1, "max_position_embeddings": 1024,
  "index_n_heads": 4, "index_head_dim": 16, "index_topk": 8, "eos_token_id": [3, 1]
  EXTRA
})";

absl::StatusOr<ModelConfig> Parse(const std::string& extra) {
  return ParseModelConfig(absl::StrReplaceAll(kBase, {{"EXTRA", extra}}));
}

TEST(ConfigTest, GlmDefaultsFromFreqAndOffset) {
  auto c = Parse(R"(, "index_topk_freq": 4, "index_skip_topk_offset": 3)");
  ASSERT_TRUE(c.ok()) << c.status();
  // full iff max(L - 3 + 1, 0) % 4 == 0: layers 0, 1, 2, 6.
  std::string kinds;
  for (const auto& l : c->layers) kinds += l.indexer == IndexerMode::kFull ? 'F' : 'S';
  EXPECT_EQ(kinds, "FFFSSSFS");
  EXPECT_EQ(c->num_indexer_layers(), 4);
  EXPECT_EQ(c->indexer_slot(6), 3);
  EXPECT_EQ(c->indexer_slot(4), -1);
  EXPECT_TRUE(c->can_cut_before(6));
  EXPECT_FALSE(c->can_cut_before(4));
  // GLM: first_k_dense_replace defaults to 3.
  EXPECT_FALSE(c->layers[2].moe);
  EXPECT_TRUE(c->layers[3].moe);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int>{1, 3}));
}

TEST(ConfigTest, Glm52LayoutHas21FullLayersOf78) {
  std::string cfg = absl::StrReplaceAll(kBase, {{"\"num_hidden_layers\": 8", "\"num_hidden_layers\": 78"},
                                                {"EXTRA", R"(, "index_topk_freq": 4, "index_skip_topk_offset": 3)"}});
  auto c = ParseModelConfig(cfg);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_indexer_layers(), 21);
}

TEST(ConfigTest, ExplicitListsWinAndMtpEntriesAreIgnored) {
  auto c = Parse(R"(, "index_topk_freq": 4, "mlp_layer_types": ["dense","sparse","dense","sparse","sparse","sparse","sparse","sparse","sparse"],
                  "indexer_types": ["full","shared","shared","full","shared","full","full","shared","full"])");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->layers[2].moe);
  EXPECT_TRUE(c->layers[1].moe);
  EXPECT_EQ(c->layers[3].indexer, IndexerMode::kFull);
  EXPECT_EQ(c->layers.size(), 8u);
}

TEST(ConfigTest, RopeParametersAndRopeScalingAreBothAccepted) {
  auto a = Parse(R"(, "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 64, "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1}, "rope_theta": 5000)");
  auto b = Parse(R"(, "rope_parameters": {"rope_type": "yarn", "factor": 40, "original_max_position_embeddings": 64, "mscale": 1.0, "mscale_all_dim": 1.0, "rope_theta": 5000})");
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(a->rope.yarn);
  EXPECT_EQ(a->rope.theta, 5000);
  EXPECT_EQ(b->rope.theta, 5000);
  EXPECT_DOUBLE_EQ(a->rope.yarn_factor, 40.0);
  EXPECT_EQ(a->rope.original_max_position_embeddings, 64);
  EXPECT_DOUBLE_EQ(a->rope.attention_factor, 1.0);  // mscale == mscale_all_dim
  auto fa = RopeInvFreq(a->rope, 8), fb = RopeInvFreq(b->rope, 8);
  EXPECT_EQ(fa, fb);
}

TEST(ConfigTest, SoftmaxScaleCarriesMscaleSquaredForDeepseek) {
  std::string cfg = absl::StrReplaceAll(kBase, {{"glm_moe_dsa", "deepseek_v32"},
      {"EXTRA", R"(, "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 64, "mscale": 1.0, "mscale_all_dim": 1.0})"}});
  auto c = ParseModelConfig(cfg);
  ASSERT_TRUE(c.ok()) << c.status();
  const double m = 0.1 * std::log(40.0) + 1.0;
  EXPECT_NEAR(c->softmax_scale, m * m / std::sqrt(24.0), 1e-12);
  EXPECT_TRUE(c->rope_interleave);
  EXPECT_FALSE(c->indexer_rope_interleave);
  // glm_moe_dsa: interleaved indexer rope, mscale applied too.
  auto g = Parse(R"(, "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 64, "mscale": 1.0, "mscale_all_dim": 1.0})");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(g->indexer_rope_interleave);
  EXPECT_NEAR(g->softmax_scale, m * m / std::sqrt(24.0), 1e-12);
}

TEST(ConfigTest, MlpLayerKindsPerFamily) {
  // deepseek_v3 reads first_k_dense_replace (default 3) and refuses a contradicting list.
  std::string v3 = absl::StrReplaceAll(kBase, {{"glm_moe_dsa", "deepseek_v3"}, {"EXTRA", ""}});
  auto c = ParseModelConfig(v3);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->layers[2].moe);
  EXPECT_TRUE(c->layers[3].moe);
  std::string bad = absl::StrReplaceAll(kBase, {{"glm_moe_dsa", "deepseek_v3"},
      {"EXTRA", R"(, "mlp_layer_types": ["dense","sparse","sparse","sparse","sparse","sparse","sparse","sparse"])"}});
  EXPECT_EQ(ParseModelConfig(bad).status().code(), absl::StatusCode::kInvalidArgument);
  // glm4_moe_lite without a list: one dense layer, whatever first_k_dense_replace says.
  std::string lite = absl::StrReplaceAll(kBase, {{"glm_moe_dsa", "glm4_moe_lite"}, {"EXTRA", R"(, "first_k_dense_replace": 3)"}});
  auto l = ParseModelConfig(lite);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_FALSE(l->layers[0].moe);
  EXPECT_TRUE(l->layers[1].moe);
}

TEST(ConfigTest, YarnInvFreqMatchesFormula) {
  RopeConfig r;
  r.yarn = true;
  r.theta = 10000;
  r.yarn_factor = 4;
  r.beta_fast = 32;
  r.beta_slow = 1;
  r.original_max_position_embeddings = 4096;
  const int dim = 64;
  auto f = RopeInvFreq(r, dim);
  auto corr = [&](double rot) { return dim * std::log(4096 / (rot * 2 * M_PI)) / (2 * std::log(10000.0)); };
  const double low = std::floor(corr(32)), high = std::ceil(corr(1));
  for (int i = 0; i < dim / 2; ++i) {
    const double base = std::pow(10000.0, 2.0 * i / dim);
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    const double expect = (1.0 / (4 * base)) * ramp + (1.0 / base) * (1 - ramp);
    EXPECT_NEAR(f[i], expect, 1e-6 * expect) << i;
  }
}

TEST(ConfigTest, ErrorsNameFieldAndValue) {
  struct Case {
    std::string from, to, needle;
  } cases[] = {
      {"glm_moe_dsa", "llama", "model_type"},
      {"\"n_group\": 1", "\"n_group\": 3", "n_group"},
      {"\"q_lora_rank\": 32", "\"q_lora_rank\": null", "q_lora_rank"},
      {"\"qk_rope_head_dim\": 8", "\"qk_rope_head_dim\": 7", "qk_rope_head_dim"},
      {"\"vocab_size\": 100", "\"vocab_size\": \"big\"", "vocab_size"},
      {"\"hidden_size\": 64", "\"hidden_size\": -1", "hidden_size"},
      {"\"num_hidden_layers\": 8,", "", "num_hidden_layers"},
      {"EXTRA", R"(, "rope_scaling": {"type": "dynamic", "factor": 2.0})", "dynamic"},
      {"EXTRA", R"(, "hidden_act": "gelu")", "hidden_act"},
      {"EXTRA", R"(, "partial_rotary_factor": 0.5)", "partial_rotary_factor"},
      {"EXTRA", R"(, "moe_layer_freq": 2)", "moe_layer_freq"},
      {"EXTRA", R"(, "indexer_types": ["shared","full","full","full","full","full","full","full"])", "indexer_types"},
      {"EXTRA", R"(, "mlp_layer_types": ["dense"])", "mlp_layer_types"},
      {"EXTRA", R"(, "quantization_config": {"quant_method": "gptq"})", "quant_method"},
  };
  for (const auto& k : cases) {
    std::string cfg = absl::StrReplaceAll(kBase, {{k.from, k.to}});
    cfg = absl::StrReplaceAll(cfg, {{"EXTRA", ""}});
    auto c = ParseModelConfig(cfg);
    ASSERT_FALSE(c.ok()) << k.to;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << k.to;
    EXPECT_NE(c.status().message().find(k.needle), std::string::npos) << c.status();
  }
  EXPECT_FALSE(ParseModelConfig("not json").ok());
  EXPECT_FALSE(ParseModelConfig("[1,2]").ok());
}

TEST(ConfigTest, QLoraNullMeansQProj) {
  std::string cfg = absl::StrReplaceAll(kBase, {{"glm_moe_dsa", "deepseek_v3"}, {"\"q_lora_rank\": 32", "\"q_lora_rank\": null"}, {"EXTRA", ""}});
  auto c = ParseModelConfig(cfg);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->q_lora_rank, 0);
  EXPECT_FALSE(c->has_dsa);
}

}  // namespace
}  // namespace strata
