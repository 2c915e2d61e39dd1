#include "model/tokenizer_pretokenizer.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/tokenizer_json_util.h"
#include "model/tokenizer_utf8.h"

namespace strata::tokenizer_internal {
namespace {

// GPT-2's pre-tokenization regex (ByteLevel with use_regex = true).
constexpr char kGpt2Pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

std::string ToByteLevel(std::string_view text) {
  const auto& table = ByteToChar();
  std::string out;
  out.reserve(text.size() * 2);
  for (char c : text) out += table[static_cast<unsigned char>(c)];
  return out;
}

absl::StatusOr<SplitBehavior> ParseBehavior(const nlohmann::json& value,
                                            const std::string& path) {
  if (!value.is_string()) return JsonTypeError(path, "a string", value);
  const std::string name = value.get<std::string>();
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  return JsonInvalid(path, absl::StrCat("unknown split behavior \"", name, "\""));
}

absl::StatusOr<std::unique_ptr<Regex>> CompileAt(std::string_view pattern,
                                                 const std::string& path) {
  auto regex = Regex::Compile(pattern);
  if (!regex.ok()) {
    return JsonInvalid(path, absl::StrCat(regex.status().message(), " in /", ToAbsl(pattern), "/"));
  }
  return regex;
}

}  // namespace

struct PreTokenizer::Step {
  enum class Kind { kSplit, kByteLevel, kDigits };
  Kind kind = Kind::kSplit;
  std::unique_ptr<Regex> regex;  // null: no splitting (ByteLevel without regex)
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;
};

PreTokenizer::PreTokenizer() = default;
PreTokenizer::~PreTokenizer() = default;

absl::StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizer::FromJson(
    const nlohmann::json& json, const std::string& path) {
  std::unique_ptr<PreTokenizer> pre(new PreTokenizer());
  if (!json.is_null()) RETURN_IF_ERROR(pre->AddSteps(json, path));
  return pre;
}

absl::Status PreTokenizer::AddSteps(const nlohmann::json& json, const std::string& path) {
  ASSIGN_OR_RETURN(const std::string type, JsonTypeName(json, path));
  if (type == "Sequence") {
    auto it = json.find("pretokenizers");
    if (it == json.end() || !it->is_array()) {
      return JsonTypeError(path + ".pretokenizers", "an array",
                           it == json.end() ? nlohmann::json() : *it);
    }
    for (size_t i = 0; i < it->size(); ++i) {
      RETURN_IF_ERROR(AddSteps((*it)[i], absl::StrCat(path, ".pretokenizers[", i, "]")));
    }
    return absl::OkStatus();
  }
  auto step = std::make_unique<Step>();
  if (type == "Split") {
    step->kind = Step::Kind::kSplit;
    auto pattern = json.find("pattern");
    if (pattern == json.end() || !pattern->is_object() || pattern->size() != 1) {
      return JsonTypeError(path + ".pattern", "{\"Regex\": ...} or {\"String\": ...}",
                           pattern == json.end() ? nlohmann::json() : *pattern);
    }
    const std::string pattern_path = path + ".pattern";
    if (auto r = pattern->find("Regex"); r != pattern->end()) {
      if (!r->is_string()) return JsonTypeError(pattern_path + ".Regex", "a string", *r);
      ASSIGN_OR_RETURN(step->regex, CompileAt(r->get<std::string>(), pattern_path + ".Regex"));
    } else if (auto s = pattern->find("String"); s != pattern->end()) {
      if (!s->is_string()) return JsonTypeError(pattern_path + ".String", "a string", *s);
      ASSIGN_OR_RETURN(step->regex, CompileAt(EscapeRegexLiteral(s->get<std::string>()),
                                              pattern_path + ".String"));
    } else {
      return JsonTypeError(pattern_path, "{\"Regex\": ...} or {\"String\": ...}", *pattern);
    }
    auto behavior = json.find("behavior");
    if (behavior == json.end()) return JsonInvalid(path, "missing \"behavior\"");
    ASSIGN_OR_RETURN(step->behavior, ParseBehavior(*behavior, path + ".behavior"));
    ASSIGN_OR_RETURN(step->invert, JsonBool(json, "invert", path, false));
  } else if (type == "ByteLevel") {
    step->kind = Step::Kind::kByteLevel;
    ASSIGN_OR_RETURN(step->add_prefix_space, JsonBool(json, "add_prefix_space", path, true));
    ASSIGN_OR_RETURN(const bool use_regex, JsonBool(json, "use_regex", path, true));
    if (use_regex) {
      ASSIGN_OR_RETURN(step->regex, CompileAt(kGpt2Pattern, path));
    }
    step->behavior = SplitBehavior::kIsolated;
  } else if (type == "Digits") {
    step->kind = Step::Kind::kDigits;
    ASSIGN_OR_RETURN(const bool individual, JsonBool(json, "individual_digits", path, false));
    ASSIGN_OR_RETURN(step->regex, CompileAt("\\p{N}", path));
    step->behavior = individual ? SplitBehavior::kIsolated : SplitBehavior::kContiguous;
  } else {
    return JsonUnsupported(path + ".type", type,
                           "supported pre-tokenizers are Sequence, Split, ByteLevel, Digits");
  }
  steps_.push_back(std::move(step));
  return absl::OkStatus();
}

bool PreTokenizer::has_byte_level() const {
  for (const auto& step : steps_) {
    if (step->kind == Step::Kind::kByteLevel) return true;
  }
  return false;
}

std::vector<std::pair<size_t, size_t>> SplitRanges(
    size_t length, const std::vector<std::pair<size_t, size_t>>& matches,
    SplitBehavior behavior, bool invert) {
  struct Part {
    size_t begin, end;
    bool is_match;
  };
  // Cover the whole piece with alternating gaps and matches.
  std::vector<Part> parts;
  if (length == 0) {
    parts.push_back({0, 0, false});
  } else {
    size_t prev = 0;
    for (const auto& [begin, end] : matches) {
      if (prev != begin) parts.push_back({prev, begin, false});
      parts.push_back({begin, end, true});
      prev = end;
    }
    if (prev != length) parts.push_back({prev, length, false});
  }
  if (invert) {
    for (Part& p : parts) p.is_match = !p.is_match;
  }

  std::vector<std::pair<size_t, size_t>> out;
  switch (behavior) {
    case SplitBehavior::kRemoved:
      for (const Part& p : parts) {
        if (!p.is_match) out.emplace_back(p.begin, p.end);
      }
      break;
    case SplitBehavior::kIsolated:
      for (const Part& p : parts) out.emplace_back(p.begin, p.end);
      break;
    case SplitBehavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const Part& p : parts) {
        if (p.is_match && !previous_match && !out.empty()) {
          out.back().second = p.end;
        } else {
          out.emplace_back(p.begin, p.end);
        }
        previous_match = p.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool previous_match = false;
      for (size_t i = parts.size(); i-- > 0;) {
        const Part& p = parts[i];
        if (p.is_match && !previous_match && !out.empty()) {
          out.back().first = p.begin;
        } else {
          out.emplace_back(p.begin, p.end);
        }
        previous_match = p.is_match;
      }
      std::reverse(out.begin(), out.end());
      break;
    }
    case SplitBehavior::kContiguous: {
      bool previous_match = false;
      for (const Part& p : parts) {
        if (p.is_match == previous_match && !out.empty()) {
          out.back().second = p.end;
        } else {
          out.emplace_back(p.begin, p.end);
        }
        previous_match = p.is_match;
      }
      break;
    }
  }
  return out;
}

