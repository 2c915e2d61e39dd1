// Helpers for the GPU kernel tests and the attention benchmark: device
// presence, checked CUDA calls, a device buffer, a fast seeded RNG, the
// benchmarks' seed and bf16 rounding. Host code only; not thread-safe (one
// per test thread).
#ifndef STRATA_KERNELS_CUDA_TEST_UTIL_H_
#define STRATA_KERNELS_CUDA_TEST_UTIL_H_

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

namespace strata::cuda::testing {

// True when a CUDA device can be used.
inline bool HaveDevice() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define STRATA_CUDA_OK(expr)                                                          \
  do {                                                                                \
    const cudaError_t strata_err_ = (expr);                                           \
    if (strata_err_ != cudaSuccess) {                                                 \
      std::fprintf(stderr, "%s:%d: %s -> %s\n", __FILE__, __LINE__, #expr,            \
                   cudaGetErrorString(strata_err_));                                  \
      std::abort();                                                                   \
    }                                                                                 \
  } while (0)

// Owns a device allocation of `bytes` bytes.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes > 0) STRATA_CUDA_OK(cudaMalloc(&ptr_, bytes));
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }
  void Upload(const void* src, size_t n) { STRATA_CUDA_OK(cudaMemcpy(ptr_, src, n, cudaMemcpyHostToDevice)); }
  void Download(void* dst, size_t n) const { STRATA_CUDA_OK(cudaMemcpy(dst, ptr_, n, cudaMemcpyDeviceToHost)); }
  // Fills with a byte pattern (0xFF: f32 NaN, int -1) so unwritten outputs show.
  void Poison(uint8_t byte = 0xFF) { STRATA_CUDA_OK(cudaMemset(ptr_, byte, bytes_)); }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// splitmix64: fast, seedable, good enough for test data.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t Next() {
    uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }  // [0, 1)
  float Normal() {  // Box-Muller, one value per call
    const double u1 = Uniform() + 0x1.0p-54, u2 = Uniform();
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
  int64_t Below(int64_t n) { return static_cast<int64_t>(Next() % static_cast<uint64_t>(n)); }

 private:
  uint64_t s_;
};

// strata::testing::TestSeed() (common/testing/test_seed.h) for code that does
// not link GoogleTest, the benchmarks: a fresh seed for every call, or the
// value of STRATA_TEST_SEED (a decimal u64), printed on stderr in the same
// words. The tests call TestSeed() itself.
inline uint64_t FreshSeed() {
  uint64_t seed = 0;
  if (const char* fixed = std::getenv("STRATA_TEST_SEED"); fixed != nullptr && *fixed != '\0') {
    char* end = nullptr;
    seed = std::strtoull(fixed, &end, 10);
    if (end == fixed || *end != '\0') {
      std::fprintf(stderr, "STRATA_TEST_SEED='%s' is not a decimal number\n", fixed);
      std::abort();
    }
  } else {
    std::random_device rd;
    seed = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }
  std::fprintf(stderr, "seed %llu (replay: STRATA_TEST_SEED=%llu)\n", static_cast<unsigned long long>(seed),
               static_cast<unsigned long long>(seed));
  return seed;
}

inline uint16_t ToBf16Bits(float x) {  // round to nearest even; NaN stays NaN
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float FromBf16Bits(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

}  // namespace strata::cuda::testing

#endif  // STRATA_KERNELS_CUDA_TEST_UTIL_H_
