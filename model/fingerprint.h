// ModelFingerprint: a 64-bit identity of a checkpoint, stored in every KV
// store session's manifest so that rows computed with one model are never
// loaded into another (docs/design.md §4.6, docs/coli-kv.md "Manifest").
//
// The fingerprint hashes, in this order, each as its byte length (u64,
// little-endian) followed by its bytes:
//   1. the bytes of config.json;
//   2. the header text of every safetensors shard, ordered by file name
//      (TensorStore::HeaderTexts);
//   3. the stored bytes of `model.embed_tokens.weight`;
//   4. the stored bytes of `model.layers.0.self_attn.kv_a_proj_with_mqa.weight`.
// Two checkpoints with equal dimensions (hence equal headers) but different
// weights differ through 3 and 4. The hash is Fingerprint64 below: stable
// across processes, builds and machines (no per-process seed).
//
// Thread-safety: pure functions.
#ifndef STRATA_MODEL_FINGERPRINT_H_
#define STRATA_MODEL_FINGERPRINT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace strata {

// A streaming 64-bit hash: 8-byte little-endian words are mixed with two
// odd multipliers and a rotation, the tail bytes and the total length are
// folded in, and Finish applies the splitmix64 finaliser. Not cryptographic:
// it identifies checkpoints, it does not authenticate them.
class Fingerprint64 {
 public:
  void Update(const void* data, size_t n);
  void Update(std::string_view s) { Update(s.data(), s.size()); }
  // Length (u64 LE), then the bytes: keeps field boundaries unambiguous.
  void UpdateField(const void* data, size_t n);
  void UpdateField(std::string_view s) { UpdateField(s.data(), s.size()); }
  uint64_t Finish() const;

 private:
  void Word(uint64_t w);
  uint64_t h_ = 0x9E3779B97F4A7C15ull;
  uint64_t total_ = 0;
  unsigned char tail_[8] = {};
  size_t tail_n_ = 0;
};

// The fingerprint of the model in `dir` (config.json + safetensors).
// NOT_FOUND when config.json, the weights or one of the two tensors is
// missing; other errors from opening the safetensors files.
absl::StatusOr<uint64_t> ModelFingerprint(const std::string& dir);

// The fingerprint of a model whose weights are generated from `seed` on the
// device (--synthetic-weights): the field "synthetic weights", the bytes of
// config.json, then the seed (u64 LE), so it never equals a checkpoint's.
// NOT_FOUND when config.json is missing.
absl::StatusOr<uint64_t> SyntheticModelFingerprint(const std::string& dir, uint64_t seed);

}  // namespace strata

#endif  // STRATA_MODEL_FINGERPRINT_H_
