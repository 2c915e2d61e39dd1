#include "model/v4/config.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace strata::v4 {
namespace {

using json = nlohmann::json;

std::string FixtureDir(const std::string& name) {
  return std::string(STRATA_SOURCE_DIR) + "/tests/data/models/" + name;
}

json ReadJson(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str());
}

AttentionKind KindOf(const std::string& s) {
  if (s == "compressed_sparse_attention") return AttentionKind::kCsa;
  if (s == "heavily_compressed_attention") return AttentionKind::kHca;
  return AttentionKind::kSliding;
}

// Every fixture's config against what transformers reported for it
// (reference.json: layer kinds, rates, rope tables, softmax scale).
class V4ConfigFixtureTest : public ::testing::TestWithParam<std::string> {};

TEST_P(V4ConfigFixtureTest, AgreesWithTransformers) {
  const std::string dir = FixtureDir(GetParam());
  auto c = LoadV4Config(dir);
  ASSERT_TRUE(c.ok()) << c.status();
  const json ref = ReadJson(dir + "/reference.json");
  ASSERT_EQ(c->layers.size(), ref["layers"].size());
  for (size_t i = 0; i < c->layers.size(); ++i) {
    const json& l = ref["layers"][i];
    EXPECT_EQ(c->layers[i].attention, KindOf(l["attention"].get<std::string>())) << "layer " << i;
    EXPECT_EQ(c->layers[i].compress_rate, l["compress_rate"].get<int>()) << "layer " << i;
    EXPECT_EQ(c->layers[i].mlp == MlpKind::kHashMoe, l["mlp"].get<std::string>() == "hash_moe") << "layer " << i;
  }
  EXPECT_EQ(c->rope_dim, ref["qk_rope_head_dim"].get<int>());
  EXPECT_NEAR(c->softmax_scale, ref["softmax_scale"].get<double>(), 1e-12);
  for (const char* kind : {"main", "compress"}) {
    const RopeConfig& rope = std::string(kind) == "main" ? c->rope_main : c->rope_compress;
    const auto want = ref["rope"][kind]["inv_freq"].get<std::vector<double>>();
    const std::vector<float> got = RopeInvFreq(rope, c->rope_dim);
    ASSERT_EQ(got.size(), want.size()) << kind;
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_NEAR(got[i], want[i], 2e-7 * std::fabs(want[i])) << kind << " inv_freq[" << i << "]";
    }
    EXPECT_DOUBLE_EQ(rope.attention_factor, ref["rope"][kind]["attention_scaling"].get<double>()) << kind;
  }
  EXPECT_EQ(c->bos_token_id, 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, V4ConfigFixtureTest,
                         ::testing::Values("deepseek_v4", "deepseek_v4_b", "deepseek_v4_fp8_fp4"));

TEST(V4ConfigTest, FixtureSpecifics) {
  auto a = LoadV4Config(FixtureDir("deepseek_v4"));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->hc_mult, 4);
  EXPECT_EQ(a->o_groups, 2);
  EXPECT_EQ(a->compress_rate_hca, 16);
  EXPECT_EQ(a->expert_format, ExpertFormat::kFloat);
  EXPECT_FALSE(a->fp8_weights);
  auto b = LoadV4Config(FixtureDir("deepseek_v4_b"));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->eos_token_ids, (std::vector<int>{1, 2}));
  EXPECT_EQ(b->hc_sinkhorn_iters, 7);
  EXPECT_DOUBLE_EQ(b->hc_eps, 1e-5);
  EXPECT_DOUBLE_EQ(b->swiglu_limit, 1.0);
  EXPECT_EQ(b->layers.size(), 4u);  // compress_ratios' fifth (MTP) entry is dropped
  EXPECT_FALSE(b->rope_main.yarn);
  EXPECT_TRUE(b->rope_compress.yarn);
  EXPECT_DOUBLE_EQ(b->rope_compress.theta, 40000.0);
  auto f = LoadV4Config(FixtureDir("deepseek_v4_fp8_fp4"));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE(f->fp8_weights);
  EXPECT_EQ(f->expert_format, ExpertFormat::kFp4);
}

