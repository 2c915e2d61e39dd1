// Routed experts of a small batch on the device, with no host round trip
// (docs/gpu-engine.md, "MoE"). After the router (LaunchMoeRoute) has chosen
// k experts per row, for every entry (row r, slot j) with expert e:
//
//   act[r*k + j] = silu(gate_e x_r) * (up_e x_r)      (inter values)
//   y[r*k + j]   = down_e act[r*k + j]                 (hidden values)
//
// and LaunchMoeCombine sums the y of a row with the routing weights. Three
// launches: one block groups the entries by expert (offsets, a list, and the
// used experts), then the gate/up and the down products over each used
// expert's weight rows (a grid over the used experts only: rows * k of them
// at most) — as matrix-vector kernels (LaunchMoeGemv: every weight row read
// once per group of up to four entries, f32 activations) or on tensor cores
// (LaunchMoeGemm: experts with more than four entries once per 32 entries,
// bf16 activations). With LaunchMoeGemv each entry's dot products run in a
// fixed order whatever else is in the batch (batch invariant). Entries whose id is out of range get y = 0.
#ifndef STRATA_KERNELS_CUDA_MOE_GEMV_H_
#define STRATA_KERNELS_CUDA_MOE_GEMV_H_

#include <cuda_runtime_api.h>

#include "kernels/cuda/layer_ops.h"

namespace strata::cuda {

struct MoeGemvParams {
  GemmType type = GemmType::kBF16;   // of the expert weights (unless fp8)
  // fp8 weights: the matrices hold e4m3 codes with one f32 scale per 128×128
  // block, [ceil(rows/128)][ceil(cols/128)] per matrix; a weight is
  // Decode(code) * scale in f32 (the CPU loader's value). LaunchMoeGemv only.
  bool fp8 = false;
  const float* const* gate_up_scale = nullptr;  // [experts] device pointers
  const float* const* down_scale = nullptr;     // [experts] device pointers
  const void* const* gate_up = nullptr;  // [experts] device pointers: [2 * inter][hidden], gate rows first
  const void* const* down = nullptr;     // [experts] device pointers: [hidden][inter]
  int experts = 0, hidden = 0, inter = 0;  // hidden and inter multiples of 8
  const float* x = nullptr;          // [rows][hidden]
  const int* expert_ids = nullptr;   // [rows][k]
  int rows = 0, k = 0;
  // Workspace and output.
  int* offsets = nullptr;            // [experts + 1]
  int* used = nullptr;               // [experts + 1]: the number of experts used, then their ids
  int* list = nullptr;               // [rows * k]
  float* act = nullptr;              // [rows * k][inter]
  float* y = nullptr;                // [rows * k][hidden]
};

// The largest rows * k the list kernel takes (one block).
inline constexpr int kMoeGemvMaxEntries = 4096;

// offsets, used and list can share one int buffer of MoeIndexInts ints.
inline int64_t MoeIndexInts(int experts, int64_t entries) { return entries + 2 * (int64_t{experts} + 1); }
// Points p.offsets, p.used and p.list into `ws` (p.experts must be set).
inline void SetMoeIndexWorkspace(MoeGemvParams& p, int* ws) {
  p.offsets = ws;
  p.used = ws + p.experts + 1;
  p.list = ws + 2 * (p.experts + 1);
}

// REQUIRES: hidden % 8 == 0, inter % 8 == 0, rows * k <= kMoeGemvMaxEntries,
// experts <= 1024.
cudaError_t LaunchMoeGemv(const MoeGemvParams& p, cudaStream_t stream);

// The same products for larger steps: experts with more than four entries
// on tensor cores (mma.sync, bf16 operands: x and act are rounded to bf16 as
// a cuBLASLt bf16 GEMM would, f32 accumulation), their entries taken 32 at a
// time, so each weight row is read once per 32 entries instead of once per
// four; experts with at most four entries by the matrix-vector kernels,
// which read their weights once too and run closer to the bandwidth. An
// entry's bits depend on its own values and on which of the two kernels its
// expert got (more than four entries in the step or not), nothing else.
// bf16 weights only (fp8: cudaErrorInvalidValue).
// REQUIRES: hidden % 256 == 0, inter % 256 == 0, rows * k <=
// kMoeGemvMaxEntries, experts <= 1024 (else cudaErrorInvalidValue).
cudaError_t LaunchMoeGemm(const MoeGemvParams& p, cudaStream_t stream);

}  // namespace strata::cuda

#endif  // STRATA_KERNELS_CUDA_MOE_GEMV_H_
