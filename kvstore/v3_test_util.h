// Helpers for the `.coli_kv` v3 tests: random headers, and the header, sizes
// and records assembled by hand from docs/coli-kv.md, "Version 3" (not from
// V3Layout, so that the layout code is checked against the spec).
//
// Not thread-safe (each test owns its generator, seeded by
// strata::testing::TestSeed(): printed, and replayed with STRATA_TEST_SEED).
#ifndef STRATA_KVSTORE_V3_TEST_UTIL_H_
#define STRATA_KVSTORE_V3_TEST_UTIL_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kvstore/coli_kv3.h"
#include "kvstore/test_util.h"

namespace strata::kv::testing {

inline V3Header RandomV3Header(std::mt19937_64& rng) {
  V3Header h;
  h.head_dim = 1 + static_cast<int32_t>(rng() % 24);
  h.rope_dim = static_cast<int32_t>(rng() % (h.head_dim + 1));
  h.index_hd = 1 + static_cast<int32_t>(rng() % 6);
  h.window = 1 + static_cast<int32_t>(rng() % 10);
  h.vocab = 1 + static_cast<int32_t>(rng() % 100000);
  h.row_format = rng() % 2 ? V3RowFormat::kFp8 : V3RowFormat::kF32;
  const int n = 1 + static_cast<int>(rng() % 5);
  for (int l = 0; l < n; ++l) {
    switch (rng() % 3) {
      case 0:
        h.layers.push_back({V3Kind::kSliding, 0});
        break;
      case 1:
        h.layers.push_back({V3Kind::kCsa, 1 + static_cast<int32_t>(rng() % 5)});
        break;
      default:
        h.layers.push_back({V3Kind::kHca, 1 + static_cast<int32_t>(rng() % 9)});
    }
  }
  return h;
}

inline int64_t SpecRoundUp(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

// The spec's sizes.
struct V3Sizes {
  int64_t row = 0, token = 0, header = 0, commit = 0, ring_offset = 0, log_offset = 0;
  int32_t live = 0;
  std::vector<int64_t> block;  // per layer, 0 for sliding
};

inline V3Sizes SpecV3Sizes(const V3Header& h) {
  V3Sizes z;
  const int64_t d = h.head_dim, dr = h.rope_dim, di = h.index_hd, nope = d - dr;
  z.row = h.row_format == V3RowFormat::kF32 ? 4 * d : SpecRoundUp(nope + 2 * dr + (nope + 63) / 64, 8);
  z.live = h.window - 1;
  z.token = 12;
  for (const V3Layer& l : h.layers) {
    if (h.window > 1) z.token += z.row;
    if (l.kind == V3Kind::kCsa) {
      z.token += 4 * (2 * d + 2 * d + 2 * di + 2 * di);
      z.live = std::max(z.live, 2 * l.rate - 1);
      z.block.push_back(12 + z.row + 4 * di);
    } else if (l.kind == V3Kind::kHca) {
      z.token += 4 * (d + d);
      z.live = std::max(z.live, l.rate - 1);
      z.block.push_back(12 + z.row);
    } else {
      z.block.push_back(0);
    }
  }
  z.header = 44 + 8 * static_cast<int64_t>(h.layers.size());
  z.commit = 32 + 4 * int64_t{z.live};
  z.ring_offset = SpecRoundUp(z.header, 4096) + 2 * SpecRoundUp(z.commit, 4096);
  z.log_offset = z.ring_offset + 2 * int64_t{z.live} * z.token;
  return z;
}

// Header bytes, field by field.
inline std::string SpecV3Header(const V3Header& h) {
  std::string s(static_cast<size_t>(44 + 8 * h.layers.size()), '\0');
  std::memcpy(s.data(), "COLIKV3", 8);
  const int32_t f[8] = {2, static_cast<int32_t>(h.layers.size()), h.head_dim, h.rope_dim, h.index_hd, h.window, h.vocab,
                        static_cast<int32_t>(h.row_format)};
  for (int i = 0; i < 8; ++i) Put32(&s, 8 + 4 * i, &f[i]);
  for (size_t l = 0; l < h.layers.size(); ++l) {
    const int32_t k = static_cast<int32_t>(h.layers[l].kind);
    Put32(&s, 40 + 8 * l, &k);
    Put32(&s, 44 + 8 * l, &h.layers[l].rate);
  }
  const uint32_t crc = BitwiseCrc32c(std::string_view(s.data(), s.size() - 4));
  Put32(&s, s.size() - 4, &crc);
  return s;
}

// A record of n bytes: two int32 fields, random payload, CRC32C.
inline std::string SpecV3Record(std::mt19937_64& rng, int64_t n, int32_t a, int32_t b) {
  std::string s(static_cast<size_t>(n), '\0');
  for (size_t i = 8; i + 4 < s.size(); ++i) s[i] = static_cast<char>(rng());
  Put32(&s, 0, &a);
  Put32(&s, 4, &b);
  const uint32_t crc = BitwiseCrc32c(std::string_view(s.data(), s.size() - 4));
  Put32(&s, s.size() - 4, &crc);
  return s;
}

// The block closes of (t0, t1] in log order — close count, then layer —
// written from the spec's rule.
inline std::vector<std::pair<int, int32_t>> SpecCloses(const V3Header& h, int64_t t0, int64_t t1) {
  std::vector<std::pair<int, int32_t>> out;
  for (int64_t c = t0 + 1; c <= t1; ++c) {
    for (size_t l = 0; l < h.layers.size(); ++l) {
      const int64_t m = h.layers[l].rate;
      if (m > 0 && c % m == 0) out.emplace_back(static_cast<int>(l), static_cast<int32_t>(c / m - 1));
    }
  }
  return out;
}

// A session's records: random token records per position and block records
// per (layer, block), fixed once drawn.
class V3Model {
 public:
  V3Model(std::mt19937_64& rng, V3Header h) : rng_(rng), h_(std::move(h)), z_(SpecV3Sizes(h_)) {}

  const V3Header& header() const { return h_; }
  const V3Sizes& sizes() const { return z_; }

  const std::string& Token(int64_t p) {
    auto it = tokens_.find(p);
    if (it == tokens_.end()) {
      const int32_t id = static_cast<int32_t>(rng_() % static_cast<uint64_t>(h_.vocab));
      it = tokens_.emplace(p, SpecV3Record(rng_, z_.token, static_cast<int32_t>(p), id)).first;
    }
    return it->second;
  }
  const std::string& Block(int l, int32_t w) {
    auto it = blocks_.find({l, w});
    if (it == blocks_.end()) it = blocks_.emplace(std::pair(l, w), SpecV3Record(rng_, z_.block[l], l, w)).first;
    return it->second;
  }
  // Token records of the append from t0 to t1.
  std::vector<std::string> Tokens(int64_t t0, int64_t t1) {
    std::vector<std::string> v;
    for (int64_t p = std::max(t0, t1 - z_.live); p < t1; ++p) v.push_back(Token(p));
    return v;
  }
  std::string Blocks(int64_t t0, int64_t t1) {
    std::string s;
    for (const auto& [l, w] : SpecCloses(h_, t0, t1)) s += Block(l, w);
    return s;
  }

 private:
  std::mt19937_64& rng_;
  V3Header h_;
  V3Sizes z_;
  std::map<int64_t, std::string> tokens_;
  std::map<std::pair<int, int32_t>, std::string> blocks_;
};

}  // namespace strata::kv::testing

#endif  // STRATA_KVSTORE_V3_TEST_UTIL_H_
