// Power-loss durability of the .coli_kv protocols (docs/coli-kv.md,
// "Crash behaviour"): for every crash point (operation index) of append,
// truncate, manifest replacement and the v1 → v2 upgrade, the file system
// crashes there, loses everything not covered by a completed sync, and the
// files are reopened. Every acknowledged (committed) record must be present
// and unaltered, and nothing unacknowledged may be reported as committed: the
// state is the one after the last acknowledged operation, or — for the one
// operation in flight — possibly the state after it.
//
// Each crash point runs twice more with DropSomeUnsyncedData (every unsynced
// write independently lost or kept), the harsher model of a real disk.
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kvstore/coli_kv_file.h"
#include "kvstore/fault_injection_env.h"
#include "kvstore/manifest.h"
#include "kvstore/session_file.h"
#include "kvstore/crash_points.h"
#include "kvstore/test_util.h"

namespace strata::kv {
namespace {

using testing::RunEveryCrashPoint;
using testing::Scenario;

// Parameterised by a repetition index only: every repetition draws fresh
// random dimensions and data.
class PowerLossTest : public ::testing::TestWithParam<int> {
 protected:
  std::mt19937_64 rng_ = testing::FreshRng();
  const std::string dir_ = "/kv";
  const std::string path_ = "/kv/s.coli_kv";
};

// Committed state of the file as a reader sees it: nrec and record bytes.
struct FileState {
  int64_t nrec;
  std::string records;  // stored bytes of [0, nrec)
  bool v2 = true;
};

FileState ReadState(Env* env, const std::string& path) {
  auto r = ColiKvReader::Open(env, path);
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return {-1, "", true};
  FileState st{(*r)->nrec(), "", (*r)->version() == Version::kV2};
  EXPECT_TRUE((*r)->ReadRecords(0, st.nrec, RecordFormat::kStored, &st.records).ok());
  EXPECT_FALSE((*r)->torn());
  return st;
}

TEST_P(PowerLossTest, Append) {
  const Dims d = testing::RandomDims(rng_);
  const int64_t rb = testing::SpecV2RecordBytes(d);
  const std::vector<int> batches = {1, 3, 1, 1, 5, 2};
  std::string all;
  const int initial = 2;
  int total_records = initial;
  for (int b : batches) total_records += b;
  for (int p = 0; p < total_records; ++p) {
    all += testing::SpecV2Record(d, testing::RandomV2Rows(rng_, d));
  }
  std::vector<int64_t> nrec_after = {initial};  // nrec after step k
  for (int b : batches) nrec_after.push_back(nrec_after.back() + b);

  Scenario s;
  s.setup = [&](FaultInjectionEnv& env) {
    ASSERT_TRUE(env.CreateDir(dir_).ok());
    auto w = ColiKvWriter::Create(&env, path_, Version::kV2, d);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->Append(std::string_view(all).substr(0, initial * rb)).ok());
  };
  s.work = [&](FaultInjectionEnv& env) {
    auto w = ColiKvWriter::Open(&env, path_);
    if (!w.ok()) return 0;
    for (size_t k = 0; k < batches.size(); ++k) {
      const std::string_view recs =
          std::string_view(all).substr(nrec_after[k] * rb, batches[k] * rb);
      if (!(*w)->Append(recs).ok()) return static_cast<int>(k);
    }
    return static_cast<int>(batches.size());
  };
  s.check = [&](FaultInjectionEnv& env, int acked) {
    const FileState st = ReadState(&env, path_);
    const int64_t lo = nrec_after[acked];
    const int64_t hi = nrec_after[std::min<size_t>(acked + 1, batches.size())];
    ASSERT_TRUE(st.nrec == lo || st.nrec == hi) << "nrec " << st.nrec << ", acknowledged " << lo;
    EXPECT_EQ(st.records, all.substr(0, st.nrec * rb));
    // The file stays appendable after recovery.
    auto w = ColiKvWriter::Open(&env, path_);
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE((*w)->Append(std::string_view(all).substr(0, rb)).ok());
  };
  const int points = RunEveryCrashPoint(s, rng_());
  EXPECT_GE(points, 2 * static_cast<int>(batches.size()));
}

TEST_P(PowerLossTest, AppendWithDropAllIsExact) {
  // With every unsynced byte lost, the committed count is exactly what was
  // acknowledged: an Append whose final sync did not return never shows.
  const Dims d = testing::RandomDims(rng_);
  const int64_t rb = testing::SpecV2RecordBytes(d);
  std::string all;
  for (int p = 0; p < 6; ++p) all += testing::SpecV2Record(d, testing::RandomV2Rows(rng_, d));
  int64_t total;
  {
    FaultInjectionEnv env;
    ASSERT_TRUE(env.CreateDir(dir_).ok());
    const int64_t base = env.operation_count();
    auto w = ColiKvWriter::Create(&env, path_, Version::kV2, d);
    for (int p = 0; p < 6; ++p) ASSERT_TRUE((*w)->Append(all.substr(p * rb, rb)).ok());
    total = env.operation_count() - base;
  }
  for (int64_t i = 0; i < total; ++i) {
    FaultInjectionEnv env;
    ASSERT_TRUE(env.CreateDir(dir_).ok());
    env.CrashAtOperation(env.operation_count() + i);
    int acked = -1;  // -1: the file's creation was not acknowledged
    auto w = ColiKvWriter::Create(&env, path_, Version::kV2, d);
    if (w.ok()) {
      acked = 0;
      for (int p = 0; p < 6 && (*w)->Append(all.substr(p * rb, rb)).ok(); ++p) acked = p + 1;
    }
    env.DropUnsyncedData();
    if (acked < 0) {
      // Not acknowledged: absent, or present and empty.
      if (env.FileExists(path_)) {
        EXPECT_EQ(ReadState(&env, path_).nrec, 0);
      }
      continue;
    }
    const FileState st = ReadState(&env, path_);
    EXPECT_EQ(st.nrec, acked) << "crash point " << i;
    EXPECT_EQ(st.records, all.substr(0, acked * rb));
  }
}

TEST_P(PowerLossTest, Truncate) {
  const Dims d = testing::RandomDims(rng_);
  const int64_t rb = testing::SpecV2RecordBytes(d);
  std::string all;
  for (int p = 0; p < 12; ++p) all += testing::SpecV2Record(d, testing::RandomV2Rows(rng_, d));
  const std::string fresh = testing::SpecV2Record(d, testing::RandomV2Rows(rng_, d));
  // Steps: truncate to 7, append `fresh`, truncate to 3, truncate to 3 again.
  // Expected bytes after each step:
  const std::vector<std::string> after = {all.substr(0, 12 * rb), all.substr(0, 7 * rb),
                                          all.substr(0, 7 * rb) + fresh, all.substr(0, 3 * rb),
                                          all.substr(0, 3 * rb)};
  Scenario s;
  s.setup = [&](FaultInjectionEnv& env) {
    ASSERT_TRUE(env.CreateDir(dir_).ok());
    auto w = ColiKvWriter::Create(&env, path_, Version::kV2, d);
    ASSERT_TRUE((*w)->Append(all).ok());
  };
  s.work = [&](FaultInjectionEnv& env) {
    auto w = ColiKvWriter::Open(&env, path_);
    if (!w.ok()) return 0;
    if (!(*w)->Truncate(7).ok()) return 0;
    if (!(*w)->Append(fresh).ok()) return 1;
    if (!(*w)->Truncate(3).ok()) return 2;
    if (!(*w)->Truncate(3).ok()) return 3;
    return 4;
  };
  s.check = [&](FaultInjectionEnv& env, int acked) {
    const FileState st = ReadState(&env, path_);
    const std::string& before = after[acked];
    const std::string& next = after[std::min(acked + 1, 4)];
    ASSERT_TRUE(st.records == before || st.records == next)
        << "nrec " << st.nrec << " matches neither the acknowledged state ("
        << before.size() / rb << " records) nor the one in flight (" << next.size() / rb << ")";
  };
  RunEveryCrashPoint(s, rng_());
}

TEST_P(PowerLossTest, ManifestReplacement) {
  std::vector<Manifest> versions;
  for (int i = 0; i < 4; ++i) {
    Manifest m;
    m.fingerprint = rng_();
    m.dims = testing::RandomDims(rng_);
    m.dims.nic = 0;  // no indexer slots to list
    m.dims.index_hd = 0;
    m.chunk_crc32c.resize(rng_() % 50, static_cast<uint32_t>(rng_()));
    m.turn_watermark = static_cast<int64_t>(rng_() % 1000);
    m.metadata["turn"] = std::to_string(i);
    versions.push_back(m);
  }
  const std::string mpath = ManifestPath(path_);
  Scenario s;
  s.setup = [&](FaultInjectionEnv& env) {
    ASSERT_TRUE(env.CreateDir(dir_).ok());
    ASSERT_TRUE(WriteManifest(&env, mpath, versions[0]).ok());
  };
  s.work = [&](FaultInjectionEnv& env) {
    for (int k = 1; k < 4; ++k) {
      if (!WriteManifest(&env, mpath, versions[k]).ok()) return k - 1;
    }
    return 3;
  };
  s.check = [&](FaultInjectionEnv& env, int acked) {
    auto m = ReadManifest(&env, mpath);
    ASSERT_TRUE(m.ok()) << m.status();  // never torn, never missing
    const bool is_acked = *m == versions[acked];
    const bool is_next = acked + 1 < 4 && *m == versions[acked + 1];
    EXPECT_TRUE(is_acked || is_next) << "manifest of turn " << m->metadata["turn"]
                                     << ", acknowledged turn " << acked;
  };
  RunEveryCrashPoint(s, rng_());
}

TEST_P(PowerLossTest, UpgradeV1ToV2) {
  Dims d = testing::RandomDims(rng_);
  d.nic = d.index_hd > 0 ? d.n_layers : 0;  // default indexer map for the import
  std::string v1;
  const int n = 13;  // three checksummed chunks of 4 and one record more
  // Copied two records per write: the upgrade writes its temporary file in
  // seven pieces, each a crash point.
  const int64_t copy_bytes = 2 * testing::SpecV1RecordBytes(d);
  for (int p = 0; p < n; ++p) v1 += testing::SpecV1Record(d, testing::RandomV1Rows(rng_, d));
  const std::string original = testing::SpecHeader(false, d, n) + v1;
  std::string quantised;
  {
    FaultInjectionEnv env;
    ASSERT_TRUE(env.CreateDir(dir_).ok());
    auto f = env.Open(path_, OpenMode::kCreate);
    ASSERT_TRUE((*f)->Write(0, original).ok());
    auto r = ColiKvReader::Open(&env, path_);
    ASSERT_TRUE((*r)->ReadRecords(0, n, RecordFormat::kV2, &quantised).ok());
  }
  const uint64_t fp = rng_();
  Scenario s;
  s.setup = [&](FaultInjectionEnv& env) {
    ASSERT_TRUE(env.CreateDir(dir_).ok());
    auto f = env.Open(path_, OpenMode::kCreate);
    ASSERT_TRUE((*f)->Write(0, original).ok());
    ASSERT_TRUE((*f)->Sync().ok());
    ASSERT_TRUE(env.SyncDir(dir_).ok());
    ImportOptions o;
    o.dims = d;
    o.fingerprint = fp;
    o.chunk_records = 4;
    ASSERT_TRUE(ImportSession(&env, path_, o).ok());
  };
  s.work = [&](FaultInjectionEnv& env) { return UpgradeToV2(&env, path_, copy_bytes).ok() ? 1 : 0; };
  s.check = [&](FaultInjectionEnv& env, int acked) {
    auto bytes = ReadFileToString(&env, path_, 1 << 30);
    ASSERT_TRUE(bytes.ok()) << bytes.status();  // the session file never disappears
    const std::string v2 = testing::SpecHeader(true, d, n) + quantised;
    if (acked == 1) {
      EXPECT_EQ(*bytes, v2);
    } else {
      EXPECT_TRUE(*bytes == original || *bytes == v2) << "neither the intact v1 nor the complete v2";
    }
    // Either way the manifest's checksums (over the v2 encoding) still hold.
    CheckOptions check;
    check.expected_fingerprint = fp;
    auto session = OpenCheckedSession(&env, path_, check);
    ASSERT_TRUE(session.ok()) << session.status();
    EXPECT_EQ(session->reader->nrec(), n);
  };
  RunEveryCrashPoint(s, rng_());
}

// Import of a foreign file of several checksummed chunks and a tail: the
// manifest appears whole (and verifies) or not at all; the data file is never
// touched.
TEST_P(PowerLossTest, ImportAcrossSeveralChunks) {
  Dims d = testing::RandomDims(rng_);
  d.nic = d.index_hd > 0 ? d.n_layers : 0;
  const bool v1 = rng_() % 2;
  const int n = 4 * 3 + 1 + static_cast<int>(rng_() % 3);
  std::string records;
  for (int p = 0; p < n; ++p) {
    records += v1 ? testing::SpecV1Record(d, testing::RandomV1Rows(rng_, d))
                  : testing::SpecV2Record(d, testing::RandomV2Rows(rng_, d));
  }
  const std::string original = testing::SpecHeader(!v1, d, n) + records;
  const uint64_t fp = rng_();
  ImportOptions o;
  o.dims = d;
  o.fingerprint = fp;
  o.chunk_records = 4;
  Scenario s;
  s.setup = [&](FaultInjectionEnv& env) {
    ASSERT_TRUE(env.CreateDir(dir_).ok());
    auto f = env.Open(path_, OpenMode::kCreate);
    ASSERT_TRUE((*f)->Write(0, original).ok());
    ASSERT_TRUE((*f)->Sync().ok());
    ASSERT_TRUE(env.SyncDir(dir_).ok());
  };
  s.work = [&](FaultInjectionEnv& env) { return ImportSession(&env, path_, o).ok() ? 1 : 0; };
  s.check = [&](FaultInjectionEnv& env, int acked) {
    EXPECT_EQ(*ReadFileToString(&env, path_, 1 << 30), original);
    CheckOptions check;
    check.expected_fingerprint = fp;
    auto session = OpenCheckedSession(&env, path_, check);
    if (acked == 0 && absl::IsFailedPrecondition(session.status()) && !env.FileExists(ManifestPath(path_))) {
      return;  // not imported: no manifest at all
    }
    ASSERT_TRUE(session.ok()) << session.status();
    EXPECT_EQ(session->manifest.chunk_crc32c.size(), 3u);
    EXPECT_EQ(session->manifest.tail_records, n - 12);
    EXPECT_EQ(session->manifest.turn_watermark, n);
  };
  RunEveryCrashPoint(s, rng_());
}

INSTANTIATE_TEST_SUITE_P(Repetitions, PowerLossTest, ::testing::Range(0, 6));

}  // namespace
}  // namespace strata::kv
