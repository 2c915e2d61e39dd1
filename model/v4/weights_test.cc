// Loading DeepSeek-V4 checkpoints: the release's names, and broken variants
// of the FP8 / FP4 fixture (missing tensor, wrong shape, bad scale encoding,
// bad dtype, bad hash table), each a clear error naming the tensor and file.
#include "model/v4/weights.h"

#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "common/testing/scratch_dir.h"
#include "gtest/gtest.h"
#include "model/safetensors.h"
#include "model/safetensors_writer.h"
#include "model/v4/config.h"

namespace strata::v4 {
namespace {

std::string FixtureDir(const std::string& name) {
  return std::string(STRATA_SOURCE_DIR) + "/tests/data/models/" + name;
}

std::vector<TensorToWrite> ReadAll(const std::string& dir) {
  std::vector<TensorToWrite> out;
  auto f = SafetensorsFile::Open(dir + "/model.safetensors");
  EXPECT_TRUE(f.ok()) << f.status();
  if (!f.ok()) return out;
  for (const std::string& name : (*f)->Names()) {
    const TensorInfo* t = (*f)->Find(name);
    auto d = (*f)->Data(*t);
    out.push_back({name, t->dtype, t->shape, std::vector<uint8_t>(d.begin(), d.end())});
  }
  return out;
}

TensorToWrite* Find(std::vector<TensorToWrite>& ts, const std::string& name) {
  for (auto& t : ts) {
    if (t.name == name) return &t;
  }
  ADD_FAILURE() << "fixture has no tensor " << name;
  return nullptr;
}

// Writes `tensors` into a fresh directory and loads them with the fixture's config.
absl::StatusOr<std::unique_ptr<V4Weights>> LoadEdited(const std::string& fixture,
                                                      const std::vector<TensorToWrite>& tensors,
                                                      const ScratchDir& dir) {
  auto config = LoadV4Config(FixtureDir(fixture));
  if (!config.ok()) return config.status();
  if (auto st = WriteSafetensors(dir.path() + "/model.safetensors", tensors); !st.ok()) return st;
  auto store = TensorStore::OpenDir(dir.path());
  if (!store.ok()) return store.status();
  return LoadV4Weights(**store, *config);
}

TEST(V4WeightsTest, FixturesLoad) {
  for (const char* name : {"deepseek_v4", "deepseek_v4_b", "deepseek_v4_fp8_fp4"}) {
    auto config = LoadV4Config(FixtureDir(name));
    ASSERT_TRUE(config.ok()) << config.status();
    auto store = TensorStore::OpenDir(FixtureDir(name));
    ASSERT_TRUE(store.ok()) << store.status();
    auto w = LoadV4Weights(**store, *config);
    ASSERT_TRUE(w.ok()) << name << ": " << w.status();
    EXPECT_EQ((*w)->layers.size(), static_cast<size_t>(config->num_layers));
    EXPECT_GT((*w)->bytes, 0u);
  }
}

// The same tensors under the names of DeepSeek's release (no `model.`
// prefix, embed / norm / hc_head_* at the top, attn.kv_norm), plus an MTP
// layer that must be ignored, load to the same floats.
TEST(V4WeightsTest, ReleaseNamesLoadTheSameWeights) {
  std::vector<TensorToWrite> ts = ReadAll(FixtureDir("deepseek_v4_fp8_fp4"));
  auto rename = [](std::string n) {
    if (n == "model.embed_tokens.weight") return std::string("embed.weight");
    if (n == "model.norm.weight") return std::string("norm.weight");
    if (n.rfind("model.hc_head.", 0) == 0) return "hc_head_" + n.substr(std::string("model.hc_head.hc_").size());
    if (n.rfind("model.", 0) == 0) n = n.substr(6);
    const std::string kv = ".attn.norm.weight";
    if (n.size() > kv.size() && n.compare(n.size() - kv.size(), kv.size(), kv) == 0) {
      n = n.substr(0, n.size() - kv.size()) + ".attn.kv_norm.weight";
    }
    return n;
  };
  std::vector<TensorToWrite> release;
  for (const auto& t : ts) release.push_back({rename(t.name), t.dtype, t.shape, t.data});
  release.push_back({"mtp.0.attn.wq_a.weight", DType::kF32, {2, 2}, std::vector<uint8_t>(16, 0)});
  ScratchDir a("v4w_"), b("v4w_");
  auto orig = LoadEdited("deepseek_v4_fp8_fp4", ts, a);
  auto rel = LoadEdited("deepseek_v4_fp8_fp4", release, b);
  ASSERT_TRUE(orig.ok()) << orig.status();
  ASSERT_TRUE(rel.ok()) << rel.status();
  const V4Weights &x = **orig, &y = **rel;
  EXPECT_EQ(x.embed, y.embed);
  EXPECT_EQ(x.final_norm, y.final_norm);
  EXPECT_EQ(x.hc_head_fn, y.hc_head_fn);
  EXPECT_EQ(x.hc_head_scale, y.hc_head_scale);
  for (size_t l = 0; l < x.layers.size(); ++l) {
    EXPECT_EQ(x.layers[l].kv_norm, y.layers[l].kv_norm);
    EXPECT_EQ(x.layers[l].q_a.w, y.layers[l].q_a.w);
    EXPECT_EQ(x.layers[l].experts[1].down.w, y.layers[l].experts[1].down.w);
  }
  EXPECT_EQ(x.bytes, y.bytes);
}

struct Broken {
  const char* name;
  std::function<void(std::vector<TensorToWrite>&)> edit;
  absl::StatusCode code;
  const char* tensor;  // named in the message
};

class V4WeightsBrokenTest : public ::testing::TestWithParam<Broken> {};

TEST_P(V4WeightsBrokenTest, IsAClearError) {
  const Broken& b = GetParam();
  std::vector<TensorToWrite> ts = ReadAll(FixtureDir("deepseek_v4_fp8_fp4"));
  b.edit(ts);
  ScratchDir dir("v4w_");
  auto w = LoadEdited("deepseek_v4_fp8_fp4", ts, dir);
  ASSERT_FALSE(w.ok()) << b.name;
  EXPECT_EQ(w.status().code(), b.code) << w.status();
  const std::string msg(w.status().message());
  std::printf("%s: %s\n", b.name, msg.c_str());
  EXPECT_NE(msg.find(b.tensor), std::string::npos) << msg;
  EXPECT_NE(msg.find(dir.path()), std::string::npos) << "the message names no file or directory: " << msg;
}

void Drop(std::vector<TensorToWrite>& ts, const std::string& name) {
  for (size_t i = 0; i < ts.size(); ++i) {
    if (ts[i].name == name) {
      ts.erase(ts.begin() + i);
      return;
    }
  }
  ADD_FAILURE() << "fixture has no tensor " << name;
}

const Broken kBroken[] = {
    {"missing_weight", [](auto& ts) { Drop(ts, "model.layers.1.attn.wq_a.weight"); }, absl::StatusCode::kNotFound,
     "model.layers.1.attn.wq_a.weight"},
    {"missing_kv_norm", [](auto& ts) { Drop(ts, "model.layers.2.attn.norm.weight"); }, absl::StatusCode::kNotFound,
     "attn.kv_norm.weight"},
    {"missing_expert", [](auto& ts) { Drop(ts, "model.layers.1.ffn.experts.3.w2.weight"); },
     absl::StatusCode::kNotFound, "model.layers.1.ffn.experts.3.w2.weight"},
    {"missing_scale", [](auto& ts) { Drop(ts, "model.layers.0.attn.wkv.scale"); }, absl::StatusCode::kNotFound,
     "model.layers.0.attn.wkv.scale"},
    {"missing_tid2eid", [](auto& ts) { Drop(ts, "model.layers.0.ffn.gate.tid2eid"); }, absl::StatusCode::kNotFound,
     "model.layers.0.ffn.gate.tid2eid"},
    {"sink_shape",
     [](auto& ts) {
       TensorToWrite* t = Find(ts, "model.layers.0.attn.attn_sink");
       t->shape = {1, 2};
     },
     absl::StatusCode::kInvalidArgument, "model.layers.0.attn.attn_sink"},
    {"fp8_shape",
     [](auto& ts) {
       TensorToWrite* t = Find(ts, "model.layers.1.attn.wo_b.weight");
       t->shape = {96, 384};
     },
     absl::StatusCode::kInvalidArgument, "model.layers.1.attn.wo_b.weight"},
    {"scale_shape",
     [](auto& ts) {
       TensorToWrite* t = Find(ts, "model.layers.0.attn.wq_b.scale");
       t->shape = {4, 1};
     },
     absl::StatusCode::kInvalidArgument, "model.layers.0.attn.wq_b.scale"},
    {"scale_nan",
     [](auto& ts) { Find(ts, "model.layers.2.attn.wq_a.scale")->data[1] = 255; },
     absl::StatusCode::kInvalidArgument, "model.layers.2.attn.wq_a.weight"},
    {"scale_dtype",
     [](auto& ts) {
       TensorToWrite* t = Find(ts, "model.layers.0.ffn.shared_experts.w1.scale");
       t->dtype = DType::kU8;
     },
     absl::StatusCode::kInvalidArgument, "model.layers.0.ffn.shared_experts.w1.scale"},
    {"fp4_scale_nan",
     [](auto& ts) { Find(ts, "model.layers.1.ffn.experts.2.w3.scale")->data[7] = 255; },
     absl::StatusCode::kInvalidArgument, "model.layers.1.ffn.experts.2.w3.weight"},
    {"fp4_shape",
     [](auto& ts) { Find(ts, "model.layers.2.ffn.experts.0.w1.weight")->shape = {96, 64}; },
     absl::StatusCode::kInvalidArgument, "model.layers.2.ffn.experts.0.w1.weight"},
    {"fp8_nan_code",
     [](auto& ts) { Find(ts, "model.layers.0.attn.indexer.wq_b.weight")->data[5] = 0x7F; },
     absl::StatusCode::kInvalidArgument, "model.layers.0.attn.indexer.wq_b.weight"},
    {"fp4_not_expert",
     [](auto& ts) {
       // A shared expert stored like a routed FP4 expert.
       TensorToWrite* w = Find(ts, "model.layers.0.ffn.shared_experts.w2.weight");
       w->dtype = DType::kI8;
       w->shape = {192, 32};
       w->data.assign(192 * 32, 0);
     },
     absl::StatusCode::kInvalidArgument, "model.layers.0.ffn.shared_experts.w2.weight"},
    {"float_expert_in_fp4",
     [](auto& ts) {
       TensorToWrite* w = Find(ts, "model.layers.0.ffn.experts.1.w1.weight");
       w->dtype = DType::kF32;
       w->shape = {64, 192};
       w->data.assign(64 * 192 * 4, 0);
     },
     absl::StatusCode::kInvalidArgument, "model.layers.0.ffn.experts.1.w1.weight"},
    {"tid2eid_range",
     [](auto& ts) {
       TensorToWrite* t = Find(ts, "model.layers.0.ffn.gate.tid2eid");
       const int64_t bad = 4;  // n_routed_experts is 4
       std::memcpy(t->data.data() + 8 * 17, &bad, 8);
     },
     absl::StatusCode::kInvalidArgument, "model.layers.0.ffn.gate.tid2eid"},
    {"tid2eid_dtype",
     [](auto& ts) {
       TensorToWrite* t = Find(ts, "model.layers.0.ffn.gate.tid2eid");
       t->dtype = DType::kF32;
       t->data.resize(t->data.size() / 2);
     },
     absl::StatusCode::kInvalidArgument, "model.layers.0.ffn.gate.tid2eid"},
    {"norm_dtype",
     [](auto& ts) {
       TensorToWrite* t = Find(ts, "model.norm.weight");
       t->dtype = DType::kI32;
     },
     absl::StatusCode::kInvalidArgument, "model.norm.weight"},
};

INSTANTIATE_TEST_SUITE_P(Variants, V4WeightsBrokenTest, ::testing::ValuesIn(kBroken),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace strata::v4
