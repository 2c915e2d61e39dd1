// Decoders of DeepSeek-V4's released weight formats (docs/deepseek-v4.md
// §2.2), exact in float32:
//
//   E8M0 scale byte b      2^(b − 127); b = 255 is NaN (refused)
//   FP8 linear weight      F8_E4M3 codes [rows, cols] with one E8M0 scale per
//                          128×128 block ([ceil(rows/128), ceil(cols/128)],
//                          partial blocks at the right and bottom edges):
//                          w[i][j] = e4m3(code[i][j]) · 2^(b[i/128][j/128] − 127)
//   FP4 expert weight      two E2M1 codes per byte ([rows, cols/2]; low nibble
//                          = column 2j, high nibble = column 2j+1), one E8M0
//                          scale per 32 columns of a row ([rows, cols/32]):
//                          w[i][j] = e2m1(code[i][j]) · 2^(b[i][j/32] − 127),
//                          e2m1 bits s e e m = (−1)^s · {0, .5, 1, 1.5, 2, 3, 4, 6}[code & 7]
//
// Errors (INVALID_ARGUMENT) name the offending element; callers add the
// tensor and file. All functions are pure and thread-safe.
#ifndef STRATA_MODEL_V4_QUANT_H_
#define STRATA_MODEL_V4_QUANT_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace strata::v4 {

inline constexpr int kFp8Block = 128;  // FP8 scale block edge
inline constexpr int kFp4Group = 32;   // FP4 columns per scale

// 2^(b − 127). REQUIRES: b != 255.
float E8m0Value(uint8_t b);

// The E2M1 value of the low four bits of `code`.
float E2m1Value(uint8_t code);

// out[rows * cols] from FP8 codes and E8M0 block scales (sizes as above).
// Refuses an E8M0 byte 255 and the e4m3 NaN codes (0x7F, 0xFF).
// REQUIRES: codes.size() == rows * cols, scales.size() == ceil(rows/128) * ceil(cols/128).
absl::Status DequantFp8Blocks(absl::Span<const uint8_t> codes, int64_t rows, int64_t cols,
                              absl::Span<const uint8_t> scales, float* out);

// out[rows * cols] from packed FP4 codes and per-32 E8M0 scales.
// Refuses an E8M0 byte 255.
// REQUIRES: cols % 32 == 0, packed.size() == rows * cols / 2, scales.size() == rows * cols / 32.
absl::Status DequantFp4Rows(absl::Span<const uint8_t> packed, int64_t rows, int64_t cols,
                            absl::Span<const uint8_t> scales, float* out);

}  // namespace strata::v4

#endif  // STRATA_MODEL_V4_QUANT_H_
