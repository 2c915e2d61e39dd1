// Does a cuBLASLt GEMM give a row the same bits whatever the batch (M) it is
// computed in? Y[M, N] = X[M, K] · W[N, K]^T with bf16 operands and float32
// accumulation/output (the shape of a projection in a decode step). For each
// M, row 0 is compared bit for bit with the M = 1 result, once with the
// library's heuristic choice per M and once with the algorithm chosen for
// M = 1 forced on every M. Prints the differing elements and the time per
// GEMM (median of 20, events) next to the matrix floor measured in the run.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#define CHECK_CUDA(x)                                                                    \
  do {                                                                                   \
    cudaError_t e = (x);                                                                 \
    if (e != cudaSuccess) {                                                              \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e));     \
      return 1;                                                                          \
    }                                                                                    \
  } while (0)
#define CHECK_LT(x)                                                                      \
  do {                                                                                   \
    cublasStatus_t s = (x);                                                              \
    if (s != CUBLAS_STATUS_SUCCESS) {                                                    \
      std::fprintf(stderr, "%s:%d cublasLt status %d\n", __FILE__, __LINE__, (int)s);    \
      return 1;                                                                          \
    }                                                                                    \
  } while (0)

namespace {

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
};

// Column-major view: C[N, M] = W^T... expressed as C = A^T(op) * B with
// A = W stored [K, N] column-major (= W[N, K] row-major), B = X stored [K, M]
// column-major (= X[M, K] row-major), C stored [N, M] column-major (= Y[M, N]).
int MakePlan(int m, int n, int k, Plan* p) {
  CHECK_LT(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  CHECK_LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  CHECK_LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  CHECK_LT(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, k, n, k));
  CHECK_LT(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16BF, k, m, k));
  CHECK_LT(cublasLtMatrixLayoutCreate(&p->c, CUDA_R_32F, n, m, n));
  return 0;
}

}  // namespace

int main() {
  const int N = 7168, K = 7168;
  const int Ms[] = {1, 2, 3, 8, 32, 64, 128};
  cublasLtHandle_t lt;
  CHECK_LT(cublasLtCreate(&lt));
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<__nv_bfloat16> w(static_cast<size_t>(N) * K), x(static_cast<size_t>(128) * K);
  for (auto& v : w) v = __float2bfloat16(d(rng) * 0.02f);
  for (auto& v : x) v = __float2bfloat16(d(rng));
  __nv_bfloat16 *dw, *dx;
  float* dy;
  void* ws;
  const size_t ws_bytes = 64 << 20;
  CHECK_CUDA(cudaMalloc(&dw, w.size() * 2));
  CHECK_CUDA(cudaMalloc(&dx, x.size() * 2));
  CHECK_CUDA(cudaMalloc(&dy, static_cast<size_t>(128) * N * 4));
  CHECK_CUDA(cudaMalloc(&ws, ws_bytes));
  CHECK_CUDA(cudaMemcpy(dw, w.data(), w.size() * 2, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(dx, x.data(), x.size() * 2, cudaMemcpyHostToDevice));
  cublasLtMatmulPreference_t pref;
  CHECK_LT(cublasLtMatmulPreferenceCreate(&pref));
  CHECK_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                sizeof(ws_bytes)));
  cudaEvent_t e0, e1;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));
  const float alpha = 1.f, beta = 0.f;
  std::vector<float> row_ref(N), row(N);
  cublasLtMatmulAlgo_t algo_m1{};
  std::printf("GEMM Y[M,%d] = X[M,%d] W^T, bf16 in, f32 accumulate/out; row 0 vs M=1\n", N, K);
  std::printf("%-6s %-10s %14s %14s %12s %12s\n", "M", "algorithm", "row0 diffs", "max |diff|", "us (median)",
              "TFLOP/s");
  for (int forced = 0; forced < 2; ++forced) {
    for (int m : Ms) {
      Plan p;
      if (MakePlan(m, N, K, &p)) return 1;
      cublasLtMatmulHeuristicResult_t h{};
      int found = 0;
      CHECK_LT(cublasLtMatmulAlgoGetHeuristic(lt, p.op, p.a, p.b, p.c, p.c, pref, 1, &h, &found));
      if (found == 0) {
        std::fprintf(stderr, "no algorithm for M=%d\n", m);
        return 1;
      }
      if (m == 1 && !forced) algo_m1 = h.algo;
      const cublasLtMatmulAlgo_t& algo = forced ? algo_m1 : h.algo;
      std::vector<float> times;
      for (int rep = 0; rep < 23; ++rep) {
        CHECK_CUDA(cudaMemset(dy, 0xFF, static_cast<size_t>(m) * N * 4));  // poison
        CHECK_CUDA(cudaEventRecord(e0));
        CHECK_LT(cublasLtMatmul(lt, p.op, &alpha, dw, p.a, dx, p.b, &beta, dy, p.c, dy, p.c, &algo, ws, ws_bytes, 0));
        CHECK_CUDA(cudaEventRecord(e1));
        CHECK_CUDA(cudaEventSynchronize(e1));
        float ms;
        CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
        if (rep >= 3) times.push_back(ms * 1000.f);
      }
      std::sort(times.begin(), times.end());
      CHECK_CUDA(cudaMemcpy(row.data(), dy, N * 4, cudaMemcpyDeviceToHost));
      if (m == 1 && !forced) row_ref = row;
      int diffs = 0;
      float maxd = 0;
      for (int i = 0; i < N; ++i) {
        if (std::memcmp(&row[i], &row_ref[i], 4) != 0) ++diffs;
        maxd = std::max(maxd, std::fabs(row[i] - row_ref[i]));
      }
      const double us = times[times.size() / 2];
      std::printf("%-6d %-10s %14d %14.3g %12.2f %12.2f\n", m, forced ? "M=1's" : "heuristic", diffs, maxd, us,
                  2.0 * m * N * K / (us * 1e-6) / 1e12);
      cublasLtMatrixLayoutDestroy(p.a);
      cublasLtMatrixLayoutDestroy(p.b);
      cublasLtMatrixLayoutDestroy(p.c);
      cublasLtMatmulDescDestroy(p.op);
    }
  }
  return 0;
}
