// Checks the DeepSeek-V4 engine against the transformers oracle fixtures in
// tests/data/models (made by tools/make_v4_fixtures.py): teacher-forced
// logits within 1e-3 · max|ref| with every top-1 equal, the greedy
// continuation, and the carried state — one token per step, odd chunkings
// and batching all give the one-shot forward's bits.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "model/safetensors.h"
#include "model/v4/config.h"
#include "model/v4/engine.h"
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

int Argmax(const float* v, int n) { return static_cast<int>(std::max_element(v, v + n) - v); }

struct Reference {
  nlohmann::json meta;
  std::vector<float> logits;  // [T, vocab]
};

Reference LoadReference(const std::string& dir) {
  Reference r;
  std::ifstream in(dir + "/reference.json");
  std::stringstream ss;
  ss << in.rdbuf();
  r.meta = nlohmann::json::parse(ss.str());
  auto f = SafetensorsFile::Open(dir + "/reference.safetensors");
  EXPECT_TRUE(f.ok()) << f.status();
  if (!f.ok()) return r;
  const TensorInfo* t = (*f)->Find("logits_f32");
  EXPECT_NE(t, nullptr);
  if (t == nullptr) return r;
  auto d = (*f)->Data(*t);
  r.logits.resize(d.size() / 4);
  std::memcpy(r.logits.data(), d.data(), d.size());
  return r;
}

// Runs `tokens` through a fresh sequence in chunks of the given sizes
// (cycled), returning every position's logits.
std::vector<float> RunChunked(V4Engine& e, const std::vector<int>& tokens, const std::vector<int>& sizes) {
  auto seq = e.NewSequence();
  std::vector<float> all, step;
  size_t at = 0, k = 0;
  while (at < tokens.size()) {
    const size_t n = std::min<size_t>(sizes[k++ % sizes.size()], tokens.size() - at);
    V4Chunk ch{seq.get(), absl::MakeConstSpan(&tokens[at], n)};
    const absl::Status st = e.Forward({ch}, true, &step);
    EXPECT_TRUE(st.ok()) << st;
    if (!st.ok()) return {};
    all.insert(all.end(), step.begin(), step.end());
    at += n;
  }
  EXPECT_EQ(seq->num_tokens(), static_cast<int>(tokens.size()));
  return all;
}

class V4FixtureTest : public ::testing::TestWithParam<std::string> {};

TEST(V4FixtureSetTest, FixturesArePresent) { EXPECT_GE(V4FixtureDirs().size(), 3u); }

TEST_P(V4FixtureTest, MatchesTransformers) {
  const std::string dir = GetParam();
  const std::string name = fs::path(dir).filename().string();
  const Reference ref = LoadReference(dir);
  const std::vector<int> tokens = ref.meta["tokens"].get<std::vector<int>>();
  const int T = static_cast<int>(tokens.size());
  auto engine = V4Engine::Load(dir, {});
  ASSERT_TRUE(engine.ok()) << engine.status();
  V4Engine& e = **engine;
  const int V = e.config().vocab_size;
  ASSERT_EQ(ref.logits.size(), static_cast<size_t>(T) * V);

  // One-shot forward, teacher forced.
  const std::vector<float> got = RunChunked(e, tokens, {T});
  ASSERT_EQ(got.size(), ref.logits.size());
  float max_ref = 0, max_err = 0;
  for (float v : ref.logits) max_ref = std::max(max_ref, std::fabs(v));
  int agree = 0;
  for (int p = 0; p < T; ++p) {
    float row_err = 0;
    for (int v = 0; v < V; ++v) {
      row_err = std::max(row_err, std::fabs(got[static_cast<size_t>(p) * V + v] - ref.logits[static_cast<size_t>(p) * V + v]));
    }
    max_err = std::max(max_err, row_err);
    EXPECT_LE(row_err, 1e-3f * max_ref) << name << " position " << p;
    const bool same = Argmax(&got[static_cast<size_t>(p) * V], V) == Argmax(&ref.logits[static_cast<size_t>(p) * V], V);
    EXPECT_TRUE(same) << name << " top-1 differs at position " << p;
    agree += same;
  }
  std::printf("%s: max|dlogit| %.3g, max|logit| %.3g, ratio %.2e, top-1 %d/%d\n", name.c_str(), max_err, max_ref,
              max_err / max_ref, agree, T);

  // The carried state: one token per step and odd chunkings give the same bits.
  EXPECT_EQ(RunChunked(e, tokens, {1}), got) << name << ": decode differs from the one-shot forward";
  const std::vector<int> fixture_sizes = ref.meta["chunked_prefill_sizes"].get<std::vector<int>>();
  EXPECT_EQ(RunChunked(e, tokens, fixture_sizes), got) << name << ": the fixture's chunking differs";
  for (const std::vector<int>& sizes : std::vector<std::vector<int>>{{3}, {7, 1, 5}, {2, 9, 1, 13}, {17, 31}}) {
    EXPECT_EQ(RunChunked(e, tokens, sizes), got) << name << ": chunks of " << sizes[0] << ", ...";
  }

  // Batching: the same sequence beside a different one gives the same bits.
  {
    auto a = e.NewSequence(), b = e.NewSequence();
    std::vector<int> other(tokens.rbegin(), tokens.rend());
    other.resize(std::min<size_t>(other.size(), 11));
    std::vector<float> batched;
    const int half = T / 2;
    V4Chunk c1[] = {{b.get(), other}, {a.get(), absl::MakeConstSpan(tokens.data(), half)}};
    ASSERT_TRUE(e.Forward(c1, true, &batched).ok());
    std::vector<float> mine(batched.begin() + other.size() * V, batched.end());
    V4Chunk c2[] = {{a.get(), absl::MakeConstSpan(tokens.data() + half, T - half)}, {b.get(), other}};
    ASSERT_TRUE(e.Forward(c2, true, &batched).ok());
    mine.insert(mine.end(), batched.begin(), batched.begin() + static_cast<size_t>(T - half) * V);
    EXPECT_EQ(mine, got) << name << ": batching changed the numbers";
  }

  // Greedy continuation, decoding through the state.
  const std::vector<int> prompt = ref.meta["greedy_prompt"].get<std::vector<int>>();
  const std::vector<int> expect = ref.meta["greedy_f32"].get<std::vector<int>>();
  auto seq = e.NewSequence();
  std::vector<int> next = prompt, out;
  std::vector<float> step;
  for (size_t i = 0; i < expect.size(); ++i) {
    V4Chunk ch{seq.get(), next};
    ASSERT_TRUE(e.Forward({ch}, false, &step).ok());
    out.push_back(Argmax(step.data(), V));
    next = {out.back()};
  }
  EXPECT_EQ(out, expect) << name;
}

