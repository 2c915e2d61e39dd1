// The device's copy bandwidth, the ceiling the GPU benchmarks divide by:
// (read + write bytes) / time of a 1 GiB device-to-device copy, median of 10
// after 2 warm-ups. 0 when the buffers cannot be allocated.
#ifndef STRATA_BENCH_COPY_BANDWIDTH_H_
#define STRATA_BENCH_COPY_BANDWIDTH_H_

#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

namespace strata::bench {

inline double CopyBandwidth() {
  const size_t n = size_t{1} << 30;
  void *a = nullptr, *b = nullptr;
  if (cudaMalloc(&a, n) != cudaSuccess || cudaMalloc(&b, n) != cudaSuccess) {
    cudaFree(a);
    return 0;
  }
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<float> ms;
  for (int i = 0; i < 12; ++i) {
    cudaEventRecord(e0);
    cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float t = 0;
    cudaEventElapsedTime(&t, e0, e1);
    if (i >= 2) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(a);
  cudaFree(b);
  return 2.0 * n / (ms[ms.size() / 2] * 1e-3);
}

}  // namespace strata::bench

#endif  // STRATA_BENCH_COPY_BANDWIDTH_H_
