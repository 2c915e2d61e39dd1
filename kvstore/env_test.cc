#include "kvstore/env.h"

#include <stdlib.h>

#include <algorithm>
#include <cerrno>
#include <random>
#include <set>
#include <string>

#include "common/testing/test_seed.h"
#include "gtest/gtest.h"
#include "kvstore/fault_injection_env.h"

namespace strata::kv {
namespace {

std::string MakeTempDir() {
  std::string tmpl = ::testing::TempDir() + "/kv_env_test.XXXXXX";
  char* d = ::mkdtemp(tmpl.data());
  EXPECT_NE(d, nullptr);
  return tmpl;
}

std::string RandomBytes(std::mt19937_64& rng, size_t n) {
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

std::string ReadAll(Env* env, const std::string& path) {
  absl::StatusOr<std::string> s = ReadFileToString(env, path, 1 << 30);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : std::string();
}

// The same contract checks run on both implementations.
void ExerciseEnv(Env* env, const std::string& dir) {
  std::mt19937_64 rng(strata::testing::TestSeed());
  const std::string a = JoinPath(dir, "a");
  const std::string b = JoinPath(dir, "b");

  EXPECT_EQ(env->Open(a, OpenMode::kRead).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(env->Open(a, OpenMode::kReadWrite).status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(env->FileExists(a));

  auto f = env->Open(a, OpenMode::kCreate);
  ASSERT_TRUE(f.ok()) << f.status();
  const std::string x = RandomBytes(rng, 1000);
  ASSERT_TRUE((*f)->Write(0, x).ok());
  const std::string y = RandomBytes(rng, 10);
  ASSERT_TRUE((*f)->Write(1200, y).ok());  // beyond the end: a zero-filled hole
  ASSERT_TRUE((*f)->Sync().ok());
  EXPECT_EQ(*(*f)->Size(), 1210u);
  std::string buf(2000, 'x');
  auto got = (*f)->Read(990, 300, buf.data());
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, 220u);  // short at the end of the file
  EXPECT_EQ(buf.substr(0, 10), x.substr(990, 10));
  EXPECT_EQ(buf.substr(10, 200), std::string(200, '\0'));
  EXPECT_EQ(buf.substr(210, 10), y);
  ASSERT_TRUE((*f)->Truncate(500).ok());
  EXPECT_EQ(*(*f)->Size(), 500u);
  ASSERT_TRUE((*f)->Close().ok());
  EXPECT_EQ((*f)->Write(0, "z").code(), absl::StatusCode::kFailedPrecondition);

  EXPECT_EQ(*env->FileSize(a), 500u);
  EXPECT_EQ(ReadAll(env, a), x.substr(0, 500));
  EXPECT_EQ(ReadFileToString(env, a, 499).status().code(), absl::StatusCode::kFailedPrecondition);

  ASSERT_TRUE(WriteFileAtomically(env, b, "hello").ok());
  EXPECT_EQ(ReadAll(env, b), "hello");
  EXPECT_FALSE(env->FileExists(b + ".tmp"));
  ASSERT_TRUE(env->Rename(b, a).ok());
  EXPECT_EQ(ReadAll(env, a), "hello");
  EXPECT_FALSE(env->FileExists(b));
  EXPECT_EQ(env->Rename(b, a).code(), absl::StatusCode::kNotFound);

  auto names = env->ListDir(dir);
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(*names, std::vector<std::string>{"a"});
  ASSERT_TRUE(env->SyncDir(dir).ok());

  auto t = env->Open(a, OpenMode::kCreateTruncate);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*(*t)->Size(), 0u);
  auto r = env->Open(a, OpenMode::kRead);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE((*r)->Write(0, "no").ok());

  ASSERT_TRUE(env->Delete(a).ok());
  EXPECT_EQ(env->Delete(a).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(env->FileSize(a).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(env->ListDir(JoinPath(dir, "missing")).status().code(), absl::StatusCode::kNotFound);
}

TEST(PosixEnv, Contract) {
  const std::string dir = MakeTempDir();
  ExerciseEnv(Env::Default(), dir);
  ASSERT_TRUE(Env::Default()->CreateDir(JoinPath(dir, "x/y")).ok());
  EXPECT_TRUE(Env::Default()->FileExists(JoinPath(dir, "x/y")));
}

TEST(FaultInjectionEnv, Contract) {
  FaultInjectionEnv env;
  ASSERT_TRUE(env.CreateDir("/d").ok());
  ExerciseEnv(&env, "/d");
}

TEST(Env, ErrnoStatusCodes) {
  EXPECT_EQ(ErrnoStatus(ENOENT, "x").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ErrnoStatus(EEXIST, "x").code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(ErrnoStatus(ENOSPC, "x").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ErrnoStatus(EDQUOT, "x").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ErrnoStatus(EACCES, "x").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(ErrnoStatus(EIO, "x").code(), absl::StatusCode::kInternal);
  EXPECT_EQ(DirName("a/b/c"), "a/b");
  EXPECT_EQ(DirName("c"), ".");
  EXPECT_EQ(DirName("/c"), "/");
  EXPECT_EQ(JoinPath("a/", "b"), "a/b");
  EXPECT_EQ(JoinPath("a", "b"), "a/b");
}

class FaultEnvTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(env_.CreateDir("/d").ok()); }

  void WriteFile(const std::string& path, const std::string& data, bool sync) {
    auto f = env_.Open(path, OpenMode::kCreate);
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE((*f)->Write(0, data).ok());
    if (sync) {
      ASSERT_TRUE((*f)->Sync().ok());
    }
  }

  FaultInjectionEnv env_;
  std::mt19937_64 rng_{strata::testing::TestSeed()};
};

TEST_F(FaultEnvTest, UnsyncedDataIsDropped) {
  const std::string a = RandomBytes(rng_, 100), b = RandomBytes(rng_, 50);
  WriteFile("/d/f", a, /*sync=*/true);
  ASSERT_TRUE(env_.SyncDir("/d").ok());
  {
    auto f = env_.Open("/d/f", OpenMode::kReadWrite);
    ASSERT_TRUE((*f)->Write(20, b).ok());  // in place, never synced
    ASSERT_TRUE((*f)->Write(100, b).ok());
  }
  std::string live = a;
  live.replace(20, 50, b);
  live += b;
  EXPECT_EQ(ReadAll(&env_, "/d/f"), live);
  env_.DropUnsyncedData();
  EXPECT_EQ(ReadAll(&env_, "/d/f"), a);
}

TEST_F(FaultEnvTest, EntriesNeedADirectorySync) {
  WriteFile("/d/synced", "x", true);
  ASSERT_TRUE(env_.SyncDir("/d").ok());
  WriteFile("/d/new", "y", true);  // data synced, entry not
  ASSERT_TRUE(env_.Rename("/d/synced", "/d/renamed").ok());
  env_.DropUnsyncedData();
  EXPECT_FALSE(env_.FileExists("/d/new"));
  EXPECT_FALSE(env_.FileExists("/d/renamed"));
  EXPECT_EQ(ReadAll(&env_, "/d/synced"), "x");

  ASSERT_TRUE(env_.Rename("/d/synced", "/d/renamed").ok());
  ASSERT_TRUE(env_.Delete("/d/renamed").ok());
  env_.DropUnsyncedData();
  EXPECT_EQ(ReadAll(&env_, "/d/synced"), "x");  // the delete was not durable either

  ASSERT_TRUE(env_.Rename("/d/synced", "/d/renamed").ok());
  ASSERT_TRUE(env_.SyncDir("/d").ok());
  env_.DropUnsyncedData();
  EXPECT_FALSE(env_.FileExists("/d/synced"));
  EXPECT_EQ(ReadAll(&env_, "/d/renamed"), "x");
}

TEST_F(FaultEnvTest, CrashAtOperation) {
  const int64_t base = env_.operation_count();  // SetUp's CreateDir
  WriteFile("/d/f", "abc", true);                // create, write, sync
  EXPECT_EQ(env_.operation_count(), base + 3);
  auto f = env_.Open("/d/f", OpenMode::kReadWrite);  // not counted
  ASSERT_TRUE(f.ok());
  env_.CrashAtOperation(base + 4);
  EXPECT_TRUE((*f)->Write(0, "X").ok());                        // operation base + 3
  EXPECT_EQ((*f)->Sync().code(), absl::StatusCode::kInternal);  // base + 4: crash
  EXPECT_TRUE(env_.crashed());
  std::string buf(3, '\0');
  EXPECT_FALSE((*f)->Read(0, 3, buf.data()).ok());
  EXPECT_FALSE(env_.Open("/d/g", OpenMode::kCreate).ok());
  env_.DropUnsyncedData();
  EXPECT_FALSE(env_.crashed());
  EXPECT_EQ(env_.operation_count(), 0);
  EXPECT_FALSE((*f)->Read(0, 3, buf.data()).ok());  // handle from before the reboot
  EXPECT_FALSE(env_.FileExists("/d/f"));            // its directory was never synced
}

TEST_F(FaultEnvTest, InjectedFaults) {
  FaultInjectionEnv::Fault fault;
  fault.op = FaultInjectionEnv::OpKind::kWrite;
  fault.path_contains = "victim";
  fault.skip = 1;
  fault.times = 2;
  env_.AddFault(fault);
  auto v = env_.Open("/d/victim", OpenMode::kCreate);
  auto o = env_.Open("/d/other", OpenMode::kCreate);
  EXPECT_TRUE((*o)->Write(0, "1").ok());
  EXPECT_TRUE((*v)->Write(0, "1").ok());  // skipped
  EXPECT_EQ((*v)->Write(0, "2").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ((*v)->Write(0, "3").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE((*v)->Write(0, "4").ok());
  EXPECT_EQ(ReadAll(&env_, "/d/victim"), "4");
  EXPECT_TRUE((*o)->Sync().ok());

  env_.ClearFaults();
  env_.SetSpaceLimit(100);
  EXPECT_TRUE((*o)->Write(0, std::string(98, 'a')).ok());  // 98 + 1 bytes in all
  EXPECT_EQ((*v)->Write(0, std::string(3, 'b')).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE((*v)->Write(0, "c").ok());  // overwrite in place: no growth
}

// Every outcome of DropSomeUnsyncedData is a state some real disk could be
// in: each file holds its durable bytes with some of the unsynced writes
// applied, and a rename is either wholly there or wholly absent.
TEST_F(FaultEnvTest, DropSomeKeepsAPossibleState) {
  std::set<std::string> seen;
  for (uint64_t seed = 0; seed < 64; ++seed) {
    FaultInjectionEnv env;
    ASSERT_TRUE(env.CreateDir("/d").ok());
    {
      auto f = env.Open("/d/f", OpenMode::kCreate);
      ASSERT_TRUE((*f)->Write(0, "aaaa").ok());
      ASSERT_TRUE((*f)->Sync().ok());
      ASSERT_TRUE(env.SyncDir("/d").ok());
      ASSERT_TRUE((*f)->Write(0, "b").ok());
      ASSERT_TRUE((*f)->Write(3, "c").ok());
    }
    ASSERT_TRUE(env.Rename("/d/f", "/d/g").ok());
    env.DropSomeUnsyncedData(seed);
    const bool f = env.FileExists("/d/f"), g = env.FileExists("/d/g");
    ASSERT_NE(f, g) << "seed " << seed;
    const std::string s = ReadAll(&env, f ? "/d/f" : "/d/g");
    ASSERT_TRUE(s == "aaaa" || s == "baaa" || s == "aaac" || s == "baac") << s;
    seen.insert(s + (f ? "f" : "g"));
  }
  EXPECT_GT(seen.size(), 3u);  // the outcomes really vary
}

// A torn write: each sector of an unsynced write reaches the disk whole or
// not at all, on its own, and some outcomes mix old and new sectors.
TEST_F(FaultEnvTest, DropSomeTearsWritesAtSectorBoundaries) {
  constexpr uint64_t kSector = FaultInjectionEnv::kSectorBytes;
  const uint64_t offset = kSector / 2;        // starts mid-sector
  const uint64_t size = 3 * kSector;          // spans four sectors
  const uint64_t file_size = offset + size + 7;
  int torn = 0;
  for (uint64_t seed = 0; seed < 64; ++seed) {
    FaultInjectionEnv env;
    ASSERT_TRUE(env.CreateDir("/d").ok());
    {
      auto f = env.Open("/d/f", OpenMode::kCreate);
      ASSERT_TRUE((*f)->Write(0, std::string(file_size, 'o')).ok());
      ASSERT_TRUE((*f)->Sync().ok());
      ASSERT_TRUE(env.SyncDir("/d").ok());
      ASSERT_TRUE((*f)->Write(offset, std::string(size, 'n')).ok());
    }
    env.DropSomeUnsyncedData(seed);
    const std::string s = ReadAll(&env, "/d/f");
    ASSERT_EQ(s.size(), file_size);
    std::set<char> kinds;
    for (uint64_t sector = 0; sector * kSector < file_size; ++sector) {
      const uint64_t b = sector * kSector, e = std::min(file_size, b + kSector);
      const uint64_t wb = std::max(b, offset), we = std::min(e, offset + size);
      for (uint64_t i = b; i < e; ++i) {
        if (i < wb || i >= we) ASSERT_EQ(s[i], 'o') << "byte " << i << " outside the write changed";
      }
      if (wb >= we) continue;
      const char first = s[wb];
      for (uint64_t i = wb; i < we; ++i) {
        ASSERT_EQ(s[i], first) << "sector " << sector << " is torn inside (seed " << seed << ")";
      }
      kinds.insert(first);
    }
    if (kinds.size() == 2) ++torn;
  }
  EXPECT_GT(torn, 0) << "no outcome mixed old and new sectors";
}

}  // namespace
}  // namespace strata::kv
