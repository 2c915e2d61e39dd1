#include "model/chat_format.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/tokenizer_utf8.h"
#include "nlohmann/json.hpp"

namespace strata {
namespace {

using tokenizer_internal::DecodeLastUtf8;
using tokenizer_internal::DecodeUtf8At;

constexpr char kDsBos[] = "<｜begin▁of▁sentence｜>";
constexpr char kDsEos[] = "<｜end▁of▁sentence｜>";
constexpr char kDsUser[] = "<｜User｜>";
constexpr char kDsAssistant[] = "<｜Assistant｜>";
constexpr char kThinkOpen[] = "<think>";
constexpr char kThinkClose[] = "</think>";

// Python's str.isspace() for one code point: the Unicode White_Space set
// plus the information separators U+001C..U+001F.
bool IsPythonSpace(uint32_t cp) {
  return tokenizer_internal::IsUnicodeWhiteSpace(cp) || (cp >= 0x1C && cp <= 0x1F);
}

// Python's str.strip() with no argument. REQUIRES: valid UTF-8.
std::string_view PyStrip(std::string_view s) {
  while (!s.empty()) {
    size_t len = 0;
    if (!IsPythonSpace(DecodeUtf8At(s, 0, &len))) break;
    s.remove_prefix(len);
  }
  while (!s.empty()) {
    size_t len = 0;
    if (!IsPythonSpace(DecodeLastUtf8(s, &len))) break;
    s.remove_suffix(len);
  }
  return s;
}

std::string_view StripNewlinesLeft(std::string_view s) {
  while (!s.empty() && s.front() == '\n') s.remove_prefix(1);
  return s;
}

std::string_view StripNewlinesRight(std::string_view s) {
  while (!s.empty() && s.back() == '\n') s.remove_suffix(1);
  return s;
}

// Python's s.split(sep)[0] and s.split(sep)[-1].
std::string_view BeforeFirst(std::string_view s, std::string_view sep) {
  const size_t pos = s.find(sep);
  return pos == std::string_view::npos ? s : s.substr(0, pos);
}
std::string_view AfterLast(std::string_view s, std::string_view sep) {
  const size_t pos = s.rfind(sep);
  return pos == std::string_view::npos ? s : s.substr(pos + sep.size());
}

absl::Status CheckMessages(absl::Span<const ChatMessage> messages, bool allow_developer) {
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (!tokenizer_internal::IsValidUtf8(m.content) ||
        !tokenizer_internal::IsValidUtf8(m.reasoning_content)) {
      return absl::InvalidArgumentError(absl::StrCat("message ", i, " is not valid UTF-8"));
    }
    if (m.role == "system" || m.role == "user" || m.role == "assistant") continue;
    if (m.role == "developer" && allow_developer) continue;
    if (m.role == "tool") {
      return absl::UnimplementedError(
          absl::StrCat("message ", i, ": tool turns are not supported by the built-in formats"));
    }
    return absl::InvalidArgumentError(
        absl::StrCat("message ", i, ": unknown role \"", m.role, "\""));
  }
  return absl::OkStatus();
}

// DeepSeek-V3 tokenizer_config.json chat_template, system/user/assistant only.
absl::StatusOr<std::string> FormatDeepseekV3(absl::Span<const ChatMessage> messages,
                                             bool add_generation_prompt,
                                             const ChatOptions& options) {
  if (options.thinking) {
    return absl::InvalidArgumentError("the deepseek_v3 chat format has no thinking mode");
  }
  RETURN_IF_ERROR(CheckMessages(messages, /*allow_developer=*/false));
  std::string system;
  bool first_system = true;
  for (const ChatMessage& m : messages) {
    if (m.role != "system") continue;
    if (!first_system) system += "\n\n";
    system += m.content;
    first_system = false;
  }
  std::string out = absl::StrCat(kDsBos, system);
  for (const ChatMessage& m : messages) {
    if (m.role == "user") {
      absl::StrAppend(&out, kDsUser, m.content);
    } else if (m.role == "assistant") {
      absl::StrAppend(&out, kDsAssistant, m.content, kDsEos);
    }
  }
  if (add_generation_prompt) out += kDsAssistant;
  return out;
}

// DeepSeek-V3.2 encoding_dsv32.encode_messages(messages, thinking_mode,
// drop_thinking=True, add_default_bos_token=True), without tools.
absl::StatusOr<std::string> FormatDeepseekV32(absl::Span<const ChatMessage> messages,
                                              const ChatOptions& options) {
  RETURN_IF_ERROR(CheckMessages(messages, /*allow_developer=*/true));
  int last_user = -1;
  for (int i = static_cast<int>(messages.size()) - 1; i >= 0; --i) {
    if (messages[i].role == "user" || messages[i].role == "developer") {
      last_user = i;
      break;
    }
  }
  std::string out = kDsBos;
  for (int i = 0; i < static_cast<int>(messages.size()); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "system") {
      out += m.content;
    } else if (m.role == "user" || m.role == "developer") {
      if (m.role == "developer" && m.content.empty()) {
        return absl::InvalidArgumentError(absl::StrCat("message ", i, ": empty developer turn"));
      }
      const std::string content =
          m.role == "user" ? m.content : absl::StrCat("\n\n# The user's message is: ", m.content);
      absl::StrAppend(&out, kDsUser, content, kDsAssistant,
                      i == last_user && options.thinking ? kThinkOpen : kThinkClose);
    } else {  // assistant
      // Reasoning is kept only after the last user turn, and only in
      // thinking mode (earlier reasoning is dropped, drop_thinking=True).
      if (options.thinking && i > last_user) {
        if (m.reasoning_content.empty()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "message ", i, ": in thinking mode an assistant turn after the last user turn "
                             "needs reasoning_content"));
        }
        absl::StrAppend(&out, m.reasoning_content, kThinkClose);
      }
      absl::StrAppend(&out, m.content, kDsEos);
    }
  }
  return out;
}

