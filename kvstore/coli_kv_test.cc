// Round trips, byte layout, torn files, sanitising and error codes of the
// .coli_kv reader and writer (docs/coli-kv.md).
#include <stdlib.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "gtest/gtest.h"
#include "kernels/fp8.h"
#include "kvstore/coli_kv.h"
#include "kvstore/coli_kv_file.h"
#include "kvstore/fault_injection_env.h"
#include "kvstore/test_util.h"

namespace strata::kv {
namespace {

using testing::FreshRng;
using testing::RandomDims;
using testing::SpecHeader;
using testing::SpecV1Record;
using testing::SpecV2Record;

// e4m3 value of a code, from the format definition (independent of kernels/).
float SpecDecode(uint8_t c) {
  if ((c & 0x7F) == 0x7F) return 0.0f;
  const int e = (c >> 3) & 15, m = c & 7;
  const float mag = e == 0 ? std::ldexp(static_cast<float>(m), -9)
                           : std::ldexp(1.0f + static_cast<float>(m) / 8.0f, e - 7);
  return (c & 0x80) ? -mag : mag;
}

float F32At(const std::string& s, size_t off) {
  float v;
  std::memcpy(&v, s.data() + off, 4);
  return v;
}
int32_t I32At(const std::string& s, size_t off) {
  int32_t v;
  std::memcpy(&v, s.data() + off, 4);
  return v;
}

// Checks that `codes` with `scale` reproduce `x` within fp8 rounding error.
void ExpectQuantizes(const std::vector<float>& x, const char* codes, float scale) {
  float amax = 0;
  for (float v : x) amax = std::max(amax, std::fabs(v));
  if (amax == 0.0f) {
    EXPECT_EQ(scale, 1.0f);
    for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(codes[i], 0);
    return;
  }
  EXPECT_NEAR(scale, amax / 448.0f, amax / 448.0f * 1e-6f);
  for (size_t i = 0; i < x.size(); ++i) {
    const float got = SpecDecode(static_cast<uint8_t>(codes[i])) * scale;
    const float tol = std::max(std::fabs(x[i]) / 16.0f, scale * std::ldexp(1.0f, -10)) * 1.0001f;
    EXPECT_NEAR(got, x[i], tol) << "element " << i;
  }
}

class ColiKvTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(env_.CreateDir("/s").ok()); }

  void WriteRaw(const std::string& path, const std::string& bytes) {
    auto f = env_.Open(path, OpenMode::kCreateTruncate);
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE((*f)->Write(0, bytes).ok());
  }
  std::string ReadRaw(const std::string& path) { return *ReadFileToString(&env_, path, 1 << 30); }

  FaultInjectionEnv env_;
  std::mt19937_64 rng_ = FreshRng();
};

TEST_F(ColiKvTest, V2RoundTripWithRandomData) {
  for (int iter = 0; iter < 20; ++iter) {
    const Dims d = RandomDims(rng_);
    const std::string path = "/s/v2_" + std::to_string(iter) + ".coli_kv";
    auto w = ColiKvWriter::Create(&env_, path, Version::kV2, d);
    ASSERT_TRUE(w.ok()) << w.status();
    std::string expected;
    const int n = 1 + static_cast<int>(rng_() % 20);
    for (int p = 0; p < n; ++p) {
      const std::string rec = SpecV2Record(d, testing::RandomV2Rows(rng_, d));
      expected += rec;
      ASSERT_TRUE((*w)->Append(rec).ok());  // one record per commit, like decode
    }
    EXPECT_EQ((*w)->nrec(), n);
    auto r = ColiKvReader::Open(&env_, path);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ((*r)->nrec(), n);
    EXPECT_FALSE((*r)->torn());
    EXPECT_EQ((*r)->dims(), d);
    EXPECT_EQ((*r)->version(), Version::kV2);
    std::string got;
    ASSERT_TRUE((*r)->ReadRecords(0, n, RecordFormat::kStored, &got).ok());
    EXPECT_EQ(got, expected);
    SanitizeStats st;
    ASSERT_TRUE((*r)->ReadRecords(0, n, RecordFormat::kV2Sanitized, &got, &st).ok());
    EXPECT_EQ(got, expected);  // valid codes and scales: nothing to change
    EXPECT_TRUE(st.clean());
    EXPECT_EQ(ReadRaw(path), SpecHeader(true, d, n) + expected);
  }
}

