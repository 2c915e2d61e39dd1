// Service benchmark (`strata_serve_bench`): time to first token, inter-token
// latency and throughput of a real local cluster (strata-coordinator and
// strata-worker processes on loopback) at 1, 8 and 32 concurrent streams
// with 1, 2 and 3 pipeline stages. Prints one table row per configuration.
//
//   strata_serve_bench [--model DIR] [--prompt-tokens 32] [--max-tokens 64]
//
// Without --model it writes a random deepseek_v32-shaped model (hidden 512,
// 6 layers) to a temporary directory.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/flags.h"
#include "common/temp_dir.h"
#include "model/config.h"
#include "model/random_model.h"
#include "tests/e2e/cluster_harness.h"

namespace {

namespace fs = std::filesystem;

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5))];
}

}  // namespace

int main(int argc, char** argv) {
  strata::FlagSet flags;
  flags.Declare("model", "model directory (default: a random model written to a temp dir)");
  flags.Declare("prompt-tokens", "prompt length (default 32)");
  flags.Declare("max-tokens", "tokens generated per stream (default 64)");
  flags.Declare("stages", "comma-separated stage counts (default 1,2,3)");
  flags.Declare("streams", "comma-separated concurrency levels (default 1,8,32)");
  flags.Declare("worker-threads", "engine threads per worker (default 1)");
  if (auto st = flags.Parse(argc, argv, 1); !st.ok()) {
    std::fprintf(stderr, "strata_serve_bench: %s\n%s", std::string(st.message()).c_str(), flags.Help().c_str());
    return 2;
  }
  auto prompt_len = flags.GetInt("prompt-tokens", 32), max_tokens = flags.GetInt("max-tokens", 64),
       threads = flags.GetInt("worker-threads", 1);
  auto stages = flags.Has("stages") ? flags.GetIntList("stages") : absl::StatusOr<std::vector<int>>({1, 2, 3});
  auto streams = flags.Has("streams") ? flags.GetIntList("streams") : absl::StatusOr<std::vector<int>>({1, 8, 32});
  if (!prompt_len.ok() || !max_tokens.ok() || !threads.ok() || !stages.ok() || !streams.ok()) {
    std::fprintf(stderr, "strata_serve_bench: bad flag value\n");
    return 2;
  }
  std::string model = flags.Get("model");
  std::string tmp;
  if (model.empty()) {
    auto dir = strata::MakeTempDir("strata_serve_bench_");
    if (!dir.ok()) {
      std::fprintf(stderr, "strata_serve_bench: %s\n", std::string(dir.status().message()).c_str());
      return 1;
    }
    tmp = *dir;
    const std::string cfg = R"({"model_type": "deepseek_v32", "vocab_size": 4096, "hidden_size": 512,
      "intermediate_size": 1024, "moe_intermediate_size": 256, "num_hidden_layers": 6, "num_attention_heads": 8,
      "q_lora_rank": 128, "kv_lora_rank": 128, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32,
      "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1,
      "first_k_dense_replace": 1, "index_n_heads": 4, "index_head_dim": 32, "index_topk": 64,
      "max_position_embeddings": 1024})";
    if (auto st = strata::WriteRandomModel(tmp, cfg); !st.ok()) {
      std::fprintf(stderr, "strata_serve_bench: %s\n", std::string(st.message()).c_str());
      return 1;
    }
    model = tmp;
  }
  auto config = strata::LoadModelConfig(model);
  if (!config.ok()) {
    std::fprintf(stderr, "strata_serve_bench: %s\n", std::string(config.status().message()).c_str());
    return 1;
  }
  const int vocab = config->vocab_size;
  std::printf("| stages | streams | TTFT p50 ms | TTFT p90 ms | ITL p50 ms | ITL p90 ms | tokens/s (all streams) |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- |\n");
  for (int s : *stages) {
    strata::e2e::HarnessOptions ho;
    ho.model_dir = model;
    ho.workers = s;
    ho.worker_threads = static_cast<int>(*threads);
    strata::e2e::ClusterHarness c(ho);
    if (!c.ok()) {
      std::fprintf(stderr, "strata_serve_bench: %s\n", c.error().c_str());
      return 1;
    }
    for (int n : *streams) {
      std::vector<strata::e2e::GenerateResult> results(n);
      std::vector<std::thread> ts;
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < n; ++i) {
        ts.emplace_back([&, i] {
          std::vector<int> prompt(*prompt_len);
          for (int k = 0; k < *prompt_len; ++k) prompt[k] = (i * 7919 + k * 131) % (vocab - 1) + 1;
          results[i] = c.Generate(strata::e2e::ClusterHarness::Greedy(prompt, static_cast<int>(*max_tokens)), 600);
        });
      }
      for (auto& t : ts) t.join();
      const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::vector<double> ttft, itl;
      int64_t tokens = 0;
      for (const auto& r : results) {
        if (!r.status.ok()) {
          std::fprintf(stderr, "strata_serve_bench: stream failed: %s\n", r.status.error_message().c_str());
          return 1;
        }
        ttft.push_back(r.first_token_ms);
        for (size_t k = 1; k < r.token_ms.size(); ++k) itl.push_back(r.token_ms[k] - r.token_ms[k - 1]);
        tokens += static_cast<int64_t>(r.tokens.size());
      }
      std::printf("| %d | %d | %.1f | %.1f | %.2f | %.2f | %.0f |\n", s, n, Percentile(ttft, 0.5),
                  Percentile(ttft, 0.9), Percentile(itl, 0.5), Percentile(itl, 0.9), tokens / wall);
      std::fflush(stdout);
    }
  }
  if (!tmp.empty()) fs::remove_all(tmp);
  return 0;
}
