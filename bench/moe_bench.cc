// Routed experts of one MoE step at DeepSeek-V3's dimensions (256 experts of
// 7168 -> 2048 -> 7168, bf16, 8 per token), with tokens routed uniformly at
// random (a trained router spreads a batch over many experts; the synthetic
// weights of strata_gpu_e2e_bench send a batch to the same few). Per step
// size: the matrix-vector kernels (LaunchMoeGemv), the tensor-core kernels
// (LaunchMoeGemm), and one cuBLASLt GEMM pair per used expert as the
// host-dispatched path runs them (the GEMMs alone: no gathers, no
// activation, no id round trip), next to the floor set by the used experts'
// weight bytes at the measured copy bandwidth.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

#include "bench/copy_bandwidth.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/layer_ops.h"
#include "kernels/cuda/moe_gemv.h"

namespace {

using strata::cuda::GemmArgs;
using strata::cuda::GemmType;

#define CHECK_CUDA(x)                                                                    \
  do {                                                                                   \
    const cudaError_t check_err_ = (x);                                                  \
    if (check_err_ != cudaSuccess) {                                                     \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(check_err_)); \
      return 1;                                                                          \
    }                                                                                    \
  } while (0)

constexpr int kExperts = 256, kHidden = 7168, kInter = 2048, kTopK = 8;

// Median device time of `run` over 9 calls after 2 warm-ups, in µs.
template <typename F>
double TimeUs(F&& run) {
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<float> t;
  for (int i = 0; i < 11; ++i) {
    cudaEventRecord(e0);
    if (!run()) return -1;
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms;
    cudaEventElapsedTime(&ms, e0, e1);
    if (i >= 2) t.push_back(ms);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2] * 1e3;
}

}  // namespace