// GLM-4.7 chat_template.jinja (GLM-5, GLM-4.7-Flash), without tools.
absl::StatusOr<std::string> FormatGlm(absl::Span<const ChatMessage> messages,
                                      bool add_generation_prompt, const ChatOptions& options) {
  RETURN_IF_ERROR(CheckMessages(messages, /*allow_developer=*/false));
  int last_user = -1;
  for (int i = 0; i < static_cast<int>(messages.size()); ++i) {
    if (messages[i].role == "user") last_user = i;
  }
  std::string out = "[gMASK]<sop>";
  for (int i = 0; i < static_cast<int>(messages.size()); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "system") {
      absl::StrAppend(&out, "<|system|>", m.content);
    } else if (m.role == "user") {
      absl::StrAppend(&out, "<|user|>", m.content);
    } else {  // assistant
      std::string_view content = m.content;
      std::string_view reasoning = m.reasoning_content;
      if (reasoning.empty() && content.find(kThinkClose) != std::string_view::npos) {
        reasoning = StripNewlinesLeft(
            AfterLast(StripNewlinesRight(BeforeFirst(content, kThinkClose)), kThinkOpen));
        content = StripNewlinesLeft(AfterLast(content, kThinkClose));
      }
      out += "<|assistant|>";
      if (i > last_user && !reasoning.empty()) {
        absl::StrAppend(&out, kThinkOpen, tokenizer_internal::ToAbsl(PyStrip(reasoning)), kThinkClose);
      } else {
        out += kThinkClose;
      }
      out += PyStrip(content);
    }
  }
  if (add_generation_prompt) {
    absl::StrAppend(&out, "<|assistant|>", options.thinking ? kThinkOpen : kThinkClose);
  }
  return out;
}

absl::StatusOr<nlohmann::json> ReadJsonFile(const std::string& path, bool* missing) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    *missing = true;
    return nlohmann::json();
  }
  *missing = false;
  std::ostringstream buffer;
  buffer << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(buffer.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(path, " is not valid JSON"));
  return j;
}

absl::Status AppendEos(const nlohmann::json& config, const std::string& path,
                       std::vector<int>* ids) {
  if (!config.is_object()) return absl::InvalidArgumentError(path + " is not a JSON object");
  auto it = config.find("eos_token_id");
  if (it == config.end() || it->is_null()) return absl::OkStatus();
  auto add = [&](const nlohmann::json& v) -> absl::Status {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": eos_token_id must be a non-negative int or a list of them, got ", v.dump()));
    }
    ids->push_back(static_cast<int>(v.get<int64_t>()));
    return absl::OkStatus();
  };
  if (it->is_array()) {
    for (const auto& v : *it) RETURN_IF_ERROR(add(v));
    return absl::OkStatus();
  }
  return add(*it);
}

}  // namespace

absl::StatusOr<std::string> FormatChat(std::string_view model_type,
                                       absl::Span<const ChatMessage> messages,
                                       bool add_generation_prompt, const ChatOptions& options) {
  if (model_type == "deepseek_v3") {
    return FormatDeepseekV3(messages, add_generation_prompt, options);
  }
  if (model_type == "deepseek_v32") {
    // The encoding script always ends a user turn with the assistant prefix;
    // add_generation_prompt has nothing left to add.
    return FormatDeepseekV32(messages, options);
  }
  if (model_type == "glm_moe_dsa" || model_type == "glm4_moe_lite") {
    return FormatGlm(messages, add_generation_prompt, options);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("no built-in chat format for model_type \"", tokenizer_internal::ToAbsl(model_type), "\""));
}

absl::StatusOr<std::vector<int>> LoadEosTokenIds(const std::string& model_dir) {
  std::vector<int> ids;
  bool missing = false;
  const std::string config_path = model_dir + "/config.json";
  ASSIGN_OR_RETURN(const nlohmann::json config, ReadJsonFile(config_path, &missing));
  if (missing) return absl::NotFoundError(absl::StrCat("cannot open ", config_path));
  RETURN_IF_ERROR(AppendEos(config, config_path, &ids));
  const std::string gen_path = model_dir + "/generation_config.json";
  ASSIGN_OR_RETURN(const nlohmann::json gen, ReadJsonFile(gen_path, &missing));
  if (!missing) RETURN_IF_ERROR(AppendEos(gen, gen_path, &ids));
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

}  // namespace strata
