#include "kernels/cuda/fp8_quantize.h"

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/kv_layout.h"

namespace strata::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

__global__ void QuantizeRowsKernel(QuantizeRowsParams p) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= p.rows) return;
  const float s = dev::QuantizeRowWarp(p.x + row * p.x_stride, p.n, p.codes + row * p.codes_stride, lane);
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
  const float cs = dev::QuantizeRowWarp(p.latent + row * kLatentDim, kLatentDim,
                                   base + kPageLatentOffset + slot * kLatentDim, lane);
  const float rs = dev::QuantizeRowWarp(p.rope + row * kRopeDim, kRopeDim,
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
