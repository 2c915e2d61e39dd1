// DeepSeek-V4 as pipeline stages (model/v4/engine.h): engines of layer ranges
// handing each token's hc_mult residual streams (hc_mult × hidden floats) to
// the next give the logits of the whole-model engine bit for bit, through a
// prefill and decode steps, on the transformers fixtures. The expected
// logits are the whole engine's (itself checked against transformers by
// fixture_test.cc).
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "model/v4/engine.h"
#include "nlohmann/json.hpp"

namespace strata::v4 {
namespace {

namespace fs = std::filesystem;

class V4StageTest : public ::testing::TestWithParam<std::string> {};

TEST_P(V4StageTest, StagesEqualTheWholeModel) {
  const std::string dir = (fs::path(STRATA_SOURCE_DIR) / "tests" / "data" / "models" / GetParam()).string();
  std::ifstream in(dir + "/reference.json");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::vector<int> tokens = nlohmann::json::parse(ss.str())["tokens"].get<std::vector<int>>();
  auto whole = V4Engine::Load(dir, {});
  ASSERT_TRUE(whole.ok()) << whole.status();
  const int L = (*whole)->config().num_layers;
  const std::vector<int> cuts = {0, 1, L - 1, L};
  std::vector<std::unique_ptr<V4Engine>> stages;
  for (size_t s = 0; s + 1 < cuts.size(); ++s) {
    V4EngineOptions o;
    o.layer_begin = cuts[s];
    o.layer_end = cuts[s + 1];
    auto e = V4Engine::Load(dir, o);
    ASSERT_TRUE(e.ok()) << e.status();
    EXPECT_EQ((*e)->stream_width(), (*e)->config().hc_mult * (*e)->config().hidden_size);
    EXPECT_LT((*e)->weight_bytes(), (*whole)->weight_bytes());
    stages.push_back(*std::move(e));
  }
  EXPECT_EQ(stages.front()->Logits(nullptr, 0, nullptr).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(stages.back()->Embed({}, nullptr).code(), absl::StatusCode::kFailedPrecondition);

  auto ref = (*whole)->NewSequence();
  std::vector<std::unique_ptr<V4Sequence>> seqs;
  for (auto& e : stages) seqs.push_back(e->NewSequence());
  const int W = stages[0]->stream_width(), V = stages[0]->config().vocab_size;
  int t = 0;
  for (int n : {17, 1, 1, 6, 1}) {
    const absl::Span<const int> step(&tokens[static_cast<size_t>(t)], static_cast<size_t>(n));
    std::vector<float> want;
    V4Chunk rc{ref.get(), step};
    ASSERT_TRUE((*whole)->Forward({&rc, 1}, /*all_logits=*/true, &want).ok());
    std::vector<float> streams(static_cast<size_t>(n) * W);
    ASSERT_TRUE(stages[0]->Embed(step, streams.data()).ok());
    for (size_t s = 0; s < stages.size(); ++s) {
      V4Chunk c{seqs[s].get(), step};
      ASSERT_TRUE(stages[s]->RunLayers({&c, 1}, streams.data()).ok());
      EXPECT_EQ(seqs[s]->num_tokens(), t + n);
    }
    std::vector<float> got(static_cast<size_t>(n) * V);
    ASSERT_TRUE(stages.back()->Logits(streams.data(), n, got.data()).ok());
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << "step at " << t;
    t += n;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, V4StageTest, ::testing::Values("deepseek_v4", "deepseek_v4_b"));

}  // namespace
}  // namespace strata::v4