absl::Status PreTokenizer::ApplyStep(const Step& step, std::vector<std::string>* pieces) const {
  std::vector<std::string> out;
  out.reserve(pieces->size());
  std::vector<std::pair<size_t, size_t>> matches;
  std::string prefixed;
  const bool byte_level = step.kind == Step::Kind::kByteLevel;
  for (const std::string& piece : *pieces) {
    std::string_view view = piece;
    if (byte_level && step.add_prefix_space && (piece.empty() || piece[0] != ' ')) {
      prefixed.resize(piece.size() + 1);
      prefixed[0] = ' ';
      piece.copy(prefixed.data() + 1, piece.size());
      view = prefixed;
    }
    if (step.regex == nullptr) {
      if (!view.empty()) out.push_back(byte_level ? ToByteLevel(view) : std::string(view));
      continue;
    }
    matches.clear();
    RETURN_IF_ERROR(step.regex->FindAll(view, &matches));
    for (const auto& [begin, end] : SplitRanges(view.size(), matches, step.behavior, step.invert)) {
      if (begin == end) continue;
      const std::string_view part = view.substr(begin, end - begin);
      out.push_back(byte_level ? ToByteLevel(part) : std::string(part));
    }
  }
  *pieces = std::move(out);
  return absl::OkStatus();
}

absl::Status PreTokenizer::Run(std::string_view text, std::vector<std::string>* pieces) const {
  if (text.empty()) return absl::OkStatus();
  std::vector<std::string> current;
  current.emplace_back(text);
  for (const auto& step : steps_) {
    RETURN_IF_ERROR(ApplyStep(*step, &current));
  }
  for (std::string& piece : current) pieces->push_back(std::move(piece));
  return absl::OkStatus();
}

}  // namespace strata::tokenizer_internal