TEST_F(ColiKvTest, V1RoundTripAndQuantisedView) {
  for (int iter = 0; iter < 20; ++iter) {
    const Dims d = RandomDims(rng_);
    const std::string path = "/s/v1_" + std::to_string(iter) + ".coli_kv";
    std::vector<testing::V1Rows> rows;
    std::string expected;
    auto w = ColiKvWriter::Create(&env_, path, Version::kV1, d);
    ASSERT_TRUE(w.ok());
    const int n = 1 + static_cast<int>(rng_() % 10);
    std::string batch;
    for (int p = 0; p < n; ++p) {
      rows.push_back(testing::RandomV1Rows(rng_, d));
      batch += SpecV1Record(d, rows.back());
    }
    ASSERT_TRUE((*w)->Append(batch).ok());  // a whole prefill in one commit
    EXPECT_EQ(ReadRaw(path), SpecHeader(false, d, n) + batch);

    auto r = ColiKvReader::Open(&env_, path);
    ASSERT_TRUE(r.ok());
    std::string got;
    ASSERT_TRUE((*r)->ReadRecords(0, n, RecordFormat::kV1, &got).ok());
    EXPECT_EQ(got, batch);
    ASSERT_TRUE((*r)->ReadRecords(0, n, RecordFormat::kV2Sanitized, &got).ok());
    const int64_t rb = testing::SpecV2RecordBytes(d);
    ASSERT_EQ(static_cast<int64_t>(got.size()), n * rb);
    for (int p = 0; p < n; ++p) {
      const size_t base = static_cast<size_t>(p * rb);
      EXPECT_EQ(I32At(got, base), rows[p].token);
      size_t off = base + 4;
      for (int l = 0; l < d.n_layers; ++l) {
        ExpectQuantizes(rows[p].latent[l], got.data() + off, F32At(got, off + d.kv_lora));
        off += d.kv_lora + 4;
        ExpectQuantizes(rows[p].rope[l], got.data() + off, F32At(got, off + d.qk_rope));
        off += d.qk_rope + 4;
      }
      for (int s = 0; s < d.nic; ++s) {
        for (int i = 0; i < d.index_hd; ++i) {
          EXPECT_EQ(F32At(got, off), rows[p].keys[s][i]);
          off += 4;
        }
      }
    }
  }
}

TEST_F(ColiKvTest, RecordSizesFollowTheSpec) {
  // GLM-5.2: 78 layers, kv_lora 512, rope 64, 21 indexer layers of 128.
  const Dims glm{78, 512, 64, 128, 21, 154880};
  EXPECT_EQ(RecordLayout(Version::kV2, glm).record_bytes(), 56308);
  EXPECT_EQ(RecordLayout(Version::kV2, glm).layer_bytes(), 584);
  EXPECT_EQ(RecordLayout(Version::kV1, glm).record_bytes(), 4 + 78 * 576 * 4 + 21 * 512);
  for (int i = 0; i < 50; ++i) {
    const Dims d = RandomDims(rng_);
    EXPECT_EQ(RecordLayout(Version::kV2, d).record_bytes(), testing::SpecV2RecordBytes(d));
    EXPECT_EQ(RecordLayout(Version::kV1, d).record_bytes(), testing::SpecV1RecordBytes(d));
  }
}

