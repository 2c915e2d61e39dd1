#include "coordinator/http/openai_response.h"

#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace strata::coordinator::http {
namespace {

using json = nlohmann::json;

v1::GenerateResponse Chunk(const std::string& text, std::vector<int> ids = {}) {
  v1::GenerateResponse r;
  r.mutable_chunk()->set_text(text);
  for (int id : ids) {
    auto* t = r.mutable_chunk()->add_tokens();
    t->set_id(id);
    t->set_logprob(-0.5f);
    auto* a = t->add_top();
    a->set_token(id);
    a->set_logprob(-0.5f);
  }
  return r;
}

v1::GenerateResponse Final(v1::FinishReason reason, int prompt, int completion) {
  v1::GenerateResponse r;
  auto* f = r.mutable_final();
  f->set_finish_reason(reason);
  f->set_request_id("req-1");
  f->set_seed(7);
  f->mutable_usage()->set_prompt_tokens(prompt);
  f->mutable_usage()->set_completion_tokens(completion);
  f->mutable_usage()->set_cached_tokens(1);
  return r;
}

ResponseContext Ctx(Endpoint ep, bool include_usage = false, bool logprobs = false) {
  ResponseContext c;
  c.endpoint = ep;
  c.id = "chatcmpl-req-1";
  c.created = 1700000000;
  c.model = "demo";
  c.include_usage = include_usage;
  c.logprobs = logprobs;
  return c;
}

// The JSON payloads of an SSE byte stream, checking the framing: every event
// is "data: <payload>\n\n", and the stream may hold comment lines.
std::vector<std::string> Events(const std::string& stream) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < stream.size()) {
    const size_t end = stream.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos) << "an event without its blank line: " << stream.substr(pos);
    if (end == std::string::npos) break;
    const std::string ev = stream.substr(pos, end - pos);
    pos = end + 2;
    if (ev.rfind(":", 0) == 0) continue;  // comment
    EXPECT_EQ(ev.rfind("data: ", 0), 0u) << ev;
    EXPECT_EQ(ev.find('\n'), std::string::npos) << "one line per event: " << ev;
    out.push_back(ev.substr(6));
  }
  return out;
}

TEST(SseTest, Framing) {
  EXPECT_EQ(SseEvent(json{{"a", "line\nbreak"}}), "data: {\"a\":\"line\\nbreak\"}\n\n");
  EXPECT_EQ(std::string(kSseDone), "data: [DONE]\n\n");
  EXPECT_EQ(Events(std::string(kSseKeepAlive) + std::string(kSseDone)), std::vector<std::string>{"[DONE]"});
  // Invalid UTF-8 (a token that is part of a character) never throws.
  EXPECT_EQ(Dump(json("a\xe2\x82")), "\"a\xef\xbf\xbd\"");
}

