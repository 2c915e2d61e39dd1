// Tokenizer: byte-level BPE read from a Hugging Face tokenizer.json, the kind
// DeepSeek-V3/V3.2 and GLM-4.x/5 ship.
//
// Encode(text, add_special_tokens) returns the ids that `tokenizers`'
// Tokenizer.encode(text, add_special_tokens) returns, which is what
// transformers' tokenizer(text)["input_ids"] gives: added tokens are cut out
// first, the rest is pre-tokenized (Split regexes, Digits, ByteLevel) and
// merged by BPE, and with add_special_tokens the post-processor's template
// adds its tokens (e.g. DeepSeek's BOS). Decode(ids, skip_special_tokens)
// equals `tokenizers`' decode with the ByteLevel decoder: bytes that are not
// valid UTF-8 become U+FFFD. What is supported and what is rejected is listed
// in docs/tokenizer.md; everything unsupported is refused when loading
// (UNIMPLEMENTED), never approximated.
//
// Thread-safety: a Tokenizer is immutable after FromFile()/FromJson() (an
// internal word cache is guarded by mutexes): Encode(), Decode() and every
// accessor may be called from any number of threads at once. A StreamDecoder
// belongs to one stream and is used by one thread at a time.
#ifndef STRATA_MODEL_TOKENIZER_H_
#define STRATA_MODEL_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "model/tokenizer_added.h"
#include "model/tokenizer_utf8.h"

namespace strata {

namespace tokenizer_internal {
class BpeModel;
class PreTokenizer;
}  // namespace tokenizer_internal

class Tokenizer {
 public:
  // Reads and parses a tokenizer.json. Errors: NOT_FOUND when the file cannot
  // be opened; otherwise as FromJson(), prefixed with the path.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromFile(const std::string& path);
  // Errors: INVALID_ARGUMENT for malformed JSON or values (the message names
  // the JSON path and the value), UNIMPLEMENTED for valid but unsupported
  // components (a normalizer that is not a no-op, a WordPiece model, ...).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJson(std::string_view json);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Errors: INVALID_ARGUMENT when `text` is not valid UTF-8 (the message gives
  // the byte offset); RESOURCE_EXHAUSTED when a regex hits PCRE2's limits.
  absl::StatusOr<std::vector<int>> Encode(std::string_view text,
                                          bool add_special_tokens = true) const;

  // Ids that name no token are skipped, as `tokenizers` does. The result is
  // always valid UTF-8.
  std::string Decode(absl::Span<const int> ids, bool skip_special_tokens = false) const;

  // The bytes `id` contributes to decoded text before UTF-8 repair (possibly
  // part of a character); empty for an id that names no token.
  const std::string& TokenBytes(int id) const;
  // The token as written in tokenizer.json (byte-level form for vocabulary
  // tokens, e.g. "Ġthe"); empty for an id that names no token.
  const std::string& IdToToken(int id) const;
  // Added tokens first, then the model vocabulary (byte-level form).
  std::optional<int> TokenToId(std::string_view token) const;
  bool IsSpecial(int id) const;
  bool IsKnown(int id) const;
  // One more than the largest id of any token (vocabulary or added).
  int id_bound() const { return static_cast<int>(token_bytes_.size()); }
  const std::vector<AddedToken>& added_tokens() const { return added_tokens_; }
  // The ids the post-processor puts before / after the text when
  // add_special_tokens is true (e.g. {BOS} / {}).
  const std::vector<int>& prefix_ids() const { return prefix_ids_; }
  const std::vector<int>& suffix_ids() const { return suffix_ids_; }

 private:
  Tokenizer();

  std::unique_ptr<tokenizer_internal::PreTokenizer> pre_;
  std::unique_ptr<tokenizer_internal::BpeModel> bpe_;
  std::unique_ptr<tokenizer_internal::AddedVocabulary> added_vocab_;
  std::vector<AddedToken> added_tokens_;
  absl::flat_hash_map<std::string, int> added_ids_;  // content -> id
  std::vector<int> prefix_ids_;
  std::vector<int> suffix_ids_;
  // Indexed by id.
  std::vector<std::string> token_text_;
  std::vector<std::string> token_bytes_;
  std::vector<uint8_t> flags_;  // kKnown | kSpecial
};

// StreamDecoder turns ids that arrive one at a time into text that is always
// whole UTF-8 characters: bytes of an unfinished character are held until a
// later token completes it. Bytes that can never form a character become
// U+FFFD as soon as that is certain; an unfinished character still held at the
// end becomes U+FFFD in Flush(). The concatenation of every Add() and the
// final Flush() equals Tokenizer::Decode() of all the ids.
//
// Thread-safety: not thread-safe; one per stream.
class StreamDecoder {
 public:
  // REQUIRES: `tokenizer` outlives this decoder.
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = false);

  // Returns the text completed by `id` (possibly empty).
  std::string Add(int id);
  // Returns what is still held (U+FFFD for an unfinished character, or "")
  // and starts afresh.
  std::string Flush();
  // Whether bytes of an unfinished character are held.
  bool has_pending() const { return utf8_.has_pending(); }

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_tokens_;
  tokenizer_internal::Utf8LossyDecoder utf8_;
};

}  // namespace strata

#endif  // STRATA_MODEL_TOKENIZER_H_
