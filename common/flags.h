// A small command-line parser for the strata tools: `--name value`,
// `--name=value`, boolean `--name`, repeatable flags, and positional
// arguments. Unknown flags and missing values are errors (INVALID_ARGUMENT
// with the flag named), so a typo never silently changes behaviour.
//
// Thread-safety: not thread-safe; parse once at start-up.
#ifndef STRATA_COMMON_FLAGS_H_
#define STRATA_COMMON_FLAGS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace strata {

class FlagSet {
 public:
  // Declares a flag. `boolean` flags take no value.
  void Declare(const std::string& name, const std::string& help, bool boolean = false,
               bool repeatable = false);

  // Parses argv[first..argc).
  absl::Status Parse(int argc, char** argv, int first);
  absl::Status Parse(const std::vector<std::string>& args);

  bool Has(const std::string& name) const;
  // The last value given, or `def`.
  std::string Get(const std::string& name, const std::string& def = "") const;
  std::vector<std::string> GetAll(const std::string& name) const;
  // Typed getters: INVALID_ARGUMENT naming the flag when the value does not parse.
  absl::StatusOr<int64_t> GetInt(const std::string& name, int64_t def) const;
  absl::StatusOr<double> GetDouble(const std::string& name, double def) const;
  // "3,17,42" -> {3, 17, 42}
  absl::StatusOr<std::vector<int>> GetIntList(const std::string& name) const;

  const std::vector<std::string>& positional() const { return positional_; }
  std::string Help() const;

 private:
  struct Spec {
    std::string help;
    bool boolean = false;
    bool repeatable = false;
  };
  std::map<std::string, Spec> specs_;
  std::map<std::string, std::vector<std::string>> values_;
  std::vector<std::string> positional_;
};

}  // namespace strata

#endif  // STRATA_COMMON_FLAGS_H_
