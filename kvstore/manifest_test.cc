#include "kvstore/manifest.h"
#include "kvstore/manifest_v3.h"

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "kvstore/coli_kv_file.h"
#include "kvstore/fault_injection_env.h"
#include "kvstore/session_file.h"
#include "kvstore/test_util.h"
#include "nlohmann/json.hpp"

namespace strata::kv {
namespace {

using testing::BitwiseCrc32c;
using testing::FreshRng;

Manifest RandomManifest(std::mt19937_64& rng) {
  Manifest m;
  m.fingerprint = rng();
  m.dims = testing::RandomDims(rng);
  for (int l = 0, left = m.dims.nic; l < m.dims.n_layers && left > 0; ++l) {
    if (static_cast<int>(rng() % (m.dims.n_layers - l)) < left) {
      m.indexer_layers.push_back(l);
      --left;
    }
  }
  m.chunk_records = 1 + static_cast<int32_t>(rng() % 100);
  m.chunk_crc32c.resize(rng() % 20);
  for (uint32_t& c : m.chunk_crc32c) c = static_cast<uint32_t>(rng());
  m.tail_records = static_cast<int32_t>(rng() % static_cast<uint64_t>(m.chunk_records));
  m.tail_crc32c = m.tail_records > 0 ? static_cast<uint32_t>(rng()) : 0;
  m.fingerprint_version = 1 + static_cast<int32_t>(rng() % 2);
  if (rng() % 2) m.model_digest = rng();
  m.turn_watermark = static_cast<int64_t>(rng() % 5000);
  const int n = static_cast<int>(rng() % 4);
  for (int i = 0; i < n; ++i) {
    m.metadata[absl::StrCat("key", rng() % 1000)] =
        absl::StrCat("v\xc3\xa9 \"quoted\" \\ \n", rng());  // é, quotes, escapes
  }
  return m;
}

// A manifest file from a JSON body, with a correct trailer.
std::string WithTrailer(const std::string& json) {
  const std::string body = json + "\n";
  return body + absl::StrFormat("crc32c %08x\n", BitwiseCrc32c(body));
}

// A version 1 manifest, as every build before version 2 wrote them.
const char* kHandWritten =
    R"({"format":"strata.coli_kv.manifest","version":1,"fingerprint":"00000000deadbeef",)"
    R"("dims":{"n_layers":4,"kv_lora":8,"qk_rope":2,"index_hd":4,"nic":2,"vocab":100},)"
    R"("indexer_layers":[1,3],"chunk_records":64,"chunk_crc32c":[1,4294967295],)"
    R"("turn_watermark":128,"metadata":{"user":"ada"}})";

const char* kHandWrittenV2 =
    R"({"format":"strata.coli_kv.manifest","version":2,"fingerprint":"00000000deadbeef",)"
    R"("fingerprint_version":2,"model_digest":"0123456789abcdef",)"
    R"("dims":{"n_layers":4,"kv_lora":8,"qk_rope":2,"index_hd":4,"nic":2,"vocab":100},)"
    R"("indexer_layers":[1,3],"chunk_records":64,"chunk_crc32c":[1,4294967295],)"
    R"("tail_records":5,"tail_crc32c":3735928559,)"
    R"("turn_watermark":128,"metadata":{"user":"ada"}})";

TEST(Manifest, RoundTripRandom) {
  std::mt19937_64 rng = FreshRng();
  for (int i = 0; i < 200; ++i) {
    const Manifest m = RandomManifest(rng);
    ASSERT_TRUE(ValidateManifest(m).ok()) << ValidateManifest(m);
    const std::string bytes = SerializeManifest(m);
    auto back = ParseManifest(bytes);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, m);
  }
}

TEST(Manifest, SerialisedLayout) {
  std::mt19937_64 rng = FreshRng();
  const Manifest m = RandomManifest(rng);
  const std::string bytes = SerializeManifest(m);
  ASSERT_GT(bytes.size(), 16u);
  const std::string body = bytes.substr(0, bytes.size() - 16);
  EXPECT_EQ(bytes.substr(bytes.size() - 16),
            absl::StrFormat("crc32c %08x\n", BitwiseCrc32c(body)));
  EXPECT_EQ(body.back(), '\n');
  EXPECT_EQ(body.find('\n'), body.size() - 1);  // one line of JSON
  const nlohmann::json j = nlohmann::json::parse(body);
  EXPECT_EQ(j["format"], "strata.coli_kv.manifest");
  EXPECT_EQ(j["version"], 2);
  EXPECT_EQ(j["fingerprint"], absl::StrFormat("%016x", m.fingerprint));
  EXPECT_EQ(j["fingerprint_version"], m.fingerprint_version);
  EXPECT_EQ(j["tail_records"], m.tail_records);
  EXPECT_EQ(j["tail_crc32c"], m.tail_crc32c);
  EXPECT_EQ(j["dims"]["kv_lora"], m.dims.kv_lora);
  EXPECT_EQ(j["chunk_crc32c"].size(), m.chunk_crc32c.size());
  EXPECT_EQ(j["turn_watermark"], m.turn_watermark);
}

TEST(Manifest, HandWrittenParses) {
  auto m = ParseManifest(WithTrailer(kHandWritten));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->fingerprint, 0xdeadbeefu);
  EXPECT_EQ(m->dims, (Dims{4, 8, 2, 4, 2, 100}));
  EXPECT_EQ(m->indexer_layers, (std::vector<int32_t>{1, 3}));
  EXPECT_EQ(m->chunk_records, 64);
  EXPECT_EQ(m->chunk_crc32c, (std::vector<uint32_t>{1, 4294967295u}));
  EXPECT_EQ(m->turn_watermark, 128);
  EXPECT_EQ(m->metadata.at("user"), "ada");
  EXPECT_EQ(m->fingerprint_version, 1);  // version 1: the first fingerprint algorithm
  EXPECT_EQ(m->tail_records, 0);         // and no tail checksum
  EXPECT_EQ(m->tail_crc32c, 0u);
  EXPECT_FALSE(m->model_digest.has_value());
}

