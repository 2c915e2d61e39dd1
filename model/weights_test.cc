// LoadWeights with keep_fp8 on the fp8 checkpoint fixture: the layers a GPU
// engine runs as fp8 GEMMs keep the stored codes and scales, which decode to
// exactly the f32 weights the plain load gives; the others (kv_b, the
// router) are f32 as before.
#include "model/weights.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "kernels/fp8.h"
#include "model/config.h"
#include "model/safetensors.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

// Decodes a kept weight as the CPU loader does (code value times scale, f32)
// and compares it with the plain load's values bit for bit.
void ExpectDecodesTo(const LinearWeights& kept, const LinearWeights& plain, const std::string& what) {
  ASSERT_TRUE(kept.is_fp8()) << what;
  EXPECT_TRUE(kept.w.empty()) << what;
  ASSERT_EQ(kept.fp8_codes.size(), plain.w.size()) << what;
  const size_t in = static_cast<size_t>(kept.in), bk = (in + 127) / 128;
  ASSERT_EQ(kept.fp8_scales.size(), ((static_cast<size_t>(kept.out) + 127) / 128) * bk) << what;
  int64_t differ = 0;
  for (size_t i = 0; i < plain.w.size(); ++i) {
    const size_t r = i / in, c = i % in;
    differ += fp8::Decode(kept.fp8_codes[i]) * kept.fp8_scales[(r / 128) * bk + c / 128] != plain.w[i];
  }
  EXPECT_EQ(differ, 0) << what;
  EXPECT_EQ(kept.b, plain.b) << what;
}

TEST(WeightsTest, KeepFp8KeepsTheStoredCodesOfTheFp8Layers) {
  const std::string dir = (fs::path(STRATA_SOURCE_DIR) / "tests" / "data" / "models" / "deepseek_v3_fp8").string();
  auto config = LoadModelConfig(dir);
  ASSERT_TRUE(config.ok()) << config.status();
  auto store = TensorStore::OpenDir(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  const int n = config->num_layers;
  auto plain = LoadWeights(**store, *config, 0, n, true, true);
  ASSERT_TRUE(plain.ok()) << plain.status();
  LoadOptions o;
  o.keep_fp8 = true;
  auto kept = LoadWeights(**store, *config, 0, n, true, true, o);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_LT((*kept)->bytes, (*plain)->bytes);
  int fp8_layers = 0;
  for (int l = 0; l < n; ++l) {
    const LayerWeights& k = (*kept)->layers[l];
    const LayerWeights& p = (*plain)->layers[l];
    const std::string at = "layer " + std::to_string(l) + " ";
    ExpectDecodesTo(k.q_a, p.q_a, at + "q_a");
    ExpectDecodesTo(k.q_b, p.q_b, at + "q_b");
    ExpectDecodesTo(k.kv_a, p.kv_a, at + "kv_a");
    ExpectDecodesTo(k.o, p.o, at + "o_proj");
    fp8_layers += 4;
    EXPECT_FALSE(k.kv_b.is_fp8()) << at;
    EXPECT_EQ(k.kv_b.w, p.kv_b.w) << at;
    if (!config->layers[l].moe) {
      ExpectDecodesTo(k.dense.gate, p.dense.gate, at + "gate");
      ExpectDecodesTo(k.dense.down, p.dense.down, at + "down");
      continue;
    }
    EXPECT_FALSE(k.router.is_fp8()) << at;
    ExpectDecodesTo(k.shared.up, p.shared.up, at + "shared up");
    for (size_t e = 0; e < k.experts.size(); ++e) {
      ExpectDecodesTo(k.experts[e].gate, p.experts[e].gate, at + "expert gate");
      ExpectDecodesTo(k.experts[e].down, p.experts[e].down, at + "expert down");
    }
  }
  EXPECT_GT(fp8_layers, 0);
  EXPECT_EQ((*kept)->embed, (*plain)->embed);
}

}  // namespace
}  // namespace strata
