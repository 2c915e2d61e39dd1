// fp8 (F8_E4M3) weights with DeepSeek-style 128x128 block scales.
#include <cmath>
#include <cstring>
#include <filesystem>
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
using ::strata::testing_util::RefBf16;
using ::strata::testing_util::RefFp8;
using ::strata::testing_util::ToBytes;
using ::strata::testing_util::WriteFileBytes;
using ::testing::HasSubstr;

class Fp8BlockScaleTest : public testing_util::ScratchDirTest {
 protected:
  // Random positive scales spanning several binades.
  std::vector<float> RandomScales(size_t n) {
    std::uniform_real_distribution<float> exponent(-12.0f, 4.0f);
    std::vector<float> s(n);
    for (float& v : s) v = std::exp2(exponent(rng_));
    return s;
  }

  // Writes weight [rows, cols] of random codes and its scales, reads it back
  // and compares every element with a straightforward loop over the blocks.
  void CheckDequant(int64_t rows, int64_t cols, DType scale_dtype) {
    SCOPED_TRACE(absl::StrCat("weight [", rows, ", ", cols, "], scales ",
                              std::string(DTypeName(scale_dtype))));
    const int64_t srows = (rows + 127) / 128, scols = (cols + 127) / 128;
    const std::vector<uint8_t> codes = RandomBytes(rng_, static_cast<size_t>(rows * cols));
    std::vector<float> scale_values = RandomScales(static_cast<size_t>(srows * scols));
    std::vector<uint8_t> scale_bytes;
    if (scale_dtype == DType::kF32) {
      scale_bytes = ToBytes(scale_values);
    } else {  // BF16: keep the top half of each f32, and the value it stands for
      for (float& v : scale_values) {
        uint32_t bits;
        std::memcpy(&bits, &v, 4);
        const uint16_t top = static_cast<uint16_t>(bits >> 16);
        scale_bytes.push_back(static_cast<uint8_t>(top & 0xFF));
        scale_bytes.push_back(static_cast<uint8_t>(top >> 8));
        v = static_cast<float>(RefBf16(top));
      }
    }
    const std::string file = absl::StrCat("w", rows, "x", cols, ".safetensors");
    ASSERT_TRUE(
        WriteSafetensors(Path(file), {{"w", DType::kF8E4M3, {rows, cols}, codes},
                                      {"w_scale_inv", scale_dtype, {srows, scols}, scale_bytes}})
            .ok());
    auto store = TensorStore::OpenDir(dir_);
    ASSERT_TRUE(store.ok()) << store.status();
    auto got = (*store)->ReadF32("w", {rows, cols});
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->size(), static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const float code_value = static_cast<float>(RefFp8(codes[r * cols + c]));
        const float want = code_value * scale_values[(r / 128) * scols + c / 128];
        ASSERT_EQ((*got)[r * cols + c], want) << "at [" << r << ", " << c << "]";
      }
    }
    // As stored: the same codes, the scales widened to f32.
    auto blocks = (*store)->ReadFp8Blocks("w", {rows, cols});
    ASSERT_TRUE(blocks.ok()) << blocks.status();
    EXPECT_EQ(blocks->codes, codes);
    EXPECT_EQ(blocks->scales, scale_values);
    std::filesystem::remove(Path(file));
  }
};

TEST_F(Fp8BlockScaleTest, PartialBlocksOnBothEdges) { CheckDequant(200, 330, DType::kF32); }
TEST_F(Fp8BlockScaleTest, BF16Scales) { CheckDequant(130, 129, DType::kBF16); }
TEST_F(Fp8BlockScaleTest, ExactMultiplesOfTheBlock) { CheckDequant(256, 128, DType::kF32); }
TEST_F(Fp8BlockScaleTest, SmallerThanOneBlock) { CheckDequant(3, 5, DType::kF32); }
TEST_F(Fp8BlockScaleTest, OneRowPastABlock) { CheckDequant(129, 1, DType::kF32); }

// Without a companion the codes are read with scale 1, whatever the rank.
TEST_F(Fp8BlockScaleTest, NoScaleTensorMeansScaleOne) {
  const std::vector<uint8_t> codes = RandomBytes(rng_, 2 * 3 * 4);
  ASSERT_TRUE(WriteSafetensors(Path("m.safetensors"), {{"w2", DType::kF8E4M3, {6, 4}, codes},
                                                       {"w3", DType::kF8E4M3, {2, 3, 4}, codes}})
                  .ok());
  auto store = TensorStore::OpenDir(dir_);
  ASSERT_TRUE(store.ok()) << store.status();
  for (const char* name : {"w2", "w3"}) {
    auto got = (*store)->ReadF32(name);
    ASSERT_TRUE(got.ok()) << got.status();
    for (size_t i = 0; i < codes.size(); ++i) {
      ASSERT_EQ((*got)[i], static_cast<float>(RefFp8(codes[i]))) << name << " " << i;
    }
  }
}

