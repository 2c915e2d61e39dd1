// Helpers shared by the kvstore tests: random dimensions and rows, and
// records assembled by hand from the byte layout of docs/coli-kv.md (not
// from RecordLayout, so that the layout code is checked against the spec).
//
// Not thread-safe (each test owns its generator). Every generator starts from
// strata::testing::TestSeed(): the seed is printed and STRATA_TEST_SEED
// replays it.
#ifndef STRATA_KVSTORE_TEST_UTIL_H_
#define STRATA_KVSTORE_TEST_UTIL_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "common/testing/test_seed.h"
#include "kvstore/coli_kv.h"

namespace strata::kv::testing {

inline std::mt19937_64 FreshRng() { return std::mt19937_64(strata::testing::TestSeed()); }

inline Dims RandomDims(std::mt19937_64& rng) {
  Dims d;
  d.n_layers = 1 + static_cast<int32_t>(rng() % 6);
  d.kv_lora = 1 + static_cast<int32_t>(rng() % 40);
  d.qk_rope = static_cast<int32_t>(rng() % 12);
  d.index_hd = (rng() % 2) ? 1 + static_cast<int32_t>(rng() % 8) : 0;
  d.nic = d.index_hd ? static_cast<int32_t>(rng() % (d.n_layers + 1)) : 0;
  d.vocab = 1 + static_cast<int32_t>(rng() % 100000);
  return d;
}

// Floats of varied magnitude, some exactly zero.
inline std::vector<float> RandomRow(std::mt19937_64& rng, int n) {
  std::vector<float> v(static_cast<size_t>(n));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const float mag = std::ldexp(1.0f, static_cast<int>(rng() % 20) - 10);
  for (float& x : v) x = (rng() % 16 == 0) ? 0.0f : nd(rng) * mag;
  return v;
}

// Hand-written spec sizes (docs/coli-kv.md, "Records").
inline int64_t SpecV2RecordBytes(const Dims& d) {
  return 4 + int64_t{d.n_layers} * (d.kv_lora + d.qk_rope + 8) + int64_t{d.nic} * d.index_hd * 4;
}
inline int64_t SpecV1RecordBytes(const Dims& d) {
  return 4 + int64_t{d.n_layers} * 4 * (d.kv_lora + d.qk_rope) + int64_t{d.nic} * d.index_hd * 4;
}

inline int32_t I32(const std::string& s, size_t off) {
  int32_t v;
  std::memcpy(&v, s.data() + off, 4);
  return v;
}

inline void Put32(std::string* s, size_t off, const void* v) { std::memcpy(s->data() + off, v, 4); }

// The header bytes, field by field at the documented offsets.
inline std::string SpecHeader(bool v2, const Dims& d, int32_t nrec) {
  std::string h(40, '\0');
  std::memcpy(h.data(), v2 ? "COLIKV2" : "COLIKV1", 8);  // 7 letters and the NUL
  const int32_t f[8] = {d.n_layers, d.kv_lora, d.qk_rope, d.index_hd, d.nic, d.vocab, nrec,
                        v2 ? 1 : 0};
  for (int i = 0; i < 8; ++i) Put32(&h, 8 + 4 * i, &f[i]);
  return h;
}

// One v1 record, written field by field: token, per layer f32 c then f32 r,
// then f32 keys per indexer slot. Returns the floats used through *rows.
struct V1Rows {
  int32_t token = 0;
  std::vector<std::vector<float>> latent, rope, keys;
};

inline V1Rows RandomV1Rows(std::mt19937_64& rng, const Dims& d) {
  V1Rows r;
  r.token = static_cast<int32_t>(rng() % static_cast<uint64_t>(d.vocab));
  for (int l = 0; l < d.n_layers; ++l) {
    r.latent.push_back(RandomRow(rng, d.kv_lora));
    r.rope.push_back(RandomRow(rng, d.qk_rope));
  }
  for (int s = 0; s < d.nic; ++s) r.keys.push_back(RandomRow(rng, d.index_hd));
  return r;
}

inline std::string SpecV1Record(const Dims& d, const V1Rows& r) {
  std::string s;
  s.append(reinterpret_cast<const char*>(&r.token), 4);
  for (int l = 0; l < d.n_layers; ++l) {
    s.append(reinterpret_cast<const char*>(r.latent[l].data()), 4 * r.latent[l].size());
    s.append(reinterpret_cast<const char*>(r.rope[l].data()), 4 * r.rope[l].size());
  }
  for (int k = 0; k < d.nic; ++k) {
    s.append(reinterpret_cast<const char*>(r.keys[k].data()), 4 * r.keys[k].size());
  }
  return s;
}

// One v2 record from explicit codes and scales, field by field.
struct V2Rows {
  int32_t token = 0;
  std::vector<std::vector<uint8_t>> latent, rope;
  std::vector<float> latent_scale, rope_scale;
  std::vector<std::vector<float>> keys;
};

inline V2Rows RandomV2Rows(std::mt19937_64& rng, const Dims& d) {
  V2Rows r;
  r.token = static_cast<int32_t>(rng() % static_cast<uint64_t>(d.vocab));
  auto codes = [&](int n) {
    std::vector<uint8_t> c(static_cast<size_t>(n));
    for (auto& x : c) {
      do {
        x = static_cast<uint8_t>(rng());
      } while ((x & 0x7F) == 0x7F);  // valid codes only
    }
    return c;
  };
  for (int l = 0; l < d.n_layers; ++l) {
    r.latent.push_back(codes(d.kv_lora));
    r.rope.push_back(codes(d.qk_rope));
    r.latent_scale.push_back(std::ldexp(1.0f + (rng() % 1000) / 1000.0f, -(int)(rng() % 12)));
    r.rope_scale.push_back(std::ldexp(1.0f + (rng() % 1000) / 1000.0f, -(int)(rng() % 12)));
  }
  for (int s = 0; s < d.nic; ++s) r.keys.push_back(RandomRow(rng, d.index_hd));
  return r;
}

inline std::string SpecV2Record(const Dims& d, const V2Rows& r) {
  std::string s;
  s.append(reinterpret_cast<const char*>(&r.token), 4);
  for (int l = 0; l < d.n_layers; ++l) {
    s.append(reinterpret_cast<const char*>(r.latent[l].data()), r.latent[l].size());
    s.append(reinterpret_cast<const char*>(&r.latent_scale[l]), 4);
    s.append(reinterpret_cast<const char*>(r.rope[l].data()), r.rope[l].size());
    s.append(reinterpret_cast<const char*>(&r.rope_scale[l]), 4);
  }
  for (int k = 0; k < d.nic; ++k) {
    s.append(reinterpret_cast<const char*>(r.keys[k].data()), 4 * r.keys[k].size());
  }
  return s;
}

// CRC32C bit by bit from the reflected polynomial: an oracle independent of
// kvstore/crc32c.cc.
inline uint32_t BitwiseCrc32c(std::string_view s) {
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : s) {
    c ^= b;
    for (int i = 0; i < 8; ++i) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
  }
  return ~c;
}

