// fp8 row quantisation on the GPU with exactly the arithmetic of
// fp8::QuantizeRow (kernels/fp8.h): the same codes and scales, bit for bit.
//
// Also the write path of the paged KV cache: AppendKvRows quantises new
// latent and rope rows straight into their page slots (kv_layout.h).
//
// Launchers are asynchronous on `stream` and thread-compatible.
#ifndef STRATA_KERNELS_CUDA_FP8_QUANTIZE_H_
#define STRATA_KERNELS_CUDA_FP8_QUANTIZE_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace strata::cuda {

struct QuantizeRowsParams {
  const float* x;       // [rows][x_stride] f32; the first n of each row are quantised
  uint8_t* codes;       // [rows][codes_stride] fp8 e4m3 codes (first n written)
  float* scales;        // [rows][scale_stride] f32; element 0 of each row written
  int64_t rows;
  int n;                // row length, 1 .. 65536
  int64_t x_stride;     // in floats
  int64_t codes_stride; // in bytes
  int64_t scale_stride; // in floats
};

// One warp per row.
cudaError_t LaunchQuantizeRows(const QuantizeRowsParams& p, cudaStream_t stream);

struct AppendKvRowsParams {
  const float* latent;     // [n_tokens][512] f32, normed latent c of the new tokens
  const float* rope;       // [n_tokens][64] f32, roped key r of the new tokens
  const int64_t* positions;// [n_tokens] token position of each row in its sequence
  const int* seq_of_row;   // [n_tokens] which sequence (row of page_table) each row belongs to
  const int* page_table;   // [n_seqs][page_table_stride] page index per logical page
  int64_t page_table_stride;
  uint8_t* pool;           // [n_pages][kPageBytes] the page pool (kv_layout.h)
  int64_t n_tokens;
};

// Quantises each (latent, rope) pair with the CPU arithmetic and stores codes
// and scales into slot positions % 64 of page page_table[seq][positions / 64].
// REQUIRES: those pages exist; no two rows target one slot.
cudaError_t LaunchAppendKvRows(const AppendKvRowsParams& p, cudaStream_t stream);

}  // namespace strata::cuda

#endif  // STRATA_KERNELS_CUDA_FP8_QUANTIZE_H_
