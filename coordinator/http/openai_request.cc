#include "coordinator/http/openai_request.h"

#include <cmath>
#include <limits>
#include <optional>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace strata::coordinator::http {
namespace {

using json = nlohmann::json;

constexpr absl::string_view kParamPayload = "type.strata.dev/http.param";

std::string TypeName(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer() || v.is_number_unsigned()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  return "an object";
}

absl::Status WrongType(absl::string_view param, absl::string_view want, const json& got) {
  return InvalidParam(param, absl::StrCat("'", param, "' must be ", want, ", got ", TypeName(got)));
}

// The field, or null when absent or null (OpenAI clients send null for
// "not set").
const json* Field(const json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::StatusOr<std::optional<bool>> GetBool(const json& body, const char* name) {
  const json* v = Field(body, name);
  if (v == nullptr) return std::optional<bool>();
  if (!v->is_boolean()) return WrongType(name, "a boolean", *v);
  return std::optional<bool>(v->get<bool>());
}

absl::StatusOr<std::optional<double>> GetNumber(const json& body, const char* name) {
  const json* v = Field(body, name);
  if (v == nullptr) return std::optional<double>();
  if (!v->is_number()) return WrongType(name, "a number", *v);
  return std::optional<double>(v->get<double>());
}

// An integer in [lo, hi]; an integral float (10.0) is taken as an integer.
absl::StatusOr<std::optional<int64_t>> GetInt(const json& body, const char* name, int64_t lo, int64_t hi) {
  const json* v = Field(body, name);
  if (v == nullptr) return std::optional<int64_t>();
  int64_t x = 0;
  if (v->is_number_unsigned()) {
    const uint64_t u = v->get<uint64_t>();
    if (u > static_cast<uint64_t>(hi)) {
      return InvalidParam(name, absl::StrCat("'", name, "' must be in [", lo, ", ", hi, "], got ", u));
    }
    x = static_cast<int64_t>(u);
  } else if (v->is_number_integer()) {
    x = v->get<int64_t>();
  } else if (v->is_number_float() && std::isfinite(v->get<double>()) &&
             v->get<double>() == std::floor(v->get<double>()) && std::fabs(v->get<double>()) < 9e15) {
    x = static_cast<int64_t>(v->get<double>());
  } else {
    return WrongType(name, "an integer", *v);
  }
  if (x < lo || x > hi) {
    return InvalidParam(name, absl::StrCat("'", name, "' must be in [", lo, ", ", hi, "], got ", x));
  }
  return std::optional<int64_t>(x);
}

absl::StatusOr<std::string> GetString(const json& body, const char* name) {
  const json* v = Field(body, name);
  if (v == nullptr) return std::string();
  if (!v->is_string()) return WrongType(name, "a string", *v);
  return v->get<std::string>();
}

#define STRATA_ASSIGN(lhs, expr)        \
  auto lhs##_or = (expr);               \
  if (!lhs##_or.ok()) return lhs##_or.status(); \
  auto lhs = *std::move(lhs##_or)

// Fields whose presence means a feature Strata does not offer.
absl::Status RejectUnsupported(const json& body, Endpoint endpoint) {
  STRATA_ASSIGN(n, GetInt(body, "n", 1, 1 << 20));
  if (n && *n != 1) {
    return InvalidParam("n", absl::StrCat("only n = 1 is supported (got ", *n,
                                          "); send one request per completion, with different seeds"));
  }
  STRATA_ASSIGN(best_of, GetInt(body, "best_of", 1, 1 << 20));
  if (best_of && *best_of != 1) return InvalidParam("best_of", "only best_of = 1 is supported");
  if (const json* v = Field(body, "logit_bias"); v != nullptr && !(v->is_object() && v->empty())) {
    return InvalidParam("logit_bias", "logit_bias is not supported");
  }
  for (const char* f : {"tools", "functions"}) {
    if (const json* v = Field(body, f); v != nullptr && !(v->is_array() && v->empty())) {
      return InvalidParam(f, "tool and function calling are not supported");
    }
  }
  if (const json* v = Field(body, "tool_choice"); v != nullptr && !(v->is_string() && *v == "none")) {
    return InvalidParam("tool_choice", "tool calling is not supported; tool_choice may only be \"none\"");
  }
  if (const json* v = Field(body, "response_format"); v != nullptr) {
    if (!v->is_object() || v->value("type", json()) != "text") {
      return InvalidParam("response_format", "only response_format {\"type\": \"text\"} is supported");
    }
  }
  if (endpoint == Endpoint::kCompletions) {
    STRATA_ASSIGN(echo, GetBool(body, "echo"));
    if (echo && *echo) return InvalidParam("echo", "echo is not supported");
    if (const json* v = Field(body, "suffix"); v != nullptr && !(v->is_string() && v->get<std::string>().empty())) {
      return InvalidParam("suffix", "suffix (fill in the middle) is not supported");
    }
  }
  return absl::OkStatus();
}

// prompt: a string, token ids, or a one-element array of either.
absl::Status ParsePrompt(const json& body, v1::GenerateRequest* g) {
  const json* p = Field(body, "prompt");
  if (p == nullptr) {
    g->set_prompt("");
    return absl::OkStatus();
  }
  const json* one = p;
  if (p->is_array() && !p->empty() && (p->at(0).is_string() || p->at(0).is_array())) {
    if (p->size() != 1) {
      return InvalidParam("prompt", absl::StrCat("one prompt per request is supported, got ", p->size()));
    }
    one = &p->at(0);
  }
  if (one->is_string()) {
    g->set_prompt(one->get<std::string>());
    return absl::OkStatus();
  }
  if (one->is_array()) {
    auto* ids = g->mutable_tokens();
    for (const json& t : *one) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
        return InvalidParam("prompt", "a token-id prompt must hold non-negative integers only");
      }
      ids->add_ids(static_cast<int32_t>(t.get<int64_t>()));
    }
    return absl::OkStatus();
  }
  return WrongType("prompt", "a string, an array of token ids, or a one-element array of either", *p);
}

// One message's content: a string, or an array of {"type": "text"} parts.
absl::StatusOr<std::string> MessageContent(const json& m, size_t i) {
  const std::string param = absl::StrCat("messages[", i, "].content");
  auto it = m.find("content");
  if (it == m.end() || it->is_null()) return std::string();
  if (it->is_string()) return it->get<std::string>();
  if (!it->is_array()) return WrongType(param, "a string or an array of text parts", *it);
  std::string text;
  for (const json& part : *it) {
    if (!part.is_object() || part.value("type", json()) != "text" || !part.contains("text") ||
        !part["text"].is_string()) {
      return InvalidParam(param, "only text parts ({\"type\": \"text\", \"text\": \"...\"}) are supported");
    }
    text += part["text"].get<std::string>();
  }
  return text;
}

absl::StatusOr<std::vector<v1::ChatMessage>> ParseMessages(const json& body) {
  const json* msgs = Field(body, "messages");
  if (msgs == nullptr) return std::vector<v1::ChatMessage>();
  if (!msgs->is_array()) return WrongType("messages", "an array of messages", *msgs);
  std::vector<v1::ChatMessage> out;
  for (size_t i = 0; i < msgs->size(); ++i) {
    const json& m = (*msgs)[i];
    if (!m.is_object()) return WrongType(absl::StrCat("messages[", i, "]"), "an object", m);
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) {
      return InvalidParam(absl::StrCat("messages[", i, "].role"), "every message needs a string 'role'");
    }
    v1::ChatMessage cm;
    cm.set_role(role->get<std::string>());
    STRATA_ASSIGN(content, MessageContent(m, i));
    cm.set_content(std::move(content));
    out.push_back(std::move(cm));
  }
  return out;
}

// thinking: the extension field, or chat_template_kwargs.thinking /
// .enable_thinking as vLLM clients send it.
absl::StatusOr<bool> ParseThinking(const json& body) {
  STRATA_ASSIGN(t, GetBool(body, "thinking"));
  if (t) return *t;
  if (const json* kw = Field(body, "chat_template_kwargs"); kw != nullptr) {
    if (!kw->is_object()) return WrongType("chat_template_kwargs", "an object", *kw);
    for (const char* k : {"thinking", "enable_thinking"}) {
      STRATA_ASSIGN(v, GetBool(*kw, k));
      if (v) return *v;
    }
  }
  return false;
}

absl::Status ParseSampling(const json& body, Endpoint endpoint, OpenAiRequest* out) {
  v1::GenerateRequest& g = out->generate;
  v1::SamplingParams* s = g.mutable_sampling();
  STRATA_ASSIGN(temperature, GetNumber(body, "temperature"));
  if (temperature) s->set_temperature(static_cast<float>(*temperature));
  STRATA_ASSIGN(top_p, GetNumber(body, "top_p"));
  if (top_p) s->set_top_p(static_cast<float>(*top_p));
  STRATA_ASSIGN(min_p, GetNumber(body, "min_p"));
  if (min_p) s->set_min_p(static_cast<float>(*min_p));
  STRATA_ASSIGN(top_k, GetInt(body, "top_k", -1, std::numeric_limits<int32_t>::max()));
  if (top_k) s->set_top_k(static_cast<int32_t>(*top_k));
  STRATA_ASSIGN(rep, GetNumber(body, "repetition_penalty"));
  if (rep) s->set_repetition_penalty(static_cast<float>(*rep));
  STRATA_ASSIGN(freq, GetNumber(body, "frequency_penalty"));
  if (freq) s->set_frequency_penalty(static_cast<float>(*freq));
  STRATA_ASSIGN(pres, GetNumber(body, "presence_penalty"));
  if (pres) s->set_presence_penalty(static_cast<float>(*pres));
  STRATA_ASSIGN(seed, GetInt(body, "seed", 0, std::numeric_limits<int64_t>::max()));
  if (seed) s->set_seed(static_cast<uint64_t>(*seed));

  v1::StoppingParams* st = g.mutable_stopping();
  const int64_t kMaxInt = std::numeric_limits<int32_t>::max();
  STRATA_ASSIGN(max_tokens, GetInt(body, "max_tokens", 1, kMaxInt));
  if (endpoint == Endpoint::kChatCompletions) {
    STRATA_ASSIGN(mct, GetInt(body, "max_completion_tokens", 1, kMaxInt));
    if (mct) max_tokens = mct;  // the newer name wins, as OpenAI documents
  }
  if (max_tokens) st->set_max_tokens(static_cast<int32_t>(*max_tokens));
  if (const json* stop = Field(body, "stop"); stop != nullptr) {
    if (stop->is_string()) {
      st->add_stop(stop->get<std::string>());
    } else if (stop->is_array()) {
      for (const json& x : *stop) {
        if (!x.is_string()) return InvalidParam("stop", "'stop' must be a string or an array of strings");
        st->add_stop(x.get<std::string>());
      }
    } else {
      return WrongType("stop", "a string or an array of strings", *stop);
    }
  }
  if (const json* ids = Field(body, "stop_token_ids"); ids != nullptr) {
    if (!ids->is_array()) return WrongType("stop_token_ids", "an array of token ids", *ids);
    for (const json& x : *ids) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > kMaxInt) {
        return InvalidParam("stop_token_ids", "'stop_token_ids' must hold non-negative integers");
      }
      st->add_stop_token_ids(static_cast<int32_t>(x.get<int64_t>()));
    }
  }
  STRATA_ASSIGN(ignore_eos, GetBool(body, "ignore_eos"));
  if (ignore_eos) st->set_ignore_eos(*ignore_eos);
  STRATA_ASSIGN(skip, GetBool(body, "skip_special_tokens"));
  if (skip) g.set_skip_special_tokens(*skip);

  // Logprobs: chat has logprobs (bool) + top_logprobs (0..20); completions
  // has logprobs (an integer: that many alternatives).
  if (endpoint == Endpoint::kChatCompletions) {
    STRATA_ASSIGN(lp, GetBool(body, "logprobs"));
    STRATA_ASSIGN(top, GetInt(body, "top_logprobs", 0, 20));
    if (top && !(lp && *lp)) return InvalidParam("top_logprobs", "top_logprobs needs \"logprobs\": true");
    if (lp && *lp) {
      out->logprobs = true;
      out->top_logprobs = static_cast<int>(top.value_or(0));
    }
  } else {
    if (const json* v = Field(body, "logprobs"); v != nullptr && v->is_boolean()) {
      return WrongType("logprobs", "an integer (the number of alternatives, 0 to 20)", *v);
    }
    STRATA_ASSIGN(lp, GetInt(body, "logprobs", 0, 20));
    if (lp) {
      out->logprobs = true;
      out->top_logprobs = static_cast<int>(*lp);
    }
  }
  if (out->logprobs) g.set_logprobs(out->top_logprobs);
  return absl::OkStatus();
}

