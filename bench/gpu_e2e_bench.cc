// End-to-end decode on the GPU with DeepSeek-V3's real dimensions (7168
// hidden, 128 heads, MLA 512/64, 256 experts of 2048, 8 per token): a few
// layers of each kind, weights generated on the device from a seed, KV
// filled with random rows for long contexts. Prints, per layer, the decode
// step time at batch 1 and 32 and context 4k and 128k next to the floor
// set by the bytes that step must read (active weights + KV) at the copy
// bandwidth measured in the same run. Then prefill: one sequence, a chunk
// of 512 prompt tokens after a prefix of 0, 4k or 32k tokens, per layer,
// next to its FLOPs (dense GEMMs plus absorbed attention).
//
//   strata_gpu_e2e_bench [--dsa] [--fp8-weights] [--split-bf16-rows=N] [--no-small-gemv] [--profile-step]
//     --dsa: DeepSeek-V3.2 with the indexer, top-2048 sparse attention;
//     --fp8-weights: GpuEngineOptions::fp8_weights (every projection, the dense
//     MLP and the experts in fp8 with 128x128 block scales; kv_b stays bf16);
//     --split-bf16-rows: GpuEngineOptions::split_bf16_max_rows (0: every
//     GEMM input rounded to bf16); --no-small-gemv: steps of <= 4 rows use
//     cuBLASLt too (GpuEngineOptions::small_step_gemv); --profile-step: only
//     batch 1 at 4k, its first measured step between cudaProfilerStart and
//     cudaProfilerStop (for a profiler started with --profile-from-start off).
#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench/copy_bandwidth.h"
#include "model/config.h"
#include "model/gpu/gpu_engine.h"

namespace {

// DeepSeek-V3's (and V3.2's) real dimensions with three layers: the model
// directories strata up --synthetic-weights serves (config.json only).
constexpr const char* kV3Dir = "bench/synthetic/deepseek-v3-3l";
constexpr const char* kV32Dir = "bench/synthetic/deepseek-v32-3l";

}  // namespace

