// `strata score`: runs a token sequence teacher-forced through the engine and
// prints one JSON object (the accuracy hook; the format is in docs/cli.md).
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cli/commands.h"
#include "common/flags.h"
#include "common/thread_pool.h"
#include "model/engine.h"
#include "model/v4/config.h"
#include "model/v4/engine.h"
#include "model/tokenizer.h"
#include "nlohmann/json.hpp"

namespace strata::cli {
namespace {

constexpr const char* kHelp = R"(usage: strata score --model DIR (--tokens 3,17,42,... | --text TEXT) [flags]

Runs the sequence teacher-forced (one token per step through the decode path,
or all at once with --prefill) and prints one JSON object:
  tokens, argmax (T entries), next_token_logprobs (T-1 entries), and logits
  ([T][vocab]) with --full-logits; with --text also n_tokens, mean_nll and
  perplexity (over the T-1 predicted tokens).
flags:
)";

int Fail(const absl::Status& s, int code = 1) {
  std::fprintf(stderr, "strata score: %s\n", std::string(s.message()).c_str());
  return code;
}

// Teacher-forced logits [T][vocab] of `tokens` through engine `e` (Engine
// or v4::V4Engine, with its chunk type).
template <class E, class Chunk>
absl::StatusOr<std::vector<float>> TeacherForced(E& e, const std::vector<int>& tokens, bool prefill) {
  std::vector<float> logits;
  auto seq = e.NewSequence();
  if (prefill) {
    Chunk ch{seq.get(), tokens};
    if (auto st = e.Forward({ch}, true, &logits); !st.ok()) return st;
    return logits;
  }
  std::vector<float> step;
  for (size_t i = 0; i < tokens.size(); ++i) {
    Chunk ch{seq.get(), absl::MakeConstSpan(&tokens[i], 1)};
    if (auto st = e.Forward({ch}, false, &step); !st.ok()) return st;
    logits.insert(logits.end(), step.begin(), step.end());
  }
  return logits;
}

// log softmax(logits)[target], in double.
double LogProb(const float* logits, int n, int target) {
  double m = -INFINITY;
  for (int i = 0; i < n; ++i) m = std::max(m, static_cast<double>(logits[i]));
  double s = 0;
  for (int i = 0; i < n; ++i) s += std::exp(static_cast<double>(logits[i]) - m);
  return static_cast<double>(logits[target]) - m - std::log(s);
}

}  // namespace

