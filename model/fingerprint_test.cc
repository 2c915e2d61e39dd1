#include "model/fingerprint.h"

#include <filesystem>
#include <fstream>
#include <random>
#include <utility>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/testing/scratch_dir.h"
#include "gtest/gtest.h"
#include "common/testing/test_seed.h"
#include "model/random_model.h"
#include "model/safetensors.h"

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

// Flips one byte at `offset` of tensor `name`'s data in the single-file model
// at `dir`.
void FlipTensorByte(const std::string& dir, const std::string& name, uint64_t offset) {
  std::fstream f(dir + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
  uint64_t header_len = 0;
  f.read(reinterpret_cast<char*>(&header_len), 8);
  std::string header(header_len, '\0');
  f.read(header.data(), static_cast<std::streamsize>(header_len));
  const size_t at = header.find("\"" + name + "\"");
  ASSERT_NE(at, std::string::npos) << name;
  const size_t offs = header.find("data_offsets", at);
  const size_t begin = header.find('[', offs) + 1;
  const uint64_t first = std::stoull(header.substr(begin));
  const auto pos = static_cast<std::streamoff>(8 + header_len + first + offset);
  f.seekg(pos);
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x01);
  f.seekp(pos);
  f.write(&c, 1);
}

// Every tensor contributes: one flipped byte anywhere in any tensor (the
// random model's tensors are all under kFullTensorBytes, so every byte is
// hashed) changes version 2, while version 1 misses most of them.
TEST_F(FingerprintTest, EveryTensorContributes) {
  const std::string base = Model("every", 6);
  auto want = ModelFingerprint(base);
  auto want_legacy = LegacyModelFingerprint(base);
  ASSERT_TRUE(want.ok() && want_legacy.ok());
  auto store = TensorStore::OpenDir(base);
  ASSERT_TRUE(store.ok());
  const std::vector<std::string> names = (*store)->Names();
  ASSERT_GT(names.size(), 10u);
  std::mt19937_64 rng(testing::TestSeed());
  int legacy_missed = 0;
  for (const std::string& name : names) {
    const TensorInfo info = *(*store)->Info(name);
    ASSERT_LE(info.nbytes, kFullTensorBytes) << name;
    if (info.nbytes == 0) continue;
    const std::string dir = MakeScratchDir("fp_flip_");
    dirs_.push_back(dir);
    for (const char* f : {"config.json", "model.safetensors"}) fs::copy_file(base + "/" + f, dir + "/" + f);
    const uint64_t offset = rng() % info.nbytes;
    FlipTensorByte(dir, name, offset);
    auto got = ModelFingerprint(dir);
    ASSERT_TRUE(got.ok());
    EXPECT_NE(*got, *want) << "a changed byte " << offset << " of " << name << " went unnoticed";
    legacy_missed += *LegacyModelFingerprint(dir) == *want_legacy;
  }
  EXPECT_GT(legacy_missed, 0);  // what version 2 fixes
}

// A tensor larger than kFullTensorBytes is sampled: a byte inside a window
// counts, one between windows does not (ModelDigest sees both).
TEST_F(FingerprintTest, LargeTensorsAreSampledAndTheDigestReadsEverything) {
  constexpr const char* kWide = R"({
  "model_type": "deepseek_v3", "vocab_size": 2048, "hidden_size": 32, "intermediate_size": 48,
  "moe_intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
  "num_key_value_heads": 2, "q_lora_rank": 16, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
  "qk_rope_head_dim": 8, "v_head_dim": 8, "n_routed_experts": 4, "n_shared_experts": 1,
  "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1, "first_k_dense_replace": 1,
  "max_position_embeddings": 128
})";
  const std::string base = Model("wide", 7, kWide);
  auto store = TensorStore::OpenDir(base);
  ASSERT_TRUE(store.ok());
  const uint64_t n = (*store)->Info("model.embed_tokens.weight")->nbytes;  // f32: 2048 · 32 · 4
  ASSERT_GT(n, kFullTensorBytes);
  FingerprintStats stats;
  auto fp = ModelFingerprint(base, &stats);
  auto digest = ModelDigest(base);
  ASSERT_TRUE(fp.ok() && digest.ok());
  EXPECT_LT(stats.bytes_read, stats.tensor_bytes);
  EXPECT_NE(*fp, *digest);
  const uint64_t second_window = 1 * (n - kSampleWindowBytes) / (kSampleWindows - 1);
  const uint64_t inside = second_window + 17;
  const uint64_t between = kSampleWindowBytes + 5;  // after the first window, before the second
  ASSERT_LT(between, second_window);
  for (const auto& [offset, seen] : {std::pair<uint64_t, bool>{inside, true}, {between, false}}) {
    const std::string dir = MakeScratchDir("fp_wide_");
    dirs_.push_back(dir);
    for (const char* f : {"config.json", "model.safetensors"}) fs::copy_file(base + "/" + f, dir + "/" + f);
    FlipTensorByte(dir, "model.embed_tokens.weight", offset);
    EXPECT_EQ(*ModelFingerprint(dir) != *fp, seen) << "offset " << offset;
    EXPECT_NE(*ModelDigest(dir), *digest) << "offset " << offset;
  }
}

// The values of committed fixtures, computed by tools/model_fingerprint.py
// (an implementation of docs/coli-kv.md's description independent of this
// code): the algorithms may not drift between builds, or stored sessions
// would stop loading. Version 1 must stay what every build before version 2
// recorded.
TEST(FingerprintGoldenTest, CommittedFixtures) {
  struct Golden {
    const char* dir;
    uint64_t v2, digest, v1;
  };
  for (const Golden& g : {Golden{"tests/data/models/deepseek_v3", 0x72c8c1269c644276ull, 0x2f46263266316c0aull,
                                 0xd1e24373aefac53eull},
                          Golden{"tests/data/models/deepseek_v3_fp8", 0x6fd39e8b7d3f5c18ull,
                                 0xf475e21f2e024a1cull, 0x632e0cd51d68e349ull}}) {
    const std::string dir = std::string(STRATA_SOURCE_DIR) + "/" + g.dir;
    EXPECT_EQ(*ModelFingerprint(dir), g.v2) << g.dir;
    EXPECT_EQ(*ModelDigest(dir), g.digest) << g.dir;
    EXPECT_EQ(*LegacyModelFingerprint(dir), g.v1) << g.dir;
  }
}

TEST(FingerprintGoldenTest, IdentityValuesForTheKvStore) {
  const std::string dir = std::string(STRATA_SOURCE_DIR) + "/tests/data/models/deepseek_v3";
  auto ids = FingerprintModel(dir, std::nullopt);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(ids->fingerprint, 0x72c8c1269c644276ull);
  EXPECT_EQ(ids->legacy_fingerprint, 0xd1e24373aefac53eull);
  auto synthetic = FingerprintModel(dir, 9);
  ASSERT_TRUE(synthetic.ok());
  EXPECT_EQ(synthetic->fingerprint, *SyntheticModelFingerprint(dir, 9));
  EXPECT_EQ(synthetic->legacy_fingerprint, synthetic->fingerprint);
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
