#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/safetensors_test_util.h"
#include "model/safetensors_writer.h"
#include "nlohmann/json.hpp"

namespace strata {
namespace {

using ::strata::testing_util::RandomBytes;
using ::strata::testing_util::ReadFileBytes;
using ::strata::testing_util::RefBf16;
using ::strata::testing_util::RefF16;
using ::strata::testing_util::RefFp8;
using ::strata::testing_util::SameValue;
using ::strata::testing_util::ToBytes;
using ::strata::testing_util::WriteFileBytes;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

constexpr DType kEveryDType[] = {DType::kF32,  DType::kBF16, DType::kF16, DType::kF8E4M3,
                                 DType::kI32,  DType::kI64,  DType::kU8,  DType::kBool,
                                 DType::kF8E8M0, DType::kI8};

uint16_t U16At(absl::Span<const uint8_t> b, size_t i) {
  return static_cast<uint16_t>(b[2 * i] | (b[2 * i + 1] << 8));
}

// The value the reader must produce for element i of a float tensor's bytes,
// computed without the code under test. F8_E4M3 without block scales.
double ReferenceElement(DType dtype, absl::Span<const uint8_t> bytes, size_t i) {
  switch (dtype) {
    case DType::kF32: {
      float f;
      std::memcpy(&f, bytes.data() + 4 * i, 4);
      return f;
    }
    case DType::kBF16:
      return RefBf16(U16At(bytes, i));
    case DType::kF16:
      return RefF16(U16At(bytes, i));
    case DType::kF8E4M3:
      return RefFp8(bytes[i]);
    default:
      return std::nan("");
  }
}

class SafetensorsTest : public testing_util::ScratchDirTest {
 protected:
  TensorToWrite RandomTensor(const std::string& name, DType dtype, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return {name, dtype, std::move(shape), RandomBytes(rng_, n * DTypeSize(dtype))};
  }
  std::unique_ptr<TensorStore> OpenStore() {
    auto store = TensorStore::OpenDir(dir_);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? std::move(store).value() : nullptr;
  }
};

TEST(DTypeTest, NamesSizesAndParsing) {
  for (DType d : kEveryDType) {
    auto parsed = ParseDType(DTypeName(d));
    ASSERT_TRUE(parsed.ok()) << DTypeName(d);
    EXPECT_EQ(*parsed, d);
  }
  EXPECT_EQ(DTypeName(DType::kF8E4M3), "F8_E4M3");
  EXPECT_EQ(DTypeSize(DType::kF32), 4u);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kI64), 8u);
  EXPECT_EQ(DTypeSize(DType::kBool), 1u);
  EXPECT_EQ(DTypeName(DType::kF8E8M0), "F8_E8M0");
  EXPECT_EQ(DTypeSize(DType::kF8E8M0), 1u);
  EXPECT_EQ(DTypeName(DType::kI8), "I8");
  EXPECT_EQ(DTypeSize(DType::kI8), 1u);
  EXPECT_FALSE(DTypeIsFloat(DType::kF8E8M0));  // raw-only: model/v4/quant.h decodes it
  EXPECT_EQ(ParseDType("F64").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseDType("f32").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ShapeString({200, 330}), "[200, 330]");
  EXPECT_EQ(ShapeString({}), "[]");
}

