#include "kernels/cuda/fp8_gemm.h"

#include <cublasLt.h>

#include <algorithm>
#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace strata::cuda {
namespace {

constexpr size_t kWorkspaceBytes = 32u << 20;
constexpr int kMaxRows = 65535;
constexpr int kFp8LibraryK = 4 * kFp8BlockSize;  // see Run

int RowClass(int m) {
  int c = 16;
  while (c < m && c < kMaxRows) c <<= 1;
  return std::min(c, kMaxRows);
}

int64_t RoundUp16(int64_t v) { return (v + 15) / 16 * 16; }

struct Layouts {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  ~Layouts() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// Column-major view: Y^T (n × m, f32) = W (k × n codes, transposed) · Xq^T
// (k × m codes), W's scales one per 128×128 block, Xq's one per 128 of k.
bool MakeLayouts(const Fp8GemvArgs& a, int m, int64_t ldq, const void* w_scale, const void* x_scale, Layouts* l) {
  if (cublasLtMatmulDescCreate(&l->op, CUBLAS_COMPUTE_32F, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS) return false;
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  const int32_t a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  auto set = [&](cublasLtMatmulDescAttributes_t attr, const void* v, size_t bytes) {
    return cublasLtMatmulDescSetAttribute(l->op, attr, v, bytes) == CUBLAS_STATUS_SUCCESS;
  };
  return set(CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)) && set(CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)) &&
         set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode, sizeof(a_mode)) &&
         set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode, sizeof(b_mode)) &&
         set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w_scale, sizeof(w_scale)) &&
         set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x_scale, sizeof(x_scale)) &&
         cublasLtMatrixLayoutCreate(&l->a, CUDA_R_8F_E4M3, a.k, a.n, a.ldw) == CUBLAS_STATUS_SUCCESS &&
         cublasLtMatrixLayoutCreate(&l->b, CUDA_R_8F_E4M3, a.k, m, ldq) == CUBLAS_STATUS_SUCCESS &&
         cublasLtMatrixLayoutCreate(&l->c, CUDA_R_32F, a.n, m, a.ldy) == CUBLAS_STATUS_SUCCESS;
}

using PlanKey = std::tuple<int, int, int, int64_t, int64_t>;  // rows, n, k, ldw, ldy

}  // namespace

struct Fp8GemmRunner::Impl {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  // The quantised inputs: codes [m][ldq], then the scales [k/128][m].
  void* quantised = nullptr;
  size_t quantised_bytes = 0;
  // Algorithm per shape and row class; null: the library offers none.
  std::map<PlanKey, std::unique_ptr<cublasLtMatmulAlgo_t>> algos;

  ~Impl() {
    if (quantised) cudaFree(quantised);
    if (workspace) cudaFree(workspace);
    if (handle) cublasLtDestroy(handle);
  }

  const cublasLtMatmulAlgo_t* Algo(const Fp8GemvArgs& a, int m, int64_t ldq, const void* x_scale) {
    const PlanKey key{m, a.n, a.k, a.ldw, a.ldy};
    auto found = algos.find(key);
    if (found != algos.end()) return found->second.get();
    Layouts l;
    cublasLtMatmulHeuristicResult_t h{};
    int count = 0;
    cublasLtMatmulPreference_t pref = nullptr;
    bool ok = cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS;
    const size_t ws = kWorkspaceBytes;
    ok = ok &&
         cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)) ==
             CUBLAS_STATUS_SUCCESS &&
         MakeLayouts(a, m, ldq, a.scale, x_scale, &l) &&
         cublasLtMatmulAlgoGetHeuristic(handle, l.op, l.a, l.b, l.c, l.c, pref, 1, &h, &count) ==
             CUBLAS_STATUS_SUCCESS &&
         count > 0;
    if (pref != nullptr) cublasLtMatmulPreferenceDestroy(pref);
    auto& slot = algos[key];
    if (ok) slot = std::make_unique<cublasLtMatmulAlgo_t>(h.algo);
    return slot.get();
  }
};

Fp8GemmRunner::Fp8GemmRunner(bool batch_invariant)
    : batch_invariant_(batch_invariant), impl_(std::make_unique<Impl>()) {}
Fp8GemmRunner::~Fp8GemmRunner() = default;

absl::StatusOr<std::unique_ptr<Fp8GemmRunner>> Fp8GemmRunner::Create(bool batch_invariant) {
  std::unique_ptr<Fp8GemmRunner> r(new Fp8GemmRunner(batch_invariant));
  Impl& im = *r->impl_;
  if (cublasLtCreate(&im.handle) != CUBLAS_STATUS_SUCCESS) return absl::InternalError("cublasLtCreate failed");
  if (cudaMalloc(&im.workspace, kWorkspaceBytes) != cudaSuccess) {
    cudaGetLastError();
    return absl::ResourceExhaustedError("cannot allocate the 32 MiB cuBLASLt workspace");
  }
  return r;
}

