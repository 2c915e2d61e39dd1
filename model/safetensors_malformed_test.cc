// Malformed safetensors files and model directories: each must give a
// specific status code with a message naming the file (and the tensor, when
// one is involved), never a crash.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/safetensors.h"
#include "model/safetensors_test_util.h"
#include "model/safetensors_writer.h"
#include "nlohmann/json.hpp"

namespace strata {
namespace {

using ::strata::testing_util::RandomBytes;
using ::strata::testing_util::WriteFileBytes;
using ::testing::HasSubstr;

constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;
constexpr auto kDataLoss = absl::StatusCode::kDataLoss;
constexpr auto kNotFound = absl::StatusCode::kNotFound;

std::string Le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
  return s;
}

// Length prefix (the true header length unless overridden), header, data.
std::string RawFile(const std::string& header, size_t data_bytes = 16,
                    std::optional<uint64_t> length = std::nullopt) {
  return Le64(length.value_or(header.size())) + header + std::string(data_bytes, '\x11');
}

// One F32 entry for hand-written headers.
std::string Entry(const std::string& name, const std::string& dtype, const std::string& shape,
                  const std::string& offsets) {
  return absl::StrCat("\"", name, "\":{\"dtype\":\"", dtype, "\",\"shape\":", shape,
                      ",\"data_offsets\":", offsets, "}");
}

// [[[ ... ]]] with `depth` levels.
std::string Nested(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

struct MalformedCase {
  std::string label;
  std::string bytes;
  absl::StatusCode code;
  std::string tensor;  // empty when no tensor is involved
  std::string message_part = "";
};

using MalformedTest = testing_util::ScratchDirTest;

TEST_F(MalformedTest, EachHeaderDefectHasItsOwnError) {
  const std::string ok_w = Entry("w", "F32", "[4]", "[0,16]");
  const std::vector<MalformedCase> cases = {
      {"empty_file", "", kDataLoss, "", "fewer than the 8-byte"},
      {"truncated_length", std::string(5, '\0'), kDataLoss, "", "fewer than the 8-byte"},
      {"header_length_over_limit", RawFile("{}", 16, 100000001), kInvalid, "", "limit"},
      {"huge_header_length", RawFile("{}", 16, 1ull << 40), kInvalid, "", "limit"},
      {"max_header_length", RawFile("{}", 16, ~0ull), kInvalid, "", "limit"},
      {"header_past_end", RawFile("{" + ok_w + "}", 16, 1000), kDataLoss, "", "truncated"},
      {"empty_header", RawFile("", 16), kInvalid, "", "not valid JSON"},
      {"not_json", RawFile("hello world"), kInvalid, "", "not valid JSON"},
      {"json_array", RawFile("[1,2]"), kInvalid, "", "not a JSON object"},
      {"json_string", RawFile("\"w\""), kInvalid, "", "not a JSON object"},
      {"truncated_json", RawFile("{\"w\":{\"dtype\":\"F32\""), kInvalid, "", "not valid JSON"},
      {"invalid_utf8", RawFile("{\"w\xff\":{}}"), kInvalid, "", "not valid JSON"},
      {"entry_not_object", RawFile("{\"w\":5}"), kInvalid, "w", "not a JSON object"},
      {"missing_dtype", RawFile("{\"w\":{\"shape\":[4],\"data_offsets\":[0,16]}}"), kInvalid, "w",
       "needs"},
      {"missing_shape", RawFile("{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,16]}}"), kInvalid,
       "w", "needs"},
      {"missing_offsets", RawFile("{\"w\":{\"dtype\":\"F32\",\"shape\":[4]}}"), kInvalid, "w",
       "needs"},
      {"unknown_dtype", RawFile("{" + Entry("w", "Q4_K", "[4]", "[0,16]") + "}"), kInvalid, "w",
       "unsupported dtype \"Q4_K\""},
      {"unsupported_dtype_f64", RawFile("{" + Entry("w", "F64", "[2]", "[0,16]") + "}"), kInvalid,
       "w", "unsupported dtype \"F64\""},
      {"dtype_not_string", RawFile("{\"w\":{\"dtype\":4,\"shape\":[4],\"data_offsets\":[0,16]}}"),
       kInvalid, "w", "dtype is not a string"},
      {"shape_not_array", RawFile("{" + Entry("w", "F32", "4", "[0,16]") + "}"), kInvalid, "w",
       "shape is not an array"},
      {"offsets_past_end", RawFile("{" + Entry("w", "F32", "[16]", "[0,64]") + "}"), kDataLoss, "w",
       "past the end"},
      {"offsets_start_past_end", RawFile("{" + Entry("w", "F32", "[0]", "[17,17]") + "}"),
       kDataLoss, "w", "past the end"},
      {"offsets_backwards", RawFile("{" + Entry("w", "F32", "[2]", "[8,0]") + "}"), kInvalid, "w",
       "backwards"},
      {"offsets_one_number", RawFile("{" + Entry("w", "F32", "[4]", "[0]") + "}"), kInvalid, "w",
       "data_offsets"},
      {"offsets_three_numbers", RawFile("{" + Entry("w", "F32", "[4]", "[0,16,16]") + "}"),
       kInvalid, "w", "data_offsets"},
      {"offsets_negative", RawFile("{" + Entry("w", "F32", "[2]", "[-8,0]") + "}"), kInvalid, "w",
       "data_offsets"},
      {"offsets_not_integers", RawFile("{" + Entry("w", "F32", "[4]", "[0.0,16.0]") + "}"),
       kInvalid, "w", "data_offsets"},
      {"size_mismatch", RawFile("{" + Entry("w", "F32", "[3]", "[0,16]") + "}"), kInvalid, "w",
       "needs 12"},
      {"bf16_size_mismatch", RawFile("{" + Entry("w", "BF16", "[4, 2]", "[0,8]") + "}"), kInvalid,
       "w", "needs 16"},
      {"overlap",
       RawFile("{" + Entry("a", "F32", "[2]", "[0,8]") + "," + Entry("b", "F32", "[2]", "[4,12]") +
               "}"),
       kInvalid, "b", "overlap tensor \"a\""},
      {"same_range_twice",
       RawFile("{" + Entry("a", "F32", "[4]", "[0,16]") + "," + Entry("b", "I32", "[4]", "[0,16]") +
               "}"),
       kInvalid, "b", "overlap tensor \"a\""},
      {"negative_dim", RawFile("{" + Entry("w", "F32", "[-1,4]", "[0,16]") + "}"), kInvalid, "w",
       "not an integer in [0, 2^63)"},
      {"fractional_dim", RawFile("{" + Entry("w", "F32", "[2.5]", "[0,16]") + "}"), kInvalid, "w",
       "not an integer"},
      {"string_dim", RawFile("{" + Entry("w", "F32", "[\"4\"]", "[0,16]") + "}"), kInvalid, "w",
       "not an integer"},
      {"dim_at_2_pow_63", RawFile("{" + Entry("w", "U8", "[9223372036854775808]", "[0,16]") + "}"),
       kInvalid, "w", "not an integer in [0, 2^63)"},
      {"dim_beyond_u64", RawFile("{" + Entry("w", "U8", "[18446744073709551616]", "[0,16]") + "}"),
       kInvalid, "w", "not an integer"},
      {"element_count_overflow",
       RawFile("{" + Entry("w", "U8", "[4294967296,4294967296]", "[0,16]") + "}"), kInvalid, "w",
       "overflows"},
      {"element_count_above_int64",
       RawFile("{" + Entry("w", "U8", "[4294967296,2147483648]", "[0,16]") + "}"), kInvalid, "w",
       "overflows"},
      {"byte_size_overflow",
       RawFile("{" + Entry("w", "F32", "[4611686018427387904]", "[0,16]") + "}"), kInvalid, "w",
       "byte size"},
      {"absurd_shape", RawFile("{" + Entry("w", "F32", "[1099511627776]", "[0,16]") + "}"),
       kInvalid, "w", "needs 4398046511104"},
      {"metadata_not_object", RawFile("{\"__metadata__\":[1]," + ok_w + "}"), kInvalid, "",
       "__metadata__"},
      {"metadata_value_not_string", RawFile("{\"__metadata__\":{\"k\":1}," + ok_w + "}"), kInvalid,
       "", "__metadata__"},
      {"duplicate_tensor", RawFile("{" + ok_w + "," + ok_w + "}"), kInvalid, "w", "more than once"},
      // Messages quoting a value once dumped it recursively: a deep value
      // overflowed the stack.
      {"deeply_nested_entry", RawFile("{\"w\":" + Nested(1000000) + "}"), kInvalid, "w",
       "an array of 1 elements"},
      {"deeply_nested_dim",
       RawFile("{" + Entry("w", "F32", "[" + Nested(1000000) + "]", "[0,16]") + "}"), kInvalid, "w",
       "an array of 1 elements"},
  };
  for (const MalformedCase& c : cases) {
    SCOPED_TRACE(c.label);
    const std::string path = Path(c.label + ".safetensors");
    WriteFileBytes(path, c.bytes);
    auto file = SafetensorsFile::Open(path);
    ASSERT_FALSE(file.ok());
    EXPECT_EQ(file.status().code(), c.code) << file.status();
    EXPECT_THAT(file.status().message(), HasSubstr(path));
    if (!c.tensor.empty()) {
      EXPECT_THAT(file.status().message(), HasSubstr("\"" + c.tensor + "\""));
    }
    EXPECT_THAT(file.status().message(), HasSubstr(c.message_part));
    // A directory holding the file fails the same way.
    auto store = TensorStore::OpenDir(dir_);
    EXPECT_FALSE(store.ok());
    std::filesystem::remove(path);
  }
}

TEST_F(MalformedTest, UnusualButValidHeadersAreAccepted) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"empty_object", RawFile("{}", 0)},
      {"padded_header", RawFile("{" + Entry("w", "F32", "[4]", "[0,16]") + "}        ")},
      {"scalar", RawFile("{" + Entry("s", "I32", "[]", "[0,4]") + "}", 4)},
      {"gap_between_tensors", RawFile("{" + Entry("a", "U8", "[2]", "[0,2]") + "," +
                                      Entry("b", "U8", "[2]", "[8,10]") + "}")},
      {"empty_tensors_share_an_offset",
       RawFile("{" + Entry("a", "F32", "[0,3]", "[4,4]") + "," + Entry("b", "F32", "[0]", "[4,4]") +
               "," + Entry("c", "F32", "[2]", "[0,8]") + "}")},
      {"extra_entry_keys",
       RawFile("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"x\":1}}")},
      {"metadata", RawFile("{\"__metadata__\":{\"format\":\"pt\"}," +
                           Entry("w", "F32", "[4]", "[0,16]") + "}")},
  };
  for (const auto& [label, bytes] : cases) {
    SCOPED_TRACE(label);
    const std::string path = Path(label + ".safetensors");
    WriteFileBytes(path, bytes);
    auto file = SafetensorsFile::Open(path);
    EXPECT_TRUE(file.ok()) << file.status();
  }
}

