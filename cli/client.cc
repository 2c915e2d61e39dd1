// `strata generate --server ADDR`: the gRPC client of strata.v1.Generation,
// with the flags and output of the in-process `strata generate`
// (docs/cli.md). Also `strata session save|resume|list|rm` (cli/session.cc)
// share the channel helper below.
#include <atomic>
#include <csignal>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "cli/commands.h"
#include "cli/generation_flags.h"
#include "cli/remote.h"
#include "common/flags.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "strata/v1/generation.grpc.pb.h"

namespace strata::cli {
namespace {

std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop.store(true); }

constexpr const char* kHelp = R"(usage: strata generate --server ADDR (--prompt TEXT | --chat TEXT | --tokens IDS) [flags]

Streams a generation from a Strata cluster (strata-coordinator at ADDR) with
the same flags and output as the in-process `strata generate`; --model,
--kv-dtype and --threads are accepted and ignored (the cluster's own apply).
With --json, prints one JSON object at the end:
  {"tokens": [...], "text": ..., "finish_reason": "stop|length|eos|abort", "session_id": ...}
Ctrl-C aborts the request (finish_reason "abort", exit code 130).
flags:
)";

int Fail(const std::string& msg, int code = 1) {
  std::fprintf(stderr, "strata generate: %s\n", msg.c_str());
  return code;
}

const char* ReasonName(v1::FinishReason r) {
  switch (r) {
    case v1::FINISH_REASON_STOP: return "stop";
    case v1::FINISH_REASON_LENGTH: return "length";
    case v1::FINISH_REASON_EOS: return "eos";
    case v1::FINISH_REASON_ABORT: return "abort";
    case v1::FINISH_REASON_ERROR: return "error";
    default: return "unknown";
  }
}

}  // namespace

