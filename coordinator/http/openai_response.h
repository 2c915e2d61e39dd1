// OpenAI-compatible answers: a completion or chat completion built from the
// generation service's responses, as one JSON body or as server-sent events,
// and errors in OpenAI's error shape. The JSON, the SSE framing and the
// status codes are in docs/http.md §3 and §5.
//
// Thread-safety: a ResponseBuilder belongs to one request (one thread at a
// time); the free functions are pure.
#ifndef STRATA_COORDINATOR_HTTP_OPENAI_RESPONSE_H_
#define STRATA_COORDINATOR_HTTP_OPENAI_RESPONSE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "coordinator/http/openai_request.h"
#include "model/tokenizer.h"
#include "nlohmann/json.hpp"
#include "strata/v1/generation.pb.h"

namespace strata::coordinator::http {

// The JSON text of a value; invalid UTF-8 (a token that is part of a
// character) is replaced with U+FFFD rather than failing.
std::string Dump(const nlohmann::json& v);

// One server-sent event: "data: <json>\n\n".
std::string SseEvent(const nlohmann::json& v);
// The last event of every stream.
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";
// A comment line, ignored by clients: written while a stream waits, so that a
// client that went away is noticed.
inline constexpr std::string_view kSseKeepAlive = ": keep-alive\n\n";

// The HTTP status for a status from the service: INVALID_ARGUMENT,
// FAILED_PRECONDITION, OUT_OF_RANGE and UNIMPLEMENTED 400, UNAUTHENTICATED 401,
// PERMISSION_DENIED 403, NOT_FOUND 404, ALREADY_EXISTS 409,
// RESOURCE_EXHAUSTED 429, CANCELLED 499, UNAVAILABLE 503, DEADLINE_EXCEEDED
// 504, anything else 500.
int HttpStatus(const absl::Status& status);
// {"error": {"message", "type", "param", "code"}}: type from the HTTP status
// (invalid_request_error, authentication_error, permission_error,
// not_found_error, rate_limit_error, server_error), param from ErrorParam,
// code the given one or one derived from the status.
nlohmann::json ErrorBody(int http_status, absl::string_view message, absl::string_view param = "",
                         absl::string_view code = "");
nlohmann::json ErrorBody(const absl::Status& status);

// "stop", "length", "abort" or "error" (eos is "stop", as OpenAI reports it).
std::string FinishReasonName(v1::FinishReason reason);

struct ResponseContext {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string id;       // "cmpl-..." or "chatcmpl-..."
  int64_t created = 0;  // unix seconds
  std::string model;    // the served model name
  bool logprobs = false;
  bool include_usage = false;
  const Tokenizer* tokenizer = nullptr;  // token strings for logprobs; may be null
};

class ResponseBuilder {
 public:
  explicit ResponseBuilder(ResponseContext ctx) : ctx_(std::move(ctx)) {}

  // Non-streaming: every response of the generation, then Body().
  void Add(const v1::GenerateResponse& r);
  bool finished() const { return finished_; }
  // REQUIRES: finished(). The completion or chat completion object.
  nlohmann::json Body() const;

  // Streaming. The first event (chat: the assistant role); then the events
  // of each response (a chunk's text and logprobs; for the final message the
  // chunk with finish_reason, then the usage chunk when include_usage);
  // Done() is kSseDone.
  std::string StreamStart();
  std::string StreamEvents(const v1::GenerateResponse& r);

 private:
  nlohmann::json ChunkBase() const;
  nlohmann::json Logprobs(const v1::GenerateChunk& c);
  nlohmann::json Usage() const;
  nlohmann::json Extension() const;

  const ResponseContext ctx_;
  std::string text_;
  nlohmann::json logprobs_;  // accumulated (non-streaming)
  int64_t text_offset_ = 0;  // completions' text_offset
  bool finished_ = false;
  v1::GenerateFinal final_;
};

}  // namespace strata::coordinator::http

#endif  // STRATA_COORDINATOR_HTTP_OPENAI_RESPONSE_H_
