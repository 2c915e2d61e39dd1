// The fp8 e4m3 ("fn" variant) codec and the per-row quantisation that every
// KV-cache row goes through, on the CPU and on the GPU alike.
//
// Format: 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits; largest
// finite value ±448 (code 0x7E); 0x7F / 0xFF are NaN and have no infinities.
// See docs/coli-kv.md ("fp8 codec") for the exact rules.
//
// All functions are pure and thread-safe.
#ifndef STRATA_KERNELS_FP8_H_
#define STRATA_KERNELS_FP8_H_

#include <cstdint>
#include <limits>

namespace strata::fp8 {

inline constexpr float kMax = 448.0f;
// A row whose largest magnitude is not above this (or is not finite-sized)
// quantises to all-zero codes with scale 1.
inline constexpr float kTinyAmax = 1e-35f;
inline constexpr float kHugeAmax = 3.4e38f;

// Rounds to nearest, ties to even; saturates overflow and ±inf to ±448; keeps
// the sign of zero; never produces the NaN codes; maps NaN to 0x00.
uint8_t Encode(float x);

// Decodes a code; the NaN codes decode to 0.
float Decode(uint8_t code);

// The 256-entry decode table (NaN codes hold 0).
const float* DecodeTable();

// Quantises n floats: amax = max |x_i| over non-NaN entries; if
// !(amax > kTinyAmax) or amax > kHugeAmax every code is 0 and the scale is 1;
// otherwise inv = 448 / amax, code_i = Encode(x_i * inv), scale = amax / 448.
// Returns the scale. All arithmetic is float32.
float QuantizeRow(const float* x, int n, uint8_t* codes);

// out_i = Decode(code_i) * scale.
void DequantizeRow(const uint8_t* codes, float scale, int n, float* out);

// True when a stored scale may be used (finite and positive); rows with any
// other scale are inert (read as zeros).
inline bool ScaleIsUsable(float scale) {
  return scale > 0.0f && scale <= std::numeric_limits<float>::max();  // false for NaN, +inf
}

}  // namespace strata::fp8

#endif  // STRATA_KERNELS_FP8_H_
