// The per-layer device operations of the GPU engine (model/gpu): embedding,
// norms, rope, activations, the paged fp8 cache write for any latent/rope
// width, MLA attention and DSA indexer scores for any head shape, and the
// MoE router and combine. Each mirrors the CPU engine's arithmetic
// (model/attention.cc, model/mlp.cc, kernels/cpu/ops.cc) per row, so a
// row's result never depends on the other rows of its batch.
//
// The DeepSeek-V3 shapes (latent 512, rope 64; index dim 128) also have the
// tuned kernels of mla_decode.h and dsa_indexer.h; the generic kernels here
// are the fallback for every other shape and use the same page layout,
// generalised: a page of 64 tokens holds latent codes, rope codes and
// {c_scale, r_scale} pairs, each array 16-byte aligned (MlaPageLayout), which
// for 512/64 is exactly kv_layout.h.
//
// All launchers are asynchronous on `stream` and return the launch error.
#ifndef STRATA_KERNELS_CUDA_LAYER_OPS_H_
#define STRATA_KERNELS_CUDA_LAYER_OPS_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace strata::cuda {

constexpr size_t Align16(size_t n) { return (n + 15) / 16 * 16; }

// The page of one (sequence, layer) for any latent and rope width.
struct MlaPageLayout {
  int latent_dim = 512;
  int rope_dim = 64;
  constexpr size_t rope_offset() const { return Align16(64 * static_cast<size_t>(latent_dim)); }
  constexpr size_t scale_offset() const { return rope_offset() + Align16(64 * static_cast<size_t>(rope_dim)); }
  constexpr size_t page_bytes() const { return scale_offset() + 64 * 2 * sizeof(float); }
};

// Index-key pages: 64 x dim codes, then 64 f32 scales (16-byte aligned).
struct IndexPageLayout {
  int dim = 128;
  constexpr size_t scale_offset() const { return Align16(64 * static_cast<size_t>(dim)); }
  constexpr size_t page_bytes() const { return scale_offset() + 64 * sizeof(float); }
};

// Where each row of a batch lives: row i is position positions[i] of the
// sequence whose pages are page_table[page_row[i] * page_table_stride ...].
struct RowPages {
  const int64_t* positions;   // [rows]
  const int* page_row;        // [rows]
  const int* page_table;      // [seqs][page_table_stride]
  int64_t page_table_stride;
};

// out[r] = table[tokens[r]] (f32 or bf16 table), f32 out [rows][hidden].
cudaError_t LaunchEmbed(const void* table, bool table_bf16, const int* tokens, int rows, int hidden,
                        float* out, cudaStream_t stream);

// out[r] = w * (x[r] * inv), inv = 1/sqrt(mean(x^2) + eps) (sum in f64).
// x and out rows are `stride` floats apart; out may equal x.
cudaError_t LaunchRmsNorm(const float* x, const float* w, int rows, int n, int64_t stride, double eps,
                          float* out, cudaStream_t stream);

// LayerNorm with weight and bias (mean and variance in f64), in place allowed.
cudaError_t LaunchLayerNorm(const float* x, const float* w, const float* b, int rows, int n,
                            int64_t stride, double eps, float* out, cudaStream_t stream);

// Rotates `dim` values at x + r*row_stride + h*head_stride for every row r
// and head h < heads, at position positions[r]: interleaved pairs (2i, 2i+1)
// or halves (i, i + dim/2); cos and sin of the f32 angle inv_freq[i]*pos are
// taken in f64 and scaled by attention_factor, as the CPU does. REQUIRES:
// dim even and at most 8192 (else cudaErrorInvalidValue).
cudaError_t LaunchRope(float* x, int rows, int64_t row_stride, int heads, int64_t head_stride, int dim,
                       const int64_t* positions, const float* inv_freq, float attention_factor,
                       bool interleave, cudaStream_t stream);

// out[i] = silu(g[i]) * u[i] for i < n; g and u rows are interleaved when
// the caller passes strides (row r: g + r*stride, u + r*stride, n per row).
cudaError_t LaunchSiluMul(const float* g, const float* u, int rows, int n, int64_t in_stride,
                          float* out, cudaStream_t stream);

// acc[i] += d[i].
cudaError_t LaunchAdd(float* acc, const float* d, int64_t n, cudaStream_t stream);