int main(int argc, char** argv) {
  bool dsa = false;
  int split_rows = strata::GpuEngineOptions().split_bf16_max_rows;
  bool small_gemv = true;
  bool profile_step = false;
  bool fp8 = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--dsa") == 0) {
      dsa = true;
    } else if (std::strcmp(argv[i], "--fp8-weights") == 0) {
      fp8 = true;
    } else if (std::strcmp(argv[i], "--no-small-gemv") == 0) {
      small_gemv = false;
    } else if (std::strcmp(argv[i], "--profile-step") == 0) {
      profile_step = true;
    } else if (std::strncmp(argv[i], "--split-bf16-rows=", 18) == 0) {
      char* end = nullptr;
      const long v = std::strtol(argv[i] + 18, &end, 10);
      if (end == argv[i] + 18 || *end != '\0' || v < 0 || v > INT32_MAX) {
        std::fprintf(stderr, "--split-bf16-rows: expected a row count, got '%s'\n", argv[i] + 18);
        return 2;
      }
      split_rows = static_cast<int>(v);
    } else {
      std::fprintf(stderr,
                   "usage: strata_gpu_e2e_bench [--dsa] [--fp8-weights] [--split-bf16-rows=N] [--no-small-gemv] "
                   "[--profile-step]\n");
      return 2;
    }
  }
  auto config = strata::LoadModelConfig(dsa ? kV32Dir : kV3Dir);  // (run from the tree's root)
  if (!config.ok()) {
    std::fprintf(stderr, "config: %s\n", config.status().ToString().c_str());
    return 1;
  }
  const strata::ModelConfig& c = *config;
  const double bw = strata::bench::CopyBandwidth();
  std::printf("model: %s dims, %d layers (layer 0 dense MLP, then MoE), %s weights, fp8 KV\n",
              dsa ? "DeepSeek-V3.2 (DSA top-2048)" : "DeepSeek-V3", c.num_layers,
              fp8 ? "fp8 block-scaled (kv_b bf16)" : "bf16");
  std::printf("measured copy bandwidth: %.2f TB/s\n", bw / 1e12);
  strata::GpuEngineOptions opt;
  opt.kv_cache_bytes = int64_t{14} << 30;
  opt.profile_layers = true;
  opt.split_bf16_max_rows = split_rows;
  opt.small_step_gemv = small_gemv;
  opt.fp8_weights = fp8;
  std::printf("GEMM inputs of steps of at most %d rows split into hi + lo bf16; steps of <= 4 rows %s\n", split_rows,
              small_gemv ? "on the matrix-vector kernels" : "through cuBLASLt");
  const auto t0 = std::chrono::steady_clock::now();
  auto engine = strata::GpuEngine::CreateSynthetic(c, opt, 20261129);
  if (!engine.ok()) {
    std::fprintf(stderr, "engine: %s\n", engine.status().ToString().c_str());
    return 1;
  }
  const double gen_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("weights: %.1f GB generated on the device in %.1f s\n", (*engine)->weight_bytes() / 1e9, gen_s);

  // Bytes one decode step must read per layer, besides the KV.
  const double H = c.hidden_size, NH = c.num_heads, QK = c.qk_head_dim(), L = c.kv_lora_rank,
               R = c.qk_rope_head_dim;
  // Bytes per weight: 2 in bf16; 1 + 4 / 128² in fp8 (codes and block scales).
  const double wb = fp8 ? 1.0 + 4.0 / (128 * 128) : 2.0;
  const double attn = wb * (H * c.q_lora_rank + c.q_lora_rank * NH * QK + H * (L + R) + NH * c.v_head_dim * H) +
                      2 * NH * (c.qk_nope_head_dim + c.v_head_dim) * L;
  const double indexer = dsa ? wb * (c.q_lora_rank * c.index_n_heads * c.index_head_dim + H * c.index_head_dim +
                                     H * c.index_n_heads)
                             : 0;
  const double expert = wb * 3 * H * c.moe_intermediate_size;
  const double dense_mlp = wb * 3 * H * c.intermediate_size;
  const double router = 4 * H * c.n_routed_experts;
  const double row_bytes = 512 + 64 + 8;  // one token's fp8 row and scales
  const double key_bytes = 128 + 4;       // one indexer key

  std::printf("\n%-6s %-8s %-6s %-10s %10s %12s %10s %8s %9s\n", "batch", "context", "layer", "kind", "us/step",
              "bytes/step", "floor us", "ratio", "experts");
  for (int batch : {1, 32}) {
    for (int64_t ctx : {int64_t{4096}, int64_t{131072}}) {
      if (profile_step && (batch != 1 || ctx != 4096)) continue;
      std::vector<std::unique_ptr<strata::GpuSequence>> seqs;
      for (int b = 0; b < batch; ++b) {
        auto s = (*engine)->NewSequence();
        if (!s.ok()) return 1;
        const absl::Status f = (*engine)->FillRandomContext(s->get(), ctx, 1000 + b);
        if (!f.ok()) {
          std::fprintf(stderr, "fill: %s\n", f.ToString().c_str());
          return 1;
        }
        seqs.push_back(std::move(*s));
      }
      std::vector<std::vector<float>> sums(c.num_layers);
      std::vector<int> experts(c.num_layers, 0);
      std::vector<int> token(batch, 7);
      std::vector<float> logits;
      const int warm = 2, steps = 7;
      for (int it = 0; it < warm + steps; ++it) {
        std::vector<strata::GpuChunk> chunks;
        for (int b = 0; b < batch; ++b) chunks.push_back({seqs[b].get(), absl::MakeConstSpan(&token[b], 1)});
        if (profile_step && it == warm) cudaProfilerStart();
        const absl::Status st = (*engine)->Forward(chunks, false, &logits);
        if (profile_step && it == warm) cudaProfilerStop();
        if (!st.ok()) {
          std::fprintf(stderr, "step: %s\n", st.ToString().c_str());
          return 1;
        }
        for (int b = 0; b < batch; ++b) {
          const float* row = &logits[static_cast<size_t>(b) * c.vocab_size];
          token[b] = static_cast<int>(std::max_element(row, row + c.vocab_size) - row);
        }
        if (it < warm) continue;
        for (int l = 0; l < c.num_layers; ++l) {
          sums[l].push_back((*engine)->profile()[l].ms);
          experts[l] = std::max(experts[l], (*engine)->profile()[l].experts_used);
        }
      }
      for (int l = 0; l < c.num_layers; ++l) {
        std::sort(sums[l].begin(), sums[l].end());
        const double us = sums[l][sums[l].size() / 2] * 1e3;
        const bool moe = c.layers[l].moe;
        const int64_t kv_rows = dsa ? std::min<int64_t>(ctx, c.index_topk) : ctx;
        double bytes = attn + indexer + batch * kv_rows * row_bytes + (dsa ? batch * ctx * key_bytes : 0);
        bytes += moe ? router + expert * (experts[l] + c.n_shared_experts) : dense_mlp;
        const double floor_us = bytes / bw * 1e6;
        std::printf("%-6d %-8lld %-6d %-10s %10.1f %11.1fM %10.1f %7.2fx %9d\n", batch,
                    static_cast<long long>(ctx), l, moe ? "moe" : "dense", us, bytes / 1e6, floor_us,
                    us / floor_us, moe ? experts[l] : 0);
      }
      std::fflush(stdout);
    }
  }
  if (profile_step) return 0;

  // ---- the last stage's token choice for 32 rows ----------------------------
  // lm_head, then: the device argmax, the device sampler (temperature 0.8,
  // top-p 0.9), or the logits copied to the host (where penalties and
  // logprobs are applied). Wall time per call, median of 9.
  {
    const int rows = 32;
    std::vector<float> hidden(static_cast<size_t>(rows) * c.hidden_size);
    for (size_t i = 0; i < hidden.size(); ++i) hidden[i] = static_cast<float>((i * 2654435761u) % 1000) / 500.0f - 1.0f;
    std::vector<strata::SampleDraw> draws(rows);
    for (int r = 0; r < rows; ++r) draws[r] = strata::SampleDraw{0.8f, 0, 0.9f, 0.0f, (r + 0.5) / rows};
    auto time_ms = [&](auto&& call) {
      std::vector<double> t;
      for (int i = 0; i < 10; ++i) {
        const auto a = std::chrono::steady_clock::now();
        if (!call().ok()) return -1.0;
        if (i > 0) t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count());
      }
      std::sort(t.begin(), t.end());
      return t[t.size() / 2];
    };
    std::vector<int> ids;
    std::vector<float> logits;
    const double argmax = time_ms([&] { return (*engine)->GreedyTokens(hidden.data(), rows, &ids); });
    const double sampled = time_ms([&] { return (*engine)->SampleTokens(hidden.data(), draws, &ids); });
    const double copied = time_ms([&] { return (*engine)->Logits(hidden.data(), rows, &logits); });
    // The host path as a worker runs it: the logits copied, then each row
    // through its request's Sampler on one thread.
    strata::SamplingParams sp;
    sp.temperature = 0.8f;
    sp.top_p = 0.9f;
    sp.seed = 1;
    auto host_sampler = strata::Sampler::Create(sp, c.vocab_size);
    if (!host_sampler.ok()) return 1;
    const double on_host = time_ms([&] {
      const absl::Status st = (*engine)->Logits(hidden.data(), rows, &logits);
      for (int r = 0; r < rows && st.ok(); ++r)
        ids[r] = (*host_sampler)->Sample(absl::MakeConstSpan(&logits[static_cast<size_t>(r) * c.vocab_size], c.vocab_size));
      return st;
    });
    std::printf("\ntoken choice for %d rows (vocabulary %d, lm_head included), ms per call: device argmax %.3f, "
                "device sampler (T 0.8, top-p 0.9) %.3f; logits to the host %.3f, and sampled there (one thread) "
                "%.3f\n",
                rows, c.vocab_size, argmax, sampled, copied, on_host);
  }

  // ---- prefill: one sequence, a 512-token chunk after a prefix ------------
  // FLOPs per prompt token and layer: the GEMMs (2 per weight of the dense
  // MLP, or of the shared and 8 routed experts) and the absorbed attention
  // over its prefix (2 x heads x (576 + 512) per key).
  const int chunk = 512;
  const double moe_params = 3 * H * c.moe_intermediate_size * (c.num_experts_per_tok + c.n_shared_experts) +
                            H * c.n_routed_experts;
  std::printf("\nprefill: one sequence, %d prompt tokens after a prefix (median of 3, after one warm-up)\n", chunk);
  std::printf("%-8s %-6s %-6s %10s %12s %10s\n", "prefix", "layer", "kind", "ms", "GFLOP", "TFLOP/s");
  for (int64_t prefix : {int64_t{0}, int64_t{4096}, int64_t{32768}}) {
    std::vector<std::vector<float>> ms(c.num_layers);
    std::vector<double> wall;
    std::vector<int> prompt(chunk);
    double first_ms = 0;
    int experts = 0;
    for (int rep = 0; rep < 4; ++rep) {
      // A new prompt each time: new expert row counts, as a server sees.
      for (int i = 0; i < chunk; ++i) prompt[i] = static_cast<int>((i * 7919 + 13 + rep * 104729) % c.vocab_size);
      auto s = (*engine)->NewSequence();
      if (!s.ok()) return 1;
      if (prefix > 0 && !(*engine)->FillRandomContext(s->get(), prefix, 77 + rep).ok()) return 1;
      std::vector<float> logits;
      const strata::GpuChunk one{s->get(), absl::MakeConstSpan(prompt)};
      const auto w0 = std::chrono::steady_clock::now();
      const absl::Status st = (*engine)->Forward(absl::MakeConstSpan(&one, 1), false, &logits);
      const double w = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - w0).count();
      if (!st.ok()) {
        std::fprintf(stderr, "prefill: %s\n", st.ToString().c_str());
        return 1;
      }
      if (rep == 0) {  // warm-up
        first_ms = w;
        continue;
      }
      wall.push_back(w);
      for (int l = 0; l < c.num_layers; ++l) {
        ms[l].push_back((*engine)->profile()[l].ms);
        experts = std::max(experts, (*engine)->profile()[l].experts_used);
      }
    }
    double keys = 0;  // causal: each row attends to position + 1 keys (at most top-k with DSA)
    for (int i = 0; i < chunk; ++i)
      keys += dsa ? std::min<double>(c.index_topk, prefix + i + 1) : static_cast<double>(prefix + i + 1);
    const double attn_flops = 2.0 * NH * (L + R + L) * keys;
    for (int l = 0; l < c.num_layers; ++l) {
      std::sort(ms[l].begin(), ms[l].end());
      const double t = ms[l][ms[l].size() / 2];
      const bool moe = c.layers[l].moe;
      const double gemm = 2.0 * chunk * ((attn + indexer) / 2 + (moe ? moe_params : dense_mlp / 2));
      const double flops = gemm + attn_flops;
      std::printf("%-8lld %-6d %-6s %10.2f %12.1f %10.1f\n", static_cast<long long>(prefix), l,
                  moe ? "moe" : "dense", t, flops / 1e9, flops / (t * 1e-3) / 1e12);
    }
    std::sort(wall.begin(), wall.end());
    std::printf("%-8lld whole Forward (wall, host included): %.2f ms (first one %.2f ms); experts used per MoE "
                "layer up to %d; all %d experts' weights read at the copy bandwidth: %.2f ms\n",
                static_cast<long long>(prefix), wall[wall.size() / 2], first_ms, experts, c.n_routed_experts,
                expert * c.n_routed_experts / bw * 1e3);
    std::fflush(stdout);
  }
  return 0;
}
