#include "coordinator/http/openai_response.h"

#include "absl/strings/match.h"

namespace strata::coordinator::http {
namespace {

using json = nlohmann::json;

const char* TypeOf(int http_status) {
  switch (http_status) {
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 429:
      return "rate_limit_error";
    default:
      return http_status >= 500 ? "server_error" : "invalid_request_error";
  }
}

const char* CodeOf(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return "invalid_value";
    case absl::StatusCode::kFailedPrecondition:
      return "failed_precondition";
    case absl::StatusCode::kUnimplemented:
      return "unsupported";
    case absl::StatusCode::kUnauthenticated:
      return "invalid_api_key";
    case absl::StatusCode::kPermissionDenied:
      return "permission_denied";
    case absl::StatusCode::kNotFound:
      return "not_found";
    case absl::StatusCode::kAlreadyExists:
      return "already_exists";
    case absl::StatusCode::kResourceExhausted:
      return "rate_limit_exceeded";
    case absl::StatusCode::kCancelled:
      return "cancelled";
    case absl::StatusCode::kUnavailable:
      return "service_unavailable";
    case absl::StatusCode::kDeadlineExceeded:
      return "timeout";
    default:
      return "internal_error";
  }
}

// The string of one token for logprobs, and its bytes.
json TokenEntry(const Tokenizer* tok, int id, float logprob, bool chat) {
  const std::string bytes = tok != nullptr ? tok->TokenBytes(id) : std::string();
  const std::string text = tok != nullptr ? bytes : "token_" + std::to_string(id);
  if (!chat) return json::array({text, logprob});
  json b = json::array();
  for (unsigned char c : bytes) b.push_back(static_cast<int>(c));
  return json{{"token", text}, {"logprob", logprob}, {"bytes", b}};
}

}  // namespace

std::string Dump(const json& v) { return v.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string SseEvent(const json& v) { return "data: " + Dump(v) + "\n\n"; }

int HttpStatus(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kUnimplemented:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kAlreadyExists:
      return 409;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kCancelled:
      return 499;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

json ErrorBody(int http_status, absl::string_view message, absl::string_view param, absl::string_view code) {
  json e{{"message", std::string(message)},
         {"type", TypeOf(http_status)},
         {"param", param.empty() ? json() : json(std::string(param))},
         {"code", code.empty() ? json() : json(std::string(code))}};
  return json{{"error", e}};
}

json ErrorBody(const absl::Status& s) {
  std::string param = ErrorParam(s);
  // The sampler names its field: "SamplingParams.top_p must be ...".
  constexpr absl::string_view kSampling = "SamplingParams.";
  if (param.empty() && absl::StartsWith(s.message(), kSampling)) {
    const absl::string_view rest = s.message().substr(kSampling.size());
    param = std::string(rest.substr(0, rest.find(' ')));
  }
  return ErrorBody(HttpStatus(s), s.message(), param, CodeOf(s));
}

std::string FinishReasonName(v1::FinishReason reason) {
  switch (reason) {
    case v1::FINISH_REASON_STOP:
    case v1::FINISH_REASON_EOS:
      return "stop";
    case v1::FINISH_REASON_LENGTH:
      return "length";
    case v1::FINISH_REASON_ABORT:
      return "abort";
    default:
      return "error";
  }
}

json ResponseBuilder::ChunkBase() const {
  const bool chat = ctx_.endpoint == Endpoint::kChatCompletions;
  return json{{"id", ctx_.id},
              {"object", chat ? "chat.completion.chunk" : "text_completion"},
              {"created", ctx_.created},
              {"model", ctx_.model}};
}

json ResponseBuilder::Logprobs(const v1::GenerateChunk& c) {
  const bool chat = ctx_.endpoint == Endpoint::kChatCompletions;
  json out = chat ? json{{"content", json::array()}}
                  : json{{"tokens", json::array()},
                         {"token_logprobs", json::array()},
                         {"top_logprobs", json::array()},
                         {"text_offset", json::array()}};
  for (const v1::GeneratedToken& t : c.tokens()) {
    if (chat) {
      json e = TokenEntry(ctx_.tokenizer, t.id(), t.logprob(), true);
      json top = json::array();
      for (const v1::TokenLogprob& a : t.top()) top.push_back(TokenEntry(ctx_.tokenizer, a.token(), a.logprob(), true));
      e["top_logprobs"] = top;
      out["content"].push_back(e);
    } else {
      json e = TokenEntry(ctx_.tokenizer, t.id(), t.logprob(), false);
      out["tokens"].push_back(e[0]);
      out["token_logprobs"].push_back(t.logprob());
      json top = json::object();
      for (const v1::TokenLogprob& a : t.top()) {
        json x = TokenEntry(ctx_.tokenizer, a.token(), a.logprob(), false);
        top[x[0].get<std::string>()] = a.logprob();
      }
      out["top_logprobs"].push_back(top);
      out["text_offset"].push_back(text_offset_);
      text_offset_ += ctx_.tokenizer != nullptr ? static_cast<int64_t>(ctx_.tokenizer->TokenBytes(t.id()).size()) : 0;
    }
  }
  return out;
}

json ResponseBuilder::Usage() const {
  const v1::Usage& u = final_.usage();
  return json{{"prompt_tokens", u.prompt_tokens()},
              {"completion_tokens", u.completion_tokens()},
              {"total_tokens", u.prompt_tokens() + u.completion_tokens()},
              {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens()}}}};
}