// y[r][j] += b[j] for r < rows, j < n.
cudaError_t LaunchAddBias(float* y, const float* b, int rows, int n, cudaStream_t stream);

// x[i] *= s.
cudaError_t LaunchScale(float* x, int64_t n, float s, cudaStream_t stream);

// Round-to-nearest bf16 copy of n floats (out is __nv_bfloat16[n]).
cudaError_t LaunchToBf16(const float* x, int64_t n, void* out, cudaStream_t stream);

// GEMM inputs as two bf16 terms. For b < batch, i < m, l < k with
// v = x[b * stride_x + i * ldx + l]: out[b][i][l] = bf16(v) (hi) and
// out[b][m + i][l] = bf16(v - hi) (lo); out is __nv_bfloat16[batch][2m][k].
// hi + lo is v to a relative 2^-16, so a bf16 GEMM over the 2m rows whose
// halves LaunchAddSplitHalves then adds computes with the f32 inputs.
cudaError_t LaunchSplitBf16(const float* x, int batch, int m, int k, int64_t ldx, int64_t stride_x, void* out,
                            cudaStream_t stream);

// y[b * stride_y + i * ldy + j] = y2[b][i][j] + y2[b][m + i][j] for
// y2 = float[batch][2m][n] (the product of LaunchSplitBf16's rows).
cudaError_t LaunchAddSplitHalves(const float* y2, int batch, int m, int n, float* y, int64_t ldy, int64_t stride_y,
                                 cudaStream_t stream);

// dst[i] = src[idx[i]] (rows of `cols` floats).
cudaError_t LaunchGatherRows(const float* src, const int* idx, int n, int cols, float* dst,
                             cudaStream_t stream);
// dst[idx[i]] = src[i].
cudaError_t LaunchScatterRows(const float* src, const int* idx, int n, int cols, float* dst,
                              cudaStream_t stream);

// Quantises each row's latent (latent_dim floats at latent + r*stride) and
// rope (rope_dim floats at rope + r*stride) with the CPU's fp8 arithmetic
// into its slot of the paged cache.
cudaError_t LaunchAppendMlaRows(const float* latent, const float* rope, int64_t stride, int rows,
                                const RowPages& where, const MlaPageLayout& layout, uint8_t* pool,
                                cudaStream_t stream);

// Stores n `.coli_kv` v2 layer rows (latent_dim codes, f32 c_scale,
// rope_dim codes, f32 r_scale; bytes copied as they are) into the slots of
// positions first_pos .. first_pos+n-1 of the sequence whose page ids are
// `pages` (one page-table row).
cudaError_t LaunchStoreV2Rows(const uint8_t* rows, int64_t n, int64_t first_pos, const int* pages,
                              const MlaPageLayout& layout, uint8_t* pool, cudaStream_t stream);

// Reads index keys back as floats (code * usable scale, as the CPU keeps
// them) for positions first_pos .. first_pos+n-1: out [n][dim].
cudaError_t LaunchLoadIndexKeys(const uint8_t* pool, const int* pages, int64_t first_pos, int64_t n,
                                const IndexPageLayout& layout, float* out, cudaStream_t stream);

// The same for DSA index keys (dim floats at k + r*stride).
cudaError_t LaunchAppendIndexKeys(const float* k, int64_t stride, int rows, const RowPages& where,
                                  const IndexPageLayout& layout, uint8_t* pool, cudaStream_t stream);

// Absorbed MLA attention for any shape, one query row per (row, head):
//   s_t = scale * (q_abs . c_t + q_pe . r_t),  out = sum_t softmax(s)_t c_t
// over positions 0 .. seq_lens[r]-1 (dense) or the entries of indices[r]
// that are in that range (sparse).
struct MlaAttendParams {
  const float* q_abs;        // [rows][heads][latent_dim]
  const float* q_pe;         // row r, head h at q_pe + r*q_pe_row_stride + h*q_pe_head_stride
  int64_t q_pe_row_stride = 0;
  int64_t q_pe_head_stride = 0;
  int rows = 0;
  int heads = 0;
  float softmax_scale = 1.0f;
  MlaPageLayout layout;      // latent_dim <= 1024
  const uint8_t* pool;
  const int* page_row;       // [rows]
  const int* page_table;
  int64_t page_table_stride = 0;
  const int* seq_lens;       // [rows]
  const int* indices = nullptr;  // [rows][index_stride], -1 = none; null = dense
  int64_t index_stride = 0;
  float* out;                // [rows][heads][latent_dim]
};
cudaError_t LaunchMlaAttend(const MlaAttendParams& p, cudaStream_t stream);

