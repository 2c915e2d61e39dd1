#include "common/temp_dir.h"

#include <stdlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"

namespace strata {

absl::StatusOr<std::string> MakeTempDirIn(const std::string& base, std::string_view prefix) {
  std::string path = (std::filesystem::path(base) / (std::string(prefix) + "XXXXXX")).string();
  if (mkdtemp(path.data()) == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("cannot make a directory ", path, ": ", std::strerror(errno)));
  }
  return path;
}

absl::StatusOr<std::string> MakeTempDir(std::string_view prefix) {
  std::error_code ec;
  const std::filesystem::path base = std::filesystem::temp_directory_path(ec);
  if (ec) return absl::FailedPreconditionError(absl::StrCat("no temp directory: ", ec.message()));
  return MakeTempDirIn(base.string(), prefix);
}

}  // namespace strata
