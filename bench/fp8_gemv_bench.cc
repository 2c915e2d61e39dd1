// Strata's fp8 block-scaled small-step GEMM (kernels/cuda/fp8_gemv.h) at
// DeepSeek-V3.2's weight shapes, M = 1, 2, 4, 8: µs per call, weight bytes/s,
// FLOP/s, and the ratio to the floor set by the weight's bytes (fp8 codes and
// f32 block scales) at the device copy bandwidth measured in the same run.
// Both forms run: tensor cores (the default for M > 1 and the batch-invariant
// form) and CUDA cores (the default for M = 1). Each shape's calls are captured in a CUDA graph and replayed, and each call
// reads another copy of the weight (enough copies to pass 512 MiB), so the
// L2 holds none of it: what a decode step sees, layer after layer. The bf16
// kernel of the engine today (LaunchSmallGemm on the dequantised weight, M <=
// 4, twice the bytes) runs beside it the same way.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "bench/copy_bandwidth.h"
#include "kernels/cuda/fp8_gemm.h"
#include "kernels/cuda/fp8_gemv.h"
#include "kernels/cuda/small_gemm.h"

namespace {

using strata::cuda::Fp8GemvArgs;
using strata::cuda::GemmArgs;

#define CHECK_CUDA(x)                                                                           \
  do {                                                                                          \
    const cudaError_t check_err_ = (x);                                                         \
    if (check_err_ != cudaSuccess) {                                                            \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(check_err_)); \
      std::exit(1);                                                                             \
    }                                                                                           \
  } while (0)

struct Shape {
  const char* name;
  int n, k;
};

// DeepSeek-V3.2's fp8 linear weights (N × K), one layer.
constexpr Shape kShapes[] = {
    {"q_a", 1536, 7168},         {"kv_a", 576, 7168},          {"q_b", 24576, 1536},
    {"o_proj", 7168, 16384},     {"indexer wq_b", 8192, 1536}, {"indexer wk", 128, 7168},
    {"expert gate+up", 4096, 7168}, {"expert down", 7168, 2048}, {"dense gate+up", 36864, 7168},
    {"dense down", 7168, 18432},
};
constexpr int kRowCounts[] = {1, 2, 4, 8};
constexpr size_t kPoolBytes = size_t{512} << 20;
constexpr int kCallsPerGraph = 64;

// µs per call: `launch(c)` for c = 0 .. kCallsPerGraph - 1 captured once and
// replayed; median of 9 replays after 2 warm-ups.
template <typename Launch>
double GraphUsPerCall(cudaStream_t stream, Launch&& launch) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  for (int c = 0; c < kCallsPerGraph; ++c) CHECK_CUDA(launch(c));
  CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t e0, e1;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));
  std::vector<float> ms;
  for (int r = 0; r < 11; ++r) {
    CHECK_CUDA(cudaEventRecord(e0, stream));
    CHECK_CUDA(cudaGraphLaunch(exec, stream));
    CHECK_CUDA(cudaEventRecord(e1, stream));
    CHECK_CUDA(cudaEventSynchronize(e1));
    float t = 0;
    CHECK_CUDA(cudaEventElapsedTime(&t, e0, e1));
    if (r >= 2) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  CHECK_CUDA(cudaEventDestroy(e0));
  CHECK_CUDA(cudaEventDestroy(e1));
  CHECK_CUDA(cudaGraphExecDestroy(exec));
  CHECK_CUDA(cudaGraphDestroy(graph));
  return ms[ms.size() / 2] * 1e3 / kCallsPerGraph;
}

}  // namespace