TEST(Manifest, HandWrittenVersion2Parses) {
  auto m = ParseManifest(WithTrailer(kHandWrittenV2));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->fingerprint, 0xdeadbeefu);
  EXPECT_EQ(m->fingerprint_version, 2);
  EXPECT_EQ(m->model_digest, 0x0123456789abcdefull);
  EXPECT_EQ(m->chunk_crc32c, (std::vector<uint32_t>{1, 4294967295u}));
  EXPECT_EQ(m->tail_records, 5);
  EXPECT_EQ(m->tail_crc32c, 0xdeadbeefu);
  EXPECT_EQ(ChunkedRecords(*m), 128);
  EXPECT_EQ(ChecksummedRecords(*m), 133);
  // Written back, it is the same manifest.
  EXPECT_EQ(*ParseManifest(SerializeManifest(*m)), *m);
}

TEST(Manifest, EveryFlippedByteIsDetected) {
  const std::string good = WithTrailer(kHandWritten);
  std::mt19937_64 rng = FreshRng();
  for (size_t i = 0; i < good.size(); ++i) {
    std::string bad = good;
    bad[i] ^= static_cast<char>(1 + rng() % 255);
    EXPECT_EQ(ParseManifest(bad).status().code(), absl::StatusCode::kDataLoss) << "byte " << i;
  }
  for (size_t n = 0; n < good.size(); ++n) {
    EXPECT_EQ(ParseManifest(good.substr(0, n)).status().code(), absl::StatusCode::kDataLoss);
  }
  EXPECT_EQ(ParseManifest(good + "x").status().code(), absl::StatusCode::kDataLoss);
}