int main() {
  const double bw = strata::bench::CopyBandwidth();
  std::printf("measured copy bandwidth: %.2f TB/s\n", bw / 1e12);
  const size_t gu = size_t{2} * kInter * kHidden, dn = size_t{kHidden} * kInter;  // elements per expert
  void *w_gate_up, *w_down;
  CHECK_CUDA(cudaMalloc(&w_gate_up, gu * kExperts * 2));
  CHECK_CUDA(cudaMalloc(&w_down, dn * kExperts * 2));
  CHECK_CUDA(strata::cuda::LaunchFillUniform(w_gate_up, true, gu * kExperts, 1, 0.0f, 0.01f, nullptr));
  CHECK_CUDA(strata::cuda::LaunchFillUniform(w_down, true, dn * kExperts, 2, 0.0f, 0.02f, nullptr));
  std::vector<const void*> ptrs(2 * kExperts);
  for (int e = 0; e < kExperts; ++e) {
    ptrs[e] = static_cast<const uint16_t*>(w_gate_up) + gu * e;
    ptrs[kExperts + e] = static_cast<const uint16_t*>(w_down) + dn * e;
  }
  const void** table;
  CHECK_CUDA(cudaMalloc(&table, ptrs.size() * sizeof(void*)));
  CHECK_CUDA(cudaMemcpy(table, ptrs.data(), ptrs.size() * sizeof(void*), cudaMemcpyHostToDevice));
  const int max_rows = 512, max_n = max_rows * kTopK;
  float *x, *act, *y, *g;
  void *x16, *act16;
  int *ids, *idx;
  CHECK_CUDA(cudaMalloc(&x, size_t{max_rows} * kHidden * 4));
  CHECK_CUDA(cudaMalloc(&act, size_t{max_n} * kInter * 4));
  CHECK_CUDA(cudaMalloc(&y, size_t{max_n} * kHidden * 4));
  CHECK_CUDA(cudaMalloc(&g, size_t{max_n} * 2 * kInter * 4));
  CHECK_CUDA(cudaMalloc(&x16, size_t{max_n} * kHidden * 2));
  CHECK_CUDA(cudaMalloc(&act16, size_t{max_n} * kInter * 2));
  CHECK_CUDA(cudaMalloc(&ids, max_n * 4));
  CHECK_CUDA(cudaMalloc(&idx, strata::cuda::MoeIndexInts(kExperts, max_n) * 4));
  CHECK_CUDA(strata::cuda::LaunchFillUniform(x, false, size_t{max_rows} * kHidden, 3, 0.0f, 1.0f, nullptr));
  CHECK_CUDA(strata::cuda::LaunchFillUniform(x16, true, size_t{max_n} * kHidden, 4, 0.0f, 1.0f, nullptr));
  CHECK_CUDA(strata::cuda::LaunchFillUniform(act16, true, size_t{max_n} * kInter, 5, 0.0f, 1.0f, nullptr));
  auto gemm = strata::cuda::GemmRunner::Create(false);
  if (!gemm.ok()) return 1;

  std::mt19937 rng(20261129);
  std::printf("\n%-6s %-8s %10s %10s %12s %10s %10s\n", "rows", "experts", "gemv us", "mma us", "cublas us",
              "floor us", "mma/floor");
  for (int rows : {1, 4, 8, 16, 32, 64, 128, 256, 512}) {
    std::vector<int> h_ids(static_cast<size_t>(rows) * kTopK);
    for (int r = 0; r < rows; ++r) {
      std::vector<int> all(kExperts);
      for (int e = 0; e < kExperts; ++e) all[e] = e;
      std::shuffle(all.begin(), all.end(), rng);
      std::copy(all.begin(), all.begin() + kTopK, h_ids.begin() + static_cast<size_t>(r) * kTopK);
    }
    CHECK_CUDA(cudaMemcpy(ids, h_ids.data(), h_ids.size() * 4, cudaMemcpyHostToDevice));
    std::vector<int> count(kExperts, 0);
    for (int e : h_ids) ++count[e];
    const int used = static_cast<int>(std::count_if(count.begin(), count.end(), [](int c) { return c > 0; }));
    strata::cuda::MoeGemvParams p;
    p.type = GemmType::kBF16;
    p.gate_up = table;
    p.down = table + kExperts;
    p.experts = kExperts;
    p.hidden = kHidden;
    p.inter = kInter;
    p.x = x;
    p.expert_ids = ids;
    p.rows = rows;
    p.k = kTopK;
    strata::cuda::SetMoeIndexWorkspace(p, idx);
    p.act = act;
    p.y = y;
    const double gemv = TimeUs([&] { return strata::cuda::LaunchMoeGemv(p, nullptr) == cudaSuccess; });
    const double mma = TimeUs([&] { return strata::cuda::LaunchMoeGemm(p, nullptr) == cudaSuccess; });
    const double cublas = TimeUs([&] {
      int off = 0;
      for (int e = 0; e < kExperts; ++e) {
        if (count[e] == 0) continue;
        GemmArgs a;
        a.type = GemmType::kBF16;
        a.m = count[e];
        a.n = 2 * kInter;
        a.k = kHidden;
        a.x = static_cast<const uint16_t*>(x16) + static_cast<size_t>(off) * kHidden;
        a.ldx = kHidden;
        a.w = ptrs[e];
        a.ldw = kHidden;
        a.y = g + static_cast<size_t>(off) * 2 * kInter;
        a.ldy = 2 * kInter;
        if (!(*gemm)->Run(a, nullptr).ok()) return false;
        GemmArgs b = a;
        b.n = kHidden;
        b.k = kInter;
        b.x = static_cast<const uint16_t*>(act16) + static_cast<size_t>(off) * kInter;
        b.ldx = kInter;
        b.w = ptrs[kExperts + e];
        b.ldw = kInter;
        b.y = y + static_cast<size_t>(off) * kHidden;
        b.ldy = kHidden;
        if (!(*gemm)->Run(b, nullptr).ok()) return false;
        off += count[e];
      }
      return true;
    });
    const double floor_us = used * (gu + dn) * 2.0 / bw * 1e6;
    std::printf("%-6d %-8d %10.1f %10.1f %12.1f %10.1f %9.2fx\n", rows, used, gemv, mma, cublas, floor_us,
                mma / floor_us);
    std::fflush(stdout);
  }
  return 0;
}
