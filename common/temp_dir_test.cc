#include "common/temp_dir.h"

#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

TEST(TempDirTest, EachCallMakesANewEmptyDirectory) {
  auto a = MakeTempDir("strata_temp_dir_test_");
  auto b = MakeTempDir("strata_temp_dir_test_");
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_NE(*a, *b);
  EXPECT_TRUE(fs::is_directory(*a));
  EXPECT_TRUE(fs::is_empty(*a));
  EXPECT_EQ(fs::path(*a).filename().string().rfind("strata_temp_dir_test_", 0), 0u);
  // What a directory holds never shows up in the next one.
  std::ofstream(fs::path(*a) / "stale") << "x";
  auto c = MakeTempDir("strata_temp_dir_test_");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(fs::is_empty(*c));
  for (const auto& d : {*a, *b, *c}) fs::remove_all(d);
}

TEST(TempDirTest, AnUnwritableTempDirIsAnError) {
  const char* old = getenv("TMPDIR");
  const std::string saved = old ? old : "";
  setenv("TMPDIR", "/proc/strata_no_such_dir", 1);
  auto d = MakeTempDir("x_");
  if (old) {
    setenv("TMPDIR", saved.c_str(), 1);
  } else {
    unsetenv("TMPDIR");
  }
  EXPECT_FALSE(d.ok());
}

}  // namespace
}  // namespace strata
