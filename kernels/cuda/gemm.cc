#include "kernels/cuda/gemm.h"

#include <cublasLt.h>

#include <algorithm>
#include <map>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"

namespace strata::cuda {
namespace {

constexpr size_t kWorkspaceBytes = 32u << 20;
constexpr int kMaxRows = 65535;  // the largest step GpuEngine runs

// The largest power of two <= 256 dividing the address of every batch's
// operand. cuBLASLt assumes 256-byte alignment unless told otherwise, and
// an algorithm picked under that assumption reads misaligned operands wrong.
uint32_t Alignment(const void* p, int64_t stride_elems, int batch, size_t elem) {
  uint64_t bits = reinterpret_cast<uintptr_t>(p);
  if (batch > 1) bits |= static_cast<uint64_t>(stride_elems) * elem;
  uint32_t al = 256;
  while (al > 1 && bits % al != 0) al >>= 1;
  return al;
}

struct Aligns {
  uint32_t a, b, c;  // W, x, y
};

Aligns AlignsOf(const GemmArgs& g) {
  const size_t in = g.type == GemmType::kBF16 ? 2 : 4;
  return {Alignment(g.w, g.stride_w, g.batch, in), Alignment(g.x, g.stride_x, g.batch, in),
          Alignment(g.y, g.stride_y, g.batch, 4)};
}

using PlanKey = std::tuple<int, int, int, int, int64_t, int64_t, int64_t, bool, int, int64_t, int64_t, int64_t,
                           uint32_t, uint32_t, uint32_t>;

PlanKey KeyOf(const GemmArgs& a, int m) {
  const Aligns al = AlignsOf(a);
  return {static_cast<int>(a.type), m, a.n, a.k, a.ldx, a.ldw, a.ldy, a.w_is_kn, a.batch, a.stride_x, a.stride_w,
          a.stride_y, al.a, al.b, al.c};
}

// The rows an algorithm is chosen for: m itself up to 16, then the next
// power of two. A prefill chunk or an expert's share of a step takes a new m
// almost every call, and one heuristic query costs far more than the GEMM.
int RowClass(int m) {
  if (m <= 16) return m;
  int c = 32;
  while (c < m && c < kMaxRows) c <<= 1;
  return std::min(c, kMaxRows);
}

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

bool SetBatch(cublasLtMatrixLayout_t l, int batch, int64_t stride) {
  if (batch == 1) return true;
  const int32_t count = batch;
  return cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)) ==
             CUBLAS_STATUS_SUCCESS &&
         cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)) ==
             CUBLAS_STATUS_SUCCESS;
}

// Column-major view: Y^T (n x m) = op(W) (n x k) * X^T (k x m).
bool MakeLayouts(const GemmArgs& a, int m, Layouts* l) {
  const cudaDataType_t in = a.type == GemmType::kBF16 ? CUDA_R_16BF : CUDA_R_32F;
  if (cublasLtMatmulDescCreate(&l->op, CUBLAS_COMPUTE_32F, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS) return false;
  const cublasOperation_t ta = a.w_is_kn ? CUBLAS_OP_N : CUBLAS_OP_T, tb = CUBLAS_OP_N;
  if (cublasLtMatmulDescSetAttribute(l->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)) != CUBLAS_STATUS_SUCCESS ||
      cublasLtMatmulDescSetAttribute(l->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)) != CUBLAS_STATUS_SUCCESS) {
    return false;
  }
  const bool ok = (a.w_is_kn ? cublasLtMatrixLayoutCreate(&l->a, in, a.n, a.k, a.ldw)
                             : cublasLtMatrixLayoutCreate(&l->a, in, a.k, a.n, a.ldw)) == CUBLAS_STATUS_SUCCESS &&
                  cublasLtMatrixLayoutCreate(&l->b, in, a.k, m, a.ldx) == CUBLAS_STATUS_SUCCESS &&
                  cublasLtMatrixLayoutCreate(&l->c, CUDA_R_32F, a.n, m, a.ldy) == CUBLAS_STATUS_SUCCESS;
  return ok && SetBatch(l->a, a.batch, a.stride_w) && SetBatch(l->b, a.batch, a.stride_x) &&
         SetBatch(l->c, a.batch, a.stride_y);
}

}  // namespace

struct GemmRunner::Impl {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  // Algorithm per shape and row class (m = 1 for every m in batch-invariant
  // mode); a null entry: the heuristic offered none, use the plain kernel.
  std::map<PlanKey, std::unique_ptr<cublasLtMatmulAlgo_t>> algos;
  int64_t heuristic_queries = 0;
  // The cached algorithm for `a` chosen for algo_m rows (queried on first
  // use); null when the heuristic offers none.
  const cublasLtMatmulAlgo_t* Algo(const GemmArgs& a, int algo_m, bool batch_invariant);
  ~Impl() {
    if (workspace) cudaFree(workspace);
    if (handle) cublasLtDestroy(handle);
  }
};

GemmRunner::GemmRunner(bool batch_invariant) : batch_invariant_(batch_invariant), impl_(std::make_unique<Impl>()) {}
GemmRunner::~GemmRunner() = default;

