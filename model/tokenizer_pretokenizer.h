// PreTokenizer: the `pre_tokenizer` stage of a Hugging Face tokenizer.json,
// which cuts text (between added tokens) into the pieces that BPE sees.
//
// Supported steps (nested "Sequence"s are flattened, in order):
//   Split      {"pattern": {"Regex": p} | {"String": s}, "behavior":
//              "Removed" | "Isolated" | "MergedWithPrevious" |
//              "MergedWithNext" | "Contiguous", "invert": bool}
//   ByteLevel  {"add_prefix_space": bool, "use_regex": bool}: optionally
//              prepends " " to every piece that does not start with one,
//              optionally splits with GPT-2's regex, then maps every byte to
//              GPT-2's printable character (so later steps and BPE see the
//              byte-level form).
//   Digits     {"individual_digits": bool}: splits off Unicode numbers (\p{N}),
//              one per piece or in runs.
// Empty pieces are dropped after every step, as `tokenizers` does.
//
// Internal to model/tokenizer*; not a public API.
//
// Thread-safety: immutable after FromJson(); Run() may be called
// concurrently.
#ifndef STRATA_MODEL_TOKENIZER_PRETOKENIZER_H_
#define STRATA_MODEL_TOKENIZER_PRETOKENIZER_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/tokenizer_regex.h"
#include "nlohmann/json.hpp"

namespace strata::tokenizer_internal {

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

class PreTokenizer {
 public:
  // `json` is the value of "pre_tokenizer" (null means no pre-tokenization);
  // `path` names it in error messages. Errors: INVALID_ARGUMENT for malformed
  // values, UNIMPLEMENTED for pre-tokenizer types Strata does not support.
  static absl::StatusOr<std::unique_ptr<PreTokenizer>> FromJson(const nlohmann::json& json,
                                                                const std::string& path);
  ~PreTokenizer();

  // Cuts `text` and appends the pieces to *pieces.
  // REQUIRES: text is valid UTF-8.
  absl::Status Run(std::string_view text, std::vector<std::string>* pieces) const;

  // Whether a ByteLevel step is present (byte-level BPE needs one).
  bool has_byte_level() const;

 private:
  struct Step;
  PreTokenizer();
  absl::Status AddSteps(const nlohmann::json& json, const std::string& path);
  absl::Status ApplyStep(const Step& step, std::vector<std::string>* pieces) const;

  std::vector<std::unique_ptr<Step>> steps_;
};

// Turns the matches of a pattern inside a piece of `length` bytes into the
// [begin, end) ranges that Split keeps, following `tokenizers`' semantics for
// each behaviour and `invert`. Exposed for tests.
std::vector<std::pair<size_t, size_t>> SplitRanges(
    size_t length, const std::vector<std::pair<size_t, size_t>>& matches,
    SplitBehavior behavior, bool invert);

}  // namespace strata::tokenizer_internal

#endif  // STRATA_MODEL_TOKENIZER_PRETOKENIZER_H_
