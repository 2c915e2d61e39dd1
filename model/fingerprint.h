// ModelFingerprint: a 64-bit identity of a checkpoint, stored in every KV
// store session's manifest so that rows computed with one model are never
// loaded into another (docs/coli-kv.md, "Manifest" and "Model fingerprint").
//
// Version 2 (ModelFingerprint, what new manifests record) hashes, each as its
// byte length (u64, little-endian) followed by its bytes:
//   1. the string "strata model fingerprint v2";
//   2. the bytes of config.json;
//   3. the header text of every safetensors shard, ordered by file name;
//   4. for every tensor, in ascending byte order of names: its name, then its
//      sample: the whole stored bytes when they are at most kFullTensorBytes,
//      else kSampleWindows windows of kSampleWindowBytes at offsets
//      floor(i · (n − kSampleWindowBytes) / (kSampleWindows − 1)), i = 0 …
//      kSampleWindows − 1 (the first and the last window included).
// Every tensor contributes, so a checkpoint that differs in any tensor (a
// fine-tune of one layer) gets another fingerprint, and at most 32 KiB of
// each tensor is read: about 3 GB of a 700 GB DeepSeek-V3 checkpoint's ~91k
// tensors. A change that touches only bytes between the windows of a large
// tensor is not seen; ModelDigest reads everything.
//
// Version 1 (LegacyModelFingerprint: manifests written before version 2)
// hashed config.json, the shard headers, and the stored bytes of
// `model.embed_tokens.weight` and of layer 0's `kv_a_proj_with_mqa` only.
//
// The hash is Fingerprint64 below: stable across processes, builds and
// machines (no per-process seed). Not cryptographic: it identifies
// checkpoints, it does not authenticate them.
//
// Thread-safety: pure functions (they may use the default thread pool).
#ifndef STRATA_MODEL_FINGERPRINT_H_
#define STRATA_MODEL_FINGERPRINT_H_

#include <cstddef>
#include <cstdint>
#include <optional>
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

inline constexpr uint64_t kFullTensorBytes = 32 * 1024;
inline constexpr uint64_t kSampleWindowBytes = 4 * 1024;
inline constexpr int kSampleWindows = 8;
static_assert(kSampleWindows * kSampleWindowBytes <= kFullTensorBytes);

// The fingerprint algorithm versions, as manifests record them.
inline constexpr int kLegacyFingerprintVersion = 1;
inline constexpr int kFingerprintVersion = 2;

// What a fingerprint read.
struct FingerprintStats {
  int64_t tensors = 0;
  uint64_t tensor_bytes = 0;  // stored bytes of every tensor
  uint64_t bytes_read = 0;    // of those, hashed
};

// Version 2 of the model in `dir` (config.json + safetensors). NOT_FOUND when
// config.json or the weights are missing; other errors from opening the
// safetensors files. `stats`, when given, says what was read.
absl::StatusOr<uint64_t> ModelFingerprint(const std::string& dir, FingerprintStats* stats = nullptr);

// Version 1 (see above). NOT_FOUND also when one of its two tensors is
// missing.
absl::StatusOr<uint64_t> LegacyModelFingerprint(const std::string& dir);

// Like version 2 with every byte of every tensor hashed (a tensor's sample is
// all its bytes): another value than ModelFingerprint, recorded in a manifest
// only when the cluster computed it (docs/coli-kv.md, "Model fingerprint").
// Reads the whole checkpoint.
absl::StatusOr<uint64_t> ModelDigest(const std::string& dir, FingerprintStats* stats = nullptr);

// What a cluster sends the KV store about its model: the current
// fingerprint, the version-1 one (0 when the model has no version-1
// fingerprint: it lacks one of its two tensors), and a line saying what was
// read. With a synthetic seed both are SyntheticModelFingerprint.
struct ModelIdentityValues {
  uint64_t fingerprint = 0;
  uint64_t legacy_fingerprint = 0;
  std::string what;
};
absl::StatusOr<ModelIdentityValues> FingerprintModel(const std::string& dir,
                                                     std::optional<uint64_t> synthetic_seed);

// The fingerprint of a model whose weights are generated from `seed` on the
// device (--synthetic-weights): the field "synthetic weights", the bytes of
// config.json, then the seed (u64 LE), so it never equals a checkpoint's.
// NOT_FOUND when config.json is missing.
absl::StatusOr<uint64_t> SyntheticModelFingerprint(const std::string& dir, uint64_t seed);

}  // namespace strata

#endif  // STRATA_MODEL_FINGERPRINT_H_