TEST(Manifest, StrictValidation) {
  auto code = [](const std::string& json) { return ParseManifest(WithTrailer(json)).status().code(); };
  auto edit = [](std::string from, std::string to) {
    std::string s = kHandWritten;
    const size_t at = s.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return s.replace(at, from.size(), to);
  };
  const auto kLoss = absl::StatusCode::kDataLoss;
  EXPECT_EQ(code(kHandWritten), absl::StatusCode::kOk);
  EXPECT_EQ(code(edit("\"version\":1", "\"version\":3")), absl::StatusCode::kFailedPrecondition);
  // Version 2 needs its keys; version 1 may not have them.
  EXPECT_EQ(code(edit("\"version\":1", "\"version\":2")), kLoss);
  EXPECT_EQ(code(edit("\"turn_watermark\"", "\"tail_records\":0,\"turn_watermark\"")), kLoss);
  EXPECT_EQ(code(edit("\"version\":1", "\"version\":0")), kLoss);
  EXPECT_EQ(code(edit("strata.coli_kv.manifest", "other")), kLoss);
  EXPECT_EQ(code(edit("\"turn_watermark\"", "\"extra\":1,\"turn_watermark\"")), kLoss);
  EXPECT_EQ(code(edit("\"turn_watermark\":128,", "")), kLoss);
  EXPECT_EQ(code(edit("\"turn_watermark\":128", "\"turn_watermark\":128,\"turn_watermark\":1")),
            kLoss);
  EXPECT_EQ(code(edit("\"turn_watermark\":128", "\"turn_watermark\":\"128\"")), kLoss);
  EXPECT_EQ(code(edit("\"turn_watermark\":128", "\"turn_watermark\":128.5")), kLoss);
  EXPECT_EQ(code(edit("\"turn_watermark\":128", "\"turn_watermark\":-1")), kLoss);
  EXPECT_EQ(code(edit("\"turn_watermark\":128", "\"turn_watermark\":99999999999")), kLoss);
  EXPECT_EQ(code(edit("00000000deadbeef", "0000000deadbeef")), kLoss);
  EXPECT_EQ(code(edit("00000000deadbeef", "00000000DEADBEEF")), kLoss);
  EXPECT_EQ(code(edit("[1,3]", "[3,1]")), kLoss);
  EXPECT_EQ(code(edit("[1,3]", "[1]")), kLoss);
  EXPECT_EQ(code(edit("[1,3]", "[1,4]")), kLoss);
  EXPECT_EQ(code(edit("4294967295", "4294967296")), kLoss);
  EXPECT_EQ(code(edit("\"chunk_records\":64", "\"chunk_records\":0")), kLoss);
  EXPECT_EQ(code(edit("\"n_layers\":4", "\"n_layers\":0")), kLoss);
  EXPECT_EQ(code(edit("\"n_layers\":4,", "")), kLoss);
  EXPECT_EQ(code(edit("\"ada\"", "7")), kLoss);
  EXPECT_EQ(code(edit("{\"user\":\"ada\"}", "[]")), kLoss);
  EXPECT_EQ(code(edit("{\"user\":\"ada\"}", "{\"\":\"x\"}")), kLoss);  // empty key
  EXPECT_EQ(code(edit("\"ada\"", "[[[[[[[[1]]]]]]]]")), kLoss);
  EXPECT_EQ(code(std::string(100000, '[') + std::string(100000, ']')), kLoss);
  EXPECT_EQ(code("[]"), kLoss);
  EXPECT_EQ(code("not json"), kLoss);
  EXPECT_EQ(code(std::string(kHandWritten) + " {}"), kLoss);

  auto edit2 = [](std::string from, std::string to) {
    std::string s = kHandWrittenV2;
    const size_t at = s.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return s.replace(at, from.size(), to);
  };
  EXPECT_EQ(code(kHandWrittenV2), absl::StatusCode::kOk);
  EXPECT_EQ(code(edit2("\"tail_records\":5", "\"tail_records\":64")), kLoss);  // a whole chunk
  EXPECT_EQ(code(edit2("\"tail_records\":5", "\"tail_records\":-1")), kLoss);
  EXPECT_EQ(code(edit2("\"tail_records\":5", "\"tail_records\":0")), kLoss);  // crc without records
  EXPECT_EQ(code(edit2("3735928559", "4294967296")), kLoss);
  EXPECT_EQ(code(edit2("\"fingerprint_version\":2", "\"fingerprint_version\":3")), kLoss);
  EXPECT_EQ(code(edit2("\"fingerprint_version\":2", "\"fingerprint_version\":0")), kLoss);
  EXPECT_EQ(code(edit2("\"fingerprint_version\":2,", "")), kLoss);
  EXPECT_EQ(code(edit2("\"tail_crc32c\":3735928559,", "")), kLoss);
  EXPECT_EQ(code(edit2("\"0123456789abcdef\"", "\"\"")), absl::StatusCode::kOk);  // no digest
  EXPECT_EQ(code(edit2("\"0123456789abcdef\"", "\"0123456789ABCDEF\"")), kLoss);
  EXPECT_EQ(code(edit2("\"0123456789abcdef\"", "\"0123\"")), kLoss);
  EXPECT_EQ(code(edit2("\"0123456789abcdef\"", "81985529216486895")), kLoss);
  EXPECT_EQ(code(edit2("\"model_digest\":\"0123456789abcdef\",", "")), kLoss);
}

