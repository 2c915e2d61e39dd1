// A new, empty directory under the system temp dir (mkdtemp), for tools that
// write a scratch model or store: never one an earlier run left behind.
#ifndef STRATA_COMMON_TEMP_DIR_H_
#define STRATA_COMMON_TEMP_DIR_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace strata {

// Makes "<temp dir>/<prefix>XXXXXX" and returns its path.
absl::StatusOr<std::string> MakeTempDir(std::string_view prefix);

// The same under `base` (tests pass their own temp dir).
absl::StatusOr<std::string> MakeTempDirIn(const std::string& base, std::string_view prefix);

}  // namespace strata

#endif  // STRATA_COMMON_TEMP_DIR_H_
