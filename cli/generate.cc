// `strata generate`: in-process text generation with streaming output
// (docs/cli.md).
#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cli/commands.h"
#include "cli/generation_flags.h"
#include "common/flags.h"
#include "common/thread_pool.h"
#include "model/chat_format.h"
#include "model/engine.h"
#include "model/v4/config.h"
#include "model/v4/engine.h"
#include "model/sampler.h"
#include "model/stop_matcher.h"
#include "model/tokenizer.h"
#include "nlohmann/json.hpp"

namespace strata::cli {
namespace {

std::atomic<bool> g_interrupted{false};
void OnSigint(int) { g_interrupted.store(true); }

constexpr const char* kHelp = R"(usage: strata generate --model DIR (--prompt TEXT | --chat TEXT | --tokens IDS) [flags]

Generates a continuation in-process and streams its text to standard output.
With --json, prints one JSON object at the end instead:
  {"tokens": [generated ids], "text": ..., "finish_reason": "stop|length|eos"}
Ctrl-C stops cleanly (finish_reason "abort").
flags:
)";

int Fail(const absl::Status& s, int code = 1) {
  std::fprintf(stderr, "strata generate: %s\n", std::string(s.message()).c_str());
  return code;
}

// Generates with engine `e` (Engine or v4::V4Engine, with its chunk type)
// once it is loaded; `cfg` is its config (the fields both configs share).
template <class E, class Chunk>
int GenerateWith(E& e, const FlagSet& flags, SamplingParams sp, const std::string& dir) {
  const auto& cfg = e.config();
  if (auto st = Validate(sp, cfg.vocab_size); !st.ok()) return Fail(st, 2);

  std::unique_ptr<Tokenizer> tok;
  const std::string tok_path = dir + "/tokenizer.json";
  if (std::filesystem::exists(tok_path)) {
    auto t = Tokenizer::FromFile(tok_path);
    if (!t.ok()) return Fail(t.status());
    tok = std::move(*t);
  } else if (!flags.Has("tokens")) {
    return Fail(absl::NotFoundError(absl::StrCat(tok_path, " not found: --prompt and --chat need a tokenizer; use --tokens")));
  }
  if (!sp.stop.empty() && tok == nullptr) {
    return Fail(absl::InvalidArgumentError("--stop needs a tokenizer.json in the model directory"), 2);
  }

  if ((flags.Has("prompt") && flags.Get("prompt").empty()) || (flags.Has("chat") && flags.Get("chat").empty())) {
    return Fail(absl::InvalidArgumentError("the prompt is empty"), 2);
  }
  std::vector<int> prompt;
  if (flags.Has("tokens")) {
    auto ids = flags.GetIntList("tokens");
    if (!ids.ok()) return Fail(ids.status(), 2);
    prompt = *ids;
  } else if (flags.Has("prompt")) {
    auto ids = tok->Encode(flags.Get("prompt"), /*add_special_tokens=*/true);
    if (!ids.ok()) return Fail(ids.status());
    prompt = *ids;
  } else {
    std::vector<ChatMessage> msgs;
    if (flags.Has("system")) msgs.push_back({"system", flags.Get("system"), ""});
    msgs.push_back({"user", flags.Get("chat"), ""});
    auto text = FormatChat(cfg.model_type, msgs, /*add_generation_prompt=*/true);
    if (!text.ok()) return Fail(text.status());
    auto ids = tok->Encode(*text, /*add_special_tokens=*/false);
    if (!ids.ok()) return Fail(ids.status());
    prompt = *ids;
  }
  if (prompt.empty()) return Fail(absl::InvalidArgumentError("the prompt is empty"), 2);
  if (static_cast<int64_t>(prompt.size()) >= cfg.max_position_embeddings) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("the prompt has ", prompt.size(),
        " tokens; the model's context is ", cfg.max_position_embeddings)), 2);
  }

  auto sampler = Sampler::Create(sp, cfg.vocab_size);
  if (!sampler.ok()) return Fail(sampler.status(), 2);
  (*sampler)->ObservePrompt(prompt);

  std::signal(SIGINT, OnSigint);
  const bool json = flags.Has("json");
  std::unique_ptr<StreamDecoder> stream;
  if (tok) stream = std::make_unique<StreamDecoder>(*tok, /*skip_special_tokens=*/true);
  StopMatcher stops(sp.stop);
  std::string text;
  auto emit = [&](const std::string& s) {
    text += s;
    if (!json && !s.empty()) {
      std::fwrite(s.data(), 1, s.size(), stdout);
      std::fflush(stdout);
    }
  };

  auto seq = e.NewSequence();
  std::vector<int> generated;
  std::vector<float> logits;
  std::vector<int> next = prompt;
  std::string finish = "length";
  const int limit = static_cast<int>(std::min<int64_t>(*sp.max_tokens, cfg.max_position_embeddings - prompt.size()));
  while (static_cast<int>(generated.size()) < limit) {
    if (g_interrupted.load()) {
      finish = "abort";
      break;
    }
    Chunk ch{seq.get(), next};
    if (auto st = e.Forward({ch}, false, &logits); !st.ok()) return Fail(st);
    const int token = (*sampler)->Sample(logits);
    (*sampler)->Observe(token, /*is_prompt=*/false);
    const TokenStop ts = CheckTokenStop(sp, cfg.eos_token_ids, token, static_cast<int>(generated.size()) + 1);
    if (ts == TokenStop::kEos || ts == TokenStop::kStopToken) {
      finish = ts == TokenStop::kEos ? "eos" : "stop";
      break;
    }
    generated.push_back(token);
    if (stream) {
      auto r = stops.Feed(stream->Add(token));
      emit(r.text);
      if (r.stopped) {
        finish = "stop";
        break;
      }
    }
    if (ts == TokenStop::kLength) break;
    next = {token};
  }
  if (stream && finish != "stop") {
    auto r = stops.Feed(stream->Flush());
    emit(r.text);
    if (r.stopped) {
      finish = "stop";
    } else {
      emit(stops.Flush());
    }
  }
  if (json) {
    nlohmann::json out;
    out["tokens"] = generated;
    out["text"] = text;
    out["finish_reason"] = finish;
    std::printf("%s\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::printf("\n");
    std::fflush(stdout);
    std::fprintf(stderr, "[%zu tokens, finish_reason=%s]\n", generated.size(), finish.c_str());
  }
  return finish == "abort" ? 130 : 0;
}

}  // namespace