TEST(Manifest, ValidateRejectsBadValues) {
  std::mt19937_64 rng = FreshRng();
  Manifest m = RandomManifest(rng);
  auto code_with = [&](auto change) {
    Manifest x = m;
    change(x);
    return ValidateManifest(x).code();
  };
  const auto kBad = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(code_with([](Manifest& x) { x.metadata["k"] = "\xff\xfe"; }), kBad);
  EXPECT_EQ(code_with([](Manifest& x) { x.metadata["\xc0\x80"] = "overlong NUL"; }), kBad);
  EXPECT_EQ(code_with([](Manifest& x) { x.metadata["\xed\xa0\x80"] = "surrogate"; }), kBad);
  EXPECT_EQ(code_with([](Manifest& x) { x.metadata[""] = "v"; }), kBad);
  EXPECT_EQ(code_with([](Manifest& x) { x.metadata[std::string(257, 'k')] = "v"; }), kBad);
  EXPECT_EQ(code_with([](Manifest& x) { x.metadata["k"] = std::string(65537, 'v'); }), kBad);
  EXPECT_EQ(code_with([](Manifest& x) {
              for (int i = 0; i < 1025; ++i) x.metadata[absl::StrCat(i)] = "";
            }),
            kBad);
  EXPECT_EQ(code_with([](Manifest& x) { x.chunk_records = 0; }), kBad);
  EXPECT_EQ(code_with([](Manifest& x) { x.turn_watermark = -1; }), kBad);
  EXPECT_EQ(code_with([](Manifest& x) { x.indexer_layers.push_back(0); }), kBad);
  EXPECT_EQ(code_with([](Manifest& x) { x.dims.kv_lora = 0; }), kBad);
  EXPECT_EQ(code_with([](Manifest& x) { x.tail_records = x.chunk_records; }), kBad);
  EXPECT_EQ(code_with([](Manifest& x) { x.tail_records = -1; }), kBad);
  EXPECT_EQ(code_with([](Manifest& x) { x.tail_records = 0, x.tail_crc32c = 7; }), kBad);
  EXPECT_EQ(code_with([](Manifest& x) { x.fingerprint_version = 0; }), kBad);
  EXPECT_EQ(code_with([](Manifest& x) { x.fingerprint_version = 3; }), kBad);
  EXPECT_EQ(code_with([](Manifest& x) { x.metadata["ok"] = "\xe2\x82\xac \xf0\x9f\x98\x80"; }),
            absl::StatusCode::kOk);  // € and an emoji
  FaultInjectionEnv env;
  Manifest bad = m;
  bad.chunk_records = 0;
  EXPECT_EQ(WriteManifest(&env, "m", bad).code(), kBad);
}

TEST(Manifest, FileIo) {
  FaultInjectionEnv env;
  ASSERT_TRUE(env.CreateDir("/s").ok());
  std::mt19937_64 rng = FreshRng();
  const Manifest m = RandomManifest(rng);
  EXPECT_EQ(ReadManifest(&env, "/s/m").status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(WriteManifest(&env, "/s/m", m).ok());
  EXPECT_EQ(*ReadManifest(&env, "/s/m"), m);
  EXPECT_FALSE(env.FileExists("/s/m.tmp"));
  // A manifest over the size limit is refused without being read whole.
  auto f = env.Open("/s/big", OpenMode::kCreate);
  ASSERT_TRUE((*f)->Write(kMaxManifestBytes, "x").ok());
  EXPECT_EQ(ReadManifest(&env, "/s/big").status().code(), absl::StatusCode::kDataLoss);
}

class SessionFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(env_.CreateDir("/s").ok());
    dims_ = testing::RandomDims(rng_);
    dims_.nic = dims_.index_hd > 0 ? dims_.n_layers : 0;
    auto w = ColiKvWriter::Create(&env_, path_, Version::kV2, dims_);
    ASSERT_TRUE(w.ok());
    n_ = 3 * 4 + 1 + static_cast<int>(rng_() % 2);  // three chunks of 4 and a tail of 1 or 2
    for (int p = 0; p < n_; ++p) records_ += testing::SpecV2Record(dims_, testing::RandomV2Rows(rng_, dims_));
    ASSERT_TRUE((*w)->Append(records_).ok());
  }

  ImportOptions Options() {
    ImportOptions o;
    o.dims = dims_;
    o.fingerprint = fingerprint_;
    o.chunk_records = 4;
    return o;
  }

  FaultInjectionEnv env_;
  std::mt19937_64 rng_ = FreshRng();
  const std::string path_ = "/s/x.coli_kv";
  Dims dims_;
  int n_ = 0;
  std::string records_;
  const uint64_t fingerprint_ = rng_();
};

