#include "coordinator/http/openai_request.h"

#include <string>

#include "gtest/gtest.h"

namespace strata::coordinator::http {
namespace {

OpenAiRequest ParseOk(Endpoint ep, const std::string& body) {
  absl::StatusOr<OpenAiRequest> r = ParseOpenAiRequest(ep, body);
  EXPECT_TRUE(r.ok()) << r.status() << " for " << body;
  return r.ok() ? *r : OpenAiRequest();
}

// The request is refused with INVALID_ARGUMENT naming `param`, and the
// message holds `words`.
void ExpectRefused(Endpoint ep, const std::string& body, const std::string& param, const std::string& words) {
  absl::StatusOr<OpenAiRequest> r = ParseOpenAiRequest(ep, body);
  ASSERT_FALSE(r.ok()) << body;
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << body;
  EXPECT_EQ(ErrorParam(r.status()), param) << r.status();
  EXPECT_NE(r.status().message().find(words), std::string::npos) << r.status();
}

constexpr Endpoint kCmpl = Endpoint::kCompletions;
constexpr Endpoint kChat = Endpoint::kChatCompletions;

TEST(OpenAiRequestTest, CompletionWithEverySamplingField) {
  OpenAiRequest r = ParseOk(kCmpl, R"({"model": "demo", "prompt": "The list type", "max_tokens": 16,
      "temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 42, "stop": ["\n\n", "END"],
      "frequency_penalty": 0.5, "presence_penalty": -0.5, "repetition_penalty": 1.1, "n": 1,
      "stop_token_ids": [7], "ignore_eos": true, "skip_special_tokens": false, "user": "ignored"})");
  EXPECT_EQ(r.model, "demo");
  EXPECT_FALSE(r.stream);
  const v1::GenerateRequest& g = r.generate;
  EXPECT_EQ(g.prompt(), "The list type");
  EXPECT_FLOAT_EQ(g.sampling().temperature(), 0.7f);
  EXPECT_FLOAT_EQ(g.sampling().top_p(), 0.9f);
  EXPECT_EQ(g.sampling().top_k(), 40);
  EXPECT_FLOAT_EQ(g.sampling().min_p(), 0.05f);
  EXPECT_EQ(g.sampling().seed(), 42u);
  EXPECT_FLOAT_EQ(g.sampling().frequency_penalty(), 0.5f);
  EXPECT_FLOAT_EQ(g.sampling().presence_penalty(), -0.5f);
  EXPECT_FLOAT_EQ(g.sampling().repetition_penalty(), 1.1f);
  EXPECT_EQ(g.stopping().max_tokens(), 16);
  ASSERT_EQ(g.stopping().stop_size(), 2);
  EXPECT_EQ(g.stopping().stop(0), "\n\n");
  EXPECT_EQ(g.stopping().stop_token_ids(0), 7);
  EXPECT_TRUE(g.stopping().ignore_eos());
  EXPECT_FALSE(g.skip_special_tokens());
  EXPECT_FALSE(g.has_logprobs());
}

TEST(OpenAiRequestTest, UnsetFieldsStayUnsetSoStrataDefaultsApply) {
  OpenAiRequest r = ParseOk(kCmpl, R"({"prompt": "x", "temperature": null, "stop": null, "seed": null})");
  EXPECT_FALSE(r.generate.sampling().has_temperature());
  EXPECT_FALSE(r.generate.sampling().has_seed());
  EXPECT_FALSE(r.generate.stopping().has_max_tokens());
  EXPECT_EQ(r.generate.stopping().stop_size(), 0);
  EXPECT_FALSE(r.generate.has_skip_special_tokens());
}

TEST(OpenAiRequestTest, PromptForms) {
  EXPECT_EQ(ParseOk(kCmpl, R"({"prompt": "a"})").generate.prompt(), "a");
  EXPECT_EQ(ParseOk(kCmpl, R"({"prompt": ["a"]})").generate.prompt(), "a");
  OpenAiRequest ids = ParseOk(kCmpl, R"({"prompt": [3, 17, 42]})");
  ASSERT_EQ(ids.generate.tokens().ids_size(), 3);
  EXPECT_EQ(ids.generate.tokens().ids(2), 42);
  EXPECT_EQ(ParseOk(kCmpl, R"({"prompt": [[5, 6]]})").generate.tokens().ids_size(), 2);
  ExpectRefused(kCmpl, R"({"prompt": ["a", "b"]})", "prompt", "one prompt per request");
  ExpectRefused(kCmpl, R"({"prompt": [1, -2]})", "prompt", "non-negative");
  ExpectRefused(kCmpl, R"({"prompt": 5})", "prompt", "must be a string");
}

TEST(OpenAiRequestTest, ChatMessagesAndTextParts) {
  OpenAiRequest r = ParseOk(kChat, R"({"messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": [{"type": "text", "text": "Hello, "}, {"type": "text", "text": "world"}]},
      {"role": "assistant", "content": null}],
      "max_completion_tokens": 8, "max_tokens": 99, "chat_template_kwargs": {"enable_thinking": true}})");
  const v1::ChatMessages& c = r.generate.chat();
  ASSERT_EQ(c.messages_size(), 3);
  EXPECT_EQ(c.messages(0).role(), "system");
  EXPECT_EQ(c.messages(1).content(), "Hello, world");
  EXPECT_EQ(c.messages(2).content(), "");
  EXPECT_TRUE(c.thinking());
  EXPECT_EQ(r.generate.stopping().max_tokens(), 8);  // max_completion_tokens wins
  ExpectRefused(kChat, R"({"messages": []})", "messages", "at least one");
  ExpectRefused(kChat, R"({"model": "m"})", "messages", "at least one");
  ExpectRefused(kChat, R"({"messages": [{"content": "x"}]})", "messages[0].role", "role");
  ExpectRefused(kChat, R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})",
                "messages[0].content", "only text parts");
  ExpectRefused(kChat, R"({"messages": "hi"})", "messages", "must be an array");
}

