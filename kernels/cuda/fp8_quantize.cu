#include "kernels/cuda/fp8_quantize.h"

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/kv_layout.h"

namespace strata::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

// Quantises one row with one warp, exactly as fp8::QuantizeRow: amax skips
// NaN (fmaxf ignores NaN operands; max is order-independent), the tiny/huge
// guard, IEEE division for 448/amax and amax/448, one f32 multiply per code.
// Returns the scale (valid in every lane).
__device__ float QuantizeRowWarp(const float* x, int n, uint8_t* codes, int lane) {
  float amax = 0.0f;
  for (int i = lane; i < n; i += 32) amax = fmaxf(amax, fabsf(x[i]));
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  if (!(amax > 1e-35f) || amax > 3.4e38f) {
    for (int i = lane; i < n; i += 32) codes[i] = 0;
    return 1.0f;
  }
  const float inv = __fdiv_rn(448.0f, amax);
  for (int i = lane; i < n; i += 32) codes[i] = dev::EncodeE4m3(__fmul_rn(x[i], inv));
  return __fdiv_rn(amax, 448.0f);
}

__global__ void QuantizeRowsKernel(QuantizeRowsParams p) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= p.rows) return;
  const float s = QuantizeRowWarp(p.x + row * p.x_stride, p.n, p.codes + row * p.codes_stride, lane);
  if (lane == 0) p.scales[row * p.scale_stride] = s;
}

__global__ void AppendKvRowsKernel(AppendKvRowsParams p) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= p.n_tokens) return;
  const int64_t pos = p.positions[row];
  const int seq = p.seq_of_row[row];
  const int page = p.page_table[seq * p.page_table_stride + pos / kPageTokens];
  const int slot = static_cast<int>(pos % kPageTokens);
  uint8_t* base = p.pool + static_cast<size_t>(page) * kPageBytes;
  const float cs = QuantizeRowWarp(p.latent + row * kLatentDim, kLatentDim,
                                   base + kPageLatentOffset + slot * kLatentDim, lane);
  const float rs = QuantizeRowWarp(p.rope + row * kRopeDim, kRopeDim,
                                   base + kPageRopeOffset + slot * kRopeDim, lane);
  if (lane == 0) {
    float* scales = reinterpret_cast<float*>(base + kPageScaleOffset) + 2 * slot;
    scales[0] = cs;
    scales[1] = rs;
  }
}

}  // namespace

cudaError_t LaunchQuantizeRows(const QuantizeRowsParams& p, cudaStream_t stream) {
  if (p.rows <= 0) return cudaSuccess;
  if (p.n <= 0 || p.n > 65536) return cudaErrorInvalidValue;
  const int64_t blocks = (p.rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  QuantizeRowsKernel<<<static_cast<unsigned>(blocks), kWarpsPerBlock * 32, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t LaunchAppendKvRows(const AppendKvRowsParams& p, cudaStream_t stream) {
  if (p.n_tokens <= 0) return cudaSuccess;
  const int64_t blocks = (p.n_tokens + kWarpsPerBlock - 1) / kWarpsPerBlock;
  AppendKvRowsKernel<<<static_cast<unsigned>(blocks), kWarpsPerBlock * 32, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace strata::cuda
