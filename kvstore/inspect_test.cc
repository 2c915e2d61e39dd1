#include "kvstore/inspect.h"

#include <optional>
#include <string>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "kvstore/coli_kv3_file.h"
#include "kvstore/coli_kv_file.h"
#include "kvstore/fault_injection_env.h"
#include "kvstore/manifest.h"
#include "kvstore/session_file.h"
#include "kvstore/test_util.h"
#include "kvstore/v3_test_util.h"
#include "nlohmann/json.hpp"

namespace strata::kv {
namespace {

using Json = nlohmann::json;

class InspectTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(env_.CreateDir("/s").ok());
    dims_ = testing::RandomDims(rng_);
    dims_.nic = dims_.index_hd > 0 ? dims_.n_layers : 0;
    for (int p = 0; p < n_; ++p) {
      rows_.push_back(testing::RandomV2Rows(rng_, dims_));
      records_ += testing::SpecV2Record(dims_, rows_.back());
    }
    Write(path_, testing::SpecHeader(true, dims_, n_) + records_);
  }

  void Write(const std::string& path, const std::string& bytes) {
    auto f = env_.Open(path, OpenMode::kCreateTruncate);
    ASSERT_TRUE((*f)->Write(0, bytes).ok());
  }

  void Import(std::optional<uint64_t> digest = std::nullopt) {
    ImportOptions o;
    o.dims = dims_;
    o.fingerprint = fingerprint_;
    o.model_digest = digest;
    o.chunk_records = 4;
    o.metadata["who"] = "test";
    ASSERT_TRUE(ImportSession(&env_, path_, o).ok());
  }

  Json Report(InspectOptions o = {}) {
    auto s = InspectFile(&env_, path_, o);
    EXPECT_TRUE(s.ok()) << s.status();
    return Json::parse(s.ok() ? *s : "{}");
  }

  static std::string FirstCode(const Json& j) {
    return j["problems"].empty() ? "OK" : j["problems"][0]["code"].get<std::string>();
  }

  FaultInjectionEnv env_;
  std::mt19937_64 rng_ = testing::FreshRng();
  const std::string path_ = "/s/a.coli_kv";
  Dims dims_;
  const int n_ = 10;
  std::vector<testing::V2Rows> rows_;
  std::string records_;
  const uint64_t fingerprint_ = rng_();
};