int Score(const std::vector<std::string>& args) {
  FlagSet flags;
  flags.Declare("model", "model directory (config.json + safetensors)");
  flags.Declare("tokens", "comma-separated token ids");
  flags.Declare("text", "text, tokenised as the HF tokenizer(text) would (special tokens included)");
  flags.Declare("kv-dtype", "KV cache dtype: f32 (default) or fp8");
  flags.Declare("fp8-indexer-keys", "quantise DSA indexer keys with the fp8 codec", true);
  flags.Declare("prefill", "run the whole sequence as one prefill chunk", true);
  flags.Declare("full-logits", "include the [T][vocab] logits", true);
  flags.Declare("threads", "worker threads (default: one per core)");
  flags.Declare("help", "show this help", true);
  if (auto st = flags.Parse(args); !st.ok()) return Fail(st, 2);
  if (flags.Has("help")) {
    std::printf("%s%s", kHelp, flags.Help().c_str());
    return 0;
  }
  if (!flags.Has("model")) return Fail(absl::InvalidArgumentError("--model is required"), 2);
  if (flags.Has("tokens") == flags.Has("text")) {
    return Fail(absl::InvalidArgumentError("give exactly one of --tokens and --text"), 2);
  }
  auto tokens = flags.GetIntList("tokens");
  if (!tokens.ok()) return Fail(tokens.status(), 2);
  if (flags.Has("text")) {
    auto tok = Tokenizer::FromFile(flags.Get("model") + "/tokenizer.json");
    if (!tok.ok()) return Fail(tok.status());
    auto ids = (*tok)->Encode(flags.Get("text"), /*add_special_tokens=*/true);
    if (!ids.ok()) return Fail(ids.status());
    *tokens = *ids;
  }
  if (tokens->empty()) return Fail(absl::InvalidArgumentError("the sequence needs at least one token"), 2);
  EngineOptions opt;
  const std::string kv = flags.Get("kv-dtype", "f32");
  if (kv == "fp8") {
    opt.kv_dtype = KvDtype::kFp8;
  } else if (kv != "f32") {
    return Fail(absl::InvalidArgumentError(absl::StrCat("--kv-dtype must be f32 or fp8, got '", kv, "'")), 2);
  }
  opt.fp8_indexer_keys = flags.Has("fp8-indexer-keys");
  auto threads = flags.GetInt("threads", 0);
  if (!threads.ok()) return Fail(threads.status(), 2);
  if (*threads < 0 || *threads > kMaxThreads) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("--threads must be in [0, ", kMaxThreads, "]")), 2);
  }
  opt.num_threads = static_cast<int>(*threads);

  // DeepSeek-V4 runs on its own engine (docs/engine.md), f32 only for now.
  auto model_type = v4::ReadModelType(flags.Get("model"));
  if (!model_type.ok()) return Fail(model_type.status());
  const bool is_v4 = *model_type == "deepseek_v4";
  std::unique_ptr<Engine> engine;
  std::unique_ptr<v4::V4Engine> engine_v4;
  int V = 0;
  if (is_v4) {
    if (opt.kv_dtype != KvDtype::kF32 || opt.fp8_indexer_keys) {
      return Fail(absl::InvalidArgumentError("deepseek_v4 keeps its state in float32 only (no fp8 V4 cache yet): use --kv-dtype f32"), 2);
    }
    auto loaded = v4::V4Engine::Load(flags.Get("model"), v4::V4EngineOptions{opt.num_threads});
    if (!loaded.ok()) return Fail(loaded.status());
    engine_v4 = std::move(*loaded);
    V = engine_v4->config().vocab_size;
  } else {
    auto loaded = Engine::Load(flags.Get("model"), opt);
    if (!loaded.ok()) return Fail(loaded.status());
    engine = std::move(*loaded);
    V = engine->config().vocab_size;
  }
  const int T = static_cast<int>(tokens->size());
  // Checked here for the whole sequence: the engine sees one token per step
  // and would name the position within that step.
  for (int i = 0; i < T; ++i) {
    if ((*tokens)[i] < 0 || (*tokens)[i] >= V) {
      return Fail(absl::InvalidArgumentError(absl::StrCat("token id ", (*tokens)[i], " at position ", i,
                                                          " is outside the model's vocabulary [0, ", V, ")")));
    }
  }
  auto scored = is_v4 ? TeacherForced<v4::V4Engine, v4::V4Chunk>(*engine_v4, *tokens, flags.Has("prefill"))
                      : TeacherForced<Engine, SeqChunk>(*engine, *tokens, flags.Has("prefill"));
  if (!scored.ok()) return Fail(scored.status());
  const std::vector<float>& logits = *scored;
  nlohmann::json out;
  out["tokens"] = *tokens;
  std::vector<int> argmax(T);
  std::vector<double> lp;
  for (int p = 0; p < T; ++p) {
    const float* row = &logits[static_cast<size_t>(p) * V];
    argmax[p] = static_cast<int>(std::max_element(row, row + V) - row);
    if (p + 1 < T) lp.push_back(LogProb(row, V, (*tokens)[p + 1]));
  }
  out["argmax"] = argmax;
  out["next_token_logprobs"] = lp;
  if (flags.Has("text")) {
    double nll = 0;
    for (double v : lp) nll -= v;
    const double mean = lp.empty() ? 0.0 : nll / static_cast<double>(lp.size());
    out["n_tokens"] = T;
    out["mean_nll"] = mean;
    out["perplexity"] = std::exp(mean);
  }
  if (flags.Has("full-logits")) {
    nlohmann::json rows = nlohmann::json::array();
    for (int p = 0; p < T; ++p) {
      rows.push_back(std::vector<float>(logits.begin() + static_cast<size_t>(p) * V,
                                        logits.begin() + static_cast<size_t>(p + 1) * V));
    }
    out["logits"] = std::move(rows);
  }
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace strata::cli