TEST(OpenAiRequestTest, StreamAndUsage) {
  OpenAiRequest r = ParseOk(kChat, R"({"messages": [{"role": "user", "content": "x"}], "stream": true,
      "stream_options": {"include_usage": true}})");
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  ExpectRefused(kChat, R"({"messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": true}})",
                "stream_options", "needs \"stream\": true");
  ExpectRefused(kCmpl, R"({"prompt": "x", "stream": "yes"})", "stream", "must be a boolean, got a string");
}

TEST(OpenAiRequestTest, Logprobs) {
  OpenAiRequest chat = ParseOk(kChat, R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true,
      "top_logprobs": 3})");
  EXPECT_TRUE(chat.logprobs);
  EXPECT_EQ(chat.top_logprobs, 3);
  EXPECT_EQ(chat.generate.logprobs(), 3);
  OpenAiRequest plain = ParseOk(kChat, R"({"messages": [{"role": "user", "content": "x"}], "logprobs": false})");
  EXPECT_FALSE(plain.generate.has_logprobs());
  ExpectRefused(kChat, R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})", "top_logprobs",
                "needs \"logprobs\": true");
  ExpectRefused(kChat, R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 21})",
                "top_logprobs", "[0, 20]");
  OpenAiRequest cmpl = ParseOk(kCmpl, R"({"prompt": "x", "logprobs": 2})");
  EXPECT_TRUE(cmpl.logprobs);
  EXPECT_EQ(cmpl.generate.logprobs(), 2);
  ExpectRefused(kCmpl, R"({"prompt": "x", "logprobs": true})", "logprobs", "an integer");
}

TEST(OpenAiRequestTest, UnsupportedFeaturesAreRefusedClearly) {
  ExpectRefused(kCmpl, R"({"prompt": "x", "n": 2})", "n", "only n = 1");
  ExpectRefused(kCmpl, R"({"prompt": "x", "best_of": 3})", "best_of", "best_of = 1");
  ExpectRefused(kCmpl, R"({"prompt": "x", "logit_bias": {"5": 10}})", "logit_bias", "not supported");
  ExpectRefused(kCmpl, R"({"prompt": "x", "echo": true})", "echo", "not supported");
  ExpectRefused(kCmpl, R"({"prompt": "x", "suffix": "y"})", "suffix", "not supported");
  ExpectRefused(kChat, R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})", "tools",
                "not supported");
  ExpectRefused(kChat, R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}})",
                "response_format", "only response_format");
  // Their "off" values are accepted.
  ParseOk(kCmpl, R"({"prompt": "x", "n": 1, "best_of": 1, "logit_bias": {}, "echo": false, "suffix": null})");
  ParseOk(kChat, R"({"messages": [{"role": "user", "content": "x"}], "tools": [], "tool_choice": "none",
      "response_format": {"type": "text"}})");
}