// Every dtype, random shapes and random bits (so NaN, inf, subnormals and
// negative zero turn up in the float types), compared with the independent
// converters of the test.
TEST_F(SafetensorsTest, EveryDTypeRoundTrips) {
  std::vector<TensorToWrite> tensors;
  for (DType d : kEveryDType) {
    const int64_t rows = 1 + static_cast<int64_t>(rng_() % 37);
    const int64_t cols = 1 + static_cast<int64_t>(rng_() % 53);
    tensors.push_back(RandomTensor(absl::StrCat("t.", std::string(DTypeName(d))), d, {rows, cols}));
    tensors.push_back(RandomTensor(absl::StrCat("scalar.", std::string(DTypeName(d))), d, {}));
    tensors.push_back(RandomTensor(absl::StrCat("empty.", std::string(DTypeName(d))), d, {0, 7}));
    tensors.push_back(RandomTensor(absl::StrCat("3d.", std::string(DTypeName(d))), d, {2, 3, 5}));
  }
  ASSERT_TRUE(WriteSafetensors(Path("model.safetensors"), tensors).ok());
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->Names().size(), tensors.size());

  for (const TensorToWrite& t : tensors) {
    SCOPED_TRACE(t.name);
    auto info = store->Info(t.name);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->name, t.name);
    EXPECT_EQ(info->dtype, t.dtype);
    EXPECT_EQ(info->shape, t.shape);
    EXPECT_EQ(info->nbytes, t.data.size());
    auto raw = store->ReadRaw(t.name);
    ASSERT_TRUE(raw.ok()) << raw.status();
    EXPECT_THAT(*raw, ElementsAreArray(t.data));

    auto f32 = store->ReadF32(t.name);
    if (!DTypeIsFloat(t.dtype)) {
      EXPECT_EQ(f32.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(f32.status().message(), HasSubstr(t.name));
      EXPECT_THAT(f32.status().message(), HasSubstr("ReadRaw"));
      continue;
    }
    ASSERT_TRUE(f32.ok()) << f32.status();
    const size_t n = t.data.size() / DTypeSize(t.dtype);
    ASSERT_EQ(f32->size(), n);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_TRUE(SameValue((*f32)[i], ReferenceElement(t.dtype, t.data, i))) << "element " << i;
    }
  }
}

// Every 16-bit pattern once, so every class of bf16 and f16 value is covered.
TEST_F(SafetensorsTest, EverySixteenBitCodeConverts) {
  std::vector<uint16_t> codes(65536);
  for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<uint16_t>(i);
  std::vector<uint8_t> fp8_codes(256);
  for (size_t i = 0; i < fp8_codes.size(); ++i) fp8_codes[i] = static_cast<uint8_t>(i);
  ASSERT_TRUE(
      WriteSafetensors(Path("model.safetensors"), {{"bf16", DType::kBF16, {65536}, ToBytes(codes)},
                                                   {"f16", DType::kF16, {256, 256}, ToBytes(codes)},
                                                   {"fp8", DType::kF8E4M3, {256}, fp8_codes}})
          .ok());
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  auto bf16 = store->ReadF32("bf16");
  auto f16 = store->ReadF32("f16");
  auto fp8 = store->ReadF32("fp8");
  ASSERT_TRUE(bf16.ok() && f16.ok() && fp8.ok());
  for (size_t i = 0; i < codes.size(); ++i) {
    ASSERT_TRUE(SameValue((*bf16)[i], RefBf16(codes[i]))) << "bf16 code " << i;
    ASSERT_TRUE(SameValue((*f16)[i], RefF16(codes[i]))) << "f16 code " << i;
  }
  for (size_t i = 0; i < 256; ++i) {
    ASSERT_TRUE(SameValue((*fp8)[i], RefFp8(static_cast<uint8_t>(i)))) << "fp8 code " << i;
  }
  EXPECT_EQ((*f16)[0x3C00], 1.0f);
  EXPECT_EQ((*f16)[0x0001], std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ((*bf16)[0x3F80], 1.0f);
  EXPECT_EQ((*fp8)[0x7E], 448.0f);
}

TEST_F(SafetensorsTest, FileExposesHeaderMetadataAndData) {
  std::vector<float> w = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -0.5f};
  ASSERT_TRUE(
      WriteSafetensors(Path("a.safetensors"),
                       {{"w", DType::kF32, {2, 3}, ToBytes(w)},
                        {"ids", DType::kI64, {2}, ToBytes(std::vector<int64_t>{-1, 1LL << 40})}},
                       {{"format", "pt"}, {"note", "fixture"}})
          .ok());
  auto file = SafetensorsFile::Open(Path("a.safetensors"));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->path(), Path("a.safetensors"));
  EXPECT_THAT((*file)->Names(), ElementsAre("ids", "w"));
  EXPECT_EQ((*file)->Find("missing"), nullptr);
  const TensorInfo* info = (*file)->Find("w");
  ASSERT_NE(info, nullptr);
  EXPECT_EQ(info->num_elements(), 6);
  EXPECT_THAT((*file)->Data(*info), ElementsAreArray(ToBytes(w)));
  EXPECT_EQ((*file)->metadata().at("format"), "pt");
  EXPECT_EQ((*file)->metadata().at("note"), "fixture");
  EXPECT_EQ((*file)->metadata().size(), 2u);

  // header_json() is the stored header byte for byte.
  const std::string bytes = ReadFileBytes(Path("a.safetensors"));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
  EXPECT_EQ((*file)->header_json(), bytes.substr(8, n));
  EXPECT_EQ((*file)->file_size(), bytes.size());
}