// A file assembled by hand from the documented offsets reads back correctly;
// a file written by the writer has the documented bytes at those offsets.
TEST_F(ColiKvTest, ByteExactLayout) {
  const Dims d{3, 8, 4, 2, 2, 1000};
  const int32_t token = static_cast<int32_t>(rng_() % 1000);
  std::string rec(static_cast<size_t>(4 + 3 * (8 + 4 + 8) + 2 * 2 * 4), '\0');
  std::memcpy(rec.data(), &token, 4);
  // Layer l starts at 4 + 20·l: 8 latent codes, f32 scale, 4 rope codes, f32 scale.
  std::vector<uint8_t> codes(rec.size());
  for (int l = 0; l < 3; ++l) {
    const size_t base = 4 + 20 * l;
    for (int i = 0; i < 8; ++i) rec[base + i] = static_cast<char>(0x30 + l + i);
    const float cs = 0.5f + l, rs = 0.25f + l;
    std::memcpy(rec.data() + base + 8, &cs, 4);
    for (int i = 0; i < 4; ++i) rec[base + 12 + i] = static_cast<char>(0xB0 + l + i);
    std::memcpy(rec.data() + base + 16, &rs, 4);
  }
  // Indexer slots at 4 + 3·20 = 64: two keys of 2 floats.
  const float keys[4] = {1.5f, -2.0f, 3.25f, 0.125f};
  std::memcpy(rec.data() + 64, keys, 16);
  std::string file = SpecHeader(true, d, 1) + rec;
  WriteRaw("/s/hand.coli_kv", file);

  auto r = ColiKvReader::Open(&env_, "/s/hand.coli_kv");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->nrec(), 1);
  EXPECT_EQ((*r)->dims(), d);
  const RecordLayout& L = (*r)->layout();
  EXPECT_EQ(L.latent_offset(1), 24);
  EXPECT_EQ(L.latent_scale_offset(1), 32);
  EXPECT_EQ(L.rope_offset(2), 56);
  EXPECT_EQ(L.rope_scale_offset(2), 60);
  EXPECT_EQ(L.indexer_offset(1), 72);
  EXPECT_EQ(L.file_offset(3), 40 + 3 * 80);
  std::string got;
  ASSERT_TRUE((*r)->ReadRecords(0, 1, RecordFormat::kV1, &got).ok());
  // v1 view: layer l at 4 + 48·l: 8 f32 latent, 4 f32 rope; keys at 148.
  for (int l = 0; l < 3; ++l) {
    for (int i = 0; i < 8; ++i) {
      EXPECT_EQ(F32At(got, 4 + 48 * l + 4 * i), SpecDecode(0x30 + l + i) * (0.5f + l));
    }
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(F32At(got, 4 + 48 * l + 32 + 4 * i), SpecDecode(0xB0 + l + i) * (0.25f + l));
    }
  }
  EXPECT_EQ(F32At(got, 148), 1.5f);
  EXPECT_EQ(F32At(got, 160), 0.125f);

  // The writer: header fields at 0, 8..28, 32, 36; record 1 at 40 + 80.
  auto w = ColiKvWriter::Create(&env_, "/s/w.coli_kv", Version::kV2, d);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->Append(rec + rec).ok());
  const std::string bytes = ReadRaw("/s/w.coli_kv");
  ASSERT_EQ(bytes.size(), 40u + 2 * 80);
  EXPECT_EQ(bytes.substr(0, 8), std::string("COLIKV2\0", 8));
  EXPECT_EQ(I32At(bytes, 8), 3);
  EXPECT_EQ(I32At(bytes, 12), 8);
  EXPECT_EQ(I32At(bytes, 16), 4);
  EXPECT_EQ(I32At(bytes, 20), 2);
  EXPECT_EQ(I32At(bytes, 24), 2);
  EXPECT_EQ(I32At(bytes, 28), 1000);
  EXPECT_EQ(I32At(bytes, 32), 2);
  EXPECT_EQ(I32At(bytes, 36), 1);
  EXPECT_EQ(I32At(bytes, 120), token);
  EXPECT_EQ(F32At(bytes, 120 + 4 + 20 + 8), 1.5f);  // layer 1 latent scale
  EXPECT_EQ(F32At(bytes, 120 + 64 + 8), 3.25f);     // slot 1 key 0
}