// Strata's fields beside OpenAI's (docs/http.md §3): what reproduces or
// continues the request.
json ResponseBuilder::Extension() const {
  json x{{"request_id", final_.request_id()},
         {"seed", final_.seed()},
         {"finish_reason", v1::FinishReason_Name(final_.finish_reason())},
         {"timings",
          {{"queue_ms", final_.timings().queue_ms()},
           {"ttft_ms", final_.timings().ttft_ms()},
           {"total_ms", final_.timings().total_ms()},
           {"tokens_per_s", final_.timings().tokens_per_s()}}}};
  if (!final_.session_id().empty()) {
    x["session_id"] = final_.session_id();
    x["session_tokens"] = final_.session_tokens();
  }
  return x;
}

void ResponseBuilder::Add(const v1::GenerateResponse& r) {
  if (r.has_chunk()) {
    text_ += r.chunk().text();
    if (ctx_.logprobs && r.chunk().tokens_size() > 0) {
      json lp = Logprobs(r.chunk());
      if (logprobs_.is_null()) {
        logprobs_ = lp;
      } else {
        for (auto& [k, v] : lp.items()) {
          for (auto& e : v) logprobs_[k].push_back(e);
        }
      }
    }
  } else if (r.has_final()) {
    final_ = r.final();
    finished_ = true;
  }
}

json ResponseBuilder::Body() const {
  const bool chat = ctx_.endpoint == Endpoint::kChatCompletions;
  json choice{{"index", 0}, {"finish_reason", FinishReasonName(final_.finish_reason())}};
  json lp = json();
  if (ctx_.logprobs) {
    lp = logprobs_.is_null() ? (chat ? json{{"content", json::array()}} : json::object()) : logprobs_;
  }
  choice["logprobs"] = lp;
  if (chat) {
    choice["message"] = json{{"role", "assistant"}, {"content", text_}};
  } else {
    choice["text"] = text_;
  }
  return json{{"id", ctx_.id},
              {"object", chat ? "chat.completion" : "text_completion"},
              {"created", ctx_.created},
              {"model", ctx_.model},
              {"choices", json::array({choice})},
              {"usage", Usage()},
              {"strata", Extension()}};
}

std::string ResponseBuilder::StreamStart() {
  if (ctx_.endpoint != Endpoint::kChatCompletions) return "";
  json c = ChunkBase();
  c["choices"] = json::array(
      {json{{"index", 0}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", json()}, {"finish_reason", json()}}});
  if (ctx_.include_usage) c["usage"] = json();
  return SseEvent(c);
}

std::string ResponseBuilder::StreamEvents(const v1::GenerateResponse& r) {
  const bool chat = ctx_.endpoint == Endpoint::kChatCompletions;
  if (r.has_chunk()) {
    const v1::GenerateChunk& c = r.chunk();
    // A token whose text is held back (part of a character, or of a
    // possible stop string) is sent with its logprobs only when asked for.
    if (c.text().empty() && !(ctx_.logprobs && c.tokens_size() > 0)) return "";
    json choice{{"index", 0}, {"logprobs", ctx_.logprobs ? Logprobs(c) : json()}, {"finish_reason", json()}};
    if (chat) {
      choice["delta"] = json{{"content", c.text()}};
    } else {
      choice["text"] = c.text();
    }
    json out = ChunkBase();
    out["choices"] = json::array({choice});
    if (ctx_.include_usage) out["usage"] = json();
    return SseEvent(out);
  }
  if (!r.has_final()) return "";
  final_ = r.final();
  finished_ = true;
  json choice{{"index", 0}, {"logprobs", json()}, {"finish_reason", FinishReasonName(final_.finish_reason())}};
  if (chat) {
    choice["delta"] = json::object();
  } else {
    choice["text"] = "";
  }
  json last = ChunkBase();
  last["choices"] = json::array({choice});
  // The usage of the whole request rides on the finishing chunk; with
  // stream_options.include_usage it comes as OpenAI sends it instead: null
  // on every chunk, then one chunk with no choices.
  last["usage"] = ctx_.include_usage ? json() : Usage();
  last["strata"] = Extension();
  std::string events = SseEvent(last);
  if (ctx_.include_usage) {
    json u = ChunkBase();
    u["choices"] = json::array();
    u["usage"] = Usage();
    events += SseEvent(u);
  }
  return events;
}

}  // namespace strata::coordinator::http
