// `strata bench serve`: the service benchmark (bench/RESULTS.md, "Service")
// as a subcommand. For each stage count it starts a local cluster with
// `strata up --workers S` (this same binary), runs rounds of 1, 8 and 32
// concurrent greedy streams through strata.v1.Generation and prints one
// markdown table row per (stages, streams): time to first token and
// inter-token latency percentiles measured at the client, and the tokens per
// second of all streams over the round's wall time.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cli/commands.h"
#include "cli/remote.h"
#include "common/flags.h"
#include "common/temp_dir.h"
#include "grpcpp/grpcpp.h"
#include "model/config.h"
#include "model/random_model.h"
#include "strata/v1/generation.grpc.pb.h"

namespace strata::cli {


namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr const char* kHelp = R"(usage: strata bench serve [--model DIR | --random-model] [flags]

Starts a local cluster (`strata up`) with 1, 2 and 3 workers in turn and
measures streaming generation at 1, 8 and 32 concurrent streams: time to
first token (TTFT) and inter-token latency (ITL) at the client, and the
tokens/s of all streams. Prompts are token ids (no tokenizer needed),
decoding is greedy with EOS ignored. Each cluster first serves one warm-up
request (its TTFT, the cold start, goes to stderr) so that the table shows
steady state. Prints a markdown table.
flags:
)";

// The random deepseek_v32-shaped model of bench/serve_bench.cc.
constexpr const char* kRandomConfig = R"({"model_type": "deepseek_v32", "vocab_size": 4096, "hidden_size": 512,
  "intermediate_size": 1024, "moe_intermediate_size": 256, "num_hidden_layers": 6, "num_attention_heads": 8,
  "q_lora_rank": 128, "kv_lora_rank": 128, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32,
  "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1,
  "first_k_dense_replace": 1, "index_n_heads": 4, "index_head_dim": 32, "index_topk": 64,
  "max_position_embeddings": 1024})";

int Fail(const std::string& msg, int code = 1) {
  std::fprintf(stderr, "strata bench: %s\n", msg.c_str());
  return code;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5))];
}

// A `strata up` child: started with its stdout on a pipe, stopped with SIGTERM.
class UpProcess {
 public:
  ~UpProcess() { Stop(); }