// deepseek_v4_b (DeepSeek's layout) rewritten in transformers' layout from
// what transformers reported: the same model.
TEST(V4ConfigTest, BothLayoutsGiveTheSameModel) {
  const std::string dir = FixtureDir("deepseek_v4_b");
  const json ds = ReadJson(dir + "/config.json");
  const json ref = ReadJson(dir + "/reference.json");
  json tf = ds;
  for (const char* k : {"compress_ratios", "num_hash_layers", "qk_rope_head_dim", "rope_scaling", "compress_rope_theta"}) {
    tf.erase(k);
  }
  tf["layer_types"] = json::array();
  tf["mlp_layer_types"] = json::array();
  for (const json& l : ref["layers"]) {
    tf["layer_types"].push_back(l["attention"]);
    tf["mlp_layer_types"].push_back(l["mlp"]);
  }
  tf["compress_rates"] = {{"compressed_sparse_attention", 4}, {"heavily_compressed_attention", 128}};
  tf["partial_rotary_factor"] = 0.25;
  tf["rope_parameters"] = {{"main", ref["rope"]["main"]["params"]}, {"compress", ref["rope"]["compress"]["params"]}};
  auto a = ParseV4Config(ds.dump());
  auto b = ParseV4Config(tf.dump());
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  for (size_t i = 0; i < a->layers.size(); ++i) {
    EXPECT_EQ(a->layers[i].attention, b->layers[i].attention);
    EXPECT_EQ(a->layers[i].compress_rate, b->layers[i].compress_rate);
    EXPECT_EQ(a->layers[i].mlp, b->layers[i].mlp);
  }
  EXPECT_EQ(a->rope_dim, b->rope_dim);
  EXPECT_EQ(RopeInvFreq(a->rope_main, a->rope_dim), RopeInvFreq(b->rope_main, b->rope_dim));
  EXPECT_EQ(RopeInvFreq(a->rope_compress, a->rope_dim), RopeInvFreq(b->rope_compress, b->rope_dim));
  EXPECT_EQ(a->rope_compress.attention_factor, b->rope_compress.attention_factor);
}

// A broken variant of a fixture config: INVALID_ARGUMENT naming the field.
struct Broken {
  const char* name;
  const char* fixture;
  std::function<void(json&)> edit;
  const char* field;  // expected in the message
};

class V4ConfigBrokenTest : public ::testing::TestWithParam<Broken> {};

TEST_P(V4ConfigBrokenTest, IsRefusedNamingTheField) {
  const Broken& b = GetParam();
  json j = ReadJson(FixtureDir(b.fixture) + "/config.json");
  b.edit(j);
  auto c = ParseV4Config(j.dump());
  ASSERT_FALSE(c.ok()) << b.name;
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
  std::printf("%s: %s\n", b.name, std::string(c.status().message()).c_str());
  EXPECT_NE(std::string(c.status().message()).find(b.field), std::string::npos) << c.status();
}

