// Saving a DeepSeek-V4 sequence's carried state (model/v4/sequence.h,
// docs/deepseek-v4.md §4.4) into a `.coli_kv` v3 file and loading it back
// (the layout: docs/coli-kv.md, "Version 3").
//
// What goes where: a token record holds, for one position, every layer's
// window row and the raw compressor and indexer projections (kv, gate) that
// the state keeps of it; a block record holds a closed block's compressed row
// and, for CSA layers, its index key. With rows stored as f32 a loaded
// sequence has the bits of the saved one, so a resumed sequence continues
// exactly like an uninterrupted one; with fp8 rows (DeepSeek's 584-byte
// encoding at head_dim 512) the window and compressed rows come back rounded.
//
// Thread-safety: free functions; a sequence must not be advanced while it is
// being saved.
#ifndef STRATA_MODEL_V4_KV_STATE_H_
#define STRATA_MODEL_V4_KV_STATE_H_

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvstore/coli_kv3.h"
#include "kvstore/coli_kv3_file.h"
#include "model/v4/config.h"
#include "model/v4/sequence.h"

namespace strata::v4 {

// The v3 header of a model: its layers' kinds and rates, head_dim, rope_dim,
// index_head_dim, sliding_window and vocabulary.
kv::V3Header V4KvHeader(const V4Config& config, kv::V3RowFormat format);

// A pipeline stage's share of the state (docs/coli-kv.md, "V4 sessions in
// the KV store"): the parts of layers [begin, end) of the token records and
// those layers' block records. After a step that advanced `seq` from t0 to
// T = seq.num_tokens() tokens: *slices gets the range's part of the token
// records of positions [max(t0, T − N), T) (layout.slice_bytes(begin, end)
// bytes each, what the state at T keeps of them), *blocks the sealed block
// records of the range's layers closed in (t0, T], in log order.
// FAILED_PRECONDITION when the layout is not the config's or t0 > T;
// INVALID_ARGUMENT for a bad range.
absl::Status EncodeV4Step(const V4Config& config, const V4Sequence& seq, int begin, int end, int64_t t0,
                          const kv::V3Layout& layout, std::string* slices, std::string* blocks);

// The inverse at T tokens: fills layers [begin, end) of `seq` (new, empty)
// from the range's slices of positions [layout.first_live(T), T) and its
// block records of every close in (0, T] (checked: DATA_LOSS when sizes,
// CRC32C, layer or block index are wrong). Does not Commit: the caller
// commits T once every range it holds is decoded.
absl::Status DecodeV4Stage(const V4Config& config, const kv::V3Layout& layout, int begin, int end, int64_t t,
                           std::string_view slices, std::string_view blocks, V4Sequence* seq);

// Appends what `seq` gained since the writer's committed token count T0:
// the token records of the positions [max(T0, T − N), T) and the blocks closed
// in (T0, T], then commits T = seq.num_tokens() (ColiKv3Writer::Append).
// new_tokens: the token ids of positions [T0, T). FAILED_PRECONDITION when
// the file's header is not the config's or T0 > T; INVALID_ARGUMENT when
// new_tokens has not T − T0 ids; OK and nothing written when T == T0.
absl::Status SaveV4Sequence(const V4Config& config, const V4Sequence& seq, absl::Span<const int> new_tokens,
                            kv::ColiKv3Writer* writer);

// The committed state of a file as a new sequence. FAILED_PRECONDITION when
// the header is not the config's; the reader's DATA_LOSS errors.
absl::StatusOr<std::unique_ptr<V4Sequence>> LoadV4Sequence(const V4Config& config, const kv::ColiKv3Reader& reader);

}  // namespace strata::v4

#endif  // STRATA_MODEL_V4_KV_STATE_H_
