// Linear layers of small decode steps on fp8 weights with 128×128 block
// scales (DeepSeek's checkpoint format, F8_E4M3 + `weight_scale_inv`), read
// as stored: the weight stays fp8 on the device and is decoded in registers
// (docs/gpu-kernels.md, "fp8 weights").
//
//   y[i][j] (+)= sum_l x[i][l] * W(j, l),   W(j, l) = e4m3(code[j][l]) * scale[j/128][l/128]
//
// for i < m <= kFp8GemvMaxRows, x f32 [m][k], y f32 [m][n]. The library's
// block-scaled fp8 GEMM refuses m <= 2 and costs 10–16 µs a call below m ≈
// 128 whatever the weight's size (bench/RESULTS.md, 2026-12-02); a decode
// step is bound by reading the weights, so these kernels read every weight
// byte once per call, 16 codes per load, and multiply in f32.
//
// Order: lane (or thread) t sums, per output, its chunks of 16 columns in
// column order — each chunk's 16 products in order, times the chunk's block
// scale — then a butterfly over the warp (and, in the split form, the warps'
// sums in warp order). The order depends on the shape alone, so a row's bits
// do not depend on m or on the other rows.
// NaN codes (0x7F / 0xFF) read as 0, fp8::Decode's rule.
#ifndef STRATA_KERNELS_CUDA_FP8_GEMV_H_
#define STRATA_KERNELS_CUDA_FP8_GEMV_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace strata::cuda {

inline constexpr int kFp8GemvMaxRows = 8;
inline constexpr int kFp8BlockSize = 128;

// Which units multiply. The tensor-core form costs the same for m = 1 … 8
// (it reads each weight once, whatever m); the CUDA-core form is faster at m
// = 1 and grows with m. kAuto takes the CUDA cores for m = 1 and the tensor
// cores above, so a row's bits depend on m being 1 or not; the batch-invariant
// mode asks for kTensorCores, whose bits do not depend on m
// (docs/gpu-kernels.md, "fp8 weights").
enum class Fp8GemvForm { kAuto, kTensorCores, kCudaCores };

struct Fp8GemvArgs {
  int m = 0, n = 0, k = 0;
  const float* x = nullptr;      // [m][ldx], f32
  int64_t ldx = 0;
  const uint8_t* w = nullptr;    // [n][ldw] e4m3 codes (bytes)
  int64_t ldw = 0;
  const float* scale = nullptr;  // [ceil(n/128)][ld_scale], f32 (ld_scale >= ceil(k/128))
  int64_t ld_scale = 0;
  float* y = nullptr;            // [m][ldy], f32
  int64_t ldy = 0;
  bool accumulate = false;       // y += x W^T instead of y = x W^T
  Fp8GemvForm form = Fp8GemvForm::kAuto;
};

// Whether LaunchFp8Gemv takes `a`: 1 <= m <= 8, n, k >= 1, k, ldw multiples
// of 16, ldx a multiple of 4, w and x 16-byte aligned, ld_scale >=
// ceil(k/128), no null pointer.
bool Fp8GemvSupports(const Fp8GemvArgs& a);

// REQUIRES: Fp8GemvSupports(a) (else cudaErrorInvalidValue).
cudaError_t LaunchFp8Gemv(const Fp8GemvArgs& a, cudaStream_t stream);

// Quantises the activations of a block-scaled fp8 GEMM per 1×128 group, as
// DeepSeek's inference does: for row i < m and group g (columns 128g …
// min(128g + 128, k) - 1), the group through fp8::QuantizeRow (the same f32
// arithmetic, bit for bit): codes[i][c] and scales[g * rows + i] (the group's
// scales of all rows contiguous: the layout cuBLASLt's VEC128_32F mode
// reads). codes[i][k .. ldc) are set to 0. Rows m .. rows - 1 (padding for
// the library) get zero codes and scale 1.
// REQUIRES: 1 <= m <= rows <= 65535, k >= 1, ldx >= k, ldc >= k.
cudaError_t LaunchQuantizeGroups128(const float* x, int m, int k, int64_t ldx, uint8_t* codes, int64_t ldc,
                                    float* scales, int rows, cudaStream_t stream);

// Synthetic fp8 weights: codes[i] = e4m3(448 u) with u uniform in [-1, 1)
// from (seed, i) (never a NaN code), so that with block scale s the values
// are uniform in ±448 s. Same codes for the same seed on any device.
cudaError_t LaunchFillRandomFp8(uint8_t* codes, int64_t n, uint64_t seed, cudaStream_t stream);

// Replaces the NaN codes (0x7F, 0xFF) of n codes by 0x00, so that every
// product reads them as 0: the GEMV does so in registers, the library would
// read NaN. Weights are cleared once, when they are loaded.
cudaError_t LaunchClearNanCodes(uint8_t* codes, int64_t n, cudaStream_t stream);

// y[i][j] = src[i][j] (or y += src with accumulate) for i < m, j < n.
cudaError_t LaunchCopyRows(const float* src, int m, int n, int64_t lds, float* y, int64_t ldy, bool accumulate,
                           cudaStream_t stream);

}  // namespace strata::cuda

#endif  // STRATA_KERNELS_CUDA_FP8_GEMV_H_
