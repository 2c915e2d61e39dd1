// ParseTokenizerJson: reads a tokenizer.json in one streaming (SAX) pass.
// model.vocab and model.merges (the bulk of the file: 150k entries and 300k
// merges for GLM) go straight into flat vectors; everything else becomes an
// ordinary nlohmann::json value. A DOM of the whole file would take several
// times longer to build and free.
//
// Internal to model/tokenizer*; not a public API.
//
// Thread-safety: a pure function.
#ifndef STRATA_MODEL_TOKENIZER_JSON_READER_H_
#define STRATA_MODEL_TOKENIZER_JSON_READER_H_

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace strata::tokenizer_internal {

struct TokenizerJson {
  // The whole file except model.vocab and model.merges when those were
  // captured below (an ill-typed vocab or merges value stays here, for the
  // model loader to reject with its path).
  nlohmann::json dom;
  bool has_vocab = false;
  std::vector<std::pair<std::string, int>> vocab;  // in file order
  bool has_merges = false;
  // Both forms ("a b" and ["a", "b"]) as (left, right), in file order.
  std::vector<std::pair<std::string, std::string>> merges;
};

// Errors: INVALID_ARGUMENT for text that is not JSON (with the byte position),
// for vocab ids that are not integers in [0, max_id], and for merges that are
// neither "a b" (exactly one space) nor a pair of strings.
absl::StatusOr<TokenizerJson> ParseTokenizerJson(std::string_view text, int64_t max_id);

}  // namespace strata::tokenizer_internal

#endif  // STRATA_MODEL_TOKENIZER_JSON_READER_H_
