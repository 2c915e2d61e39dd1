#include "model/tokenizer_regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "absl/strings/str_cat.h"

namespace strata::tokenizer_internal {
namespace {

// Per-thread match state: one ovector pair is enough (only the whole match is
// read) and a JIT stack that grows up to 8 MiB for long runs.
class ThreadMatchState {
 public:
  ThreadMatchState() {
    data_ = pcre2_match_data_create(1, nullptr);
    context_ = pcre2_match_context_create(nullptr);
    jit_stack_ = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    if (context_ != nullptr && jit_stack_ != nullptr) {
      pcre2_jit_stack_assign(context_, nullptr, jit_stack_);
    }
  }
  ~ThreadMatchState() {
    pcre2_match_data_free(data_);
    pcre2_match_context_free(context_);
    pcre2_jit_stack_free(jit_stack_);
  }
  pcre2_match_data* data() { return data_; }
  pcre2_match_context* context() { return context_; }

 private:
  pcre2_match_data* data_ = nullptr;
  pcre2_match_context* context_ = nullptr;
  pcre2_jit_stack* jit_stack_ = nullptr;
};

ThreadMatchState& MatchState() {
  thread_local ThreadMatchState state;
  return state;
}

std::string Pcre2Message(int code) {
  PCRE2_UCHAR buffer[256];
  if (pcre2_get_error_message(code, buffer, sizeof(buffer)) < 0) {
    return absl::StrCat("PCRE2 error ", code);
  }
  return std::string(reinterpret_cast<const char*>(buffer));
}

}  // namespace

std::string TranslateOnigPattern(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 16);
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c != '\\' || i + 1 == pattern.size()) {
      out.push_back(c);
      continue;
    }
    const char next = pattern[++i];
    switch (next) {
      case 's':
        out += "\\p{White_Space}";
        break;
      case 'S':
        out += "\\P{White_Space}";
        break;
      case 'h':
        out += "\\p{ASCII_Hex_Digit}";
        break;
      case 'H':
        out += "\\P{ASCII_Hex_Digit}";
        break;
      case 'Q': {
        // A quoted run stays as it is, up to and including \E.
        const size_t end = pattern.find("\\E", i + 1);
        const size_t stop = end == std::string_view::npos ? pattern.size() : end + 2;
        out += "\\Q";
        out.append(pattern.substr(i + 1, stop - (i + 1)));
        i = stop - 1;
        break;
      }
      default:
        out.push_back('\\');
        out.push_back(next);
    }
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Regex>> Regex::Compile(std::string_view onig_pattern) {
  const std::string pattern = TranslateOnigPattern(onig_pattern);
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                    PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (code == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "regex does not compile at offset ", offset, ": ", Pcre2Message(error)));
  }
  // The JIT is an optimisation: without it (or if it fails) the interpreter
  // gives the same matches.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return std::unique_ptr<Regex>(new Regex(std::string(onig_pattern), code));
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

absl::Status Regex::FindAll(std::string_view text,
                            std::vector<std::pair<size_t, size_t>>* out) const {
  auto* code = static_cast<pcre2_code*>(code_);
  ThreadMatchState& state = MatchState();
  if (state.data() == nullptr) return absl::ResourceExhaustedError("out of memory for regex");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t search_from = 0;
  bool have_last = false;
  size_t last_match_end = 0;
  while (search_from <= text.size()) {
    int rc = pcre2_match(code, subject, text.size(), search_from, PCRE2_NO_UTF_CHECK,
                         state.data(), state.context());
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      rc = pcre2_match(code, subject, text.size(), search_from,
                       PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, state.data(), state.context());
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      return absl::ResourceExhaustedError(
          absl::StrCat("regex /", pattern_, "/ failed: ", Pcre2Message(rc)));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(state.data());
    const size_t begin = ovector[0];
    const size_t end = ovector[1];
    if (begin == end && have_last && last_match_end == end) {
      // Oniguruma's iterator never returns an empty match right where the
      // previous match ended; it steps one character and searches again.
      if (search_from >= text.size()) break;
      size_t step = 1;
      const auto lead = static_cast<unsigned char>(text[search_from]);
      if (lead >= 0xF0) {
        step = 4;
      } else if (lead >= 0xE0) {
        step = 3;
      } else if (lead >= 0xC0) {
        step = 2;
      }
      search_from += step;
      continue;
    }
    out->emplace_back(begin, end);
    search_from = end;
    have_last = true;
    last_match_end = end;
  }
  return absl::OkStatus();
}

std::string EscapeRegexLiteral(std::string_view literal) {
  std::string out;
  out.reserve(literal.size() * 2);
  for (char c : literal) {
    const auto u = static_cast<unsigned char>(c);
    const bool plain = u >= 0x80 || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
                       (c >= 'A' && c <= 'Z') || c == '_';
    if (!plain) {
      if (c == '\0') {
        out += "\\x{0}";
        continue;
      }
      out.push_back('\\');
    }
    out.push_back(c);
  }
  return out;
}

}  // namespace strata::tokenizer_internal
