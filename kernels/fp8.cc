#include "kernels/fp8.h"

#include <cmath>
#include <cstring>

namespace strata::fp8 {
namespace {

struct Table {
  float v[256];
  Table() {
    for (int c = 0; c < 256; ++c) {
      const int e = (c >> 3) & 15;
      const int m = c & 7;
      float mag;
      if ((c & 0x7F) == 0x7F) {
        mag = 0.0f;  // NaN code decodes to 0
      } else if (e == 0) {
        mag = std::ldexp(static_cast<float>(m), -9);
      } else {
        mag = std::ldexp(1.0f + static_cast<float>(m) / 8.0f, e - 7);
      }
      v[c] = (c & 0x80) ? -mag : mag;
    }
  }
};

const Table& GetTable() {
  static const Table table;
  return table;
}

}  // namespace

const float* DecodeTable() { return GetTable().v; }

float Decode(uint8_t code) { return GetTable().v[code]; }

uint8_t Encode(float x) {
  if (std::isnan(x)) return 0x00;
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80);
  const float a = std::fabs(x);
  if (a >= kMax) return sign | 0x7E;  // saturate, ±inf included
  if (a < 0.015625f) {                // below 2^-6: the subnormal grid 2^-9
    // a * 512 is exact; round half to even on the integer grid. Code 8 is
    // the smallest normal (2^-6), which the integer 8 spells too.
    const float q = a * 512.0f;
    uint32_t n = static_cast<uint32_t>(q);
    const float frac = q - static_cast<float>(n);
    if (frac > 0.5f || (frac == 0.5f && (n & 1))) ++n;
    return sign | static_cast<uint8_t>(n);
  }
  uint32_t abits = bits & 0x7FFFFFFF;
  uint32_t u = abits >> 20;  // 8 exponent bits + top 3 mantissa bits
  const uint32_t rem = abits & 0xFFFFF;
  if (rem > 0x80000 || (rem == 0x80000 && (u & 1))) ++u;  // carries into the exponent
  const int exp8 = static_cast<int>(u >> 3) - 127 + 7;
  uint32_t code = (static_cast<uint32_t>(exp8) << 3) | (u & 7);
  if (code > 0x7E) code = 0x7E;
  return sign | static_cast<uint8_t>(code);
}

float QuantizeRow(const float* x, int n, uint8_t* codes) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    if (a > amax) amax = a;  // NaN compares false and is skipped
  }
  if (!(amax > kTinyAmax) || amax > kHugeAmax) {
    std::memset(codes, 0, static_cast<size_t>(n));
    return 1.0f;
  }
  const float inv = kMax / amax;
  for (int i = 0; i < n; ++i) codes[i] = Encode(x[i] * inv);
  return amax / kMax;
}

void DequantizeRow(const uint8_t* codes, float scale, int n, float* out) {
  const float* t = DecodeTable();
  for (int i = 0; i < n; ++i) out[i] = t[codes[i]] * scale;
}

}  // namespace strata::fp8