TEST(OpenAiRequestTest, WrongTypesAndRanges) {
  ExpectRefused(kCmpl, R"({"prompt": "x", "max_tokens": "16"})", "max_tokens", "must be an integer, got a string");
  ExpectRefused(kCmpl, R"({"prompt": "x", "max_tokens": 1.5})", "max_tokens", "an integer");
  ExpectRefused(kCmpl, R"({"prompt": "x", "max_tokens": 0})", "max_tokens", "[1, ");
  ExpectRefused(kCmpl, R"({"prompt": "x", "max_tokens": 99999999999})", "max_tokens", "[1, ");
  EXPECT_EQ(ParseOk(kCmpl, R"({"prompt": "x", "max_tokens": 16.0})").generate.stopping().max_tokens(), 16);
  ExpectRefused(kCmpl, R"({"prompt": "x", "temperature": "hot"})", "temperature", "must be a number");
  ExpectRefused(kCmpl, R"({"prompt": "x", "seed": -1})", "seed", "[0, ");
  ExpectRefused(kCmpl, R"({"prompt": "x", "seed": 18446744073709551615})", "seed", "[0, ");
  ExpectRefused(kCmpl, R"({"prompt": "x", "stop": [1]})", "stop", "strings");
  ExpectRefused(kCmpl, R"({"prompt": "x", "stop": 3})", "stop", "a string or an array");
  ExpectRefused(kCmpl, R"({"prompt": "x", "top_k": -2})", "top_k", "[-1, ");
  ExpectRefused(kCmpl, R"({"prompt": "x", "session_id": 5})", "session_id", "must be a string");
  ExpectRefused(kCmpl, R"({"prompt": "x", "model": ["m"]})", "model", "must be a string");
}

TEST(OpenAiRequestTest, MalformedBodies) {
  for (const char* body : {"", "{", "{\"prompt\": }", "not json", "{\"a\":1}}", "\xff\xfe"}) {
    absl::StatusOr<OpenAiRequest> r = ParseOpenAiRequest(kCmpl, body);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("not valid JSON"), std::string::npos) << r.status();
  }
  ExpectRefused(kCmpl, "[1, 2]", "", "must be a JSON object");
  ExpectRefused(kCmpl, "\"text\"", "", "must be a JSON object");
  // Deep nesting is refused before parsing (no recursion to overflow).
  const std::string deep = "{\"prompt\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
  ExpectRefused(kCmpl, deep, "", "nests");
  // Brackets inside strings do not count.
  ParseOk(kCmpl, "{\"prompt\": \"" + std::string(1000, '[') + "\\\"" + "\"}");
}

TEST(OpenAiRequestTest, SessionExtension) {
  OpenAiRequest r = ParseOk(kChat, R"({"messages": [{"role": "user", "content": "x"}], "session_id": "s1",
      "persist": false, "request_id": "mine"})");
  EXPECT_EQ(r.generate.session_id(), "s1");
  EXPECT_TRUE(r.generate.has_persist());
  EXPECT_FALSE(r.generate.persist());
  EXPECT_EQ(r.generate.request_id(), "mine");
  // continue_turn needs no new messages.
  OpenAiRequest c = ParseOk(kChat, R"({"session_id": "s1", "continue_turn": true})");
  EXPECT_TRUE(c.generate.continue_turn());
}

TEST(OpenAiRequestTest, Tokenize) {
  absl::StatusOr<TokenizeRequest> p = ParseTokenizeRequest(R"({"prompt": "hi"})");
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(p->chat);
  EXPECT_TRUE(p->add_special_tokens);
  absl::StatusOr<TokenizeRequest> m =
      ParseTokenizeRequest(R"({"messages": [{"role": "user", "content": "hi"}], "add_special_tokens": true})");
  ASSERT_TRUE(m.ok());
  EXPECT_TRUE(m->chat);
  EXPECT_TRUE(m->add_special_tokens);
  EXPECT_EQ(ErrorParam(ParseTokenizeRequest(R"({"text": "hi"})").status()), "prompt");
  absl::StatusOr<std::vector<int>> ids = ParseDetokenizeRequest(R"({"tokens": [1, 2, 3]})");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(ErrorParam(ParseDetokenizeRequest(R"({"tokens": [1, "2"]})").status()), "tokens");
  EXPECT_EQ(ErrorParam(ParseDetokenizeRequest(R"({"tokens": 3})").status()), "tokens");
}

}  // namespace
}  // namespace strata::coordinator::http
