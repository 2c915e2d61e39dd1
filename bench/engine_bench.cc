// CPU engine benchmark: prefill and decode tokens/s at several context
// lengths, KV dtypes and thread counts, next to the machine's ceilings
// measured in the same run (streaming read bandwidth and the float32
// multiply-add rate of the engine's own dot-product kernel).
//
// usage: strata_engine_bench [--model DIR] [--contexts 128,1024,4096]
//                            [--decode-steps N] [--threads-list 1,0]
// Without --model it builds a random model with the demo model's shape.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "common/flags.h"
#include "kernels/cpu/ops.h"
#include "model/engine.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// Bytes/s reading a buffer much larger than the caches, all threads.
double MeasureReadBandwidth(ThreadPool& pool) {
  const size_t n = size_t{256} << 20 >> 2;  // 256 MiB of floats
  std::vector<float> buf(n, 1.0f);
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    std::vector<double> part(pool.num_threads() * 4, 0.0);
    auto t0 = Clock::now();
    pool.ParallelFor(static_cast<int64_t>(n), 1 << 20, [&](int64_t b, int64_t e) {
      float s = 0;
      for (int64_t i = b; i < e; ++i) s += buf[i];
      part[(b / (1 << 20)) % part.size()] += s;
    });
    auto t1 = Clock::now();
    best = std::max(best, n * 4.0 / Seconds(t0, t1));
  }
  return best;
}

// FLOP/s of cpu::Dot on in-cache data, all threads.
double MeasureDotRate(ThreadPool& pool) {
  const int len = 2048, reps = 20000;
  std::vector<float> a(len, 0.5f), b(len, 0.25f);
  auto t0 = Clock::now();
  std::vector<float> sink(pool.num_threads() * 8, 0);
  pool.ParallelFor(pool.num_threads(), 1, [&](int64_t s, int64_t e) {
    for (int64_t t = s; t < e; ++t) {
      float acc = 0;
      for (int r = 0; r < reps; ++r) acc += cpu::Dot(a.data(), b.data(), len);
      sink[t] = acc;
    }
  });
  auto t1 = Clock::now();
  return 2.0 * len * reps * pool.num_threads() / Seconds(t0, t1);
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  using namespace strata;
  FlagSet flags;
  flags.Declare("model", "model directory (default models/demo)");
  flags.Declare("contexts", "context lengths (default 128,1024,4096)");
  flags.Declare("decode-steps", "decode steps timed per point (default 16)");
  flags.Declare("threads-list", "thread counts, 0 = all cores (default 1,0)");
  if (auto st = flags.Parse(argc, argv, 1); !st.ok()) {
    std::fprintf(stderr, "%s\n%s", std::string(st.message()).c_str(), flags.Help().c_str());
    return 2;
  }
  const std::string dir = flags.Get("model", "models/demo");
  auto contexts = flags.Has("contexts") ? *flags.GetIntList("contexts") : std::vector<int>{128, 1024, 4096};
  auto thread_list = flags.Has("threads-list") ? *flags.GetIntList("threads-list") : std::vector<int>{1, 0};
  const int steps = static_cast<int>(*flags.GetInt("decode-steps", 16));

  ThreadPool all(0);
  const double bw = MeasureReadBandwidth(all);
  const double flops = MeasureDotRate(all);
  std::printf("ceilings (all %d threads): read %.2f GB/s, dot f32 %.2f GFLOP/s\n", all.num_threads(), bw / 1e9,
              flops / 1e9);
  std::printf("%-6s %-4s %-7s %12s %12s %12s %10s %10s %8s\n", "ctx", "kv", "threads", "prefill tok/s",
              "decode ms", "decode tok/s", "GB/s", "GFLOP/s", "x floor");
  for (int threads : thread_list) {
    for (KvDtype dt : {KvDtype::kF32, KvDtype::kFp8}) {
      EngineOptions opt;
      opt.kv_dtype = dt;
      opt.num_threads = threads;
      auto engine = Engine::Load(dir, opt);
      if (!engine.ok()) {
        std::fprintf(stderr, "%s\n", std::string(engine.status().message()).c_str());
        return 1;
      }
      Engine& e = **engine;
      const ModelConfig& c = e.config();
      for (int ctx : contexts) {
        if (ctx + steps > c.max_position_embeddings) continue;
        std::mt19937 rng(ctx);
        std::vector<int> prompt(ctx);
        for (auto& t : prompt) t = static_cast<int>(rng() % c.vocab_size);
        auto kv = e.NewSequence();
        std::vector<float> logits;
        auto t0 = Clock::now();
        SeqChunk ch{kv.get(), prompt};
        if (!e.Forward({ch}, false, &logits).ok()) return 1;
        auto t1 = Clock::now();
        int tok = 1;
        auto t2 = Clock::now();
        for (int s = 0; s < steps; ++s) {
          SeqChunk d{kv.get(), absl::MakeConstSpan(&tok, 1)};
          if (!e.Forward({d}, false, &logits).ok()) return 1;
          tok = static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
        }
        auto t3 = Clock::now();
        const double dec = Seconds(t2, t3) / steps;
        // Bytes a decode step must read: all weights held (every expert may be
        // routed to over a run; routed experts actually used are fewer) are an
        // upper bound, so count the active ones: attention + dense/shared MLP +
        // top-k experts + lm_head, plus the KV rows of every layer.
        const double H = c.hidden_size, L = c.kv_lora_rank, R = c.qk_rope_head_dim, NH = c.num_heads;
        double active = 0;
        for (int l = 0; l < c.num_layers; ++l) {
          active += H * (c.q_lora_rank ? c.q_lora_rank : NH * c.qk_head_dim()) +
                    (c.q_lora_rank ? c.q_lora_rank * NH * c.qk_head_dim() : 0) + H * (L + R) +
                    L * NH * (c.qk_nope_head_dim + c.v_head_dim) + NH * c.v_head_dim * H;
          if (c.layers[l].moe) {
            active += 3.0 * H * c.moe_intermediate_size * (c.num_experts_per_tok + c.n_shared_experts) + H * c.n_routed_experts;
          } else {
            active += 3.0 * H * c.intermediate_size;
          }
        }
        active += H * c.vocab_size;
        const double t = ctx + steps / 2.0;
        const double kv_bytes = c.num_layers * t * (L + R) * 4.0;  // engine reads dequantised floats
        const double bytes = active * 4 + kv_bytes;
        const double fl = 2 * active + c.num_layers * t * NH * 2 * (2 * (L + R) + L) + c.num_layers * NH * 2 * L * (c.qk_nope_head_dim + c.v_head_dim);
        const double floor_s = std::max(bytes / bw, fl / flops);
        std::printf("%-6d %-4s %-7d %12.1f %12.3f %12.1f %10.2f %10.2f %8.2f\n", ctx,
                    dt == KvDtype::kF32 ? "f32" : "fp8", e.num_threads(), ctx / Seconds(t0, t1), dec * 1e3,
                    1.0 / dec, bytes / dec / 1e9, fl / dec / 1e9, dec / floor_s);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
