// Built-in chat formats: the prompt text a model's own chat template would
// produce, without a Jinja engine, chosen by config.json's model_type.
//
//   deepseek_v3              DeepSeek-V3's tokenizer_config.json chat_template
//                            (system prompts joined by "\n\n" right after BOS,
//                            "<｜User｜>...", "<｜Assistant｜>...<｜end▁of▁sentence｜>").
//   deepseek_v32             DeepSeek-V3.2's encoding script
//                            (encoding/encoding_dsv32.py, encode_messages);
//                            every user turn ends with "<｜Assistant｜>" and
//                            "</think>" (chat mode) or "<think>" (thinking mode,
//                            last user turn only).
//   glm_moe_dsa, glm4_moe_lite
//                            GLM-4.7's chat_template.jinja (GLM-5 and
//                            GLM-4.7-Flash): "[gMASK]<sop>", "<|system|>...",
//                            "<|user|>...", "<|assistant|></think>...".
//
// Only system, user and assistant turns (and DeepSeek-V3.2's developer turn)
// are supported; tool calls and tool results are not yet (UNIMPLEMENTED).
// The exact strings, and how add_generation_prompt and thinking map onto each
// template, are in docs/tokenizer.md.
//
// The result already holds the BOS-like prefix: encode it with
// add_special_tokens = false (as transformers' apply_chat_template does).
//
// Thread-safety: pure functions.
#ifndef STRATA_MODEL_CHAT_FORMAT_H_
#define STRATA_MODEL_CHAT_FORMAT_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace strata {

struct ChatMessage {
  std::string role;     // "system", "user", "assistant" ("developer": deepseek_v32)
  std::string content;
  // The assistant's reasoning, for templates that keep it (empty = none).
  std::string reasoning_content;
};

struct ChatOptions {
  // Thinking (reasoning) mode. false: DeepSeek-V3.2 "chat" mode and GLM's
  // enable_thinking = false (the generation prompt closes the think block);
  // true: DeepSeek-V3.2 "thinking" mode and GLM's default (opens it).
  // DeepSeek-V3's template has no thinking mode: true is INVALID_ARGUMENT.
  bool thinking = false;
};

// Errors: INVALID_ARGUMENT for an unknown model_type or role, or a message the
// template cannot express (e.g. a DeepSeek-V3.2 thinking-mode assistant turn
// after the last user turn without reasoning); UNIMPLEMENTED for tool turns.
absl::StatusOr<std::string> FormatChat(std::string_view model_type,
                                       absl::Span<const ChatMessage> messages,
                                       bool add_generation_prompt,
                                       const ChatOptions& options = {});

// The end-of-sequence ids of a checkpoint: the union of config.json's and
// generation_config.json's "eos_token_id" (each an int, a list of ints, null
// or absent; generation_config.json may be missing), sorted and deduplicated.
// Errors: NOT_FOUND when config.json is missing; INVALID_ARGUMENT when either
// file is not JSON or eos_token_id has another type or a negative id.
absl::StatusOr<std::vector<int>> LoadEosTokenIds(const std::string& model_dir);

}  // namespace strata

#endif  // STRATA_MODEL_CHAT_FORMAT_H_