TEST_F(SessionFileTest, ImportWritesChecksumsAndOpenChecksThem) {
  CheckOptions check;
  check.expected_fingerprint = fingerprint_;
  EXPECT_EQ(OpenCheckedSession(&env_, path_, check).status().code(),
            absl::StatusCode::kFailedPrecondition);  // no manifest yet
  ASSERT_TRUE(ImportSession(&env_, path_, Options()).ok());
  auto m = ReadManifest(&env_, ManifestPath(path_));
  ASSERT_TRUE(m.ok());
  const int64_t rb = testing::SpecV2RecordBytes(dims_);
  ASSERT_EQ(m->chunk_crc32c.size(), 3u);
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(m->chunk_crc32c[k], BitwiseCrc32c(std::string_view(records_).substr(k * 4 * rb, 4 * rb)));
  }
  EXPECT_EQ(m->tail_records, n_ - 12);
  EXPECT_EQ(m->tail_crc32c, BitwiseCrc32c(std::string_view(records_).substr(12 * rb)));
  EXPECT_EQ(m->turn_watermark, n_);
  EXPECT_EQ(m->fingerprint, fingerprint_);
  EXPECT_EQ(m->fingerprint_version, Manifest::kCurrentFingerprintVersion);
  auto s = OpenCheckedSession(&env_, path_, check);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->reader->nrec(), n_);
  EXPECT_EQ(ImportSession(&env_, path_, Options()).code(), absl::StatusCode::kAlreadyExists);

  // Another checkpoint's fingerprint: refused, and the message names both.
  check.expected_fingerprint = fingerprint_ ^ 1;
  auto other = OpenCheckedSession(&env_, path_, check);
  EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(other.status().message().find(absl::StrFormat("%016x", fingerprint_)),
            absl::string_view::npos);
  EXPECT_NE(other.status().message().find(absl::StrFormat("%016x", fingerprint_ ^ 1)),
            absl::string_view::npos);
  check.expected_fingerprint.reset();

  // One flipped byte in a checksummed chunk: DATA_LOSS naming the chunk.
  const int64_t victim = static_cast<int64_t>(rng_() % (12 * rb));
  {
    auto f = env_.Open(path_, OpenMode::kReadWrite);
    char c;
    ASSERT_TRUE((*f)->Read(40 + victim, 1, &c).ok());
    c ^= 0x10;
    ASSERT_TRUE((*f)->Write(40 + victim, std::string_view(&c, 1)).ok());
  }
  auto bad = OpenCheckedSession(&env_, path_, check);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(bad.status().message().find(absl::StrCat("chunk ", victim / (4 * rb))),
            absl::string_view::npos)
      << bad.status();
  check.verify_checksums = false;
  EXPECT_TRUE(OpenCheckedSession(&env_, path_, check).ok());
}

// Records after the last complete chunk are checksummed too: a session
// shorter than one chunk is not left without coverage.
TEST_F(SessionFileTest, TailRecordsAreChecksummed) {
  ASSERT_TRUE(ImportSession(&env_, path_, Options()).ok());
  const int64_t rb = testing::SpecV2RecordBytes(dims_);
  const int64_t victim = 12 * rb + static_cast<int64_t>(rng_() % ((n_ - 12) * rb));
  {
    auto f = env_.Open(path_, OpenMode::kReadWrite);
    char c;
    ASSERT_TRUE((*f)->Read(40 + victim, 1, &c).ok());
    c ^= 0x01;
    ASSERT_TRUE((*f)->Write(40 + victim, std::string_view(&c, 1)).ok());
  }
  auto bad = OpenCheckedSession(&env_, path_, {});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(bad.status().message().find("after the last complete chunk (records 12 to"),
            absl::string_view::npos)
      << bad.status();
}