// Every proper prefix of a valid file is a truncated file: DATA_LOSS.
TEST_F(MalformedTest, EveryTruncationIsDataLoss) {
  auto bytes = SerializeSafetensors({{"a", DType::kBF16, {3, 5}, RandomBytes(rng_, 30)},
                                     {"b", DType::kU8, {7}, RandomBytes(rng_, 7)}});
  ASSERT_TRUE(bytes.ok());
  const std::string path = Path("t.safetensors");
  for (size_t len = 0; len < bytes->size(); ++len) {
    WriteFileBytes(path, bytes->substr(0, len));
    auto file = SafetensorsFile::Open(path);
    ASSERT_EQ(file.status().code(), kDataLoss) << "prefix of " << len << " bytes";
  }
  WriteFileBytes(path, *bytes);
  EXPECT_TRUE(SafetensorsFile::Open(path).ok());
}

// Random byte changes in the header: an error or a consistent file, never a
// crash or an out-of-bounds read (run under the sanitizers).
TEST_F(MalformedTest, RandomHeaderCorruptionNeverCrashes) {
  auto bytes = SerializeSafetensors({{"layer.a", DType::kF32, {3, 5}, RandomBytes(rng_, 60)},
                                     {"layer.b", DType::kF16, {2}, RandomBytes(rng_, 4)},
                                     {"layer.c", DType::kF8E4M3, {9}, RandomBytes(rng_, 9)}});
  ASSERT_TRUE(bytes.ok());
  const std::string path = Path("f.safetensors");
  const std::string alphabet = "{}[]\",:0123456789-.e FUB_E48 \x00\xff";
  int opened = 0;
  for (int trial = 0; trial < 400; ++trial) {
    std::string mutated = *bytes;
    const int edits = 1 + static_cast<int>(rng_() % 3);
    for (int e = 0; e < edits; ++e) {
      const size_t at = rng_() % (mutated.size() < 120 ? mutated.size() : 120);
      mutated[at] = (rng_() & 1) ? alphabet[rng_() % alphabet.size()] : static_cast<char>(rng_());
    }
    WriteFileBytes(path, mutated);
    auto file = SafetensorsFile::Open(path);
    if (!file.ok()) {
      EXPECT_THAT(file.status().code(), ::testing::AnyOf(kInvalid, kDataLoss)) << file.status();
      EXPECT_THAT(file.status().message(), HasSubstr(path));
      continue;
    }
    ++opened;
    uint64_t sum = 0;
    for (const std::string& name : (*file)->Names()) {
      const TensorInfo* info = (*file)->Find(name);
      const auto data = (*file)->Data(*info);
      ASSERT_EQ(data.size(), info->nbytes);
      for (uint8_t b : data) sum += b;
    }
    (void)sum;
  }
  RecordProperty("opened", opened);
}

