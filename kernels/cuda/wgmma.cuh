// Hopper warpgroup MMA (wgmma) building blocks: shared-memory matrix
// descriptors for the 128-byte swizzled layout, the fences, the three shapes
// the MLA decode kernel uses and the e4m3 one of the DSA indexer, named
// barriers and register reallocation (docs/gpu-kernels.md).
//
// Include only from .cu files compiled for sm_90a. Every function here must be
// called by all 128 threads of a warpgroup together (the barriers: by the
// threads the count names).
#ifndef STRATA_KERNELS_CUDA_WGMMA_CUH_
#define STRATA_KERNELS_CUDA_WGMMA_CUH_

#include <cstdint>

namespace strata::cuda::wgmma {

// A descriptor of a bf16 operand stored in 128-byte swizzled atoms (8 rows of
// 128 bytes, 16-byte chunk c of row r stored at chunk c ^ (r % 8); every atom
// 1024-byte aligned). `lbo` and `sbo` are byte strides (multiples of 16):
//   K-major (the row holds 64 consecutive K elements): sbo = stride between
//     groups of 8 rows (M or N); lbo unused.
//   MN-major (the row holds 64 consecutive M/N elements): lbo = stride between
//     groups of 64 M/N elements, sbo = stride between groups of 8 K rows.
__device__ __forceinline__ uint64_t SmemDesc(uint32_t smem_addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((smem_addr >> 4) & 0x3FFFu) |
         (static_cast<uint64_t>((lbo >> 4) & 0x3FFFu) << 16) |
         (static_cast<uint64_t>((sbo >> 4) & 0x3FFFu) << 32) |
         (static_cast<uint64_t>(1) << 62);  // 128-byte swizzle
}

// `desc` advanced by `units` 16-byte units: a 32-bit add on the start-address
// field (shared addresses stay below 256 KB, so it never carries out of it).
__device__ __forceinline__ uint64_t DescAdd(uint64_t desc, uint32_t units) {
  return (desc & 0xFFFFFFFF00000000ull) | (static_cast<uint32_t>(desc) + units);
}

// Byte offset of 16-byte chunk `chunk` (0..7) of row `row` in a swizzled block
// of rows of 128 bytes whose start is 1024-byte aligned.
__host__ __device__ constexpr uint32_t SwizzledChunk(int row, int chunk) {
  return static_cast<uint32_t>(row * 128 + ((chunk ^ (row & 7)) << 4));
}

// Orders this thread's generic-proxy shared-memory writes before later
// wgmma reads of them (follow with a barrier).
__device__ __forceinline__ void FenceProxyAsync() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void Fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void Commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void Wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// The f32 accumulators of the shapes below: 16 (or 128) of them bound as
// operands d[o] .. d[o + 15] (constraints), and the operand numbers of the
// first 32 and 128 in the instruction text (%0 ..).
#define STRATA_WGMMA_D16(d, o) \
  "+f"(d[o]), "+f"(d[o + 1]), "+f"(d[o + 2]), "+f"(d[o + 3]), "+f"(d[o + 4]), "+f"(d[o + 5]), \
  "+f"(d[o + 6]), "+f"(d[o + 7]), "+f"(d[o + 8]), "+f"(d[o + 9]), "+f"(d[o + 10]), "+f"(d[o + 11]), \
  "+f"(d[o + 12]), "+f"(d[o + 13]), "+f"(d[o + 14]), "+f"(d[o + 15])
#define STRATA_WGMMA_D128(d)                                                                   \
  STRATA_WGMMA_D16(d, 0), STRATA_WGMMA_D16(d, 16), STRATA_WGMMA_D16(d, 32), STRATA_WGMMA_D16(d, 48), \
      STRATA_WGMMA_D16(d, 64), STRATA_WGMMA_D16(d, 80), STRATA_WGMMA_D16(d, 96), STRATA_WGMMA_D16(d, 112)
#define STRATA_WGMMA_D32_NAMES \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
#define STRATA_WGMMA_D128_NAMES \
  "{" \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15," \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31," \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47," \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63," \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79," \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95," \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111," \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "

// d[64 x 32] (+)= A[64 x 16] * B[16 x 32], bf16 operands in shared
// memory, both K-major; d += when accumulate, else d =. Accumulator layout:
// warp w of the warpgroup, g = lane / 4, q = lane % 4: d[4j + 2i + c] is row
// 16w + g + 8i, column 8j + 2q + c (j = 0..3).
__device__ __forceinline__ void M64N32K16SS(float (&d)[16], uint64_t desc_a, uint64_t desc_b,
                                            bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "%16, %17, p, 1, 1, 0, 0;\n}\n"
      : STRATA_WGMMA_D16(d, 0)
      : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)));
}

// d[64 x 64] (+)= A[64 x 32] * B[32 x 64], e4m3 operands in shared memory,
// both K-major (e4m3 has no transposed form); accumulators as above with
// j = 0..7.
__device__ __forceinline__ void M64N64K32E4m3SS(float (&d)[32], uint64_t desc_a, uint64_t desc_b,
                                                bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 " STRATA_WGMMA_D32_NAMES
      "%32, %33, p, 1, 1;\n}\n"
      : STRATA_WGMMA_D16(d, 0), STRATA_WGMMA_D16(d, 16)
      : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)));
}

// d[64 x 256] += A[64 x 16] * B[16 x 256]: A bf16 in registers (the
// m16n8k16 A fragment of each warp's 16 rows), B bf16 in shared memory,
// MN-major. Accumulator layout as above with j = 0..31.
__device__ __forceinline__ void M64N256K16RS(float (&d)[128], const uint32_t (&a)[4],
                                             uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " STRATA_WGMMA_D128_NAMES
      "{%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
      : STRATA_WGMMA_D128(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}

// d[64 x 256] += A[64 x 16] * B[16 x 256], bf16; A K-major in shared memory
// (descriptor), B MN-major (transposed) in shared memory; accumulators as
// M64N256K16RS. The same product as the RS form when A holds the same values.
__device__ __forceinline__ void M64N256K16SS(float (&d)[128], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " STRATA_WGMMA_D128_NAMES
      "%128, %129, p, 1, 1, 0, 1;\n}\n"
      : STRATA_WGMMA_D128(d)
      : "l"(desc_a), "l"(desc_b), "r"(1));
}

#undef STRATA_WGMMA_D16
#undef STRATA_WGMMA_D128
#undef STRATA_WGMMA_D32_NAMES
#undef STRATA_WGMMA_D128_NAMES

// Named barriers (id 1..15; 0 is __syncthreads): `count` threads, a multiple
// of 32, take part; Arrive does not wait.
__device__ __forceinline__ void BarSync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void BarArrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// Register reallocation between warpgroups (all threads of the warpgroup).
template <int N>
__device__ __forceinline__ void RegAlloc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void RegDealloc() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

}  // namespace strata::cuda::wgmma

#endif  // STRATA_KERNELS_CUDA_WGMMA_CUH_