// Deeper JSON than any request needs is refused before it is parsed: the
// parsed value's destructor and printers recurse.
constexpr int kMaxDepth = 64;

bool TooDeep(absl::string_view body) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char c : body) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxDepth) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

absl::StatusOr<json> ParseObject(absl::string_view body) {
  if (TooDeep(body)) {
    return InvalidParam("", absl::StrCat("the request body nests arrays and objects more than ", kMaxDepth,
                                         " deep"));
  }
  json j;
  try {
    j = json::parse(body.begin(), body.end());
  } catch (const json::parse_error& e) {
    return InvalidParam("", absl::StrCat("the request body is not valid JSON (", e.what(), ")"));
  }
  if (!j.is_object()) return InvalidParam("", "the request body must be a JSON object");
  return j;
}

}  // namespace

absl::Status InvalidParam(absl::string_view param, absl::string_view message) {
  absl::Status s = absl::InvalidArgumentError(message);
  if (!param.empty()) s.SetPayload(kParamPayload, absl::Cord(param));
  return s;
}

std::string ErrorParam(const absl::Status& status) {
  auto p = status.GetPayload(kParamPayload);
  return p ? std::string(*p) : std::string();
}

absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(Endpoint endpoint, absl::string_view body) {
  STRATA_ASSIGN(j, ParseObject(body));
  OpenAiRequest out;
  out.endpoint = endpoint;
  STRATA_ASSIGN(model, GetString(j, "model"));
  out.model = std::move(model);
  if (absl::Status st = RejectUnsupported(j, endpoint); !st.ok()) return st;
  STRATA_ASSIGN(stream, GetBool(j, "stream"));
  out.stream = stream.value_or(false);
  if (const json* so = Field(j, "stream_options"); so != nullptr) {
    if (!so->is_object()) return WrongType("stream_options", "an object", *so);
    if (!out.stream) return InvalidParam("stream_options", "stream_options needs \"stream\": true");
    STRATA_ASSIGN(usage, GetBool(*so, "include_usage"));
    out.include_usage = usage.value_or(false);
  }
  v1::GenerateRequest& g = out.generate;
  if (endpoint == Endpoint::kCompletions) {
    if (absl::Status st = ParsePrompt(j, &g); !st.ok()) return st;
  } else {
    STRATA_ASSIGN(msgs, ParseMessages(j));
    auto* chat = g.mutable_chat();
    for (auto& m : msgs) *chat->add_messages() = std::move(m);
    STRATA_ASSIGN(thinking, ParseThinking(j));
    chat->set_thinking(thinking);
  }
  if (absl::Status st = ParseSampling(j, endpoint, &out); !st.ok()) return st;

  // Strata's extensions: sessions (docs/http.md §4) and a client request id.
  STRATA_ASSIGN(session, GetString(j, "session_id"));
  g.set_session_id(session);
  STRATA_ASSIGN(cont, GetBool(j, "continue_turn"));
  g.set_continue_turn(cont.value_or(false));
  STRATA_ASSIGN(persist, GetBool(j, "persist"));
  if (persist) g.set_persist(*persist);
  STRATA_ASSIGN(request_id, GetString(j, "request_id"));
  g.set_request_id(request_id);
  if (endpoint == Endpoint::kChatCompletions && g.chat().messages_size() == 0 && !g.continue_turn()) {
    return InvalidParam("messages", "'messages' must hold at least one message");
  }
  return out;
}