// Index problems, each in its own directory with two good shards.
TEST_F(MalformedTest, IndexDefects) {
  struct IndexCase {
    const char* label;
    std::string index;
    absl::StatusCode code;
    std::string message_part;
  };
  const std::string s1 = "model-1.safetensors";
  auto map_of = [](const nlohmann::json& weight_map) {
    return nlohmann::json{{"metadata", {{"total_size", 8}}}, {"weight_map", weight_map}}.dump();
  };
  const std::vector<IndexCase> cases = {
      {"not_json", "{\"weight_map\": ", kInvalid, "not valid JSON"},
      {"array", "[]", kInvalid, "not a JSON object"},
      {"no_weight_map", "{\"metadata\":{}}", kInvalid, "weight_map"},
      {"weight_map_not_object", "{\"weight_map\":[]}", kInvalid, "weight_map"},
      {"empty_weight_map", map_of(nlohmann::json::object()), kInvalid, "empty"},
      {"shard_not_string", map_of({{"a", 3}}), kInvalid, "\"a\""},
      {"shard_escapes_dir", map_of({{"a", "../" + s1}}), kInvalid, "\"a\""},
      {"shard_absolute", map_of({{"a", "/" + s1}}), kInvalid, "\"a\""},
      {"shard_empty_name", map_of({{"a", ""}}), kInvalid, "\"a\""},
      {"missing_shard", map_of({{"a", s1}, {"b", "model-9.safetensors"}}), kNotFound,
       "model-9.safetensors"},
      {"tensor_absent_from_shard", map_of({{"a", s1}, {"zz", s1}}), kNotFound, "\"zz\""},
      {"duplicate_key", "{\"weight_map\":{\"a\":\"" + s1 + "\",\"a\":\"" + s1 + "\"}}", kInvalid,
       "more than once"},
  };
  for (const IndexCase& c : cases) {
    SCOPED_TRACE(c.label);
    const std::string sub = Path(c.label);
    std::filesystem::create_directory(sub);
    ASSERT_TRUE(WriteSafetensors(sub + "/" + s1, {{"a", DType::kU8, {4}, RandomBytes(rng_, 4)},
                                                  {"b", DType::kU8, {4}, RandomBytes(rng_, 4)}})
                    .ok());
    WriteFileBytes(sub + "/model.safetensors.index.json", c.index);
    auto store = TensorStore::OpenDir(sub);
    ASSERT_FALSE(store.ok());
    EXPECT_EQ(store.status().code(), c.code) << store.status();
    EXPECT_THAT(store.status().message(), HasSubstr(sub));
    EXPECT_THAT(store.status().message(), HasSubstr(c.message_part));
  }
}

// A broken shard named by a good index: the shard's own error comes back.
TEST_F(MalformedTest, BrokenShardBehindAnIndex) {
  WriteFileBytes(Path("s.safetensors"), RawFile("{" + Entry("w", "F32", "[4]", "[0,64]") + "}"));
  WriteFileBytes(Path("model.safetensors.index.json"),
                 nlohmann::json{{"weight_map", {{"w", "s.safetensors"}}}}.dump());
  auto store = TensorStore::OpenDir(dir_);
  EXPECT_EQ(store.status().code(), kDataLoss);
  EXPECT_THAT(store.status().message(), HasSubstr(Path("s.safetensors")));
  EXPECT_THAT(store.status().message(), HasSubstr("\"w\""));
}

}  // namespace
}  // namespace strata
