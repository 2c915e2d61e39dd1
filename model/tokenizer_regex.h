// Regex: a compiled PCRE2 pattern used by the tokenizer's pre-tokenizers.
//
// Patterns come from tokenizer.json, where Hugging Face `tokenizers` runs them
// with Oniguruma. They are compiled with PCRE2 in UTF + UCP mode (Unicode
// properties \p{L}, \p{N}, ..., look-ahead, inline flags such as (?i:...)),
// with the JIT when the library has one, after TranslateOnigPattern() maps
// the escapes whose meaning differs between the two engines. FindAll()
// reproduces Oniguruma's find_iter: successive non-overlapping matches, and an
// empty match right at the end of the previous match is skipped.
//
// Internal to model/tokenizer*; not a public API.
//
// Thread-safety: immutable after Compile(); FindAll() may be called from many
// threads at once (each thread keeps its own match data and JIT stack).
#ifndef STRATA_MODEL_TOKENIZER_REGEX_H_
#define STRATA_MODEL_TOKENIZER_REGEX_H_

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace strata::tokenizer_internal {

class Regex {
 public:
  // INVALID_ARGUMENT (with PCRE2's message and offset) when the pattern does
  // not compile.
  static absl::StatusOr<std::unique_ptr<Regex>> Compile(std::string_view pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Appends the [begin, end) byte ranges of the matches in `text`.
  // REQUIRES: text is valid UTF-8.
  // Errors: RESOURCE_EXHAUSTED when PCRE2 hits a match limit.
  absl::Status FindAll(std::string_view text,
                       std::vector<std::pair<size_t, size_t>>* out) const;

  const std::string& pattern() const { return pattern_; }

 private:
  Regex(std::string pattern, void* code) : pattern_(std::move(pattern)), code_(code) {}

  std::string pattern_;
  void* code_;  // pcre2_code_8*
};

// Rewrites an Oniguruma pattern for PCRE2: \s and \S become \p{White_Space}
// and \P{White_Space} (PCRE2's Unicode \s also matches U+180E, Oniguruma's
// does not), \h and \H become ASCII hex digits (PCRE2's \h is horizontal
// space). Escaped backslashes and \Q...\E runs are left alone; the
// replacements are valid inside character classes too.
std::string TranslateOnigPattern(std::string_view pattern);

// A pattern that matches `literal` exactly.
std::string EscapeRegexLiteral(std::string_view literal);

}  // namespace strata::tokenizer_internal

#endif  // STRATA_MODEL_TOKENIZER_REGEX_H_
