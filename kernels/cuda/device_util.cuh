// Device-side building blocks shared by the kernels in kernels/cuda: the fp8
// codec in the exact arithmetic of kernels/fp8.h, exact fp8 -> bf16 widening,
// cp.async, ex2.approx, the bf16 m16n8k16 tensor-core MMA, mbarriers with
// bulk copies, and programmatic dependent launches.
//
// Include only from .cu files. Everything here but LaunchAfter is a pure
// device function.
#ifndef STRATA_KERNELS_CUDA_DEVICE_UTIL_CUH_
#define STRATA_KERNELS_CUDA_DEVICE_UTIL_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cuda_runtime_api.h>

#include <cstdint>

namespace strata::cuda::dev {

// ---- fp8 e4m3 ("fn") encode: a bit-for-bit port of fp8::Encode ----------
// Round to nearest even, saturate to ±448 (±inf included), keep the sign of
// zero, NaN -> 0x00. Written with integer operations so that the result does
// not depend on the hardware conversion (which maps NaN to 0x7F).
__device__ __forceinline__ uint8_t EncodeE4m3(float x) {
  if (x != x) return 0x00;
  const uint32_t bits = __float_as_uint(x);
  const uint32_t sign = (bits >> 24) & 0x80u;
  const float a = fabsf(x);
  if (a >= 448.0f) return static_cast<uint8_t>(sign | 0x7Eu);
  if (a < 0.015625f) {  // subnormal grid 2^-9; a * 512 is exact
    const float q = a * 512.0f;
    uint32_t n = static_cast<uint32_t>(q);
    const float frac = q - static_cast<float>(n);
    if (frac > 0.5f || (frac == 0.5f && (n & 1u))) ++n;
    return static_cast<uint8_t>(sign | n);
  }
  const uint32_t abits = bits & 0x7FFFFFFFu;
  uint32_t u = abits >> 20;
  const uint32_t rem = abits & 0xFFFFFu;
  if (rem > 0x80000u || (rem == 0x80000u && (u & 1u))) ++u;
  const int exp8 = static_cast<int>(u >> 3) - 127 + 7;
  uint32_t code = (static_cast<uint32_t>(exp8) << 3) | (u & 7u);
  if (code > 0x7Eu) code = 0x7Eu;
  return static_cast<uint8_t>(sign | code);
}

// Quantises one row with one warp, exactly as fp8::QuantizeRow: amax skips
// NaN (fmaxf ignores NaN operands; max is order-independent), the tiny/huge
// guard, IEEE division for 448/amax and amax/448, one f32 multiply per code.
// Returns the scale (valid in every lane).
__device__ inline float QuantizeRowWarp(const float* x, int n, uint8_t* codes, int lane) {
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

// Clears every byte of w that holds a NaN code (0x7F / 0xFF), so that NaN
// codes decode to 0 as the CPU table does. A byte is a NaN code when its low
// seven bits are all ones, so adding 1 to them sets its bit 7 exactly then
// (no carry leaves the byte); prmt's sign mode spreads each bit 7 over its
// byte.
__device__ __forceinline__ uint32_t ClearNanCodes(uint32_t w) {
  const uint32_t t = (w & 0x7F7F7F7Fu) + 0x01010101u;
  uint32_t nan_bytes;
  asm("prmt.b32 %0, %1, 0, 0xBA98;" : "=r"(nan_bytes) : "r"(t));
  return w & ~nan_bytes;
}

// Two fp8 e4m3 codes (low byte first) -> two f32 values, exactly: e4m3x2 ->
// f16x2 in hardware, then f16 -> f32. (NaN codes stay NaN.)
__device__ __forceinline__ float2 E4m3x2ToFloat2(uint32_t two_codes) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(
      static_cast<__nv_fp8x2_storage_t>(two_codes & 0xFFFFu), __NV_E4M3);
  return __half22float2(*reinterpret_cast<const __half2*>(&h));
}

// Two fp8 e4m3 codes (low byte first) -> bf16x2, exactly (every e4m3 value is
// a bf16 value).
__device__ __forceinline__ uint32_t E4m3x2ToBf16x2(uint32_t two_codes) {
  const __nv_bfloat162 b = __float22bfloat162_rn(E4m3x2ToFloat2(two_codes));
  return *reinterpret_cast<const uint32_t*>(&b);
}

// 16 codes (a uint4) -> 16 bf16 values (two uint4), NaN codes read as 0.
__device__ __forceinline__ void E4m3x16ToBf16(uint4 codes, uint4& lo, uint4& hi) {
  const uint32_t w[4] = {ClearNanCodes(codes.x), ClearNanCodes(codes.y),
                         ClearNanCodes(codes.z), ClearNanCodes(codes.w)};
  lo.x = E4m3x2ToBf16x2(w[0]);
  lo.y = E4m3x2ToBf16x2(w[0] >> 16);
  lo.z = E4m3x2ToBf16x2(w[1]);
  lo.w = E4m3x2ToBf16x2(w[1] >> 16);
  hi.x = E4m3x2ToBf16x2(w[2]);
  hi.y = E4m3x2ToBf16x2(w[2] >> 16);
  hi.z = E4m3x2ToBf16x2(w[3]);
  hi.w = E4m3x2ToBf16x2(w[3] >> 16);
}

// One fp8 e4m3 code -> f32, exactly; the NaN codes decode to 0 (fp8::Decode).
__device__ __forceinline__ float DecodeE4m3(uint8_t code) {
  if ((code & 0x7Fu) == 0x7Fu) return 0.0f;
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code), __NV_E4M3);
  return __half2float(*reinterpret_cast<const __half*>(&h));
}