TEST_F(SessionFileTest, InconsistentManifestsAreDataLoss) {
  ASSERT_TRUE(ImportSession(&env_, path_, Options()).ok());
  const Manifest good = *ReadManifest(&env_, ManifestPath(path_));
  auto code_with = [&](auto change) {
    Manifest m = good;
    change(m);
    EXPECT_TRUE(WriteManifest(&env_, ManifestPath(path_), m).ok());
    return OpenCheckedSession(&env_, path_, {}).status().code();
  };
  EXPECT_EQ(code_with([](Manifest&) {}), absl::StatusCode::kOk);
  EXPECT_EQ(code_with([](Manifest& m) { m.dims.vocab += 1; }), absl::StatusCode::kDataLoss);
  EXPECT_EQ(code_with([&](Manifest& m) { m.turn_watermark = n_ + 1; }), absl::StatusCode::kDataLoss);
  EXPECT_EQ(code_with([](Manifest& m) { m.chunk_crc32c.push_back(0); m.chunk_crc32c.push_back(0); }),
            absl::StatusCode::kDataLoss);
  // A tail reaching past the committed records (n_ is 13 or 14).
  EXPECT_EQ(code_with([](Manifest& m) { m.tail_records = 3, m.tail_crc32c = 1; }), absl::StatusCode::kDataLoss);
  auto f = env_.Open(ManifestPath(path_), OpenMode::kReadWrite);
  ASSERT_TRUE((*f)->Write(3, "#").ok());
  EXPECT_EQ(OpenCheckedSession(&env_, path_, {}).status().code(), absl::StatusCode::kDataLoss);
}

TEST_F(SessionFileTest, ImportErrors) {
  ImportOptions o = Options();
  o.dims.kv_lora += 1;
  auto s = ImportSession(&env_, path_, o);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("kv_lora"), absl::string_view::npos) << s;
  EXPECT_EQ(ImportSession(&env_, "/s/none.coli_kv", Options()).code(), absl::StatusCode::kNotFound);
  if (dims_.nic > 1) {
    o = Options();
    o.indexer_layers.assign(static_cast<size_t>(dims_.nic), 0);  // not increasing
    EXPECT_EQ(ImportSession(&env_, path_, o).code(), absl::StatusCode::kInvalidArgument);
  }
  Dims partial{4, 8, 2, 4, 2, 10};
  EXPECT_EQ(DefaultIndexerLayers(partial).status().code(), absl::StatusCode::kInvalidArgument);
  auto r = ColiKvReader::Open(&env_, path_);
  EXPECT_EQ(ComputeChunkCrcs(**r, 4, 0, 4).status().code(), absl::StatusCode::kOutOfRange);
}

// The manifest of a v3 file (docs/coli-kv.md, "Manifest of a v3 file"):
// round trip, its own key set, and each parser refusing the other's version.
TEST(V3ManifestTest, RoundTripAndVersions) {
  auto rng = FreshRng();
  V3Manifest m;
  m.fingerprint = rng();
  m.fingerprint_version = 1 + static_cast<int32_t>(rng() % 2);
  if (rng() % 2) m.model_digest = rng();
  m.header_crc32c = static_cast<uint32_t>(rng());
  m.turn_watermark = static_cast<int64_t>(rng() % 5000);
  m.metadata["strata.pending"] = "12:7";
  const std::string bytes = SerializeV3Manifest(m);
  auto back = ParseV3Manifest(bytes);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, m);
  const nlohmann::json j = nlohmann::json::parse(bytes.substr(0, bytes.find('\n')));
  EXPECT_EQ(j["version"], 3);
  EXPECT_EQ(j.size(), 8u);
  EXPECT_EQ(ParseManifest(bytes).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ParseV3Manifest(SerializeManifest(RandomManifest(rng))).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // An unknown key (with a correct trailer) and a broken trailer.
  nlohmann::json extra = j;
  extra["chunk_records"] = 64;
  std::string body = extra.dump() + "\n";
  body += absl::StrFormat("crc32c %08x\n", BitwiseCrc32c(body));
  EXPECT_EQ(ParseV3Manifest(body).status().code(), absl::StatusCode::kDataLoss);
  std::string torn = bytes;
  torn[5] ^= 1;
  EXPECT_EQ(ParseV3Manifest(torn).status().code(), absl::StatusCode::kDataLoss);
  m.fingerprint_version = 3;
  EXPECT_EQ(ValidateV3Manifest(m).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strata::kv