// The model of a session: random v2 records per position, sliced by layer
// range with the spec's offsets (kvstore/session.h, SliceBytes).
class RecordModel {
 public:
  RecordModel(std::mt19937_64& rng, const Dims& d, std::vector<int32_t> indexer_layers)
      : rng_(rng), d_(d), il_(std::move(indexer_layers)) {}

  const std::string& Record(int64_t p) {
    while (static_cast<int64_t>(recs_.size()) <= p) {
      recs_.push_back(SpecV2Record(d_, RandomV2Rows(rng_, d_)));
    }
    return recs_[static_cast<size_t>(p)];
  }
  int32_t Token(int64_t p) { return I32(Record(p), 0); }
  void Replace(int64_t p) { recs_[static_cast<size_t>(p)] = SpecV2Record(d_, RandomV2Rows(rng_, d_)); }

  std::string Slice(int64_t p, int b, int e) {
    const std::string& r = Record(p);
    const int64_t lb = d_.kv_lora + d_.qk_rope + 8;
    std::string s = r.substr(static_cast<size_t>(4 + b * lb), static_cast<size_t>((e - b) * lb));
    for (size_t k = 0; k < il_.size(); ++k) {
      if (il_[k] >= b && il_[k] < e) {
        s += r.substr(static_cast<size_t>(4 + d_.n_layers * lb + static_cast<int64_t>(k) * d_.index_hd * 4),
                      static_cast<size_t>(d_.index_hd * 4));
      }
    }
    return s;
  }

 private:
  std::mt19937_64& rng_;
  Dims d_;
  std::vector<int32_t> il_;
  std::vector<std::string> recs_;
};

}  // namespace strata::kv::testing

#endif  // STRATA_KVSTORE_TEST_UTIL_H_
