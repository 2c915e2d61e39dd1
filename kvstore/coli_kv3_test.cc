// The .coli_kv v3 layout against docs/coli-kv.md, "Version 3" (sizes, header,
// commit records, record placement, fp8 rows — each written by hand from the
// spec in kvstore/v3_test_util.h), and the reader's and writer's error codes.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kvstore/coli_kv3.h"
#include "kvstore/coli_kv3_file.h"
#include "kvstore/fault_injection_env.h"
#include "kvstore/test_util.h"
#include "kvstore/v3_test_util.h"

namespace strata::kv {
namespace {

using testing::FreshRng;
using testing::I32;
using testing::RandomV3Header;
using testing::SpecV3Header;
using testing::SpecV3Sizes;
using testing::V3Model;

constexpr char kPath[] = "/kv/s.coli_kv";

uint64_t U64At(const std::string& s, size_t off) {
  uint64_t v;
  std::memcpy(&v, s.data() + off, 8);
  return v;
}

// e4m3 value of a code, from the format definition (independent of kernels/).
float SpecDecode(uint8_t c) {
  if ((c & 0x7F) == 0x7F) return 0.0f;
  const int e = (c >> 3) & 15, m = c & 7;
  const float mag = e == 0 ? std::ldexp(static_cast<float>(m), -9) : std::ldexp(1.0f + m / 8.0f, e - 7);
  return (c & 0x80) ? -mag : mag;
}

TEST(ColiKv3Test, LayoutMatchesTheSpec) {
  auto rng = FreshRng();
  for (int rep = 0; rep < 300; ++rep) {
    const V3Header h = RandomV3Header(rng);
    ASSERT_TRUE(ValidateV3Header(h).ok()) << h.ToString();
    const auto z = SpecV3Sizes(h);
    const V3Layout L(h);
    SCOPED_TRACE(h.ToString());
    EXPECT_EQ(EncodeV3Header(h), SpecV3Header(h));
    EXPECT_EQ(L.row_bytes(), z.row);
    EXPECT_EQ(L.token_bytes(), z.token);
    EXPECT_EQ(L.live_tokens(), z.live);
    EXPECT_EQ(L.ring_slots(), 2 * z.live);
    EXPECT_EQ(L.ring_offset(), z.ring_offset);
    EXPECT_EQ(L.log_offset(), z.log_offset);
    EXPECT_EQ(L.commit_bytes(), z.commit);
    const int64_t t0 = static_cast<int64_t>(rng() % 50), t1 = t0 + static_cast<int64_t>(rng() % 50);
    EXPECT_EQ(L.Closes(t0, t1), testing::SpecCloses(h, t0, t1));
    uint64_t log = 0;
    for (const auto& [l, w] : testing::SpecCloses(h, 0, t1)) log += static_cast<uint64_t>(z.block[l]);
    EXPECT_EQ(L.LogBytes(t1), log);
    auto back = DecodeV3Header(SpecV3Header(h));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, h);
  }
  // DeepSeek's row at head_dim 512 / rope 64: 448 + 128 + 7 scales + 1 pad.
  V3Header h;
  h.head_dim = 512;
  h.rope_dim = 64;
  h.index_hd = 128;
  h.window = 128;
  h.vocab = 129280;
  h.row_format = V3RowFormat::kFp8;
  h.layers = {{V3Kind::kCsa, 4}, {V3Kind::kHca, 128}};
  EXPECT_EQ(V3Layout(h).row_bytes(), 584);
  EXPECT_EQ(V3Layout(h).live_tokens(), 127);
}

TEST(ColiKv3Test, AppendsPlaceRecordsWhereTheSpecSays) {
  auto rng = FreshRng();
  for (int rep = 0; rep < 40; ++rep) {
    V3Model model(rng, RandomV3Header(rng));
    const auto& z = model.sizes();
    FaultInjectionEnv env;
    ASSERT_TRUE(env.CreateDir("/kv").ok());
    auto w = ColiKv3Writer::Create(&env, kPath, model.header());
    ASSERT_TRUE(w.ok()) << w.status();
    int64_t t = 0;
    uint64_t seq = 1;
    for (int step = 0; step < 8; ++step) {
      const int64_t nt = t + 1 + static_cast<int64_t>(rng() % (step % 3 == 2 ? 3 * z.live + 3 : 3));
      ASSERT_TRUE((*w)->Append(nt, model.Tokens(t, nt), model.Blocks(t, nt)).ok());
      t = nt;
      ++seq;
      // The file, read as bytes: the current commit record at the spec's
      // offset of copy seq mod 2 ... copies alternate, starting with 0.
      auto bytes = ReadFileToString(&env, kPath, 1 << 30);
      ASSERT_TRUE(bytes.ok());
      EXPECT_EQ(bytes->substr(0, static_cast<size_t>(z.header)), SpecV3Header(model.header()));
      const size_t coff = static_cast<size_t>(testing::SpecRoundUp(z.header, 4096) +
                                              ((seq - 1) % 2) * testing::SpecRoundUp(z.commit, 4096));
      EXPECT_EQ(U64At(*bytes, coff), seq);
      EXPECT_EQ(U64At(*bytes, coff + 8), static_cast<uint64_t>(t));
      const std::string blocks = model.Blocks(0, t);
      EXPECT_EQ(U64At(*bytes, coff + 16), blocks.size());
      const int32_t n = I32(*bytes, coff + 24);
      ASSERT_EQ(n, std::min<int64_t>(t, z.live));
      EXPECT_EQ(static_cast<uint32_t>(I32(*bytes, coff + z.commit - 4)),
                testing::BitwiseCrc32c(std::string_view(bytes->data() + coff, static_cast<size_t>(z.commit - 4))));
      for (int32_t i = 0; i < z.live; ++i) {
        const int32_t slot = I32(*bytes, coff + 28 + 4 * i);
        if (i >= n) {
          EXPECT_EQ(slot, -1);
          continue;
        }
        ASSERT_GE(slot, 0);
        ASSERT_LT(slot, 2 * z.live);
        EXPECT_EQ(bytes->substr(static_cast<size_t>(z.ring_offset + slot * z.token), static_cast<size_t>(z.token)),
                  model.Token(t - n + i))
            << "position " << t - n + i;
      }
      if (!blocks.empty()) EXPECT_EQ(bytes->substr(static_cast<size_t>(z.log_offset), blocks.size()), blocks);
      // And through the reader.
      auto r = ColiKv3Reader::Open(&env, kPath);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ((*r)->num_tokens(), t);
      std::string got;
      for (int64_t p = t - n; p < t; ++p) {
        ASSERT_TRUE((*r)->ReadTokenRecord(p, &got).ok());
        EXPECT_EQ(got, model.Token(p));
      }
      EXPECT_EQ((*r)->ReadTokenRecord(t, &got).code(), absl::StatusCode::kOutOfRange);
      EXPECT_EQ((*r)->ReadTokenRecord(t - n - 1, &got).code(), absl::StatusCode::kOutOfRange);
      ASSERT_TRUE((*r)->ReadBlockLog(&got).ok());
      EXPECT_EQ(got, blocks);
    }
  }
}

TEST(ColiKv3Test, HeaderErrors) {
  auto rng = FreshRng();
  const V3Header h = RandomV3Header(rng);
  const std::string good = SpecV3Header(h);
  EXPECT_EQ(DecodeV3Header("COLIKV2").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeV3Header("hello, world").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeV3Header("COLIK").status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(DecodeV3Header(good.substr(0, good.size() - 1)).status().code(), absl::StatusCode::kDataLoss);
  for (size_t i = 8; i < good.size(); ++i) {
    std::string bad = good;
    bad[i] ^= 0x10;
    EXPECT_EQ(DecodeV3Header(bad).status().code(), absl::StatusCode::kDataLoss) << "byte " << i;
  }
  // Out-of-range fields with a correct CRC32C are still refused.
  V3Header wrong = h;
  wrong.rope_dim = wrong.head_dim + 1;
  EXPECT_EQ(DecodeV3Header(SpecV3Header(wrong)).status().code(), absl::StatusCode::kDataLoss);
  wrong = h;
  wrong.layers[0] = {V3Kind::kSliding, 4};
  EXPECT_EQ(DecodeV3Header(SpecV3Header(wrong)).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ValidateV3Header(wrong).code(), absl::StatusCode::kInvalidArgument);
  wrong = h;
  wrong.layers[0] = {V3Kind::kCsa, 4};
  wrong.index_hd = 0;
  EXPECT_EQ(ValidateV3Header(wrong).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ColiKv3Test, CommitRecordsAndRecordsAreChecked) {
  auto rng = FreshRng();
  V3Header h = RandomV3Header(rng);
  h.layers.push_back({V3Kind::kCsa, 2});
  V3Model model(rng, h);
  const auto& z = model.sizes();
  FaultInjectionEnv env;
  ASSERT_TRUE(env.CreateDir("/kv").ok());
  auto w = ColiKv3Writer::Create(&env, kPath, h);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->Append(4, model.Tokens(0, 4), model.Blocks(0, 4)).ok());  // commit 1 (seq 2)
  ASSERT_TRUE((*w)->Append(9, model.Tokens(4, 9), model.Blocks(4, 9)).ok());  // commit 0 (seq 3)
  const std::string original = *ReadFileToString(&env, kPath, 1 << 30);
  const int32_t live_slot = (*w)->commit().slots.at(0);
  auto write = [&](const std::string& bytes) {
    auto f = env.Open(kPath, OpenMode::kCreateTruncate);
    ASSERT_TRUE((*f)->Write(0, bytes).ok());
  };
  const size_t c0 = static_cast<size_t>(testing::SpecRoundUp(z.header, 4096));
  const size_t c1 = c0 + static_cast<size_t>(testing::SpecRoundUp(z.commit, 4096));
  // A damaged current commit record: the older one is current again.
  std::string bytes = original;
  bytes[c0 + 9] ^= 1;
  write(bytes);
  auto r = ColiKv3Reader::Open(&env, kPath);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->num_tokens(), 4);
  EXPECT_EQ((*r)->current(), 1);
  EXPECT_FALSE((*r)->other_commit_problem().empty());
  // Both damaged: DATA_LOSS.
  bytes[c1 + 3] ^= 1;
  write(bytes);
  EXPECT_EQ(ColiKv3Reader::Open(&env, kPath).status().code(), absl::StatusCode::kDataLoss);
  // A damaged token record, block record, or a file cut short: DATA_LOSS on read.
  std::string got;
  for (int kind = 0; kind < 3; ++kind) {
    bytes = original;
    if (kind == 0) bytes[static_cast<size_t>(z.ring_offset + live_slot * z.token + 9)] ^= 4;
    if (kind == 1) bytes[bytes.size() - 5] ^= 4;
    if (kind == 2) bytes.resize(bytes.size() - 1);
    write(bytes);
    r = ColiKv3Reader::Open(&env, kPath);
    ASSERT_TRUE(r.ok()) << r.status();
    absl::Status s = (*r)->ReadBlockLog(&got);
    for (int64_t p = (*r)->first_live(); p < 9 && s.ok(); ++p) s = (*r)->ReadTokenRecord(p, &got);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << "damage " << kind;
  }
  EXPECT_EQ(ColiKv3Reader::Open(&env, "/kv/none").status().code(), absl::StatusCode::kNotFound);
}

TEST(ColiKv3Test, AppendRefusesRecordsThatAreNotTheNextOnes) {
  auto rng = FreshRng();
  V3Header h = RandomV3Header(rng);
  h.window = 4;
  h.layers.push_back({V3Kind::kHca, 2});
  V3Model model(rng, h);
  FaultInjectionEnv env;
  ASSERT_TRUE(env.CreateDir("/kv").ok());
  auto w = ColiKv3Writer::Create(&env, kPath, h);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(ColiKv3Writer::Create(&env, kPath, h).status().code(), absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE((*w)->Append(3, model.Tokens(0, 3), model.Blocks(0, 3)).ok());
  const auto code = [&](int64_t nt, std::vector<std::string> recs, const std::string& blocks) {
    return (*w)->Append(nt, recs, blocks).code();
  };
  const auto inv = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(code(3, {}, ""), inv);
  EXPECT_EQ(code(2, {}, ""), inv);
  EXPECT_EQ(code(5, model.Tokens(3, 4), model.Blocks(3, 5)), inv);  // one record short
  std::vector<std::string> recs = model.Tokens(3, 5);
  recs[1][9] ^= 1;  // CRC32C
  EXPECT_EQ(code(5, recs, model.Blocks(3, 5)), inv);
  recs = model.Tokens(3, 5);
  std::swap(recs[0], recs[1]);  // positions
  EXPECT_EQ(code(5, recs, model.Blocks(3, 5)), inv);
  EXPECT_EQ(code(5, model.Tokens(3, 5), ""), inv);  // the HCA layer's block 1 missing
  EXPECT_EQ(code(5, model.Tokens(3, 5), model.Blocks(3, 5) + "x"), inv);
  EXPECT_EQ((*w)->num_tokens(), 3);
  // A full disk fails the write, changes nothing, and the writer goes on.
  env.AddFault({FaultInjectionEnv::OpKind::kWrite, "", 0, 1});
  EXPECT_EQ(code(5, model.Tokens(3, 5), model.Blocks(3, 5)), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ((*w)->num_tokens(), 3);
  ASSERT_TRUE((*w)->Append(5, model.Tokens(3, 5), model.Blocks(3, 5)).ok());
  // A failed sync breaks it.
  env.AddFault({FaultInjectionEnv::OpKind::kSync, "", 0, 1, absl::InternalError("injected: EIO")});
  EXPECT_EQ(code(6, model.Tokens(5, 6), model.Blocks(5, 6)), absl::StatusCode::kInternal);
  EXPECT_EQ(code(6, model.Tokens(5, 6), model.Blocks(5, 6)), absl::StatusCode::kFailedPrecondition);
  auto again = ColiKv3Writer::Open(&env, kPath);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)->num_tokens(), 5);
  EXPECT_TRUE((*again)->Append(6, model.Tokens(5, 6), model.Blocks(5, 6)).ok());
}

// fp8 rows: decoded by hand from the spec (e4m3 codes times 2^(byte − 127)
// per 64 values, bf16 rope), each value within half an e4m3 step of the
// input, and the smallest power-of-two scale that keeps the tile within 448.
TEST(ColiKv3Test, Fp8RowsFollowTheSpec) {
  auto rng = FreshRng();
  for (int rep = 0; rep < 200; ++rep) {
    V3Header h;
    h.head_dim = rep == 0 ? 512 : 1 + static_cast<int32_t>(rng() % 300);
    h.rope_dim = rep == 0 ? 64 : static_cast<int32_t>(rng() % (h.head_dim + 1)) / 2 * 2;
    h.window = 2;
    h.vocab = 10;
    h.row_format = V3RowFormat::kFp8;
    h.layers = {{V3Kind::kSliding, 0}};
    const V3Layout L(h);
    const int nope = h.head_dim - h.rope_dim, tiles = (nope + 63) / 64;
    std::vector<float> x = testing::RandomRow(rng, h.head_dim), y(x.size());
    std::string bytes(static_cast<size_t>(L.row_bytes()), '\x55');
    EncodeV3Row(L, x.data(), bytes.data());
    DecodeV3Row(L, bytes.data(), y.data());
    for (int t = 0; t < tiles; ++t) {
      const int e = static_cast<uint8_t>(bytes[static_cast<size_t>(nope + 2 * h.rope_dim + t)]) - 127;
      float amax = 0;
      for (int i = t * 64; i < std::min(nope, t * 64 + 64); ++i) amax = std::max(amax, std::fabs(x[i]));
      if (amax > 0) {
        EXPECT_LE(amax, std::ldexp(448.0f, e)) << "tile " << t;
        EXPECT_GT(amax, std::ldexp(448.0f, e - 1)) << "tile " << t;
      }
      for (int i = t * 64; i < std::min(nope, t * 64 + 64); ++i) {
        const float spec = std::ldexp(SpecDecode(static_cast<uint8_t>(bytes[static_cast<size_t>(i)])), e);
        EXPECT_EQ(y[i], spec) << i;
        // e4m3 steps are 2^-9 below 2^-6 and 2^(k-3) in [2^k, 2^(k+1)): half a step.
        const float v = std::fabs(x[i]) / std::ldexp(1.0f, e);
        const float step = v < std::ldexp(1.0f, -6) ? std::ldexp(1.0f, -9) : std::ldexp(1.0f, std::ilogb(v) - 3);
        EXPECT_LE(std::fabs(x[i] - y[i]), std::ldexp(step / 2, e)) << i;
      }
    }
    for (int i = 0; i < h.rope_dim; ++i) {
      uint16_t b;
      std::memcpy(&b, bytes.data() + nope + 2 * i, 2);
      const uint32_t u = uint32_t{b} << 16;
      float spec;
      std::memcpy(&spec, &u, 4);
      EXPECT_EQ(y[nope + i], spec);
      EXPECT_LE(std::fabs(x[nope + i] - spec), std::ldexp(std::fabs(x[nope + i]), -8));
    }
    for (int64_t i = nope + 2 * h.rope_dim + tiles; i < L.row_bytes(); ++i) EXPECT_EQ(bytes[static_cast<size_t>(i)], 0);
  }
}

}  // namespace
}  // namespace strata::kv