absl::StatusOr<TokenizeRequest> ParseTokenizeRequest(absl::string_view body) {
  STRATA_ASSIGN(j, ParseObject(body));
  TokenizeRequest out;
  if (Field(j, "messages") != nullptr) {
    STRATA_ASSIGN(msgs, ParseMessages(j));
    if (msgs.empty()) return InvalidParam("messages", "'messages' must hold at least one message");
    out.messages = std::move(msgs);
    out.chat = true;
    out.add_special_tokens = false;
    STRATA_ASSIGN(thinking, ParseThinking(j));
    out.thinking = thinking;
  } else {
    const json* p = Field(j, "prompt");
    if (p == nullptr || !p->is_string()) {
      return InvalidParam("prompt", "/tokenize needs 'prompt' (a string) or 'messages'");
    }
    out.prompt = p->get<std::string>();
  }
  STRATA_ASSIGN(add, GetBool(j, "add_special_tokens"));
  if (add) out.add_special_tokens = *add;
  return out;
}

absl::StatusOr<std::vector<int>> ParseDetokenizeRequest(absl::string_view body) {
  STRATA_ASSIGN(j, ParseObject(body));
  const json* t = Field(j, "tokens");
  if (t == nullptr || !t->is_array()) return InvalidParam("tokens", "/detokenize needs 'tokens', an array of ids");
  std::vector<int> ids;
  for (const json& x : *t) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      return InvalidParam("tokens", "'tokens' must hold non-negative integer ids");
    }
    ids.push_back(static_cast<int>(x.get<int64_t>()));
  }
  return ids;
}

}  // namespace strata::coordinator::http