const Broken kBroken[] = {
    {"kv_heads", "deepseek_v4", [](json& j) { j["num_key_value_heads"] = 2; }, "num_key_value_heads"},
    {"shared_experts", "deepseek_v4", [](json& j) { j["n_shared_experts"] = 2; }, "n_shared_experts"},
    {"scoring", "deepseek_v4", [](json& j) { j["scoring_func"] = "sigmoid"; }, "scoring_func"},
    {"act", "deepseek_v4", [](json& j) { j["hidden_act"] = "gelu"; }, "hidden_act"},
    {"tied", "deepseek_v4", [](json& j) { j["tie_word_embeddings"] = true; }, "tie_word_embeddings"},
    {"attn_bias", "deepseek_v4", [](json& j) { j["attention_bias"] = true; }, "attention_bias"},
    {"mlp_bias", "deepseek_v4", [](json& j) { j["mlp_bias"] = true; }, "mlp_bias"},
    {"norm_topk", "deepseek_v4", [](json& j) { j["norm_topk_prob"] = false; }, "norm_topk_prob"},
    {"no_kinds", "deepseek_v4", [](json& j) { j.erase("layer_types"); }, "layer_types"},
    {"bad_kind", "deepseek_v4", [](json& j) { j["layer_types"][2] = "full_attention"; }, "layer_types"},
    {"short_kinds", "deepseek_v4", [](json& j) { j["layer_types"].erase(4); }, "layer_types"},
    {"bad_ratio", "deepseek_v4_b", [](json& j) { j["compress_ratios"][1] = 8; }, "compress_ratios"},
    {"short_ratios", "deepseek_v4_b", [](json& j) { j["compress_ratios"] = {128, 4, 0}; }, "compress_ratios"},
    {"ratio_vs_rate", "deepseek_v4_b",
     [](json& j) { j["compress_rates"] = {{"compressed_sparse_attention", 8}}; }, "compress_ratios"},
    {"ratio_vs_kinds", "deepseek_v4_b",
     [](json& j) {
       j["layer_types"] = {"heavily_compressed_attention", "compressed_sparse_attention", "sliding_attention",
                           "sliding_attention"};
     },
     "compress_ratios"},
    {"rate_key", "deepseek_v4", [](json& j) { j["compress_rates"]["sliding_attention"] = 2; }, "compress_rates"},
    {"rate_zero", "deepseek_v4", [](json& j) { j["compress_rates"]["heavily_compressed_attention"] = 0; },
     "compress_rates.heavily_compressed_attention"},
    {"mlp_kind", "deepseek_v4", [](json& j) { j["mlp_layer_types"][0] = "dense"; }, "mlp_layer_types"},
    {"mlp_vs_hash", "deepseek_v4", [](json& j) { j["num_hash_layers"] = 1; }, "mlp_layer_types"},
    {"rope_dims", "deepseek_v4", [](json& j) { j["qk_rope_head_dim"] = 16; }, "qk_rope_head_dim"},
    {"odd_rope", "deepseek_v4_b", [](json& j) { j["qk_rope_head_dim"] = 7; }, "partial_rotary_factor"},
    {"rope_type", "deepseek_v4_b", [](json& j) { j["rope_scaling"]["type"] = "linear"; }, "rope_type"},
    {"nested_half", "deepseek_v4", [](json& j) { j["rope_parameters"].erase("compress"); }, "rope_parameters"},
    {"nested_theta", "deepseek_v4", [](json& j) { j["rope_parameters"]["main"].erase("rope_theta"); },
     "rope_parameters.main.rope_theta"},
    {"rope_factor", "deepseek_v4", [](json& j) { j["rope_parameters"]["compress"]["partial_rotary_factor"] = 0.5; },
     "partial_rotary_factor"},
    {"q_lora", "deepseek_v4", [](json& j) { j["q_lora_rank"] = nullptr; }, "q_lora_rank"},
    {"o_groups", "deepseek_v4", [](json& j) { j["o_groups"] = 3; }, "o_groups"},
    {"topk_experts", "deepseek_v4", [](json& j) { j["num_experts_per_tok"] = 9; }, "num_experts_per_tok"},
    {"index_dim", "deepseek_v4", [](json& j) { j["index_head_dim"] = 4; }, "index_head_dim"},
    {"no_index_topk", "deepseek_v4", [](json& j) { j.erase("index_topk"); }, "index_topk"},
    {"window", "deepseek_v4", [](json& j) { j["sliding_window"] = 0; }, "sliding_window"},
    {"quant_method", "deepseek_v4_fp8_fp4", [](json& j) { j["quantization_config"]["quant_method"] = "gptq"; },
     "quant_method"},
    {"quant_block", "deepseek_v4_fp8_fp4",
     [](json& j) { j["quantization_config"]["weight_block_size"] = {64, 64}; }, "weight_block_size"},
    {"scale_fmt", "deepseek_v4_fp8_fp4", [](json& j) { j["quantization_config"]["scale_fmt"] = "fp32"; },
     "scale_fmt"},
    {"expert_dtype", "deepseek_v4_fp8_fp4", [](json& j) { j["expert_dtype"] = "int4"; }, "expert_dtype"},
    {"fp4_unquantised", "deepseek_v4_fp8_fp4", [](json& j) { j.erase("quantization_config"); }, "expert_dtype"},
    {"model_type", "deepseek_v4", [](json& j) { j["model_type"] = "deepseek_v3"; }, "model_type"},
    {"hidden", "deepseek_v4", [](json& j) { j["hidden_size"] = "64"; }, "hidden_size"},
    {"swiglu", "deepseek_v4", [](json& j) { j["swiglu_limit"] = -1; }, "swiglu_limit"},
};

INSTANTIATE_TEST_SUITE_P(Variants, V4ConfigBrokenTest, ::testing::ValuesIn(kBroken),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(V4ConfigTest, NotJsonAndMissingFiles) {
  EXPECT_EQ(ParseV4Config("{").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseV4Config("[1]").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadV4Config("/nonexistent-dir").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ReadModelType("/nonexistent-dir").status().code(), absl::StatusCode::kNotFound);
  auto t = ReadModelType(FixtureDir("deepseek_v4_b"));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t, "deepseek_v4");
}

}  // namespace
}  // namespace strata::v4