absl::StatusOr<std::unique_ptr<GemmRunner>> GemmRunner::Create(bool batch_invariant) {
  std::unique_ptr<GemmRunner> r(new GemmRunner(batch_invariant));
  Impl& im = *r->impl_;
  if (cublasLtCreate(&im.handle) != CUBLAS_STATUS_SUCCESS) return absl::InternalError("cublasLtCreate failed");
  if (cudaMalloc(&im.workspace, kWorkspaceBytes) != cudaSuccess) {
    return absl::ResourceExhaustedError("cannot allocate the 32 MiB cuBLASLt workspace");
  }
  return r;
}

const cublasLtMatmulAlgo_t* GemmRunner::Impl::Algo(const GemmArgs& a, int algo_m, bool batch_invariant) {
  Impl& im = *this;
  const PlanKey key = KeyOf(a, algo_m);
  auto found = im.algos.find(key);
  if (found != im.algos.end()) return found->second.get();
  Layouts l;
  cublasLtMatmulHeuristicResult_t h{};
  int count = 0;
  cublasLtMatmulPreference_t pref = nullptr;
  bool ok = cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS;
  if (ok) {
    const size_t ws = kWorkspaceBytes;
    const Aligns al = AlignsOf(a);
    ok = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)) ==
             CUBLAS_STATUS_SUCCESS &&
         cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al.a,
                                              sizeof(al.a)) == CUBLAS_STATUS_SUCCESS &&
         cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al.b,
                                              sizeof(al.b)) == CUBLAS_STATUS_SUCCESS &&
         cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al.c,
                                              sizeof(al.c)) == CUBLAS_STATUS_SUCCESS &&
         cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al.c,
                                              sizeof(al.c)) == CUBLAS_STATUS_SUCCESS;
  }
  ok = ok && MakeLayouts(a, algo_m, &l) &&
       cublasLtMatmulAlgoGetHeuristic(im.handle, l.op, l.a, l.b, l.c, l.c, pref, 1, &h, &count) ==
           CUBLAS_STATUS_SUCCESS &&
       count > 0;
  if (pref != nullptr) cublasLtMatmulPreferenceDestroy(pref);
  if (ok && batch_invariant) {
    // The m = 1 algorithm must serve every row count up to the engine's
    // largest step, or the shape uses the plain kernel for every m.
    for (int rows : {2, 3, 8, 17, 40, 64, 129, 1000, 4096, kMaxRows}) {
      Layouts big;
      cublasLtMatmulHeuristicResult_t check{};
      ok = ok && MakeLayouts(a, rows, &big) &&
           cublasLtMatmulAlgoCheck(im.handle, big.op, big.a, big.b, big.c, big.c, &h.algo, &check) ==
               CUBLAS_STATUS_SUCCESS &&
           check.workspaceSize <= kWorkspaceBytes;
    }
  }
  ++heuristic_queries;
  auto& slot = im.algos[key];
  if (ok) slot = std::make_unique<cublasLtMatmulAlgo_t>(h.algo);
  return slot.get();
}

int64_t GemmRunner::heuristic_queries() const { return impl_->heuristic_queries; }

absl::Status GemmRunner::Run(const GemmArgs& a, cudaStream_t stream) {
  if (a.m < 0 || a.n <= 0 || a.k <= 0 || a.batch <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("bad GEMM shape m=", a.m, " n=", a.n, " k=", a.k));
  }
  if (a.m == 0) return absl::OkStatus();
  Impl& im = *impl_;
  // Batch-invariant: the m = 1 algorithm for every m. Otherwise the row
  // class's algorithm, and the exact m's only if cuBLASLt refuses that one.
  const int algo_m = batch_invariant_ ? 1 : RowClass(a.m);
  const cublasLtMatmulAlgo_t* algo = im.Algo(a, algo_m, batch_invariant_);
  if (algo != nullptr) {
    Layouts l;
    if (!MakeLayouts(a, a.m, &l)) return absl::InternalError("cuBLASLt layout creation failed");
    const float alpha = 1.0f, beta = a.accumulate ? 1.0f : 0.0f;
    cublasStatus_t s = cublasLtMatmul(im.handle, l.op, &alpha, a.w, l.a, a.x, l.b, &beta, a.y, l.c, a.y, l.c, algo,
                                      im.workspace, kWorkspaceBytes, stream);
    if (s == CUBLAS_STATUS_NOT_SUPPORTED && !batch_invariant_ && algo_m != a.m) {
      algo = im.Algo(a, a.m, batch_invariant_);
      if (algo != nullptr)
        s = cublasLtMatmul(im.handle, l.op, &alpha, a.w, l.a, a.x, l.b, &beta, a.y, l.c, a.y, l.c, algo,
                           im.workspace, kWorkspaceBytes, stream);
    }
    if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
    if (batch_invariant_ || s != CUBLAS_STATUS_NOT_SUPPORTED) {
      return absl::InternalError(absl::StrCat("cublasLtMatmul failed with status ", static_cast<int>(s), " (m=", a.m,
                                              " n=", a.n, " k=", a.k, ")"));
    }
  }
  ++fallback_calls_;
  const cudaError_t e = LaunchPlainGemm(a, stream);
  if (e != cudaSuccess) return absl::InternalError(absl::StrCat("plain GEMM launch: ", cudaGetErrorString(e)));
  return absl::OkStatus();
}

}  // namespace strata::cuda
