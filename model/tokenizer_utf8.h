// UTF-8 helpers shared by the tokenizer: validation, code point access,
// Unicode White_Space, GPT-2's byte <-> character table, and a lossy decoder
// that turns arbitrary bytes into valid UTF-8 exactly as Rust's
// String::from_utf8_lossy and Python's bytes.decode("utf-8", "replace") do
// (each maximal ill-formed subsequence becomes one U+FFFD).
//
// Internal to model/tokenizer*; not a public API.
//
// Thread-safety: free functions are thread-safe; Utf8LossyDecoder is a value
// type used by one thread at a time.
#ifndef STRATA_MODEL_TOKENIZER_UTF8_H_
#define STRATA_MODEL_TOKENIZER_UTF8_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/strings/string_view.h"

namespace strata::tokenizer_internal {

// This absl is built with its own string_view type; absl containers and
// StrCat take that one.
inline absl::string_view ToAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// Returns the byte offset of the first ill-formed sequence, or npos when `s`
// is valid UTF-8 (no surrogates, no overlongs, nothing above U+10FFFF).
size_t FindInvalidUtf8(std::string_view s);
inline bool IsValidUtf8(std::string_view s) {
  return FindInvalidUtf8(s) == std::string_view::npos;
}

// Decodes the code point starting at s[pos] and stores its length in *len.
// REQUIRES: s is valid UTF-8 and pos < s.size() is a character boundary.
uint32_t DecodeUtf8At(std::string_view s, size_t pos, size_t* len);

// Decodes the last code point of s (0 and *len = 0 when s is empty).
// REQUIRES: s is valid UTF-8.
uint32_t DecodeLastUtf8(std::string_view s, size_t* len);

void AppendUtf8(uint32_t cp, std::string* out);

// Unicode White_Space property (what Rust's char::is_whitespace and regex
// `\s` use).
bool IsUnicodeWhiteSpace(uint32_t cp);

// GPT-2's table: byte b is represented by the character ByteToChar()[b]
// (UTF-8 encoded, 1 or 2 bytes).
const std::array<std::string, 256>& ByteToChar();
// The byte a character stands for, or -1 when the character is not in the
// table.
int CharToByte(uint32_t cp);

// Incremental lossy UTF-8 decoding. Feed() appends to *out only text that can
// no longer change; an incomplete sequence at the end is held until Finish()
// (or until later bytes complete or break it).
class Utf8LossyDecoder {
 public:
  void Feed(std::string_view bytes, std::string* out);
  // Emits U+FFFD for a held incomplete sequence and resets.
  void Finish(std::string* out);
  bool has_pending() const { return needed_ != 0; }

 private:
  uint32_t cp_ = 0;
  int needed_ = 0;
  int seen_ = 0;
  uint8_t lower_ = 0x80;
  uint8_t upper_ = 0xBF;
};

// Whole-buffer lossy decoding.
std::string DecodeUtf8Lossy(std::string_view bytes);

}  // namespace strata::tokenizer_internal

#endif  // STRATA_MODEL_TOKENIZER_UTF8_H_