TEST_F(InspectTest, HealthySession) {
  Import();
  InspectOptions o;
  o.max_tokens = 3;
  o.expected_fingerprint = fingerprint_;
  const Json j = Report(o);
  EXPECT_EQ(j["magic"], "COLIKV2");
  EXPECT_EQ(j["version"], 2);
  EXPECT_EQ(j["dims"]["kv_lora"], dims_.kv_lora);
  EXPECT_EQ(j["dims"]["nic"], dims_.nic);
  EXPECT_EQ(j["nrec"], n_);
  EXPECT_EQ(j["header_nrec"], n_);
  EXPECT_EQ(j["torn"], false);
  EXPECT_EQ(j["record_bytes"], testing::SpecV2RecordBytes(dims_));
  EXPECT_EQ(j["file_bytes"], 40 + n_ * testing::SpecV2RecordBytes(dims_));
  ASSERT_EQ(j["first_tokens"].size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(j["first_tokens"][i], rows_[i].token);
  EXPECT_EQ(j["manifest"]["present"], true);
  EXPECT_EQ(j["manifest"]["fingerprint"], absl::StrFormat("%016x", fingerprint_));
  EXPECT_EQ(j["manifest"]["checksummed_records"], 10);  // two chunks of 4 and a tail of 2
  EXPECT_EQ(j["manifest"]["fingerprint_version"], 2);
  EXPECT_EQ(j["manifest"]["checksums"], "ok");
  EXPECT_EQ(j["manifest"]["metadata"]["who"], "test");
  EXPECT_EQ(j["sanitize"]["nan_codes"], 0);
  EXPECT_EQ(j["ok"], true);
  EXPECT_TRUE(j["problems"].empty());
  EXPECT_TRUE(VerifyFile(&env_, path_, o).ok());
}

// verify --full: the model digest the manifest records must be the model's;
// a manifest without one cannot be verified that way.
TEST_F(InspectTest, ModelDigest) {
  Import();
  InspectOptions o;
  o.expected_model_digest = 0xabcdef;
  EXPECT_EQ(VerifyFile(&env_, path_, o).code(), absl::StatusCode::kFailedPrecondition);  // none recorded
  EXPECT_EQ(Report()["manifest"]["model_digest"], "");
  ASSERT_TRUE(env_.Delete(ManifestPath(path_)).ok());
  Import(0xabcdef);
  EXPECT_EQ(Report()["manifest"]["model_digest"], "0000000000abcdef");
  EXPECT_TRUE(VerifyFile(&env_, path_, o).ok());
  o.expected_model_digest = 0xabcdee;
  const absl::Status other = VerifyFile(&env_, path_, o);
  EXPECT_EQ(other.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(other.message().find("0000000000abcdee"), absl::string_view::npos) << other;
  o.expected_model_digest.reset();
  EXPECT_TRUE(VerifyFile(&env_, path_, o).ok());
}

TEST_F(InspectTest, ProblemsAndTheirCodes) {
  // No manifest.
  EXPECT_EQ(FirstCode(Report()), "FAILED_PRECONDITION");
  EXPECT_EQ(VerifyFile(&env_, path_, {}).code(), absl::StatusCode::kFailedPrecondition);
  Import();
  // Another model.
  InspectOptions o;
  o.expected_fingerprint = fingerprint_ + 1;
  EXPECT_EQ(VerifyFile(&env_, path_, o).code(), absl::StatusCode::kFailedPrecondition);
  // A NaN code in record 9 (after the complete chunks): sanitised on load,
  // and the tail's checksum no longer matches.
  {
    auto f = env_.Open(path_, OpenMode::kReadWrite);
    const int64_t off = 40 + 9 * testing::SpecV2RecordBytes(dims_) + 4;  // layer 0 latent[0]
    ASSERT_TRUE((*f)->Write(off, "\x7f").ok());
  }
  Json j = Report();
  EXPECT_EQ(j["sanitize"]["nan_codes"], 1);
  EXPECT_EQ(FirstCode(j), "DATA_LOSS");
  EXPECT_EQ(j["manifest"]["checksums"], "mismatch");
  bool tail_named = false;
  for (const Json& p : j["problems"]) {
    tail_named = tail_named || p["message"].get<std::string>().find("after the last complete chunk (records 8 to 9)") !=
                                   std::string::npos;
  }
  EXPECT_TRUE(tail_named) << j.dump();
  // A changed byte inside chunk 1.
  {
    auto f = env_.Open(path_, OpenMode::kReadWrite);
    const int64_t off = 40 + 5 * testing::SpecV2RecordBytes(dims_);
    ASSERT_TRUE((*f)->Write(off, std::string(4, '\x01')).ok());  // record 5's token id
  }
  j = Report();
  EXPECT_EQ(j["manifest"]["checksums"], "mismatch");
  bool named = false;
  for (const Json& p : j["problems"]) {
    named = named || p["message"].get<std::string>().find("chunk 1 ") != std::string::npos;
  }
  EXPECT_TRUE(named) << j.dump();
  EXPECT_EQ(VerifyFile(&env_, path_, {}).code(), absl::StatusCode::kDataLoss);
}

TEST_F(InspectTest, TornAndForeignFiles) {
  const int64_t rb = testing::SpecV2RecordBytes(dims_);
  Write(path_, testing::SpecHeader(true, dims_, n_) + records_.substr(0, 6 * rb + 1));
  Json j = Report();
  EXPECT_EQ(j["torn"], true);
  EXPECT_EQ(j["nrec"], 6);
  EXPECT_EQ(j["bytes_after_records"], 1);
  EXPECT_EQ(FirstCode(j), "DATA_LOSS");

  Write(path_, std::string("GGUF\x03\x00\x00\x00", 8) + std::string(52, 'x'));
  j = Report();
  EXPECT_EQ(j["magic"], "4747554603000000");
  EXPECT_TRUE(j["version"].is_null());
  EXPECT_EQ(FirstCode(j), "INVALID_ARGUMENT");
  EXPECT_EQ(VerifyFile(&env_, path_, {}).code(), absl::StatusCode::kInvalidArgument);

  EXPECT_EQ(InspectFile(&env_, "/s/none", {}).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(InspectTest, ConvertCarriesTheManifest) {
  Import();
  ASSERT_TRUE(ConvertSessionFile(&env_, path_, "/s/b.coli_kv", Version::kV1).ok());
  CheckOptions check;
  check.expected_fingerprint = fingerprint_;
  auto b = OpenCheckedSession(&env_, "/s/b.coli_kv", check);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->reader->version(), Version::kV1);
  EXPECT_EQ(b->reader->nrec(), n_);
  EXPECT_EQ(b->manifest.metadata.at("who"), "test");
  ASSERT_TRUE(ConvertSessionFile(&env_, "/s/b.coli_kv", "/s/b.coli_kv", Version::kV2).ok());
  EXPECT_TRUE(OpenCheckedSession(&env_, "/s/b.coli_kv", check).ok());
  EXPECT_EQ(ConvertSessionFile(&env_, path_, path_, Version::kV1).code(),
            absl::StatusCode::kInvalidArgument);
  Write("/s/foreign.coli_kv", testing::SpecHeader(true, dims_, 0));
  EXPECT_EQ(ConvertSessionFile(&env_, "/s/foreign.coli_kv", path_, Version::kV2).code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(ConvertSessionFile(&env_, "/s/none", "/s/c.coli_kv", Version::kV2).code(),
            absl::StatusCode::kNotFound);
}

// v3 files: the report names the commit and the live tokens; damage is
// DATA_LOSS; the manifest is required and checked like a v1/v2 one.
TEST(InspectV3Test, HealthyAndDamagedFiles) {
  auto rng = testing::FreshRng();
  V3Header h = testing::RandomV3Header(rng);
  h.layers.push_back({V3Kind::kCsa, 2});
  testing::V3Model model(rng, h);
  FaultInjectionEnv env;
  ASSERT_TRUE(env.CreateDir("/kv").ok());
  const std::string path = "/kv/v4.coli_kv";
  {
    auto w = ColiKv3Writer::Create(&env, path, h);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->Append(3, model.Tokens(0, 3), model.Blocks(0, 3)).ok());
    ASSERT_TRUE((*w)->Append(7, model.Tokens(3, 7), model.Blocks(3, 7)).ok());
  }
  InspectOptions o;
  auto json = InspectFile(&env, path, o);
  ASSERT_TRUE(json.ok()) << json.status();
  const Json j = Json::parse(*json);
  EXPECT_EQ(j["magic"], "COLIKV3");
  EXPECT_EQ(j["version"], 3);
  EXPECT_EQ(j["v3"]["num_tokens"], 7);
  EXPECT_EQ(j["v3"]["seq"], 3);
  EXPECT_EQ(j["v3"]["current_commit"], 0);
  EXPECT_EQ(j["v3"]["layers"].size(), h.layers.size());
  const int64_t n = std::min<int64_t>(7, model.sizes().live);
  ASSERT_EQ(j["v3"]["live_token_ids"].size(), static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(j["v3"]["live_token_ids"][i], testing::I32(model.Token(7 - n + i), 4));
  // Without a manifest (a file written outside the store), as for v1/v2.
  EXPECT_FALSE(j["ok"]);
  EXPECT_FALSE(j["manifest"]["present"]);
  EXPECT_EQ(VerifyFile(&env, path, o).code(), absl::StatusCode::kFailedPrecondition);

  // With one: the fingerprint is compared, the header CRC32C and the
  // watermark are checked.
  V3Manifest m;
  m.fingerprint = 0x1234;
  m.header_crc32c = V3HeaderCrc(h);
  m.turn_watermark = 7;
  m.metadata["k"] = "v";
  ASSERT_TRUE(WriteV3Manifest(&env, ManifestPath(path), m).ok());
  const Json jm = Json::parse(*InspectFile(&env, path, o));
  EXPECT_TRUE(jm["ok"]) << jm.dump();
  EXPECT_EQ(jm["manifest"]["fingerprint"], "0000000000001234");
  EXPECT_EQ(jm["manifest"]["turn_watermark"], 7);
  EXPECT_EQ(jm["manifest"]["metadata"]["k"], "v");
  EXPECT_TRUE(VerifyFile(&env, path, o).ok());
  InspectOptions with_model;
  with_model.expected_fingerprint = ModelIdentity(0x1234, std::nullopt);
  EXPECT_TRUE(VerifyFile(&env, path, with_model).ok());
  with_model.expected_fingerprint = ModelIdentity(1, std::nullopt);
  EXPECT_EQ(VerifyFile(&env, path, with_model).code(), absl::StatusCode::kFailedPrecondition);
  InspectOptions with_digest;
  with_digest.expected_model_digest = 5;
  EXPECT_EQ(VerifyFile(&env, path, with_digest).code(), absl::StatusCode::kFailedPrecondition);
  m.turn_watermark = 8;  // beyond the committed tokens
  ASSERT_TRUE(WriteV3Manifest(&env, ManifestPath(path), m).ok());
  EXPECT_EQ(VerifyFile(&env, path, o).code(), absl::StatusCode::kDataLoss);
  m.turn_watermark = 7;
  m.header_crc32c ^= 1;  // another file's manifest
  ASSERT_TRUE(WriteV3Manifest(&env, ManifestPath(path), m).ok());
  EXPECT_EQ(VerifyFile(&env, path, o).code(), absl::StatusCode::kDataLoss);
  m.header_crc32c ^= 1;
  ASSERT_TRUE(WriteV3Manifest(&env, ManifestPath(path), m).ok());

  // The last block record damaged.
  std::string bytes = *ReadFileToString(&env, path, 1 << 30);
  bytes[bytes.size() - 6] ^= 0x20;
  ASSERT_TRUE((*env.Open(path, OpenMode::kCreateTruncate))->Write(0, bytes).ok());
  EXPECT_EQ(VerifyFile(&env, path, o).code(), absl::StatusCode::kDataLoss);
  // A damaged header.
  bytes[13] ^= 1;
  ASSERT_TRUE((*env.Open(path, OpenMode::kCreateTruncate))->Write(0, bytes).ok());
  EXPECT_EQ(VerifyFile(&env, path, o).code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace strata::kv