// A stored scale is used only when finite and positive (fp8::ScaleIsUsable).
__device__ __forceinline__ float UsableScale(float s) {
  return (s > 0.0f && s <= 3.402823466e38f) ? s : 0.0f;
}

// 2^x with the hardware approximation (max relative error ~2^-22; -inf -> 0).
__device__ __forceinline__ float Exp2Approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Eight consecutive values as f32 (16-byte aligned, read-only in the kernel).
__device__ __forceinline__ void Load8(const __nv_bfloat16* p, float (&v)[8]) {
  const uint4 raw = __ldg(reinterpret_cast<const uint4*>(p));
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    v[2 * i] = f.x;
    v[2 * i + 1] = f.y;
  }
}
__device__ __forceinline__ void Load8(const float* p, float (&v)[8]) {
  const float4 a = __ldg(reinterpret_cast<const float4*>(p)), b = __ldg(reinterpret_cast<const float4*>(p) + 1);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

__device__ __forceinline__ uint32_t PackBf16x2(float a, float b) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// ---- cp.async ------------------------------------------------------------
__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Copies 16 bytes global -> shared; when !valid the destination is zero-filled
// and the source is not read.
__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem, bool valid) {
  const int src_size = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SmemAddr(smem)),
               "l"(gmem), "r"(src_size));
}

__device__ __forceinline__ void CpAsync8(void* smem, const void* gmem, bool valid) {
  const int src_size = valid ? 8 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(SmemAddr(smem)),
               "l"(gmem), "r"(src_size));
}

__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N of this thread's committed groups are still pending.
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// ---- mma -----------------------------------------------------------------
// d += a(16x16 bf16, row) * b(16x8 bf16, col), f32 accumulators.
// Fragment ownership (g = lane / 4, q = lane % 4):
//   a0 (g, 2q..2q+1)  a1 (g+8, 2q..)  a2 (g, 8+2q..)  a3 (g+8, 8+2q..)
//   b0 (k 2q..2q+1, n g)  b1 (k 8+2q.., n g)
//   d0,d1 (g, 2q..2q+1)  d2,d3 (g+8, 2q..2q+1)
__device__ __forceinline__ void MmaBf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The same with f16 operands (same fragment ownership).
__device__ __forceinline__ void MmaF16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ---- mbarriers and bulk copies (the async proxy) ---------------------------
// A bulk copy moves a contiguous run of bytes (16-byte aligned, a multiple of
// 16) from global to shared memory and counts them against an mbarrier's
// expected transaction bytes; waiting on the barrier's phase then makes them
// visible to the waiting threads.
__device__ __forceinline__ void MbarInit(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(SmemAddr(bar)), "r"(arrivals));
}

// After the initialising thread's MbarInit calls, before the block barrier
// that publishes them: makes the barriers visible to the async proxy.
__device__ __forceinline__ void MbarInitFence() {
  asm volatile("fence.mbarrier_init.release.cluster;\nfence.proxy.async.shared::cta;\n" ::: "memory");
}

__device__ __forceinline__ void MbarArrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(SmemAddr(bar)) : "memory");
}

// One arrival that also expects `bytes` of bulk copies in the current phase.
__device__ __forceinline__ void MbarArriveExpectTx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(SmemAddr(bar)), "r"(bytes)
               : "memory");
}

// Waits until the phase of parity `parity` has completed.
__device__ __forceinline__ void MbarWait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(SmemAddr(bar)),
      "r"(parity)
      : "memory");
}

__device__ __forceinline__ void BulkCopyToShared(void* smem, const void* gmem, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
          SmemAddr(smem)),
      "l"(gmem), "r"(bytes), "r"(SmemAddr(bar))
      : "memory");
}

// ---- programmatic dependent launch (PTX griddepcontrol) --------------------
// A kernel launched with LaunchAfter may start while the kernel before it on
// its stream still runs (once every block of that kernel has called
// LaunchDependents, or exited); it must call GridDependencyWait() before it
// reads anything that kernel writes: the wait returns when that kernel has
// finished and its writes are visible. Every block of such a kernel must
// wait, also one with nothing to do: only then do the kernels after it find
// the one before it finished. This hides the launch and the block
// scheduling of a short kernel behind the end of the one before it.
__device__ __forceinline__ void GridDependencyWait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__device__ __forceinline__ void LaunchDependents() { asm volatile("griddepcontrol.launch_dependents;\n" ::); }

template <typename... Args>
cudaError_t LaunchAfter(void (*kernel)(Args...), dim3 grid, dim3 block, cudaStream_t stream, Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, args...);
}

}  // namespace strata::cuda::dev

#endif  // STRATA_KERNELS_CUDA_DEVICE_UTIL_CUH_
