#include "model/fingerprint.h"

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/testing/scratch_dir.h"
#include "gtest/gtest.h"
#include "model/random_model.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

constexpr const char* kConfig = R"({
  "model_type": "deepseek_v3", "vocab_size": 61, "hidden_size": 32, "intermediate_size": 48,
  "moe_intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
  "num_key_value_heads": 2, "q_lora_rank": 16, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
  "qk_rope_head_dim": 8, "v_head_dim": 8, "n_routed_experts": 4, "n_shared_experts": 1,
  "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1, "first_k_dense_replace": 1,
  "max_position_embeddings": 128
})";

class FingerprintTest : public ::testing::Test {
 protected:
  std::string Model(const std::string& name, uint64_t seed, const std::string& config = kConfig) {
    const std::string dir = MakeScratchDir(absl::StrCat("fp_", name, "_"));
    RandomModelOptions o;
    o.seed = seed;
    EXPECT_TRUE(WriteRandomModel(dir, config, o).ok());
    dirs_.push_back(dir);
    return dir;
  }
  void TearDown() override {
    for (const auto& d : dirs_) fs::remove_all(d);
  }
  std::vector<std::string> dirs_;
};

TEST_F(FingerprintTest, EqualDimensionsDifferentWeightsDiffer) {
  auto a = ModelFingerprint(Model("a", 1));
  auto a2 = ModelFingerprint(Model("a2", 1));
  auto b = ModelFingerprint(Model("b", 2));
  ASSERT_TRUE(a.ok() && a2.ok() && b.ok()) << a.status() << b.status();
  EXPECT_EQ(*a, *a2);  // same bytes in another directory: same model
  EXPECT_NE(*a, *b);
}

TEST_F(FingerprintTest, OnlyTheEmbeddingDiffers) {
  const std::string a = Model("emb_a", 3);
  const std::string b = Model("emb_b", 3);
  // Flip one byte of the embedding's data in b (the first tensor in byte order
  // need not be the embedding, so find it through the header).
  std::fstream f(b + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
  uint64_t header_len = 0;
  f.read(reinterpret_cast<char*>(&header_len), 8);
  std::string header(header_len, '\0');
  f.read(header.data(), static_cast<std::streamsize>(header_len));
  const size_t at = header.find("\"model.embed_tokens.weight\"");
  ASSERT_NE(at, std::string::npos);
  const size_t offs = header.find("data_offsets", at);
  const size_t begin = header.find('[', offs) + 1;
  const uint64_t first = std::stoull(header.substr(begin));
  f.seekg(static_cast<std::streamoff>(8 + header_len + first + 5));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x01);
  f.seekp(static_cast<std::streamoff>(8 + header_len + first + 5));
  f.write(&c, 1);
  f.close();
  auto fa = ModelFingerprint(a), fb = ModelFingerprint(b);
  ASSERT_TRUE(fa.ok() && fb.ok());
  EXPECT_NE(*fa, *fb);
}

TEST_F(FingerprintTest, ConfigTextCounts) {
  const std::string a = Model("cfg", 4);
  auto before = ModelFingerprint(a);
  std::ofstream(a + "/config.json", std::ios::app) << "\n";
  auto after = ModelFingerprint(a);
  ASSERT_TRUE(before.ok() && after.ok());
  EXPECT_NE(*before, *after);
}

TEST_F(FingerprintTest, MissingModelIsNotFound) {
  auto f = ModelFingerprint((fs::path(::testing::TempDir()) / "no_such_model_dir").string());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound);
}

TEST_F(FingerprintTest, SyntheticWeightsHaveTheirOwnIdentity) {
  const std::string a = Model("syn", 5);
  auto s1 = SyntheticModelFingerprint(a, 1), s1b = SyntheticModelFingerprint(a, 1);
  auto s2 = SyntheticModelFingerprint(a, 2), real = ModelFingerprint(a);
  ASSERT_TRUE(s1.ok() && s1b.ok() && s2.ok() && real.ok());
  EXPECT_EQ(*s1, *s1b);
  EXPECT_NE(*s1, *s2);    // another seed, other weights
  EXPECT_NE(*s1, *real);  // never a checkpoint's
  std::ofstream(a + "/config.json", std::ios::app) << "\n";
  auto edited = SyntheticModelFingerprint(a, 1);
  ASSERT_TRUE(edited.ok());
  EXPECT_NE(*s1, *edited);
  EXPECT_EQ(SyntheticModelFingerprint((fs::path(::testing::TempDir()) / "no_such_model_dir").string(), 1)
                .status()
                .code(),
            absl::StatusCode::kNotFound);
}

TEST(Fingerprint64Test, SplitUpdatesEqualOneUpdateAndFieldsAreDelimited) {
  const std::string s = "the quick brown fox jumps over the lazy dog, 0123456789";
  Fingerprint64 whole;
  whole.Update(s);
  for (size_t cut = 0; cut <= s.size(); ++cut) {
    Fingerprint64 split;
    split.Update(s.substr(0, cut));
    split.Update(s.substr(cut));
    EXPECT_EQ(split.Finish(), whole.Finish()) << cut;
  }
  Fingerprint64 ab, a_b;
  ab.UpdateField("ab");
  ab.UpdateField("");
  a_b.UpdateField("a");
  a_b.UpdateField("b");
  EXPECT_NE(ab.Finish(), a_b.Finish());
}

}  // namespace
}  // namespace strata
