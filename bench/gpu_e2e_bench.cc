// End-to-end decode on the GPU with DeepSeek-V3's real dimensions (7168
// hidden, 128 heads, MLA 512/64, 256 experts of 2048, 8 per token): a few
// layers of each kind, weights generated on the device from a seed, KV
// filled with random rows for long contexts. Prints, per layer, the decode
// step time at batch 1 and 32 and context 4k and 128k next to the floor
// set by the bytes that step must read (active weights + KV) at the copy
// bandwidth measured in the same run.
//
//   strata_gpu_e2e_bench [--dsa]   (--dsa: DeepSeek-V3.2 with the indexer,
//                                   top-2048 sparse attention)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/gpu/gpu_engine.h"

namespace {

// DeepSeek-V3's (and V3.2's) real dimensions with three layers: the model
// directories strata up --synthetic-weights serves (config.json only).
constexpr const char* kV3Dir = "bench/synthetic/deepseek-v3-3l";
constexpr const char* kV32Dir = "bench/synthetic/deepseek-v32-3l";

// Device-to-device copy bandwidth (read + write bytes / time), 1 GiB.
double CopyBandwidth() {
  const size_t n = size_t{1} << 30;
  void *a, *b;
  if (cudaMalloc(&a, n) != cudaSuccess || cudaMalloc(&b, n) != cudaSuccess) return 0;
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<float> ms;
  for (int i = 0; i < 12; ++i) {
    cudaEventRecord(e0);
    cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float t;
    cudaEventElapsedTime(&t, e0, e1);
    if (i >= 2) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  cudaFree(a);
  cudaFree(b);
  return 2.0 * n / (ms[ms.size() / 2] * 1e-3);
}

}  // namespace

int main(int argc, char** argv) {
  const bool dsa = argc > 1 && std::strcmp(argv[1], "--dsa") == 0;
  auto config = strata::LoadModelConfig(dsa ? kV32Dir : kV3Dir);  // (run from the tree's root)
  if (!config.ok()) {
    std::fprintf(stderr, "config: %s\n", config.status().ToString().c_str());
    return 1;
  }
  const strata::ModelConfig& c = *config;
  const double bw = CopyBandwidth();
  std::printf("model: %s dims, %d layers (layer 0 dense MLP, then MoE), bf16 weights, fp8 KV\n",
              dsa ? "DeepSeek-V3.2 (DSA top-2048)" : "DeepSeek-V3", c.num_layers);
  std::printf("measured copy bandwidth: %.2f TB/s\n", bw / 1e12);
  strata::GpuEngineOptions opt;
  opt.kv_cache_bytes = int64_t{14} << 30;
  opt.profile_layers = true;
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
  const double attn = 2 * (H * c.q_lora_rank + c.q_lora_rank * NH * QK + H * (L + R) +
                           NH * (c.qk_nope_head_dim + c.v_head_dim) * L + NH * c.v_head_dim * H);
  const double indexer = dsa ? 2 * (c.q_lora_rank * c.index_n_heads * c.index_head_dim + H * c.index_head_dim +
                                    H * c.index_n_heads)
                             : 0;
  const double expert = 2 * 3 * H * c.moe_intermediate_size;
  const double dense_mlp = 2 * 3 * H * c.intermediate_size;
  const double router = 4 * H * c.n_routed_experts;
  const double row_bytes = 512 + 64 + 8;  // one token's fp8 row and scales
  const double key_bytes = 128 + 4;       // one indexer key

  std::printf("\n%-6s %-8s %-6s %-10s %10s %12s %10s %8s %9s\n", "batch", "context", "layer", "kind", "us/step",
              "bytes/step", "floor us", "ratio", "experts");
  for (int batch : {1, 32}) {
    for (int64_t ctx : {int64_t{4096}, int64_t{131072}}) {
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
        const absl::Status st = (*engine)->Forward(chunks, false, &logits);
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
  return 0;
}
