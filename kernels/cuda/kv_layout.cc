#include "kernels/cuda/kv_layout.h"

#include <cstring>

namespace strata::cuda {

void PackV2Row(const uint8_t* row, int slot, uint8_t* page) {
  std::memcpy(page + kPageLatentOffset + static_cast<size_t>(slot) * kLatentDim, row, kLatentDim);
  uint8_t* scales = page + kPageScaleOffset + static_cast<size_t>(slot) * 8;
  std::memcpy(scales, row + kLatentDim, 4);
  std::memcpy(page + kPageRopeOffset + static_cast<size_t>(slot) * kRopeDim, row + kLatentDim + 4,
              kRopeDim);
  std::memcpy(scales + 4, row + kLatentDim + 4 + kRopeDim, 4);
}

void UnpackV2Row(const uint8_t* page, int slot, uint8_t* row) {
  std::memcpy(row, page + kPageLatentOffset + static_cast<size_t>(slot) * kLatentDim, kLatentDim);
  const uint8_t* scales = page + kPageScaleOffset + static_cast<size_t>(slot) * 8;
  std::memcpy(row + kLatentDim, scales, 4);
  std::memcpy(row + kLatentDim + 4, page + kPageRopeOffset + static_cast<size_t>(slot) * kRopeDim,
              kRopeDim);
  std::memcpy(row + kLatentDim + 4 + kRopeDim, scales + 4, 4);
}

void PackV2Rows(const uint8_t* rows, size_t row_stride, int64_t first_pos, int64_t n,
                uint8_t* const* pages) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t pos = first_pos + i;
    PackV2Row(rows + static_cast<size_t>(i) * row_stride, static_cast<int>(pos % kPageTokens),
              pages[pos / kPageTokens]);
  }
}

void UnpackV2Rows(const uint8_t* const* pages, int64_t first_pos, int64_t n, uint8_t* rows,
                  size_t row_stride) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t pos = first_pos + i;
    UnpackV2Row(pages[pos / kPageTokens], static_cast<int>(pos % kPageTokens),
                rows + static_cast<size_t>(i) * row_stride);
  }
}

}  // namespace strata::cuda
