// BpeModel: the "model" object of a Hugging Face tokenizer.json of type BPE,
// applied to one pre-tokenized piece at a time.
//
// Supported fields: vocab (token -> id), merges (either "a b" strings or
// ["a", "b"] pairs; rank = position in the list, a later duplicate overrides
// an earlier one as in `tokenizers`), unk_token and fuse_unk, ignore_merges
// (a piece that is itself in the vocabulary becomes that one id), dropout
// null or 0, byte_fallback false, continuing_subword_prefix and
// end_of_word_suffix null or "".
//
// Merging follows `tokenizers`: every adjacent pair with a merge rule is
// queued by (rank, position); the lowest is merged first and the pairs it
// forms with its neighbours are queued in turn. Results are cached per piece
// (a bounded, sharded cache; it never changes results).
//
// Internal to model/tokenizer*; not a public API.
//
// Thread-safety: immutable after FromJson() apart from the cache, whose shards
// are guarded by mutexes; Tokenize() may be called concurrently.
#ifndef STRATA_MODEL_TOKENIZER_BPE_H_
#define STRATA_MODEL_TOKENIZER_BPE_H_

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "model/tokenizer_json_reader.h"

namespace strata::tokenizer_internal {

class BpeModel {
 public:
  // `parsed->dom["model"]` holds the options; the vocabulary and merges are
  // moved out of `parsed`. Errors: INVALID_ARGUMENT for a missing or malformed
  // vocab or merges (a merge whose parts or result are not in the
  // vocabulary), UNIMPLEMENTED for model types and options Strata does not
  // support. Errors name the JSON path under "model".
  static absl::StatusOr<std::unique_ptr<BpeModel>> FromParsed(TokenizerJson* parsed);

  // Ids above this are rejected (they would make the id tables huge).
  static constexpr int64_t kMaxTokenId = (int64_t{1} << 26) - 1;

  // Appends the ids of `piece` (a pre-tokenized piece in byte-level form).
  void Tokenize(std::string_view piece, std::vector<int>* ids) const;

  std::optional<int> TokenToId(std::string_view token) const;
  // Largest id in the vocabulary + 1.
  int id_bound() const { return static_cast<int>(id_to_token_.size()); }
  // The vocabulary token of `id`, or "" when no token has that id.
  const std::string& IdToToken(int id) const;
  size_t vocab_entries() const { return vocab_.size(); }

 private:
  BpeModel() = default;
  absl::Status LoadMerges(const std::vector<std::pair<std::string, std::string>>& merges);
  void MergeWord(std::string_view piece, std::vector<int>* ids) const;

  struct Merge {
    int rank;
    int new_id;
  };
  static uint64_t PairKey(int a, int b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  absl::flat_hash_map<std::string, int> vocab_;
  std::vector<std::string> id_to_token_;
  absl::flat_hash_map<uint64_t, Merge> merges_;
  int unk_id_ = -1;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;

  static constexpr int kCacheShards = 16;
  static constexpr size_t kCacheShardCapacity = 4096;
  static constexpr size_t kMaxCachedPieceBytes = 256;
  struct CacheShard {
    absl::Mutex mu;
    absl::flat_hash_map<std::string, std::vector<int>> map ABSL_GUARDED_BY(mu);
  };
  mutable std::array<CacheShard, kCacheShards> cache_;
};

}  // namespace strata::tokenizer_internal

#endif  // STRATA_MODEL_TOKENIZER_BPE_H_