// ReadFp8Blocks takes only block-scaled F8_E4M3 weights: other forms are
// FAILED_PRECONDITION (the caller reads them as f32), a wrong shape
// INVALID_ARGUMENT, a missing tensor NOT_FOUND.
TEST_F(Fp8BlockScaleTest, Fp8BlocksOnlyForBlockScaledWeights) {
  const std::vector<uint8_t> codes = RandomBytes(rng_, 6 * 4);
  ASSERT_TRUE(WriteSafetensors(Path("m.safetensors"),
                               {{"unscaled", DType::kF8E4M3, {6, 4}, codes},
                                {"wide", DType::kBF16, {6, 2}, codes},
                                {"w", DType::kF8E4M3, {6, 4}, codes},
                                {"w_scale_inv", DType::kF32, {1, 1}, ToBytes(std::vector<float>{0.5f})}})
                  .ok());
  auto store = TensorStore::OpenDir(dir_);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->ReadFp8Blocks("unscaled", {6, 4}).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*store)->ReadFp8Blocks("wide", {6, 2}).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*store)->ReadFp8Blocks("w", {4, 6}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*store)->ReadFp8Blocks("missing", {6, 4}).status().code(), absl::StatusCode::kNotFound);
  auto ok = (*store)->ReadFp8Blocks("w", {6, 4});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->scales, std::vector<float>{0.5f});
}

struct BadScaleCase {
  const char* label;
  std::vector<int64_t> weight_shape;
  DType scale_dtype;
  std::vector<int64_t> scale_shape;
  const char* message_part;
};

TEST_F(Fp8BlockScaleTest, InconsistentScalesAreRejectedAtOpen) {
  const BadScaleCase cases[] = {
      {"wrong_shape", {200, 330}, DType::kF32, {2, 2}, "expected [2, 3]"},
      {"transposed_shape", {200, 330}, DType::kF32, {3, 2}, "expected [2, 3]"},
      {"one_d_scales", {200, 330}, DType::kF32, {6}, "expected [2, 3]"},
      {"fp8_scales", {200, 330}, DType::kF8E4M3, {2, 3}, "must be F32, BF16 or F16"},
      {"int_scales", {200, 330}, DType::kI32, {2, 3}, "must be F32, BF16 or F16"},
      {"one_d_weight", {300}, DType::kF32, {3}, "is not 2-D"},
      {"three_d_weight", {2, 200, 330}, DType::kF32, {2, 3}, "is not 2-D"},
  };
  for (const BadScaleCase& c : cases) {
    SCOPED_TRACE(c.label);
    const std::string sub = Path(c.label);
    std::filesystem::create_directory(sub);
    int64_t wn = 1, sn = 1;
    for (int64_t d : c.weight_shape) wn *= d;
    for (int64_t d : c.scale_shape) sn *= d;
    const std::string file = sub + "/model.safetensors";
    ASSERT_TRUE(
        WriteSafetensors(file, {{"layer.w", DType::kF8E4M3, c.weight_shape, RandomBytes(rng_, wn)},
                                {"layer.w_scale_inv", c.scale_dtype, c.scale_shape,
                                 RandomBytes(rng_, sn * DTypeSize(c.scale_dtype))}})
            .ok());
    auto store = TensorStore::OpenDir(sub);
    EXPECT_EQ(store.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(store.status().message(), HasSubstr(file));
    EXPECT_THAT(store.status().message(), HasSubstr("\"layer.w"));
    EXPECT_THAT(store.status().message(), HasSubstr(c.message_part));
  }
}

// The index lists the weight but not its scales, which the shard holds:
// reading with scale 1 would be silently wrong, so it is an error.
TEST_F(Fp8BlockScaleTest, IndexThatHidesTheScalesIsRejected) {
  ASSERT_TRUE(
      WriteSafetensors(Path("s1.safetensors"),
                       {{"w", DType::kF8E4M3, {4, 4}, RandomBytes(rng_, 16)},
                        {"w_scale_inv", DType::kF32, {1, 1}, ToBytes(std::vector<float>{2})}})
          .ok());
  WriteFileBytes(Path("model.safetensors.index.json"),
                 nlohmann::json{{"weight_map", {{"w", "s1.safetensors"}}}}.dump());
  auto store = TensorStore::OpenDir(dir_);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(store.status().message(), HasSubstr("w_scale_inv"));
  EXPECT_THAT(store.status().message(), HasSubstr("s1.safetensors"));
}

}  // namespace
}  // namespace strata
