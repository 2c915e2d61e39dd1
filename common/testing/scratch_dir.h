// Scratch directories for tests: each call makes a new, empty directory under
// the test temp dir (mkdtemp), so a test never picks up what an earlier run
// left behind. (Names built from the pid are not enough: a container that runs
// the same suite again hands out the same pids, and a stale log or store in a
// reused directory reads as this run's.)
//
//   const std::string dir = strata::MakeScratchDir("cli_test_");
//   strata::ScratchDir kv("kv_");  // removed again by its destructor
#ifndef STRATA_COMMON_TESTING_SCRATCH_DIR_H_
#define STRATA_COMMON_TESTING_SCRATCH_DIR_H_

#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>

#include "common/temp_dir.h"
#include "gtest/gtest.h"

namespace strata {

// Returns the new directory's path, "<test temp dir>/<prefix>XXXXXX" (see
// MakeTempDirIn; the test must link strata::common). A failure to make it
// fails the current test and returns the path that was tried.
inline std::string MakeScratchDir(std::string_view prefix) {
  absl::StatusOr<std::string> dir = MakeTempDirIn(::testing::TempDir(), prefix);
  if (dir.ok()) return *dir;
  ADD_FAILURE() << "cannot make a scratch directory: " << dir.status().message();
  return (std::filesystem::path(::testing::TempDir()) / (std::string(prefix) + "XXXXXX")).string();
}

// A scratch directory removed (with its contents) when the object goes away:
// declare it before whatever writes into it, so that the writers stop first.
class ScratchDir {
 public:
  explicit ScratchDir(std::string_view prefix) : path_(MakeScratchDir(prefix)) {}
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace strata

#endif  // STRATA_COMMON_TESTING_SCRATCH_DIR_H_
