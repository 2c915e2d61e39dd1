// AddedToken and AddedVocabulary: the `added_tokens` of a tokenizer.json and
// how they are cut out of text before pre-tokenization.
//
// Matching follows `tokenizers`' AddedVocabulary: first the tokens with
// normalized = false are matched on the raw text, then the tokens with
// normalized = true on each remaining gap (Strata supports only identity
// normalizers, so both see the same characters). Within a pass the matches
// are leftmost-longest and non-overlapping over the whole text; then, per
// match: single_word drops a match that touches a word character (Unicode \w)
// on either side; lstrip widens it over the whitespace before it (not into an
// earlier match); rstrip widens it over the whitespace after it. Special and
// non-special added tokens are both matched; `special` only matters for
// skip_special_tokens when decoding.
//
// Internal to model/tokenizer*; AddedToken is also part of the public API
// (Tokenizer::added_tokens()).
//
// Thread-safety: immutable after construction; Split() may be called
// concurrently.
#ifndef STRATA_MODEL_TOKENIZER_ADDED_H_
#define STRATA_MODEL_TOKENIZER_ADDED_H_

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace strata {

// One entry of tokenizer.json's "added_tokens".
struct AddedToken {
  int id = 0;
  std::string content;
  bool special = false;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
};

namespace tokenizer_internal {

class AddedVocabulary {
 public:
  // A part of the text: either plain text (id < 0) or one added token.
  struct Segment {
    size_t begin;
    size_t end;
    int id;
  };

  // REQUIRES: every token has non-empty valid UTF-8 content, contents unique.
  static absl::StatusOr<std::unique_ptr<AddedVocabulary>> Create(
      const std::vector<AddedToken>& tokens);
  ~AddedVocabulary();

  // Cuts `text` into plain-text segments and added tokens, in order; the
  // segments cover the text except for nothing (lstrip/rstrip whitespace is
  // part of its token's segment). Empty plain segments are omitted.
  // REQUIRES: text is valid UTF-8.
  void Split(std::string_view text, std::vector<Segment>* out) const;

 private:
  class Matcher;
  AddedVocabulary();
  void FindMatches(std::string_view sentence, const Matcher& matcher,
                   std::vector<Segment>* out) const;

  std::vector<AddedToken> tokens_;
  std::unique_ptr<Matcher> raw_;         // normalized == false
  std::unique_ptr<Matcher> normalized_;  // normalized == true
};

}  // namespace tokenizer_internal
}  // namespace strata

#endif  // STRATA_MODEL_TOKENIZER_ADDED_H_
