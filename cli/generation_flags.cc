#include "cli/generation_flags.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace strata::cli {

void DeclareGenerationFlags(FlagSet* flags) {
  flags->Declare("prompt", "prompt text (tokenised with the model's tokenizer, BOS as the tokenizer adds it)");
  flags->Declare("chat", "a user message, formatted with the model family's chat format");
  flags->Declare("system", "optional system message for --chat");
  flags->Declare("tokens", "prompt as comma-separated token ids");
  flags->Declare("max-tokens", "most tokens to generate (default 128)");
  flags->Declare("temperature", "sampling temperature, 0 = greedy (default 1.0)");
  flags->Declare("top-p", "nucleus sampling mass in (0, 1] (default 1 = off)");
  flags->Declare("top-k", "keep the k most likely tokens (default 0 = off)");
  flags->Declare("min-p", "drop tokens below min_p times the top probability (default 0 = off)");
  flags->Declare("seed", "random seed (same seed, same tokens)");
  flags->Declare("stop", "stop string (repeatable); the text ends before it", false, true);
  flags->Declare("repetition-penalty", "HF-style repetition penalty (default 1 = off)");
  flags->Declare("frequency-penalty", "OpenAI-style frequency penalty in [-2, 2]");
  flags->Declare("presence-penalty", "OpenAI-style presence penalty in [-2, 2]");
  flags->Declare("ignore-eos", "keep generating after an end-of-sequence token", true);
  flags->Declare("json", "print one JSON object at the end instead of streaming", true);
  flags->Declare("help", "show this help", true);
}

absl::StatusOr<SamplingParams> SamplingFromFlags(const FlagSet& flags) {
  SamplingParams sp;
  ASSIGN_OR_RETURN(double temperature, flags.GetDouble("temperature", 1.0));
  ASSIGN_OR_RETURN(double top_p, flags.GetDouble("top-p", 1.0));
  ASSIGN_OR_RETURN(double min_p, flags.GetDouble("min-p", 0.0));
  ASSIGN_OR_RETURN(double rep, flags.GetDouble("repetition-penalty", 1.0));
  ASSIGN_OR_RETURN(double freq, flags.GetDouble("frequency-penalty", 0.0));
  ASSIGN_OR_RETURN(double pres, flags.GetDouble("presence-penalty", 0.0));
  ASSIGN_OR_RETURN(int64_t top_k, flags.GetInt("top-k", 0));
  ASSIGN_OR_RETURN(int64_t max_tokens, flags.GetInt("max-tokens", 128));
  sp.temperature = static_cast<float>(temperature);
  sp.top_p = static_cast<float>(top_p);
  sp.min_p = static_cast<float>(min_p);
  sp.repetition_penalty = static_cast<float>(rep);
  sp.frequency_penalty = static_cast<float>(freq);
  sp.presence_penalty = static_cast<float>(pres);
  if (top_k < -1 || top_k > (1 << 30)) {
    return absl::InvalidArgumentError(absl::StrCat("--top-k must be in [-1, 2^30], got ", top_k));
  }
  sp.top_k = static_cast<int>(top_k);
  if (max_tokens <= 0 || max_tokens > (1 << 30)) {
    return absl::InvalidArgumentError(absl::StrCat("--max-tokens must be positive, got ", max_tokens));
  }
  sp.max_tokens = static_cast<int>(max_tokens);
  if (flags.Has("seed")) {
    auto seed = flags.GetInt("seed", 0);
    if (!seed.ok() || *seed < 0) return absl::InvalidArgumentError("--seed must be a non-negative integer");
    sp.seed = static_cast<uint64_t>(*seed);
  }
  sp.stop = flags.GetAll("stop");
  sp.ignore_eos = flags.Has("ignore-eos");
  return sp;
}

}  // namespace strata::cli
