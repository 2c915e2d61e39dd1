// OpenAI-compatible request bodies (/v1/completions, /v1/chat/completions,
// /tokenize, /detokenize) turned into what the coordinator serves: a
// v1::GenerateRequest for GenerationService::Start, plus what only the HTTP
// answer needs (streaming, usage chunks, the logprobs shape). Every field,
// its mapping onto Strata's sampler and what is refused are in docs/http.md
// §3.
//
// Errors are INVALID_ARGUMENT naming the field (the OpenAI error's `param`,
// read back with ErrorParam); only the shape and types are checked here —
// ranges are checked once, by ParseRequest and the sampler's Validate, for
// HTTP and gRPC alike.
//
// Thread-safety: pure functions.
#ifndef STRATA_COORDINATOR_HTTP_OPENAI_REQUEST_H_
#define STRATA_COORDINATOR_HTTP_OPENAI_REQUEST_H_

#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "strata/v1/generation.pb.h"

namespace strata::coordinator::http {

enum class Endpoint { kCompletions, kChatCompletions };

struct OpenAiRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  v1::GenerateRequest generate;  // what GenerationService::Start runs
  std::string model;             // as the client named it (empty: not named)
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a last chunk with usage
  // Logprobs asked for: chat `logprobs: true` (top_logprobs alternatives),
  // completions `logprobs: k` (k alternatives). generate.logprobs is set too.
  bool logprobs = false;
  int top_logprobs = 0;
};

// Parses a JSON body. INVALID_ARGUMENT (with ErrorParam) for malformed JSON,
// a wrong type, a missing required field or a feature Strata does not offer
// (n > 1, tools, logit_bias, images, ...), each message saying what to send
// instead.
absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(Endpoint endpoint, absl::string_view body);

// /tokenize: {"prompt": "..."} or {"messages": [...]} (formatted with the
// model's chat format), add_special_tokens (default: true for a prompt, false
// for messages as the chat format holds them).
struct TokenizeRequest {
  std::string prompt;
  std::vector<v1::ChatMessage> messages;  // set instead of prompt
  bool chat = false;
  bool add_special_tokens = true;
  bool thinking = false;
};
absl::StatusOr<TokenizeRequest> ParseTokenizeRequest(absl::string_view body);

// /detokenize: {"tokens": [ids]}.
absl::StatusOr<std::vector<int>> ParseDetokenizeRequest(absl::string_view body);

// An INVALID_ARGUMENT naming the request field `param`, and the field named
// by a status (empty when none).
absl::Status InvalidParam(absl::string_view param, absl::string_view message);
std::string ErrorParam(const absl::Status& status);

}  // namespace strata::coordinator::http

#endif  // STRATA_COORDINATOR_HTTP_OPENAI_REQUEST_H_
