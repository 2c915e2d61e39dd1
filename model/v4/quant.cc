#include "model/v4/quant.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/fp8.h"

namespace strata::v4 {
namespace {

constexpr float kE2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

absl::Status BadScale(int64_t r, int64_t c) {
  return absl::InvalidArgumentError(
      absl::StrCat("E8M0 scale [", r, "][", c, "] is 255 (NaN); a scale must be a power of two"));
}

}  // namespace

float E8m0Value(uint8_t b) { return std::ldexp(1.0f, static_cast<int>(b) - 127); }

float E2m1Value(uint8_t code) {
  const float v = kE2m1[code & 7];
  return (code & 8) != 0 ? -v : v;
}

absl::Status DequantFp8Blocks(absl::Span<const uint8_t> codes, int64_t rows, int64_t cols,
                              absl::Span<const uint8_t> scales, float* out) {
  const int64_t scale_cols = (cols + kFp8Block - 1) / kFp8Block;
  for (size_t i = 0; i < scales.size(); ++i) {
    if (scales[i] == 255) return BadScale(static_cast<int64_t>(i) / scale_cols, static_cast<int64_t>(i) % scale_cols);
  }
  const float* table = fp8::DecodeTable();
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* src = codes.data() + r * cols;
    const uint8_t* srow = scales.data() + (r / kFp8Block) * scale_cols;
    float* dst = out + r * cols;
    for (int64_t c = 0; c < cols; ++c) {
      if ((src[c] & 0x7F) == 0x7F) {
        return absl::InvalidArgumentError(absl::StrCat("F8_E4M3 element [", r, "][", c, "] is a NaN code"));
      }
      dst[c] = table[src[c]] * E8m0Value(srow[c / kFp8Block]);
    }
  }
  return absl::OkStatus();
}

absl::Status DequantFp4Rows(absl::Span<const uint8_t> packed, int64_t rows, int64_t cols,
                            absl::Span<const uint8_t> scales, float* out) {
  const int64_t groups = cols / kFp4Group;
  for (size_t i = 0; i < scales.size(); ++i) {
    if (scales[i] == 255) return BadScale(static_cast<int64_t>(i) / groups, static_cast<int64_t>(i) % groups);
  }
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* src = packed.data() + r * (cols / 2);
    const uint8_t* srow = scales.data() + r * groups;
    float* dst = out + r * cols;
    for (int64_t c = 0; c < cols; ++c) {
      const uint8_t byte = src[c / 2];
      const uint8_t code = (c % 2 == 0) ? (byte & 0x0F) : (byte >> 4);
      dst[c] = E2m1Value(code) * E8m0Value(srow[c / kFp4Group]);
    }
  }
  return absl::OkStatus();
}

}  // namespace strata::v4
