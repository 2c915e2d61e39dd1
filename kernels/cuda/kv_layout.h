// The paged fp8 KV cache on the device (docs/design.md §4.7, docs/gpu-kernels.md
// "Paged KV layout") and its bit-exact conversion to and from `.coli_kv` v2
// layer rows (docs/coli-kv.md "Records").
//
// A page holds kPageTokens consecutive tokens of one (session, layer). Its
// bytes, all offsets 16-byte aligned:
//
//   offset     size            contents
//   0          64 x 512        latent codes c, token-major (slot s at s*512)
//   32768      64 x 64         rope codes r, token-major (slot s at 32768 + s*64)
//   36864      64 x 2 x f32    scales: slot s holds {c_scale, r_scale} at 36864 + s*8
//   total      37376
//
// A v2 layer row is the 584 bytes u8 c[512], f32 c_scale, u8 r[64], f32 r_scale.
// Packing and unpacking copy bytes (scales included, whatever their value), so
// a save after a resume writes the same bytes it read.
//
// Pure host functions; thread-safe on distinct pages.
#ifndef STRATA_KERNELS_CUDA_KV_LAYOUT_H_
#define STRATA_KERNELS_CUDA_KV_LAYOUT_H_

#include <cstddef>
#include <cstdint>

namespace strata::cuda {

inline constexpr int kPageTokens = 64;
inline constexpr int kLatentDim = 512;   // kv_lora
inline constexpr int kRopeDim = 64;      // qk_rope
inline constexpr int kRowDim = kLatentDim + kRopeDim;

inline constexpr size_t kPageLatentOffset = 0;
inline constexpr size_t kPageRopeOffset = kPageTokens * kLatentDim;               // 32768
inline constexpr size_t kPageScaleOffset = kPageRopeOffset + kPageTokens * kRopeDim;  // 36864
inline constexpr size_t kPageBytes = kPageScaleOffset + kPageTokens * 2 * sizeof(float);
static_assert(kPageBytes == 37376, "docs/design.md §4.7 page size");
static_assert(kPageRopeOffset % 16 == 0 && kPageScaleOffset % 16 == 0 && kPageBytes % 16 == 0,
              "every array of a page starts 16-byte aligned");

// Bytes of one v2 layer row in a `.coli_kv` record.
inline constexpr size_t kV2RowBytes = kLatentDim + 4 + kRopeDim + 4;
static_assert(kV2RowBytes == 584, "docs/coli-kv.md v2 layer row");

// Writes one v2 layer row into slot `slot` of `page`.
// REQUIRES: page points at kPageBytes bytes; row at kV2RowBytes; 0 <= slot < 64.
void PackV2Row(const uint8_t* row, int slot, uint8_t* page);

// Reads slot `slot` of `page` back into a v2 layer row.
// REQUIRES: as PackV2Row.
void UnpackV2Row(const uint8_t* page, int slot, uint8_t* row);

// Packs `n` consecutive v2 rows (stride `row_stride` bytes, e.g. a record size
// when the rows are one layer's slice of consecutive records) for token
// positions first_pos .. first_pos+n-1 of a sequence whose pages are `pages`
// (logical page p = pages[p]). REQUIRES: every page the positions reach exists.
void PackV2Rows(const uint8_t* rows, size_t row_stride, int64_t first_pos, int64_t n,
                uint8_t* const* pages);

// The inverse of PackV2Rows.
void UnpackV2Rows(const uint8_t* const* pages, int64_t first_pos, int64_t n, uint8_t* rows,
                  size_t row_stride);

}  // namespace strata::cuda

#endif  // STRATA_KERNELS_CUDA_KV_LAYOUT_H_
