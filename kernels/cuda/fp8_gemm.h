// Linear layers on fp8 weights with 128×128 block scales (DeepSeek's
// checkpoint format) for any number of rows (docs/gpu-kernels.md, "fp8
// weights"):
//
//   y[i][j] (+)= sum_l x[i][l] * W(j, l),   W(j, l) = e4m3(code[j][l]) * scale[j/128][l/128]
//
// with the arguments of fp8_gemv.h (Fp8GemvArgs, any m; its `form` is set
// here). Steps of at most kFp8GemvMaxRows rows, and every step when k is not
// a multiple of 512 (the library's outputs are wrong for other widths on the
// H200, measured), run LaunchFp8Gemv on the f32 inputs, eight rows at a time. Larger steps
// quantise x per 1×128 group (LaunchQuantizeGroups128,
// DeepSeek's activation quantisation) and run cuBLASLt's block-scaled fp8
// GEMM (weight scales BLK128x128_32F, activation scales VEC128_32F, f32
// output), one algorithm per shape and row class as GemmRunner does.
//
// The weights must hold no NaN codes (0x7F, 0xFF) when steps of more than
// eight rows run: the library reads them as NaN where the GEMV reads 0
// (LaunchClearNanCodes clears them; the engine does so at load).
//
// Batch invariance: with batch_invariant every step runs the tensor-core
// GEMV in chunks of eight rows (a row's bits never depend on m; the cost
// grows as m / 8 weight reads), never the library; otherwise one row runs
// the CUDA-core GEMV, two to eight the tensor-core GEMV, more the library,
// and a row's bits depend on which of the three ran.
//
// Thread-compatible: one runner per stream.
#ifndef STRATA_KERNELS_CUDA_FP8_GEMM_H_
#define STRATA_KERNELS_CUDA_FP8_GEMM_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/fp8_gemv.h"

namespace strata::cuda {

class Fp8GemmRunner {
 public:
  static absl::StatusOr<std::unique_ptr<Fp8GemmRunner>> Create(bool batch_invariant);
  ~Fp8GemmRunner();
  Fp8GemmRunner(const Fp8GemmRunner&) = delete;
  Fp8GemmRunner& operator=(const Fp8GemmRunner&) = delete;

  // Enqueues the product on `stream`. `a` as Fp8GemvSupports requires, with
  // 0 <= m <= 65535 (m = 0 does nothing). Errors: INVALID_ARGUMENT for
  // arguments the kernels cannot take, RESOURCE_EXHAUSTED when the
  // quantised inputs do not fit, INTERNAL for a cuBLASLt or launch failure.
  absl::Status Run(const Fp8GemvArgs& a, cudaStream_t stream);

  // Calls that ran the library (the others ran the GEMV).
  int64_t library_calls() const { return library_calls_; }

 private:
  struct Impl;
  explicit Fp8GemmRunner(bool batch_invariant);
  bool batch_invariant_;
  std::unique_ptr<Impl> impl_;
  int64_t library_calls_ = 0;
};

}  // namespace strata::cuda

#endif  // STRATA_KERNELS_CUDA_FP8_GEMM_H_