  // Returns the cluster address once `ready ADDRESS` was printed.
  std::string Start(const std::vector<std::string>& args, int timeout_s) {
    int fds[2];
    if (pipe(fds) != 0) return "";
    pid_ = fork();
    if (pid_ == 0) {
      dup2(fds[1], 1);
      close(fds[0]);
      const int devnull = open("/dev/null", O_WRONLY);
      if (devnull >= 0) dup2(devnull, 2);  // the cluster's messages would garble the table
      std::vector<char*> argv;
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(fds[1]);
    fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK);
    std::string line;
    const auto deadline = Clock::now() + std::chrono::seconds(timeout_s);
    while (Clock::now() < deadline) {
      char c;
      const ssize_t n = read(fds[0], &c, 1);
      if (n == 1 && c != '\n') {
        line.push_back(c);
      } else if (n == 1) {
        if (line.rfind("ready ", 0) == 0) break;
        line.clear();
      } else if (n == 0) {
        break;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    close(fds[0]);
    return line.rfind("ready ", 0) == 0 ? line.substr(6) : "";
  }

  void Stop() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    int status;
    waitpid(pid_, &status, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
};

struct StreamResult {
  grpc::Status status;
  double first_ms = -1;
  std::vector<double> token_ms;
};

StreamResult RunStream(v1::Generation::Stub* stub, const std::vector<int>& prompt, int max_tokens) {
  v1::GenerateRequest req;
  for (int t : prompt) req.mutable_tokens()->add_ids(t);
  req.mutable_sampling()->set_temperature(0);
  req.mutable_stopping()->set_max_tokens(max_tokens);
  req.mutable_stopping()->set_ignore_eos(true);
  StreamResult out;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(10));
  const auto t0 = Clock::now();
  auto reader = stub->Generate(&ctx, req);
  v1::GenerateResponse resp;
  while (reader->Read(&resp)) {
    if (!resp.has_chunk()) continue;
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    for (int i = 0; i < resp.chunk().tokens_size(); ++i) {
      if (out.first_ms < 0) out.first_ms = ms;
      out.token_ms.push_back(ms);
    }
  }
  out.status = reader->Finish();
  return out;
}

int Serve(const std::vector<std::string>& args) {
  FlagSet flags;
  flags.Declare("model", "model directory (default models/demo)");
  flags.Declare("random-model", "use a random deepseek_v32 model (hidden 512, 6 layers) written to a temp dir", true);
  flags.Declare("prompt-tokens", "prompt length in token ids (default 32)");
  flags.Declare("max-tokens", "tokens generated per stream (default 64)");
  flags.Declare("stages", "comma-separated worker counts (default 1,2,3)");
  flags.Declare("streams", "comma-separated concurrency levels (default 1,8,32)");
  flags.Declare("worker-threads", "engine threads per worker (default 1)");
  flags.Declare("bin-dir", "directory holding strata-coordinator and strata-worker (passed to strata up)");
  flags.Declare("device", "passed to strata up: cpu (default) or gpu");
  flags.Declare("gpu-kv-bytes", "passed to strata up (with --device gpu)");
  flags.Declare("synthetic-weights", "passed to strata up (with --device gpu): weights generated on the GPU from "
                                     "this seed, e.g. for --model bench/synthetic/deepseek-v3-3l");
  flags.Declare("help", "show this help", true);
  if (auto st = flags.Parse(args); !st.ok()) return Fail(std::string(st.message()), 2);
  if (flags.Has("help")) {
    std::printf("%s%s", kHelp, flags.Help().c_str());
    return 0;
  }
  auto prompt_len = flags.GetInt("prompt-tokens", 32), max_tokens = flags.GetInt("max-tokens", 64),
       threads = flags.GetInt("worker-threads", 1);
  auto stages = flags.Has("stages") ? flags.GetIntList("stages") : absl::StatusOr<std::vector<int>>({1, 2, 3});
  auto streams = flags.Has("streams") ? flags.GetIntList("streams") : absl::StatusOr<std::vector<int>>({1, 8, 32});
  for (const absl::Status& st : {prompt_len.status(), max_tokens.status(), threads.status(), stages.status(),
                                 streams.status()}) {
    if (!st.ok()) return Fail(std::string(st.message()), 2);
  }
  if (*prompt_len < 1 || *max_tokens < 1 || *threads < 0) {
    return Fail("--prompt-tokens and --max-tokens must be positive", 2);
  }
  for (int s : *stages) {
    if (s < 1 || s > 64) return Fail("--stages values must be in [1, 64]", 2);
  }
  for (int n : *streams) {
    if (n < 1 || n > 1024) return Fail("--streams values must be in [1, 1024]", 2);
  }
  if (flags.Has("random-model") && flags.Has("model")) return Fail("give --model or --random-model, not both", 2);
  std::string model = flags.Get("model", "models/demo");
  std::string tmp;
  if (flags.Has("random-model")) {
    auto dir = MakeTempDir("strata_bench_serve_");
    if (!dir.ok()) return Fail(std::string(dir.status().message()));
    tmp = *dir;
    if (auto st = WriteRandomModel(tmp, kRandomConfig); !st.ok()) return Fail(std::string(st.message()));
    model = tmp;
  }
  auto config = LoadModelConfig(model);
  if (!config.ok()) return Fail(std::string(config.status().message()), 2);
  if (*prompt_len + *max_tokens >= config->max_position_embeddings) {
    return Fail(absl::StrCat("--prompt-tokens + --max-tokens must stay below the model's context of ",
                             config->max_position_embeddings), 2);
  }
  std::error_code ec;
  const std::string self = fs::read_symlink("/proc/self/exe", ec).string();
  if (ec) return Fail("cannot find the strata binary (/proc/self/exe)");
  const int vocab = config->vocab_size;
  std::printf("| stages | streams | TTFT p50 ms | TTFT p90 ms | ITL p50 ms | ITL p90 ms | tokens/s (all streams) |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- |\n");
  std::fflush(stdout);
  int rc = 0;
  for (int s : *stages) {
    std::vector<std::string> up = {self, "up", "--workers", absl::StrCat(s), "--model", model, "--port", "0",
                                   "--no-kvstore", "--worker-threads", absl::StrCat(*threads)};
    for (const char* pass : {"bin-dir", "device", "gpu-kv-bytes", "synthetic-weights"}) {
      if (flags.Has(pass)) up.insert(up.end(), {absl::StrCat("--", pass), flags.Get(pass)});
    }
    UpProcess cluster;
    const std::string address = cluster.Start(up, 180);
    if (address.empty()) {
      rc = Fail(absl::StrCat("the cluster with ", s, " workers did not become ready (run `strata up --workers ", s,
                             " --model ", model, "` to see why)"));
      break;
    }
    auto stub = v1::Generation::NewStub(Remote::Plaintext(address).channel());
    {
      // A fresh cluster's first step pays one-time costs (GPU allocations,
      // GEMM algorithm choices): measured apart from the table.
      std::vector<int> prompt(*prompt_len);
      for (int k = 0; k < *prompt_len; ++k) prompt[k] = (k * 131 + 17) % (vocab - 1) + 1;
      const StreamResult warm = RunStream(stub.get(), prompt, static_cast<int>(*max_tokens));
      if (!warm.status.ok()) {
        rc = Fail(absl::StrCat("the warm-up stream failed: ", warm.status.error_message()));
        cluster.Stop();
        break;
      }
      std::fprintf(stderr, "%d stage(s): warm-up request (the cluster's first) TTFT %.1f ms\n", s, warm.first_ms);
    }
    for (int n : *streams) {
      std::vector<StreamResult> results(n);
      std::vector<std::thread> ts;
      const auto t0 = Clock::now();
      for (int i = 0; i < n; ++i) {
        ts.emplace_back([&, i] {
          std::vector<int> prompt(*prompt_len);
          for (int k = 0; k < *prompt_len; ++k) prompt[k] = (i * 7919 + k * 131) % (vocab - 1) + 1;
          results[i] = RunStream(stub.get(), prompt, static_cast<int>(*max_tokens));
        });
      }
      for (auto& t : ts) t.join();
      const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
      std::vector<double> ttft, itl;
      int64_t tokens = 0;
      for (const auto& r : results) {
        if (!r.status.ok()) {
          rc = Fail(absl::StrCat("a stream failed: ", r.status.error_message()));
          break;
        }
        ttft.push_back(r.first_ms);
        for (size_t k = 1; k < r.token_ms.size(); ++k) itl.push_back(r.token_ms[k] - r.token_ms[k - 1]);
        tokens += static_cast<int64_t>(r.token_ms.size());
      }
      if (rc != 0) break;
      std::printf("| %d | %d | %.1f | %.1f | %.2f | %.2f | %.0f |\n", s, n, Percentile(ttft, 0.5),
                  Percentile(ttft, 0.9), Percentile(itl, 0.5), Percentile(itl, 0.9), tokens / wall);
      std::fflush(stdout);
    }
    cluster.Stop();
    if (rc != 0) break;
  }
  if (!tmp.empty()) fs::remove_all(tmp, ec);
  return rc;
}

}  // namespace

int Bench(const std::vector<std::string>& args) {
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::fprintf(args.empty() ? stderr : stdout, "usage: strata bench serve [flags]   (strata bench serve --help)\n");
    return args.empty() ? 2 : 0;
  }
  if (args[0] == "serve") return Serve(std::vector<std::string>(args.begin() + 1, args.end()));
  return Fail(absl::StrCat("unknown benchmark '", args[0], "' (serve)"), 2);
}

}  // namespace strata::cli
