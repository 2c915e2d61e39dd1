#include "common/flags.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace strata {

void FlagSet::Declare(const std::string& name, const std::string& help, bool boolean, bool repeatable) {
  specs_[name] = Spec{help, boolean, repeatable};
}

absl::Status FlagSet::Parse(int argc, char** argv, int first) {
  std::vector<std::string> args;
  for (int i = first; i < argc; ++i) args.emplace_back(argv[i]);
  return Parse(args);
}

absl::Status FlagSet::Parse(const std::vector<std::string>& args) {
  bool only_positional = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (only_positional || a.size() < 3 || a.compare(0, 2, "--") != 0) {
      if (a == "--") {
        only_positional = true;
        continue;
      }
      positional_.push_back(a);
      continue;
    }
    std::string name = a.substr(2), value;
    bool has_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    auto it = specs_.find(name);
    if (it == specs_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name, " (see --help)"));
    }
    if (it->second.boolean) {
      if (has_value && value != "true" && value != "false") {
        return absl::InvalidArgumentError(absl::StrCat("flag --", name, " takes no value or true/false, got '", value, "'"));
      }
      if (has_value && value == "false") {
        values_.erase(name);
        continue;
      }
      value = "true";
    } else if (!has_value) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(absl::StrCat("flag --", name, " needs a value"));
      }
      value = args[++i];
    }
    auto& vals = values_[name];
    if (!vals.empty() && !it->second.repeatable && !it->second.boolean) {
      return absl::InvalidArgumentError(absl::StrCat("flag --", name, " given more than once"));
    }
    vals.push_back(value);
  }
  return absl::OkStatus();
}

bool FlagSet::Has(const std::string& name) const { return values_.count(name) > 0; }

std::string FlagSet::Get(const std::string& name, const std::string& def) const {
  auto it = values_.find(name);
  return it == values_.end() ? def : it->second.back();
}

std::vector<std::string> FlagSet::GetAll(const std::string& name) const {
  auto it = values_.find(name);
  return it == values_.end() ? std::vector<std::string>{} : it->second;
}

absl::StatusOr<int64_t> FlagSet::GetInt(const std::string& name, int64_t def) const {
  if (!Has(name)) return def;
  int64_t v;
  if (!absl::SimpleAtoi(Get(name), &v)) {
    return absl::InvalidArgumentError(absl::StrCat("flag --", name, " must be an integer, got '", Get(name), "'"));
  }
  return v;
}

absl::StatusOr<double> FlagSet::GetDouble(const std::string& name, double def) const {
  if (!Has(name)) return def;
  double v;
  if (!absl::SimpleAtod(Get(name), &v) || !std::isfinite(v)) {
    return absl::InvalidArgumentError(absl::StrCat("flag --", name, " must be a finite number, got '", Get(name), "'"));
  }
  return v;
}

absl::StatusOr<std::vector<int>> FlagSet::GetIntList(const std::string& name) const {
  std::vector<int> out;
  if (!Has(name)) return out;
  for (absl::string_view part : absl::StrSplit(Get(name), ',', absl::SkipWhitespace())) {
    int v;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &v)) {
      return absl::InvalidArgumentError(absl::StrCat("flag --", name, ": '", std::string(part), "' is not an integer"));
    }
    out.push_back(v);
  }
  return out;
}

std::string FlagSet::Help() const {
  std::string s;
  for (const auto& [name, spec] : specs_) {
    absl::StrAppend(&s, "  --", name, spec.boolean ? "" : " VALUE", "\n      ", spec.help, "\n");
  }
  return s;
}

}  // namespace strata
