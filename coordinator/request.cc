#include "coordinator/request.h"

#include <algorithm>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/chat_format.h"

namespace strata::coordinator {

absl::StatusOr<std::unique_ptr<ModelContext>> LoadModelContext(const std::string& model_dir) {
  auto ctx = std::make_unique<ModelContext>();
  ctx->model_dir = model_dir;
  ASSIGN_OR_RETURN(ctx->config, LoadModelConfig(model_dir));
  const std::string tok = model_dir + "/tokenizer.json";
  if (std::filesystem::exists(tok)) {
    ASSIGN_OR_RETURN(ctx->tokenizer, Tokenizer::FromFile(tok));
  }
  return ctx;
}

absl::Status ValidateSessionId(const std::string& id) {
  if (id.empty() || id.size() > 128) {
    return absl::InvalidArgumentError(absl::StrCat("session_id must have 1 to 128 characters, got ", id.size()));
  }
  if (!std::isalnum(static_cast<unsigned char>(id[0]))) {
    return absl::InvalidArgumentError(absl::StrCat("session_id '", id, "' must start with a letter or digit"));
  }
  for (char c : id) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') {
      return absl::InvalidArgumentError(absl::StrCat("session_id '", id, "' may only hold [A-Za-z0-9._-]"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<RequestSpec> ParseRequest(const v1::GenerateRequest& req, const ModelContext& ctx,
                                         uint64_t draw_seed) {
  const ModelConfig& cfg = ctx.config;
  RequestSpec spec;
  if (req.request_id().size() > kMaxRequestIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat("request_id has ", req.request_id().size(),
                                                   " bytes; at most ", kMaxRequestIdBytes, " are allowed"));
  }
  spec.request_id = req.request_id();
  spec.session_id = req.session_id();
  spec.continue_turn = req.continue_turn();
  if (!spec.session_id.empty()) RETURN_IF_ERROR(ValidateSessionId(spec.session_id));
  if (spec.continue_turn && spec.session_id.empty()) {
    return absl::InvalidArgumentError("continue_turn needs a session_id");
  }
  spec.persist = !spec.session_id.empty() && (!req.has_persist() || req.persist());
  spec.skip_special_tokens = !req.has_skip_special_tokens() || req.skip_special_tokens();

  switch (req.input_case()) {
    case v1::GenerateRequest::kTokens:
      for (int i = 0; i < req.tokens().ids_size(); ++i) {
        const int id = req.tokens().ids(i);
        if (id < 0 || id >= cfg.vocab_size) {
          return absl::InvalidArgumentError(absl::StrCat("tokens.ids[", i, "] = ", id,
                                                         " is outside the vocabulary [0, ", cfg.vocab_size, ")"));
        }
      }
      spec.prompt.assign(req.tokens().ids().begin(), req.tokens().ids().end());
      break;
    case v1::GenerateRequest::kPrompt: {
      if (!ctx.tokenizer) {
        return absl::FailedPreconditionError("the model has no tokenizer.json: send token ids (tokens) instead of text");
      }
      if (!req.prompt().empty()) {
        ASSIGN_OR_RETURN(spec.prompt, ctx.tokenizer->Encode(req.prompt(), /*add_special_tokens=*/true));
        const std::vector<int>& pre = ctx.tokenizer->prefix_ids();
        if (pre.size() <= spec.prompt.size() && std::equal(pre.begin(), pre.end(), spec.prompt.begin())) {
          spec.special_prefix = static_cast<int>(pre.size());
        }
      }
      break;
    }
    case v1::GenerateRequest::kChat: {
      if (!ctx.tokenizer) {
        return absl::FailedPreconditionError("the model has no tokenizer.json: chat needs one");
      }
      if (req.chat().messages_size() == 0) return absl::InvalidArgumentError("chat has no messages");
      std::vector<ChatMessage> msgs;
      for (const auto& m : req.chat().messages()) msgs.push_back({m.role(), m.content(), ""});
      ChatOptions co;
      co.thinking = req.chat().thinking();
      ASSIGN_OR_RETURN(std::string text, FormatChat(cfg.model_type, msgs, /*add_generation_prompt=*/true, co));
      ASSIGN_OR_RETURN(spec.prompt, ctx.tokenizer->Encode(text, /*add_special_tokens=*/false));
      break;
    }
    case v1::GenerateRequest::INPUT_NOT_SET:
      break;
  }
  if (spec.prompt.empty() && !spec.continue_turn) {
    return absl::InvalidArgumentError("the prompt is empty: give prompt text, token ids or chat messages");
  }
  const int64_t ctx_len = cfg.max_position_embeddings;
  if (static_cast<int64_t>(spec.prompt.size()) >= ctx_len) {
    return absl::InvalidArgumentError(absl::StrCat("the prompt has ", spec.prompt.size(),
                                                   " tokens; the model's context is ", ctx_len, " tokens"));
  }

  SamplingParams& sp = spec.sampling;
  const v1::SamplingParams& s = req.sampling();
  if (s.has_temperature()) sp.temperature = s.temperature();
  if (s.has_top_p()) sp.top_p = s.top_p();
  if (s.has_top_k()) sp.top_k = s.top_k();
  if (s.has_min_p()) sp.min_p = s.min_p();
  if (s.has_repetition_penalty()) sp.repetition_penalty = s.repetition_penalty();
  if (s.has_frequency_penalty()) sp.frequency_penalty = s.frequency_penalty();
  if (s.has_presence_penalty()) sp.presence_penalty = s.presence_penalty();
  sp.seed = s.has_seed() ? s.seed() : draw_seed;
  const v1::StoppingParams& st = req.stopping();
  if (st.has_max_tokens()) {
    if (st.max_tokens() <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("max_tokens must be positive, got ", st.max_tokens()));
    }
    if (st.max_tokens() > ctx_len) {
      return absl::InvalidArgumentError(absl::StrCat("max_tokens ", st.max_tokens(),
                                                     " is beyond the model's context of ", ctx_len, " tokens"));
    }
    sp.max_tokens = st.max_tokens();
  }
  sp.stop.assign(st.stop().begin(), st.stop().end());
  sp.stop_token_ids.assign(st.stop_token_ids().begin(), st.stop_token_ids().end());
  sp.ignore_eos = st.ignore_eos();
  if (!sp.stop.empty() && !ctx.tokenizer) {
    return absl::FailedPreconditionError("stop strings need the model's tokenizer.json; use stop_token_ids");
  }
  if (req.has_logprobs()) sp.logprobs = req.logprobs();
  RETURN_IF_ERROR(Validate(sp, cfg.vocab_size));
  return spec;
}

}  // namespace strata::coordinator