int Generate(const std::vector<std::string>& args) {
  FlagSet flags;
  flags.Declare("model", "model directory (config.json, safetensors, tokenizer.json)");
  DeclareGenerationFlags(&flags);
  flags.Declare("kv-dtype", "KV cache dtype: fp8 (default) or f32");
  flags.Declare("threads", "worker threads (default: one per core)");
  if (auto st = flags.Parse(args); !st.ok()) return Fail(st, 2);
  if (flags.Has("help")) {
    std::printf("%s%s", kHelp, flags.Help().c_str());
    return 0;
  }
  if (!flags.Has("model")) return Fail(absl::InvalidArgumentError("--model is required"), 2);
  const int inputs = flags.Has("prompt") + flags.Has("chat") + flags.Has("tokens");
  if (inputs != 1) return Fail(absl::InvalidArgumentError("give exactly one of --prompt, --chat, --tokens"), 2);

  auto parsed = SamplingFromFlags(flags);
  if (!parsed.ok()) return Fail(parsed.status(), 2);
  SamplingParams sp = *std::move(parsed);
  auto threads = flags.GetInt("threads", 0);
  if (!threads.ok()) return Fail(threads.status(), 2);
  if (*threads < 0 || *threads > kMaxThreads) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("--threads must be in [0, ", kMaxThreads, "]")), 2);
  }

  // DeepSeek-V4 runs on its own engine (docs/engine.md), f32 only for now.
  const std::string dir = flags.Get("model");
  auto model_type = v4::ReadModelType(dir);
  if (!model_type.ok()) return Fail(model_type.status());
  if (*model_type == "deepseek_v4") {
    if (flags.Has("kv-dtype") && flags.Get("kv-dtype") != "f32") {
      return Fail(absl::InvalidArgumentError("deepseek_v4 keeps its state in float32 only (no fp8 V4 cache yet): use --kv-dtype f32"), 2);
    }
    std::fprintf(stderr, "strata generate: deepseek_v4 keeps its state in float32 (no fp8 V4 cache yet)\n");
    auto engine = v4::V4Engine::Load(dir, v4::V4EngineOptions{static_cast<int>(*threads)});
    if (!engine.ok()) return Fail(engine.status());
    return GenerateWith<v4::V4Engine, v4::V4Chunk>(**engine, flags, std::move(sp), dir);
  }

  EngineOptions opt;
  opt.num_threads = static_cast<int>(*threads);
  const std::string kv = flags.Get("kv-dtype", "fp8");
  if (kv == "fp8") {
    opt.kv_dtype = KvDtype::kFp8;
  } else if (kv == "f32") {
    opt.kv_dtype = KvDtype::kF32;
  } else {
    return Fail(absl::InvalidArgumentError(absl::StrCat("--kv-dtype must be f32 or fp8, got '", kv, "'")), 2);
  }
  auto engine = Engine::Load(dir, opt);
  if (!engine.ok()) return Fail(engine.status());
  Engine& e = **engine;
  return GenerateWith<Engine, SeqChunk>(e, flags, std::move(sp), dir);
}

}  // namespace strata::cli