// DSA indexer scores for any shape:
//   score[r][t] = sum_h w[r][h] * max(score_scale * (q[r][h] . k_t), 0)
// for t < seq_lens[r] (the CPU's order of operations per head).
struct IndexerScoreParams {
  const float* q;            // [rows][heads][dim]
  const float* weights;      // [rows][heads]
  int rows = 0;
  int heads = 0;
  float score_scale = 1.0f;
  IndexPageLayout layout;
  const uint8_t* pool;
  const int* page_row;
  const int* page_table;
  int64_t page_table_stride = 0;
  const int* seq_lens;       // [rows]
  int64_t max_seq_len = 0;
  float* scores;             // [rows][score_stride]
  int64_t score_stride = 0;
};
cudaError_t LaunchIndexerScores(const IndexerScoreParams& p, cudaStream_t stream);

// The DeepSeek/GLM router per row: sigmoid scores, selection-only bias,
// group-limited top-k (group score = two largest), top-k experts written
// in ascending id order with their (normalised, scaled) weights.
struct MoeRouteParams {
  const float* logits;       // [rows][experts]
  const float* bias;         // [experts]
  int rows = 0;
  int experts = 0;
  int groups = 1;
  int topk_groups = 1;
  int k = 1;
  bool normalize = true;
  float routed_scale = 1.0f;
  int* expert_ids;           // [rows][k]
  float* expert_weights;     // [rows][k]
};
cudaError_t LaunchMoeRoute(const MoeRouteParams& p, cudaStream_t stream);

// out[r] = sum_{j<k} y[r*k + j] * w[r*k + j] (in j order), + shared[r] when
// shared is not null. Rows of `cols` floats.
cudaError_t LaunchMoeCombine(const float* y, const float* w, const float* shared, int rows, int k,
                             int cols, float* out, cudaStream_t stream);

// Greedy sampling: out[r] = argmax of row r of x [rows][n], as Sampler does
// it: NaN counts as -inf, ties go to the lowest index, and a row with no
// value above -inf gives 0.
cudaError_t LaunchArgmaxRows(const float* x, int rows, int n, int* out, cudaStream_t stream);

// A GEMM's operands (kernels/cuda/gemm.h says what they mean).
enum class GemmType { kF32, kBF16 };

struct GemmArgs {
  GemmType type = GemmType::kBF16;
  int m = 0, n = 0, k = 0;
  const void* x = nullptr;
  int64_t ldx = 0;
  const void* w = nullptr;
  int64_t ldw = 0;
  bool w_is_kn = false;  // W stored [k][n] instead of [n][k]
  float* y = nullptr;
  int64_t ldy = 0;
  int batch = 1;
  int64_t stride_x = 0, stride_w = 0, stride_y = 0;  // elements between batches
  bool accumulate = false;  // y += x W^T instead of y = x W^T
};

// The plain GEMM kernel: one thread per output, f32 accumulation in k order.
// GemmRunner's fallback; tests compare it with cuBLASLt.
cudaError_t LaunchPlainGemm(const GemmArgs& a, cudaStream_t stream);

// Deterministic pseudo-random fill from (seed, index): uniform in
// [offset - scale, offset + scale), f32 or bf16. Same values for the same
// seed on any device.
cudaError_t LaunchFillUniform(void* dst, bool bf16, int64_t n, uint64_t seed, float offset, float scale,
                              cudaStream_t stream);

// Fills whole pages with random fp8 codes (NaN codes excluded) and scales in
// [0.5, 1) / 448, as a long context for benchmarks.
cudaError_t LaunchFillRandomPages(uint8_t* pool, int64_t pages, size_t page_bytes, size_t scale_offset,
                                  int scales_per_page, uint64_t seed, cudaStream_t stream);

}  // namespace strata::cuda

#endif  // STRATA_KERNELS_CUDA_LAYER_OPS_H_