int GenerateRemote(const std::vector<std::string>& args) {
  FlagSet flags;
  DeclareRemoteFlags(&flags);
  flags.Declare("model", "ignored with --server");
  DeclareGenerationFlags(&flags);
  flags.Declare("kv-dtype", "ignored with --server");
  flags.Declare("threads", "ignored with --server");
  flags.Declare("session", "continue this session (created when new)");
  flags.Declare("continue", "continue the session's interrupted turn (no new input needed)", true);
  flags.Declare("no-persist", "do not persist the session in the KV store", true);
  flags.Declare("request-id", "request id (for Abort)");
  flags.Declare("logprobs", "report the k most likely alternatives of each token (JSON output)");
  flags.Declare("timeout", "deadline in seconds (default none)");
  if (auto st = flags.Parse(args); !st.ok()) return Fail(std::string(st.message()), 2);
  if (flags.Has("help")) {
    std::printf("%s%s", kHelp, flags.Help().c_str());
    return 0;
  }
  const int inputs = flags.Has("prompt") + flags.Has("chat") + flags.Has("tokens");
  if (inputs > 1 || (inputs == 0 && !flags.Has("continue"))) {
    return Fail("give exactly one of --prompt, --chat, --tokens", 2);
  }
  v1::GenerateRequest req;
  if (flags.Has("tokens")) {
    auto ids = flags.GetIntList("tokens");
    if (!ids.ok()) return Fail(std::string(ids.status().message()), 2);
    for (int id : *ids) req.mutable_tokens()->add_ids(id);
  } else if (flags.Has("prompt")) {
    req.set_prompt(flags.Get("prompt"));
  } else if (flags.Has("chat")) {
    if (flags.Has("system")) {
      auto* m = req.mutable_chat()->add_messages();
      m->set_role("system");
      m->set_content(flags.Get("system"));
    }
    auto* m = req.mutable_chat()->add_messages();
    m->set_role("user");
    m->set_content(flags.Get("chat"));
  }
  auto parsed = SamplingFromFlags(flags);
  if (!parsed.ok()) return Fail(std::string(parsed.status().message()), 2);
  const SamplingParams& p = *parsed;
  auto timeout = flags.GetDouble("timeout", 0.0);
  auto lp = flags.GetInt("logprobs", -1);
  if (!timeout.ok()) return Fail(std::string(timeout.status().message()), 2);
  if (!lp.ok()) return Fail(std::string(lp.status().message()), 2);
  v1::SamplingParams* sp = req.mutable_sampling();
  sp->set_temperature(p.temperature);
  sp->set_top_p(p.top_p);
  sp->set_min_p(p.min_p);
  sp->set_top_k(p.top_k);
  sp->set_repetition_penalty(p.repetition_penalty);
  sp->set_frequency_penalty(p.frequency_penalty);
  sp->set_presence_penalty(p.presence_penalty);
  if (p.seed) sp->set_seed(*p.seed);
  req.mutable_stopping()->set_max_tokens(*p.max_tokens);
  for (const auto& s : p.stop) req.mutable_stopping()->add_stop(s);
  req.mutable_stopping()->set_ignore_eos(p.ignore_eos);
  if (*lp >= 0) req.set_logprobs(static_cast<int>(*lp));
  req.set_session_id(flags.Get("session"));
  req.set_continue_turn(flags.Has("continue"));
  if (flags.Has("no-persist")) req.set_persist(false);
  req.set_request_id(flags.Get("request-id", absl::StrCat("cli-", getpid(), "-", time(nullptr))));
  if (!flags.Has("server")) return Fail("--server is required", 2);

  absl::StatusOr<Remote> remote = Remote::FromFlags(flags);
  if (!remote.ok()) return Fail(std::string(remote.status().message()), 2);
  auto stub = v1::Generation::NewStub(remote->channel());
  grpc::ClientContext ctx;
  remote->Authorize(&ctx);
  if (*timeout > 0) {
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(*timeout * 1000)));
  }
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  // Ctrl-C: abort by id (the cluster then sends the final message).
  std::atomic<bool> finished{false};
  std::thread watcher([&] {
    while (!finished.load()) {
      if (g_stop.exchange(false)) {
        grpc::ClientContext actx;
        remote->Authorize(&actx);
        actx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
        v1::AbortRequest ar;
        ar.set_request_id(req.request_id());
        v1::AbortResponse resp;
        if (!stub->Abort(&actx, ar, &resp).ok()) ctx.TryCancel();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  const bool json = flags.Has("json");
  std::vector<int> tokens;
  std::string text;
  nlohmann::json logprobs = nlohmann::json::array();
  v1::GenerateFinal final_msg;
  bool got_final = false;
  auto reader = stub->Generate(&ctx, req);
  v1::GenerateResponse resp;
  while (reader->Read(&resp)) {
    if (resp.has_chunk()) {
      for (const auto& t : resp.chunk().tokens()) {
        tokens.push_back(t.id());
        if (*lp >= 0) {
          nlohmann::json e = {{"token", t.id()}, {"logprob", t.logprob()}, {"rank", t.rank()}};
          nlohmann::json top = nlohmann::json::array();
          for (const auto& a : t.top()) top.push_back({{"token", a.token()}, {"logprob", a.logprob()}});
          e["top"] = top;
          logprobs.push_back(e);
        }
      }
      text += resp.chunk().text();
      if (!json && !resp.chunk().text().empty()) {
        std::fwrite(resp.chunk().text().data(), 1, resp.chunk().text().size(), stdout);
        std::fflush(stdout);
      }
    } else if (resp.has_final()) {
      final_msg = resp.final();
      got_final = true;
    }
  }
  grpc::Status st = reader->Finish();
  finished.store(true);
  watcher.join();
  if (!st.ok()) {
    if (!json) std::printf("\n");
    std::fflush(stdout);
    const std::string code = absl::StatusCodeToString(static_cast<absl::StatusCode>(st.error_code()));
    return Fail(absl::StrCat(st.error_message(), " [", code, "]"),
                st.error_code() == grpc::StatusCode::INVALID_ARGUMENT ? 2 : 1);
  }
  const std::string finish = got_final ? ReasonName(final_msg.finish_reason()) : "error";
  if (json) {
    nlohmann::json out;
    out["tokens"] = tokens;
    out["text"] = text;
    out["finish_reason"] = finish;
    if (!final_msg.session_id().empty()) out["session_id"] = final_msg.session_id();
    out["usage"] = {{"prompt_tokens", final_msg.usage().prompt_tokens()},
                    {"completion_tokens", final_msg.usage().completion_tokens()},
                    {"cached_tokens", final_msg.usage().cached_tokens()}};
    out["timings"] = {{"queue_ms", final_msg.timings().queue_ms()}, {"ttft_ms", final_msg.timings().ttft_ms()},
                      {"total_ms", final_msg.timings().total_ms()},
                      {"tokens_per_s", final_msg.timings().tokens_per_s()}};
    out["seed"] = final_msg.seed();
    if (*lp >= 0) out["logprobs"] = logprobs;
    std::printf("%s\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::printf("\n");
    std::fflush(stdout);
    std::fprintf(stderr, "[%zu tokens, finish_reason=%s]\n", tokens.size(), finish.c_str());
  }
  return finish == "abort" ? 130 : 0;
}

}  // namespace strata::cli