absl::Status Fp8GemmRunner::Run(const Fp8GemvArgs& args, cudaStream_t stream) {
  if (args.m == 0) return absl::OkStatus();
  Fp8GemvArgs a = args;
  const int m = a.m;
  a.m = std::min(m, kFp8GemvMaxRows);
  if (m < 0 || m > kMaxRows || !Fp8GemvSupports(a)) {
    return absl::InvalidArgumentError(absl::StrCat("fp8 GEMM arguments it cannot take: m=", m, " n=", a.n, " k=", a.k,
                                                   " ldx=", a.ldx, " ldw=", a.ldw, " (k and ldw multiples of 16, "
                                                   "16-byte aligned operands)"));
  }
  // The library gives wrong outputs unless k is a whole number of groups of
  // four 128-column blocks (k = 1040 and 1152 fail on the H200, 1024, 1536,
  // 2048 and 7168 pass: fp8_gemm_cuda_test); other widths run the GEMV at
  // every step size. DeepSeek's widths are all multiples of 512.
  if (m <= kFp8GemvMaxRows || batch_invariant_ || a.k % kFp8LibraryK != 0) {
    // The GEMV, eight rows at a time above eight rows.
    a.form = batch_invariant_ ? Fp8GemvForm::kTensorCores : Fp8GemvForm::kAuto;
    for (int i0 = 0; i0 < m; i0 += kFp8GemvMaxRows) {
      Fp8GemvArgs part = a;
      part.m = std::min(kFp8GemvMaxRows, m - i0);
      part.x = a.x + static_cast<int64_t>(i0) * a.ldx;
      part.y = a.y + static_cast<int64_t>(i0) * a.ldy;
      const cudaError_t e = LaunchFp8Gemv(part, stream);
      if (e != cudaSuccess) return absl::InternalError(absl::StrCat("fp8 GEMV launch: ", cudaGetErrorString(e)));
    }
    return absl::OkStatus();
  }
  // The library takes row counts that are multiples of 16 (others are
  // NOT_SUPPORTED on the H200 with these scale modes): other counts run
  // padded (zero codes, scale 1) into a scratch output whose first m rows
  // are then stored.
  Impl& im = *impl_;
  const int rows = static_cast<int>(RoundUp16(m));
  const bool padded = rows != m;
  const int64_t ldq = RoundUp16(a.k), groups = (a.k + kFp8BlockSize - 1) / kFp8BlockSize;
  const size_t codes_bytes = static_cast<size_t>(RoundUp16(int64_t{rows} * ldq));
  const size_t scale_bytes = static_cast<size_t>(RoundUp16(groups * rows * 4));
  const size_t out_bytes = padded ? static_cast<size_t>(rows) * a.n * 4 : 0;
  const size_t bytes = codes_bytes + scale_bytes + out_bytes;
  if (bytes > im.quantised_bytes) {
    if (im.quantised != nullptr) cudaFree(im.quantised);
    im.quantised = nullptr;
    im.quantised_bytes = 0;
    if (cudaMalloc(&im.quantised, bytes) != cudaSuccess) {
      cudaGetLastError();
      return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes for quantised inputs"));
    }
    im.quantised_bytes = bytes;
  }
  uint8_t* codes = static_cast<uint8_t*>(im.quantised);
  float* x_scale = reinterpret_cast<float*>(codes + codes_bytes);
  float* out = padded ? reinterpret_cast<float*>(codes + codes_bytes + scale_bytes) : a.y;
  const int64_t ldo = padded ? a.n : a.ldy;
  cudaError_t e = LaunchQuantizeGroups128(a.x, m, a.k, a.ldx, codes, ldq, x_scale, rows, stream);
  if (e != cudaSuccess) return absl::InternalError(absl::StrCat("activation quantisation: ", cudaGetErrorString(e)));
  Fp8GemvArgs g = a;
  g.m = rows;
  g.y = out;
  g.ldy = ldo;
  g.accumulate = a.accumulate && !padded;
  const cublasLtMatmulAlgo_t* algo = im.Algo(g, RowClass(rows), ldq, x_scale);
  Layouts l;
  if (!MakeLayouts(g, rows, ldq, g.scale, x_scale, &l)) return absl::InternalError("cuBLASLt fp8 layout creation failed");
  const float alpha = 1.0f, beta = g.accumulate ? 1.0f : 0.0f;
  cublasStatus_t s = CUBLAS_STATUS_NOT_SUPPORTED;
  if (algo != nullptr) {
    s = cublasLtMatmul(im.handle, l.op, &alpha, g.w, l.a, codes, l.b, &beta, g.y, l.c, g.y, l.c, algo, im.workspace,
                       kWorkspaceBytes, stream);
  }
  if (s == CUBLAS_STATUS_NOT_SUPPORTED && RowClass(rows) != rows) {
    algo = im.Algo(g, rows, ldq, x_scale);
    if (algo != nullptr) {
      s = cublasLtMatmul(im.handle, l.op, &alpha, g.w, l.a, codes, l.b, &beta, g.y, l.c, g.y, l.c, algo,
                         im.workspace, kWorkspaceBytes, stream);
    }
  }
  if (s != CUBLAS_STATUS_SUCCESS) {
    return absl::InternalError(absl::StrCat("cuBLASLt block-scaled fp8 GEMM failed with status ", static_cast<int>(s),
                                            " (m=", m, " n=", a.n, " k=", a.k, ")"));
  }
  if (padded) {
    e = LaunchCopyRows(out, m, a.n, ldo, a.y, a.ldy, a.accumulate, stream);
    if (e != cudaSuccess) return absl::InternalError(absl::StrCat("storing the rows: ", cudaGetErrorString(e)));
  }
  ++library_calls_;
  return absl::OkStatus();
}

}  // namespace strata::cuda
