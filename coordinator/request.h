// Turning a public GenerateRequest into a validated RequestSpec: the prompt
// as token ids (text tokenised, chat formatted), sampling parameters with a
// seed, stopping rules, and the session fields. Every rejection is
// INVALID_ARGUMENT (or FAILED_PRECONDITION when the model lacks what the
// request needs, e.g. a tokenizer) naming the field and the value.
//
// Thread-safety: ModelContext is immutable after LoadModelContext and may be
// shared by all threads; ParseRequest is thread-safe.
#ifndef STRATA_COORDINATOR_REQUEST_H_
#define STRATA_COORDINATOR_REQUEST_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "model/config.h"
#include "model/sampler.h"
#include "model/tokenizer.h"
#include "strata/v1/generation.pb.h"

namespace strata::coordinator {

struct ModelContext {
  std::string model_dir;
  ModelConfig config;
  std::unique_ptr<Tokenizer> tokenizer;  // null when the model has no tokenizer.json
};

// Reads config.json (+ generation_config.json) and tokenizer.json if present.
absl::StatusOr<std::unique_ptr<ModelContext>> LoadModelContext(const std::string& model_dir);

inline constexpr size_t kMaxRequestIdBytes = 128;

struct RequestSpec {
  // The client's id, or (when it names none) an unguessable one the
  // scheduler draws. Unique among the running requests of one owner.
  std::string request_id;
  // Who started it: the caller's API token name ("" without tokens). Abort
  // reaches only requests of the same owner.
  std::string owner;
  std::vector<int> prompt;      // may be empty only with continue_turn
  SamplingParams sampling;      // seed always set; max_tokens set or unset as asked
  std::string session_id;
  bool continue_turn = false;
  bool persist = false;         // resolved: default true for sessions
  // Set by SessionManager::Prepare, which marked the session busy itself.
  bool session_reserved = false;
  bool skip_special_tokens = true;
  // Leading prompt tokens the tokenizer's post-processor added to prompt
  // text (e.g. BOS). They start a conversation, so a prompt appended to a
  // session that already holds tokens drops them.
  int special_prefix = 0;
};

// REQUIRES: ctx outlives the call. `draw_seed` supplies a seed when the
// request has none.
absl::StatusOr<RequestSpec> ParseRequest(const v1::GenerateRequest& req, const ModelContext& ctx,
                                         uint64_t draw_seed);

// Session ids: 1 to 128 characters of [A-Za-z0-9._-], starting with a letter
// or digit (the KV store's rule).
absl::Status ValidateSessionId(const std::string& id);

}  // namespace strata::coordinator

#endif  // STRATA_COORDINATOR_REQUEST_H_