TEST_F(ColiKvTest, TornFilesLoadUpToTheLastCompleteRecord) {
  const Dims d = RandomDims(rng_);
  const int64_t rb = testing::SpecV2RecordBytes(d);
  std::string recs;
  for (int p = 0; p < 8; ++p) recs += SpecV2Record(d, testing::RandomV2Rows(rng_, d));
  // Header promises 10 records; 7 and a half are there.
  WriteRaw("/s/torn.coli_kv", SpecHeader(true, d, 10) + recs.substr(0, 7 * rb + rb / 2));
  auto r = ColiKvReader::Open(&env_, "/s/torn.coli_kv");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)->nrec(), 7);
  EXPECT_TRUE((*r)->torn());
  std::string got;
  ASSERT_TRUE((*r)->ReadRecords(0, 7, RecordFormat::kStored, &got).ok());
  EXPECT_EQ(got, recs.substr(0, 7 * rb));
  EXPECT_EQ((*r)->ReadRecords(0, 8, RecordFormat::kStored, &got).code(),
            absl::StatusCode::kOutOfRange);

  // Opening for writing repairs the header before anything is appended.
  auto w = ColiKvWriter::Open(&env_, "/s/torn.coli_kv");
  ASSERT_TRUE(w.ok());
  EXPECT_EQ((*w)->nrec(), 7);
  EXPECT_EQ(I32At(ReadRaw("/s/torn.coli_kv"), 32), 7);

  // nrec smaller than the records present: the extra bytes are ignored.
  WriteRaw("/s/extra.coli_kv", SpecHeader(true, d, 3) + recs);
  r = ColiKvReader::Open(&env_, "/s/extra.coli_kv");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)->nrec(), 3);
  EXPECT_FALSE((*r)->torn());

  // Only the header; and a header cut short.
  WriteRaw("/s/empty.coli_kv", SpecHeader(true, d, 5));
  r = ColiKvReader::Open(&env_, "/s/empty.coli_kv");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)->nrec(), 0);
  WriteRaw("/s/short.coli_kv", SpecHeader(true, d, 5).substr(0, 39));
  EXPECT_EQ(ColiKvReader::Open(&env_, "/s/short.coli_kv").status().code(),
            absl::StatusCode::kDataLoss);
}

TEST_F(ColiKvTest, SanitisesNanCodesAndInertRows) {
  const Dims d{2, 6, 3, 2, 1, 50};
  testing::V2Rows rows = testing::RandomV2Rows(rng_, d);
  rows.token = 77;  // outside vocab 50: counted, not changed
  rows.latent[0][1] = 0x7F;
  rows.latent[0][4] = 0xFF;
  rows.rope[1][2] = 0xFF;
  rows.rope[0][0] = 0x7F;  // in a row made inert below: not counted as a NaN code
  const float bad_scales[] = {std::numeric_limits<float>::quiet_NaN(),
                              std::numeric_limits<float>::infinity(), 0.0f, -0.0f, -1.0f};
  rows.latent_scale[1] = bad_scales[rng_() % 5];
  rows.rope_scale[0] = -std::numeric_limits<float>::infinity();
  rows.keys[0][1] = std::numeric_limits<float>::quiet_NaN();
  const std::string rec = SpecV2Record(d, rows);
  WriteRaw("/s/dirty.coli_kv", SpecHeader(true, d, 1) + rec);
  auto r = ColiKvReader::Open(&env_, "/s/dirty.coli_kv");
  ASSERT_TRUE(r.ok());
  std::string got;
  SanitizeStats st;
  ASSERT_TRUE((*r)->ReadRecords(0, 1, RecordFormat::kV2Sanitized, &got, &st).ok());
  EXPECT_EQ(st.nan_codes, 3);
  EXPECT_EQ(st.inert_rows, 2);
  EXPECT_EQ(st.nonfinite_keys, 1);
  EXPECT_EQ(st.bad_tokens, 1);
  // Expected record, built by hand.
  testing::V2Rows want = rows;
  want.latent[0][1] = 0;
  want.latent[0][4] = 0;
  want.rope[1][2] = 0;
  want.latent[1].assign(6, 0);
  want.latent_scale[1] = 1.0f;
  want.rope[0].assign(3, 0);
  want.rope_scale[0] = 1.0f;
  want.keys[0][1] = 0.0f;
  EXPECT_EQ(got, SpecV2Record(d, want));
  // The stored bytes are untouched.
  ASSERT_TRUE((*r)->ReadRecords(0, 1, RecordFormat::kStored, &got).ok());
  EXPECT_EQ(got, rec);
  // A tiny positive (subnormal) scale is finite and positive: usable.
  EXPECT_TRUE(fp8::ScaleIsUsable(std::numeric_limits<float>::denorm_min()));
}

