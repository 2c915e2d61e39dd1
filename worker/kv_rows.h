// The bytes a pipeline stage exchanges with the KV store for one token: the
// `.coli_kv` v2 rows of the stage's layers followed by the f32 keys of the
// DSA indexer slots whose layer is in the stage's range (the "slice" of
// proto/strata/v1/kvstore.proto AppendRequest; docs/coli-kv.md "Records").
//
// Per layer l of [layer_begin, layer_end), in order:
//   u8 c[kv_lora]  fp8 e4m3 codes of the latent
//   f32 c_scale
//   u8 r[rope]     fp8 codes of the rope key
//   f32 r_scale
// then, for each layer of the range that runs its own indexer (increasing
// layer, i.e. increasing indexer slot), f32 k[index_head_dim].
//
// An fp8 SequenceKv keeps exactly these codes and scales, so encoding and
// decoding are bit-exact; an f32 cache is quantised on encoding
// (docs/design.md §4.3) and a resume from the store is then not bit-exact.
//
// Thread-safety: pure functions; SliceLayout is an immutable value.
#ifndef STRATA_WORKER_KV_ROWS_H_
#define STRATA_WORKER_KV_ROWS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "model/config.h"
#include "model/kv_cache.h"

namespace strata::worker {

struct SliceLayout {
  int layer_begin = 0, layer_end = 0;
  int kv_lora = 0, rope = 0, index_dim = 0;
  // Local layer indices (0 = layer_begin) whose indexer keys follow the rows.
  std::vector<int> indexer_layers;

  int64_t layer_bytes() const { return kv_lora + rope + 8; }
  int64_t slice_bytes() const {
    return (layer_end - layer_begin) * layer_bytes() + static_cast<int64_t>(indexer_layers.size()) * index_dim * 4;
  }
};

// REQUIRES: 0 <= begin < end <= config.num_layers.
SliceLayout MakeSliceLayout(const ModelConfig& config, int begin, int end);

// Appends the slices of tokens [first, first + n) of `kv` to `out`.
// REQUIRES: kv holds the layout's layers and first + n <= kv.num_tokens().
void EncodeSlices(const SliceLayout& layout, const SequenceKv& kv, int first, int n, std::string* out);

// Appends one token's rows from a slice (slice_bytes() bytes) to `kv`
// (AppendQuantizedRow / AppendStoredIndexKey for each layer); the caller
// calls kv->Commit. INVALID_ARGUMENT when a scale is not a usable positive
// finite number (the store sanitises rows, so this means a damaged slice).
absl::Status DecodeSlice(const SliceLayout& layout, const char* slice, SequenceKv* kv);

}  // namespace strata::worker

#endif  // STRATA_WORKER_KV_ROWS_H_