TEST(SseTest, ChatStreamWithIncludeUsage) {
  ResponseBuilder b(Ctx(Endpoint::kChatCompletions, /*include_usage=*/true));
  std::string stream = b.StreamStart();
  stream += b.StreamEvents(Chunk("Hel"));
  stream += b.StreamEvents(Chunk(""));  // held back text: nothing to send
  stream += b.StreamEvents(Chunk("lo"));
  stream += b.StreamEvents(Final(v1::FINISH_REASON_EOS, 5, 3));
  stream += kSseDone;
  std::vector<std::string> ev = Events(stream);
  ASSERT_EQ(ev.size(), 6u);
  json first = json::parse(ev[0]);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["id"], "chatcmpl-req-1");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(first["usage"].is_null());
  EXPECT_EQ(json::parse(ev[1])["choices"][0]["delta"]["content"], "Hel");
  EXPECT_EQ(json::parse(ev[2])["choices"][0]["delta"]["content"], "lo");
  json fin = json::parse(ev[3]);
  EXPECT_EQ(fin["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(fin["choices"][0]["delta"].empty());
  EXPECT_TRUE(fin["usage"].is_null());
  EXPECT_EQ(fin["strata"]["seed"], 7);
  EXPECT_EQ(fin["strata"]["finish_reason"], "FINISH_REASON_EOS");
  json usage = json::parse(ev[4]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(usage["usage"]["completion_tokens"], 3);
  EXPECT_EQ(usage["usage"]["total_tokens"], 8);
  EXPECT_EQ(usage["usage"]["prompt_tokens_details"]["cached_tokens"], 1);
  EXPECT_EQ(ev[5], "[DONE]");
}

TEST(SseTest, CompletionStreamCarriesUsageOnTheFinishingChunk) {
  ResponseBuilder b(Ctx(Endpoint::kCompletions));
  EXPECT_EQ(b.StreamStart(), "");  // completions have no role chunk
  std::string stream = b.StreamEvents(Chunk("abc")) + b.StreamEvents(Final(v1::FINISH_REASON_LENGTH, 2, 4));
  std::vector<std::string> ev = Events(stream);
  ASSERT_EQ(ev.size(), 2u);
  json c = json::parse(ev[0]);
  EXPECT_EQ(c["object"], "text_completion");
  EXPECT_EQ(c["choices"][0]["text"], "abc");
  EXPECT_FALSE(c.contains("usage"));
  json fin = json::parse(ev[1]);
  EXPECT_EQ(fin["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(fin["usage"]["completion_tokens"], 4);
}

TEST(ResponseBuilderTest, ChatBody) {
  ResponseBuilder b(Ctx(Endpoint::kChatCompletions));
  b.Add(Chunk("Hello"));
  b.Add(Chunk(", world"));
  EXPECT_FALSE(b.finished());
  b.Add(Final(v1::FINISH_REASON_STOP, 3, 2));
  ASSERT_TRUE(b.finished());
  json body = b.Body();
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["model"], "demo");
  EXPECT_EQ(body["created"], 1700000000);
  EXPECT_EQ(body["choices"].size(), 1u);
  EXPECT_EQ(body["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(body["choices"][0]["message"]["content"], "Hello, world");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(body["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(body["usage"]["total_tokens"], 5);
  EXPECT_EQ(body["strata"]["request_id"], "req-1");
}

TEST(ResponseBuilderTest, LogprobsShapes) {
  ResponseBuilder chat(Ctx(Endpoint::kChatCompletions, false, /*logprobs=*/true));
  chat.Add(Chunk("a", {5}));
  chat.Add(Chunk("b", {6}));
  chat.Add(Final(v1::FINISH_REASON_LENGTH, 1, 2));
  json c = chat.Body()["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0]["token"], "token_5");  // no tokenizer in this test
  EXPECT_FLOAT_EQ(c[1]["logprob"].get<float>(), -0.5f);
  EXPECT_EQ(c[1]["top_logprobs"].size(), 1u);
  EXPECT_TRUE(c[0]["bytes"].is_array());

  ResponseBuilder cmpl(Ctx(Endpoint::kCompletions, false, true));
  cmpl.Add(Chunk("a", {5}));
  cmpl.Add(Final(v1::FINISH_REASON_LENGTH, 1, 1));
  json l = cmpl.Body()["choices"][0]["logprobs"];
  EXPECT_EQ(l["tokens"], json::array({"token_5"}));
  EXPECT_EQ(l["token_logprobs"].size(), 1u);
  EXPECT_EQ(l["top_logprobs"][0]["token_5"], -0.5);
  EXPECT_EQ(l["text_offset"], json::array({0}));
}

TEST(ErrorTest, StatusCodesAndShape) {
  EXPECT_EQ(HttpStatus(absl::InvalidArgumentError("x")), 400);
  EXPECT_EQ(HttpStatus(absl::FailedPreconditionError("x")), 400);
  EXPECT_EQ(HttpStatus(absl::UnauthenticatedError("x")), 401);
  EXPECT_EQ(HttpStatus(absl::NotFoundError("x")), 404);
  EXPECT_EQ(HttpStatus(absl::AlreadyExistsError("x")), 409);
  EXPECT_EQ(HttpStatus(absl::ResourceExhaustedError("x")), 429);
  EXPECT_EQ(HttpStatus(absl::UnavailableError("x")), 503);
  EXPECT_EQ(HttpStatus(absl::DeadlineExceededError("x")), 504);
  EXPECT_EQ(HttpStatus(absl::InternalError("x")), 500);

  json e = ErrorBody(InvalidParam("top_p", "SamplingParams.top_p must be in (0, 1]"));
  ASSERT_TRUE(e.contains("error"));
  EXPECT_EQ(e["error"]["message"], "SamplingParams.top_p must be in (0, 1]");
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  EXPECT_EQ(e["error"]["param"], "top_p");
  EXPECT_EQ(e["error"]["code"], "invalid_value");
  EXPECT_EQ(ErrorBody(absl::InvalidArgumentError("SamplingParams.top_p must be in (0, 1], got 5"))["error"]["param"],
            "top_p");
  json r = ErrorBody(absl::ResourceExhaustedError("full"));
  EXPECT_EQ(r["error"]["type"], "rate_limit_error");
  EXPECT_TRUE(r["error"]["param"].is_null());
  EXPECT_EQ(ErrorBody(absl::UnauthenticatedError("no"))["error"]["type"], "authentication_error");
  EXPECT_EQ(ErrorBody(absl::UnavailableError("no"))["error"]["type"], "server_error");
  EXPECT_EQ(ErrorBody(404, "gone", "model", "model_not_found")["error"]["code"], "model_not_found");
}

TEST(ErrorTest, FinishReasons) {
  EXPECT_EQ(FinishReasonName(v1::FINISH_REASON_EOS), "stop");
  EXPECT_EQ(FinishReasonName(v1::FINISH_REASON_STOP), "stop");
  EXPECT_EQ(FinishReasonName(v1::FINISH_REASON_LENGTH), "length");
  EXPECT_EQ(FinishReasonName(v1::FINISH_REASON_ABORT), "abort");
  EXPECT_EQ(FinishReasonName(v1::FINISH_REASON_ERROR), "error");
}

}  // namespace
}  // namespace strata::coordinator::http