int main() {
  const double bw = strata::bench::CopyBandwidth();
  if (bw <= 0) {
    std::fprintf(stderr, "cannot measure the copy bandwidth\n");
    return 1;
  }
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %d SMs, L2 %d MB; measured copy bandwidth %.2f TB/s (the ceiling)\n", prop.name,
              prop.multiProcessorCount, prop.l2CacheSize >> 20, bw / 1e12);

  // One pool of random codes (a weight's copies are slices of it), one of
  // random bf16 weights for the bf16 kernel, scales, inputs and outputs.
  uint8_t* codes;
  uint16_t* bf16;
  CHECK_CUDA(cudaMalloc(&codes, kPoolBytes));
  CHECK_CUDA(cudaMalloc(&bf16, kPoolBytes * 2));
  {
    std::mt19937_64 rng(1);
    std::vector<uint8_t> block(size_t{64} << 20);
    for (uint8_t& b : block) b = static_cast<uint8_t>(rng());
    for (size_t off = 0; off < kPoolBytes; off += block.size()) {
      CHECK_CUDA(cudaMemcpy(codes + off, block.data(), block.size(), cudaMemcpyHostToDevice));
    }
    for (uint8_t& b : block) b = static_cast<uint8_t>(rng() & 0x3F);  // bf16 high bytes stay small, finite
    for (size_t off = 0; off < kPoolBytes * 2; off += block.size()) {
      CHECK_CUDA(cudaMemcpy(reinterpret_cast<uint8_t*>(bf16) + off, block.data(), block.size(),
                            cudaMemcpyHostToDevice));
    }
  }
  const int max_k = 18432, max_n = 36864;
  float *scale, *x, *y;
  CHECK_CUDA(cudaMalloc(&scale, size_t{kPoolBytes / (128 * 128) + 4096} * 4));
  CHECK_CUDA(cudaMemset(scale, 0, size_t{kPoolBytes / (128 * 128) + 4096} * 4));
  CHECK_CUDA(cudaMalloc(&x, size_t{8} * max_k * 4));
  CHECK_CUDA(cudaMemset(x, 0, size_t{8} * max_k * 4));
  CHECK_CUDA(cudaMalloc(&y, size_t{8} * max_n * 4));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  std::printf("| weight (N x K) | MB | M | tensor cores us | TB/s | x floor | TFLOP/s | CUDA cores us | x floor | bf16 us | bf16 x fp8 floor |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (const Shape& s : kShapes) {
    const int bn = (s.n + 127) / 128, bk = (s.k + 127) / 128;
    const size_t w_bytes = size_t{1} * s.n * s.k, s_bytes = size_t{4} * bn * bk;
    const double bytes = static_cast<double>(w_bytes + s_bytes);
    const double floor_us = bytes / bw * 1e6;
    const int copies = static_cast<int>(std::max<size_t>(1, kPoolBytes / w_bytes));
    const int bf16_copies = static_cast<int>(std::max<size_t>(1, kPoolBytes / w_bytes));  // 2x bytes, 2x pool
    for (int m : kRowCounts) {
      auto fp8 = [&](int c, strata::cuda::Fp8GemvForm form) {
        Fp8GemvArgs a;
        a.m = m, a.n = s.n, a.k = s.k;
        a.x = x, a.ldx = s.k;
        a.w = codes + (c % copies) * w_bytes, a.ldw = s.k;
        a.scale = scale, a.ld_scale = bk;
        a.y = y, a.ldy = s.n;
        a.form = form;
        return strata::cuda::LaunchFp8Gemv(a, stream);
      };
      const double us = GraphUsPerCall(stream, [&](int c) { return fp8(c, strata::cuda::Fp8GemvForm::kTensorCores); });
      const double cuda_us = GraphUsPerCall(stream, [&](int c) { return fp8(c, strata::cuda::Fp8GemvForm::kCudaCores); });
      double bf16_us = -1;
      if (m <= strata::cuda::kSmallGemmMaxRows) {
        bf16_us = GraphUsPerCall(stream, [&](int c) {
          GemmArgs a;
          a.m = m, a.n = s.n, a.k = s.k;
          a.type = strata::cuda::GemmType::kBF16;
          a.x = x, a.ldx = s.k;
          a.w = bf16 + (c % bf16_copies) * w_bytes, a.ldw = s.k;
          a.y = y, a.ldy = s.n;
          return strata::cuda::LaunchSmallGemm(a, stream);
        });
      }
      const double tflops = 2.0 * m * s.n * s.k / (us * 1e-6) / 1e12;
      char bf16_cells[64] = "| - | - |";
      if (bf16_us > 0) std::snprintf(bf16_cells, sizeof(bf16_cells), "| %.1f | %.2f |", bf16_us, bf16_us / floor_us);
      std::printf("| %s %d x %d | %.1f | %d | %.1f | %.2f | %.2f | %.2f | %.1f | %.2f %s\n", s.name, s.n, s.k, bytes / 1e6,
                  m, us, bytes / (us * 1e-6) / 1e12, us / floor_us, tflops, cuda_us, cuda_us / floor_us, bf16_cells);
    }
  }

  // Larger steps through Fp8GemmRunner: activation quantisation per 1×128
  // group plus the library's block-scaled GEMM. The fp8 rate: the runner on
  // 8192³ in this run.
  auto runner_or = strata::cuda::Fp8GemmRunner::Create(false);
  if (!runner_or.ok()) {
    std::fprintf(stderr, "%s\n", runner_or.status().ToString().c_str());
    return 1;
  }
  strata::cuda::Fp8GemmRunner& runner = **runner_or;
  constexpr int kBigRows = 8192, kRunnerRows[] = {16, 64, 256, 1024};
  float *bx, *by;
  CHECK_CUDA(cudaMalloc(&bx, size_t{kBigRows} * max_k * 4));
  CHECK_CUDA(cudaMemset(bx, 0, size_t{kBigRows} * max_k * 4));
  CHECK_CUDA(cudaMalloc(&by, size_t{kBigRows} * max_n * 4));
  auto runner_us = [&](int m, int n, int k, int copies, size_t w_bytes) {
    auto call = [&, m, n, k](int c) {
      Fp8GemvArgs a;
      a.m = m, a.n = n, a.k = k;
      a.x = bx, a.ldx = k;
      a.w = codes + (c % copies) * w_bytes, a.ldw = k;
      a.scale = scale, a.ld_scale = (k + 127) / 128;
      a.y = by, a.ldy = n;
      return runner.Run(a, stream).ok() ? cudaSuccess : cudaErrorUnknown;
    };
    CHECK_CUDA(call(0));  // allocations and the algorithm query outside the capture
    CHECK_CUDA(cudaStreamSynchronize(stream));
    return GraphUsPerCall(stream, call);
  };
  const double big_us = runner_us(kBigRows, 8192, 8192, 1, 0);
  const double rate = 2.0 * kBigRows * 8192.0 * 8192.0 / (big_us * 1e-6);
  std::printf("\nFp8GemmRunner above eight rows (quantise + library); its fp8 rate at 8192^3: %.0f TFLOP/s\n",
              rate / 1e12);
  std::printf("| weight (N x K) | M | us | weight TB/s | TFLOP/s | x max(byte floor, rate floor) |\n| --- | --- | --- | --- | --- | --- |\n");
  for (const Shape& s : kShapes) {
    const size_t w_bytes = size_t{1} * s.n * s.k;
    const double bytes = static_cast<double>(w_bytes + size_t{4} * ((s.n + 127) / 128) * ((s.k + 127) / 128));
    const int copies = static_cast<int>(std::max<size_t>(1, kPoolBytes / w_bytes));
    for (int m : kRunnerRows) {
      const double us = runner_us(m, s.n, s.k, copies, w_bytes);
      const double flops = 2.0 * m * s.n * s.k;
      const double floor_us = std::max(bytes / bw, flops / rate) * 1e6;
      std::printf("| %s %d x %d | %d | %.1f | %.2f | %.1f | %.2f |\n", s.name, s.n, s.k, m, us,
                  bytes / (us * 1e-6) / 1e12, flops / (us * 1e-6) / 1e12, us / floor_us);
    }
  }
  CHECK_CUDA(cudaStreamDestroy(stream));
  return 0;
}