TEST_F(ColiKvTest, HeaderErrorsHaveSpecificCodes) {
  const Dims d{2, 4, 2, 0, 0, 10};
  auto code_of = [&](const std::string& bytes) {
    WriteRaw("/s/bad.coli_kv", bytes);
    return ColiKvReader::Open(&env_, "/s/bad.coli_kv").status().code();
  };
  std::string h = SpecHeader(true, d, 0);
  EXPECT_EQ(code_of(h), absl::StatusCode::kOk);
  std::string bad = h;
  bad[6] = '3';  // COLIKV3
  EXPECT_EQ(code_of(bad), absl::StatusCode::kInvalidArgument);
  bad = h;
  bad[36] = 0;  // v2 magic with the v1 tag
  EXPECT_EQ(code_of(bad), absl::StatusCode::kDataLoss);
  bad = SpecHeader(false, d, 0);
  bad[36] = 1;
  EXPECT_EQ(code_of(bad), absl::StatusCode::kDataLoss);
  auto with_dims = [&](Dims x, int32_t nrec = 0) { return code_of(SpecHeader(true, x, nrec)); };
  Dims x = d;
  x.n_layers = 0;
  EXPECT_EQ(with_dims(x), absl::StatusCode::kDataLoss);
  x = d;
  x.n_layers = 5000;
  EXPECT_EQ(with_dims(x), absl::StatusCode::kDataLoss);
  x = d;
  x.kv_lora = -1;
  EXPECT_EQ(with_dims(x), absl::StatusCode::kDataLoss);
  x = d;
  x.nic = 1;  // with index_hd 0
  EXPECT_EQ(with_dims(x), absl::StatusCode::kDataLoss);
  x = d;
  x.index_hd = 4;
  x.nic = 3;  // more than n_layers
  EXPECT_EQ(with_dims(x), absl::StatusCode::kDataLoss);
  x = d;
  x.vocab = 0;
  EXPECT_EQ(with_dims(x), absl::StatusCode::kDataLoss);
  x = {1024, 65536, 65536, 65536, 1024, 10};  // the largest dims: valid, 768 MiB records
  EXPECT_EQ(with_dims(x, 1000), absl::StatusCode::kOk);
  EXPECT_EQ((*ColiKvReader::Open(&env_, "/s/bad.coli_kv"))->nrec(), 0);  // nothing allocated
  x.kv_lora = 65537;
  EXPECT_EQ(with_dims(x), absl::StatusCode::kDataLoss);
  EXPECT_EQ(with_dims(d, -1), absl::StatusCode::kDataLoss);
  EXPECT_EQ(code_of(""), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ColiKvReader::Open(&env_, "/s/missing").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ColiKvTest, WriterErrorsHaveSpecificCodes) {
  const Dims d = RandomDims(rng_);
  const int64_t rb = testing::SpecV2RecordBytes(d);
  auto w = ColiKvWriter::Create(&env_, "/s/w.coli_kv", Version::kV2, d);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(ColiKvWriter::Create(&env_, "/s/w.coli_kv", Version::kV2, d).status().code(),
            absl::StatusCode::kAlreadyExists);
  Dims bad = d;
  bad.vocab = -3;
  EXPECT_EQ(ColiKvWriter::Create(&env_, "/s/x.coli_kv", Version::kV2, bad).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ColiKvWriter::Open(&env_, "/s/none").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ((*w)->Append(std::string(rb + 1, 'x')).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*w)->Append("").code(), absl::StatusCode::kInvalidArgument);
  const std::string rec = SpecV2Record(d, testing::RandomV2Rows(rng_, d));
  ASSERT_TRUE((*w)->Append(rec).ok());
  EXPECT_EQ((*w)->WriteAt(0, 0, "x").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*w)->WriteAt(1, rb, "x").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*w)->Commit(0).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ((*w)->Commit(2).code(), absl::StatusCode::kFailedPrecondition);  // record 1 absent
  EXPECT_EQ((*w)->Truncate(2).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ((*w)->Truncate(-1).code(), absl::StatusCode::kOutOfRange);

  // A full disk: RESOURCE_EXHAUSTED, nothing committed, the writer usable.
  env_.SetSpaceLimit(static_cast<uint64_t>(40 + rb + rb / 2));
  EXPECT_EQ((*w)->Append(rec).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ((*w)->nrec(), 1);
  env_.SetSpaceLimit(0);
  ASSERT_TRUE((*w)->Append(rec).ok());
  EXPECT_EQ((*w)->nrec(), 2);

  // A failed sync breaks the writer for good.
  FaultInjectionEnv::Fault f;
  f.op = FaultInjectionEnv::OpKind::kSync;
  f.error = absl::InternalError("injected EIO");
  env_.AddFault(f);
  EXPECT_EQ((*w)->Append(rec).code(), absl::StatusCode::kInternal);
  EXPECT_EQ((*w)->Append(rec).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*w)->nrec(), 2);
  auto r = ColiKvReader::Open(&env_, "/s/w.coli_kv");
  EXPECT_EQ((*r)->nrec(), 2);
}

TEST_F(ColiKvTest, TruncateThenAppend) {
  const Dims d = RandomDims(rng_);
  const int64_t rb = testing::SpecV2RecordBytes(d);
  auto w = ColiKvWriter::Create(&env_, "/s/t.coli_kv", Version::kV2, d);
  std::string recs;
  for (int p = 0; p < 10; ++p) recs += SpecV2Record(d, testing::RandomV2Rows(rng_, d));
  ASSERT_TRUE((*w)->Append(recs).ok());
  ASSERT_TRUE((*w)->Truncate(4).ok());
  EXPECT_EQ((*w)->nrec(), 4);
  EXPECT_EQ(ReadRaw("/s/t.coli_kv"), SpecHeader(true, d, 4) + recs.substr(0, 4 * rb));
  const std::string more = SpecV2Record(d, testing::RandomV2Rows(rng_, d));
  ASSERT_TRUE((*w)->Append(more).ok());
  EXPECT_EQ(ReadRaw("/s/t.coli_kv"), SpecHeader(true, d, 5) + recs.substr(0, 4 * rb) + more);
  ASSERT_TRUE((*w)->Truncate(0).ok());
  EXPECT_EQ(ReadRaw("/s/t.coli_kv"), SpecHeader(true, d, 0));
}

// Two stages write disjoint layer ranges of the same records in place, in
// any order; once both are synced the records commit whole.
TEST_F(ColiKvTest, InPlaceLayerRangeWrites) {
  Dims d = RandomDims(rng_);
  d.n_layers = std::max(d.n_layers, 2);
  const int split = 1 + static_cast<int>(rng_() % (d.n_layers - 1));
  auto w = ColiKvWriter::Create(&env_, "/s/p.coli_kv", Version::kV2, d);
  const RecordLayout& L = (*w)->layout();
  std::string all;
  for (int p = 0; p < 6; ++p) all += SpecV2Record(d, testing::RandomV2Rows(rng_, d));
  const int64_t rb = L.record_bytes();
  for (int p = 5; p >= 0; --p) {  // stage 2 first, backwards
    const std::string_view rec(all.data() + p * rb, static_cast<size_t>(rb));
    ASSERT_TRUE((*w)->WriteAt(p, L.layer_offset(split),
                              rec.substr(L.layer_offset(split), L.indexer_offset(0) - L.layer_offset(split)))
                    .ok());
  }
  for (int p = 0; p < 6; ++p) {
    const std::string_view rec(all.data() + p * rb, static_cast<size_t>(rb));
    ASSERT_TRUE((*w)->WriteAt(p, 0, rec.substr(0, L.layer_offset(split))).ok());
    ASSERT_TRUE((*w)->WriteAt(p, L.indexer_offset(0), rec.substr(L.indexer_offset(0))).ok());
  }
  ASSERT_TRUE((*w)->Sync().ok());
  ASSERT_TRUE((*w)->Commit(6).ok());
  EXPECT_EQ(ReadRaw("/s/p.coli_kv"), SpecHeader(true, d, 6) + all);
}

TEST_F(ColiKvTest, UpgradeAndConvert) {
  const Dims d = RandomDims(rng_);
  std::vector<testing::V1Rows> rows;
  std::string v1;
  const int n = 1 + static_cast<int>(rng_() % 12);
  for (int p = 0; p < n; ++p) {
    rows.push_back(testing::RandomV1Rows(rng_, d));
    v1 += SpecV1Record(d, rows.back());
  }
  const std::string original = SpecHeader(false, d, n) + v1;
  WriteRaw("/s/u.coli_kv", original);
  ASSERT_TRUE(env_.SyncDir("/s").ok());
  auto before = ColiKvReader::Open(&env_, "/s/u.coli_kv");
  std::string quantised;
  ASSERT_TRUE((*before)->ReadRecords(0, n, RecordFormat::kV2, &quantised).ok());

  ASSERT_TRUE(UpgradeToV2(&env_, "/s/u.coli_kv").ok());
  EXPECT_EQ(ReadRaw("/s/u.coli_kv"), SpecHeader(true, d, n) + quantised);
  EXPECT_FALSE(env_.FileExists("/s/u.coli_kv.tmp"));
  ASSERT_TRUE(UpgradeToV2(&env_, "/s/u.coli_kv").ok());  // already v2: no change
  EXPECT_EQ(ReadRaw("/s/u.coli_kv"), SpecHeader(true, d, n) + quantised);

  // v2 → v1 decodes each value as code · scale.
  ASSERT_TRUE(ConvertFile(&env_, "/s/u.coli_kv", "/s/back.coli_kv", Version::kV1).ok());
  const std::string back = ReadRaw("/s/back.coli_kv");
  ASSERT_EQ(back.substr(0, 40), SpecHeader(false, d, n));
  const int64_t rb1 = testing::SpecV1RecordBytes(d), rb2 = testing::SpecV2RecordBytes(d);
  for (int p = 0; p < n; ++p) {
    const size_t o1 = static_cast<size_t>(40 + p * rb1), o2 = static_cast<size_t>(p * rb2);
    EXPECT_EQ(I32At(back, o1), rows[p].token);
    const float s0 = F32At(quantised, o2 + 4 + d.kv_lora);
    for (int i = 0; i < d.kv_lora; ++i) {
      EXPECT_EQ(F32At(back, o1 + 4 + 4 * i), SpecDecode(quantised[o2 + 4 + i]) * s0);
    }
  }
  // Same-version conversion copies the committed records.
  ASSERT_TRUE(ConvertFile(&env_, "/s/u.coli_kv", "/s/copy.coli_kv", Version::kV2).ok());
  EXPECT_EQ(ReadRaw("/s/copy.coli_kv"), ReadRaw("/s/u.coli_kv"));
  EXPECT_EQ(ConvertFile(&env_, "/s/none", "/s/o", Version::kV2).code(), absl::StatusCode::kNotFound);
}

TEST(ColiKvPosix, RoundTripOnRealFiles) {
  std::string dir = ::testing::TempDir() + "/kv_coli_posix.XXXXXX";
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  std::mt19937_64 rng = FreshRng();
  const Dims d = RandomDims(rng);
  const std::string path = dir + "/s.coli_kv";
  auto w = ColiKvWriter::Create(Env::Default(), path, Version::kV2, d);
  ASSERT_TRUE(w.ok()) << w.status();
  std::string recs;
  for (int p = 0; p < 5; ++p) recs += SpecV2Record(d, testing::RandomV2Rows(rng, d));
  ASSERT_TRUE((*w)->Append(recs).ok());
  ASSERT_TRUE((*w)->Truncate(3).ok());
  auto bytes = ReadFileToString(Env::Default(), path, 1 << 30);
  EXPECT_EQ(*bytes, SpecHeader(true, d, 3) + recs.substr(0, 3 * testing::SpecV2RecordBytes(d)));
}

}  // namespace
}  // namespace strata::kv