TEST_F(SafetensorsTest, WriterIsDeterministicAlignedAndOrderIndependent) {
  std::vector<TensorToWrite> tensors = {
      RandomTensor("z", DType::kU8, {3}), RandomTensor("a", DType::kBF16, {5}),
      RandomTensor("m", DType::kI64, {2, 2}), RandomTensor("b", DType::kF32, {7})};
  auto first = SerializeSafetensors(tensors, {{"k", "v"}});
  std::reverse(tensors.begin(), tensors.end());
  auto second = SerializeSafetensors(tensors, {{"k", "v"}});
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(*first, *second);

  WriteFileBytes(Path("x.safetensors"), *first);
  auto file = SafetensorsFile::Open(Path("x.safetensors"));
  ASSERT_TRUE(file.ok()) << file.status();
  const uint64_t data_start = 8 + (*file)->header_json().size();
  EXPECT_EQ(data_start % 8, 0u);
  for (const std::string& name : (*file)->Names()) {
    const TensorInfo* info = (*file)->Find(name);
    EXPECT_EQ((data_start + info->data_offset) % DTypeSize(info->dtype), 0u) << name;
  }
  // The header is plain JSON an independent parser accepts.
  const auto header = nlohmann::json::parse((*file)->header_json());
  EXPECT_EQ(header["__metadata__"]["k"], "v");
  EXPECT_EQ(header["m"]["dtype"], "I64");
}