TEST_P(V4FixtureTest, BadInputChangesNothing) {
  auto engine = V4Engine::Load(GetParam(), {});
  ASSERT_TRUE(engine.ok()) << engine.status();
  V4Engine& e = **engine;
  auto seq = e.NewSequence();
  std::vector<float> logits;
  const std::vector<int> good = {1, 2, 3}, bad = {1, e.config().vocab_size, 3};
  EXPECT_EQ(e.Forward({V4Chunk{seq.get(), bad}}, false, &logits).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(e.Forward({V4Chunk{seq.get(), {}}}, false, &logits).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(e.Forward({V4Chunk{seq.get(), good}, V4Chunk{seq.get(), good}}, false, &logits).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(seq->num_tokens(), 0);
  ASSERT_TRUE(e.Forward({V4Chunk{seq.get(), good}}, false, &logits).ok());
  EXPECT_EQ(seq->num_tokens(), 3);
}

// The state's parts have the sizes docs/deepseek-v4.md §4.4 gives for every
// token count, and a copy continues exactly like the original.
TEST_P(V4FixtureTest, StateFollowsTheDocumentedLayout) {
  auto engine = V4Engine::Load(GetParam(), {});
  ASSERT_TRUE(engine.ok()) << engine.status();
  V4Engine& e = **engine;
  const V4Config& c = e.config();
  const Reference ref = LoadReference(GetParam());
  const std::vector<int> tokens = ref.meta["tokens"].get<std::vector<int>>();
  auto seq = e.NewSequence();
  std::vector<float> logits;
  for (size_t i = 0; i < tokens.size(); ++i) {
    ASSERT_TRUE(e.Forward({V4Chunk{seq.get(), absl::MakeConstSpan(&tokens[i], 1)}}, false, &logits).ok());
    const int T = seq->num_tokens();
    ASSERT_EQ(T, static_cast<int>(i) + 1);
    for (int l = 0; l < c.num_layers; ++l) {
      const V4LayerState& st = seq->layer(l);
      EXPECT_EQ(st.window_slots, c.sliding_window - 1);
      EXPECT_EQ(st.window.size(), static_cast<size_t>(c.sliding_window - 1) * c.head_dim);
      const V4LayerSpec& spec = c.layers[l];
      const int m = spec.compress_rate;
      auto check = [&](const CompressorState& cs, int width, int coff) {
        EXPECT_EQ(cs.width, width);
        EXPECT_EQ(cs.rows.size(), static_cast<size_t>(T / m) * width) << "layer " << l << " T " << T;
        EXPECT_EQ(cs.open_kv.size(), static_cast<size_t>(T % m) * coff * width);
        EXPECT_EQ(cs.open_gate.size(), cs.open_kv.size());
        const size_t overlap = coff == 2 && T >= m ? static_cast<size_t>(m) * width : 0;
        EXPECT_EQ(cs.overlap_kv.size(), overlap);
        EXPECT_EQ(cs.overlap_gate.size(), overlap);
      };
      if (spec.attention == AttentionKind::kSliding) {
        EXPECT_EQ(st.compressor.bytes(), 0u);
        EXPECT_EQ(st.indexer.bytes(), 0u);
      } else if (spec.attention == AttentionKind::kHca) {
        check(st.compressor, c.head_dim, 1);
        EXPECT_EQ(st.indexer.bytes(), 0u);
      } else {
        check(st.compressor, c.head_dim, 2);
        check(st.indexer, c.index_head_dim, 2);
      }
    }
    if (i + 1 == tokens.size() / 2) {
      // A deep copy at mid-sequence continues with the one-shot forward's bits.
      auto copy = seq->Copy();
      const std::vector<int> rest(tokens.begin() + i + 1, tokens.end());
      std::vector<float> cont;
      ASSERT_TRUE(e.Forward({V4Chunk{copy.get(), rest}}, true, &cont).ok());
      const std::vector<float> full = RunChunked(e, tokens, {static_cast<int>(tokens.size())});
      const size_t V = static_cast<size_t>(c.vocab_size);
      EXPECT_TRUE(std::equal(cont.begin(), cont.end(), full.begin() + (i + 1) * V, full.end()));
      EXPECT_EQ(seq->num_tokens(), static_cast<int>(i) + 1);  // the copy did not touch it
    }
  }
  EXPECT_GT(seq->bytes(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Models, V4FixtureTest, ::testing::ValuesIn(V4FixtureDirs()), [](const auto& info) {
  std::string n = fs::path(info.param).filename().string();
  for (char& ch : n) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return n;
});
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(V4FixtureTest);

}  // namespace
}  // namespace strata::v4