TEST_F(SafetensorsTest, WriterRejectsInconsistentTensors) {
  const std::string path = Path("bad.safetensors");
  EXPECT_EQ(WriteSafetensors(path, {{"w", DType::kF32, {2, 2}, std::vector<uint8_t>(15)}}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteSafetensors(path, {{"w", DType::kU8, {-1}, {}}}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      WriteSafetensors(path, {{"w", DType::kU8, {1}, {1}}, {"w", DType::kU8, {1}, {2}}}).code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteSafetensors(path, {{"__metadata__", DType::kU8, {1}, {1}}}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(std::filesystem::exists(path));
}

// A sharded checkpoint: weights spread over two shards, one fp8 weight whose
// block scales live in the other shard, an index that leaves one stored
// tensor out (it must stay invisible).
TEST_F(SafetensorsTest, ShardedDirectoryWithIndex) {
  std::vector<TensorToWrite> shard1 = {RandomTensor("embed.weight", DType::kBF16, {11, 6}),
                                       RandomTensor("layers.0.w", DType::kF8E4M3, {130, 4}),
                                       RandomTensor("not.in.index", DType::kF32, {2})};
  std::vector<float> scales = {0.5f, 0.25f};
  std::vector<TensorToWrite> shard2 = {
      RandomTensor("norm.weight", DType::kF16, {6}),
      {"layers.0.w_scale_inv", DType::kF32, {2, 1}, ToBytes(scales)},
      RandomTensor("token_ids", DType::kI32, {9})};
  const std::string s1 = "model-00001-of-00002.safetensors";
  const std::string s2 = "model-00002-of-00002.safetensors";
  ASSERT_TRUE(WriteSafetensors(Path(s1), shard1).ok());
  ASSERT_TRUE(WriteSafetensors(Path(s2), shard2).ok());
  nlohmann::json index = {{"metadata", {{"total_size", 1234}}},
                          {"weight_map",
                           {{"embed.weight", s1},
                            {"layers.0.w", s1},
                            {"norm.weight", s2},
                            {"layers.0.w_scale_inv", s2},
                            {"token_ids", s2}}}};
  WriteFileBytes(Path("model.safetensors.index.json"), index.dump(2));
  WriteFileBytes(Path("config.json"), "{}");

  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  EXPECT_THAT(store->Names(), ElementsAre("embed.weight", "layers.0.w", "layers.0.w_scale_inv",
                                          "norm.weight", "token_ids"));
  EXPECT_FALSE(store->Has("not.in.index"));
  EXPECT_TRUE(store->Has("norm.weight"));
  EXPECT_EQ(store->ReadF32("not.in.index").status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(store->ShardNames(), ElementsAre(s1, s2));

  auto header1 = SafetensorsFile::Open(Path(s1));
  auto header2 = SafetensorsFile::Open(Path(s2));
  ASSERT_TRUE(header1.ok() && header2.ok());
  EXPECT_THAT(store->HeaderTexts(),
              ElementsAre((*header1)->header_json(), (*header2)->header_json()));

  auto embed = store->ReadF32("embed.weight", {11, 6});
  ASSERT_TRUE(embed.ok()) << embed.status();
  for (size_t i = 0; i < embed->size(); ++i) {
    ASSERT_TRUE(SameValue((*embed)[i], RefBf16(U16At(shard1[0].data, i))));
  }
  auto norm = store->ReadF32("norm.weight");
  ASSERT_TRUE(norm.ok());
  for (size_t i = 0; i < norm->size(); ++i) {
    ASSERT_TRUE(SameValue((*norm)[i], RefF16(U16At(shard2[0].data, i))));
  }
  auto w = store->ReadF32("layers.0.w");
  ASSERT_TRUE(w.ok()) << w.status();
  for (size_t r = 0; r < 130; ++r) {
    for (size_t c = 0; c < 4; ++c) {
      const float want = static_cast<float>(RefFp8(shard1[1].data[r * 4 + c])) * scales[r / 128];
      ASSERT_EQ((*w)[r * 4 + c], want) << r << "," << c;
    }
  }
  auto ids = store->ReadRaw("token_ids");
  ASSERT_TRUE(ids.ok());
  EXPECT_THAT(*ids, ElementsAreArray(shard2[2].data));
}

TEST_F(SafetensorsTest, DirectoryWithoutIndexMergesEveryFile) {
  ASSERT_TRUE(WriteSafetensors(Path("b.safetensors"), {RandomTensor("y", DType::kF32, {2})}).ok());
  ASSERT_TRUE(WriteSafetensors(Path("a.safetensors"), {RandomTensor("x", DType::kF32, {3})}).ok());
  WriteFileBytes(Path(".partial.safetensors"), "garbage that is not a safetensors file");
  WriteFileBytes(Path("notes.txt"), "ignored");
  std::filesystem::create_directory(Path("sub.safetensors"));
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  EXPECT_THAT(store->Names(), ElementsAre("x", "y"));
  EXPECT_THAT(store->ShardNames(), ElementsAre("a.safetensors", "b.safetensors"));
  EXPECT_EQ(store->HeaderTexts().size(), 2u);
}

TEST_F(SafetensorsTest, DuplicateTensorAcrossFilesIsRejected) {
  ASSERT_TRUE(WriteSafetensors(Path("a.safetensors"), {RandomTensor("x", DType::kF32, {3})}).ok());
  ASSERT_TRUE(WriteSafetensors(Path("b.safetensors"), {RandomTensor("x", DType::kF32, {3})}).ok());
  auto store = TensorStore::OpenDir(dir_);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(store.status().message(), HasSubstr("\"x\""));
  EXPECT_THAT(store.status().message(), HasSubstr("a.safetensors"));
  EXPECT_THAT(store.status().message(), HasSubstr("b.safetensors"));
}

TEST_F(SafetensorsTest, MissingDirectoryOrFilesIsNotFound) {
  EXPECT_EQ(TensorStore::OpenDir(Path("nope")).status().code(), absl::StatusCode::kNotFound);
  auto empty = TensorStore::OpenDir(dir_);
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(empty.status().message(), HasSubstr(dir_));
  auto file = SafetensorsFile::Open(Path("missing.safetensors"));
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(file.status().message(), HasSubstr("missing.safetensors"));
}

TEST_F(SafetensorsTest, ReadErrorsNameTheTensorAndShapes) {
  ASSERT_TRUE(WriteSafetensors(Path("model.safetensors"), {RandomTensor("w", DType::kF32, {3, 4}),
                                                           RandomTensor("ids", DType::kI32, {4})})
                  .ok());
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  EXPECT_TRUE(store->ReadF32("w", {3, 4}).ok());
  auto wrong = store->ReadF32("w", {4, 3});
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong.status().message(), HasSubstr("\"w\""));
  EXPECT_THAT(wrong.status().message(), HasSubstr("expected shape [4, 3]"));
  EXPECT_THAT(wrong.status().message(), HasSubstr("found [3, 4]"));
  EXPECT_THAT(wrong.status().message(), HasSubstr("model.safetensors"));
  EXPECT_EQ(store->ReadF32("w", {12}).status().code(), absl::StatusCode::kInvalidArgument);

  for (auto status : {store->ReadF32("absent").status(), store->ReadRaw("absent").status(),
                      store->Info("absent").status()}) {
    EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
    EXPECT_THAT(status.message(), HasSubstr("\"absent\""));
  }
  EXPECT_FALSE(store->Has("absent"));
  EXPECT_EQ(store->ReadF32("ids").status().code(), absl::StatusCode::kInvalidArgument);
}

// Many threads reading the same store at once see the same values.
TEST_F(SafetensorsTest, ConcurrentReadsAgree) {
  std::vector<TensorToWrite> tensors;
  for (int i = 0; i < 8; ++i) {
    tensors.push_back(RandomTensor(absl::StrCat("t", i), kEveryDType[i % 4], {17, 23}));
  }
  ASSERT_TRUE(WriteSafetensors(Path("model.safetensors"), tensors).ok());
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  std::vector<std::vector<float>> expected;
  for (const auto& t : tensors) expected.push_back(*store->ReadF32(t.name));
  std::vector<int> mismatches(8, 0);
  std::vector<std::thread> threads;
  for (int th = 0; th < 8; ++th) {
    threads.emplace_back([&, th] {
      for (int round = 0; round < 50; ++round) {
        const size_t i = static_cast<size_t>((th + round) % 8);
        auto got = store->ReadF32(tensors[i].name);
        if (!got.ok() || std::memcmp(got->data(), expected[i].data(), got->size() * 4) != 0) {
          ++mismatches[th];
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_THAT(mismatches, ::testing::Each(0));
}

// Opening reads only the header, and reading one tensor brings only that
// tensor's pages in from disk (not its neighbours through readahead). Needs a
// file system whose page cache can be dropped (skipped on tmpfs and the like).
TEST_F(SafetensorsTest, OnlyRequestedTensorsAreRead) {
  constexpr int64_t kFloats = 2 << 20;  // 8 MiB per tensor
  const std::string path = Path("model.safetensors");
  std::vector<TensorToWrite> tensors;
  for (const char* name : {"a", "b", "c"}) {
    tensors.push_back({name, DType::kF32, {kFloats}, std::vector<uint8_t>(kFloats * 4, 1)});
  }
  ASSERT_TRUE(WriteSafetensors(path, tensors).ok());
  const int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);

  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  // A second mapping of the same file, only to locate the tensors' pages:
  // residency in the page cache is per file, not per mapping.
  auto view = SafetensorsFile::Open(path);
  ASSERT_TRUE(view.ok());
  // Pages of a tensor's bytes that are in the page cache (all of its pages
  // when `all`).
  auto resident_pages = [&](const std::string& name, bool all = false) {
    const auto bytes = (*view)->Data(*(*view)->Find(name));  // touches nothing
    const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
    const uintptr_t begin = reinterpret_cast<uintptr_t>(bytes.data()) / page * page;
    const uintptr_t end = reinterpret_cast<uintptr_t>(bytes.data() + bytes.size());
    std::vector<unsigned char> vec((end - begin + page - 1) / page);
    if (all) return static_cast<int>(vec.size());
    if (::mincore(reinterpret_cast<void*>(begin), end - begin, vec.data()) != 0) return -1;
    int count = 0;
    for (unsigned char v : vec) count += v & 1;
    return count;
  };
  if (resident_pages("b") != 0 || resident_pages("c") != 0) {
    GTEST_SKIP() << "the page cache of " << path << " cannot be dropped here";
  }
  EXPECT_LE(resident_pages("a"), 1);  // at most the page the header shares
  auto a = store->ReadF32("a");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(resident_pages("a"), resident_pages("a", /*all=*/true));
  EXPECT_LE(resident_pages("b"), 1) << "reading \"a\" read \"b\" too";
  EXPECT_EQ(resident_pages("c"), 0) << "reading \"a\" read \"c\" too";
  auto c = store->ReadRaw("c");
  ASSERT_TRUE(c.ok());
  uint64_t sum = 0;
  for (uint8_t byte : *c) sum += byte;
  EXPECT_EQ(sum, static_cast<uint64_t>(kFloats * 4));
  EXPECT_LE(resident_pages("b"), 2) << "reading \"c\" read \"b\" too";
}

}  // namespace
}  // namespace strata
