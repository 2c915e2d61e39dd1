#include "model/fingerprint.h"

#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "common/thread_pool.h"
#include "model/safetensors.h"

namespace strata {
namespace {

constexpr uint64_t kMul1 = 0x87C37B91114253D5ull;
constexpr uint64_t kMul2 = 0x4CF5AD432745937Full;

uint64_t Rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

uint64_t LoadLe64(const unsigned char* p) {
  uint64_t w = 0;
  for (int i = 7; i >= 0; --i) w = (w << 8) | p[i];
  return w;
}

}  // namespace

void Fingerprint64::Word(uint64_t w) {
  h_ ^= Rotl(w * kMul1, 31) * kMul2;
  h_ = Rotl(h_, 27) * 5 + 0x52DCE729;
}

void Fingerprint64::Update(const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  total_ += n;
  while (n > 0 && tail_n_ > 0 && tail_n_ < 8) {
    tail_[tail_n_++] = *p++;
    --n;
    if (tail_n_ == 8) {
      Word(LoadLe64(tail_));
      tail_n_ = 0;
    }
  }
  while (n >= 8) {
    Word(LoadLe64(p));
    p += 8;
    n -= 8;
  }
  while (n > 0) {
    tail_[tail_n_++] = *p++;
    --n;
  }
}

void Fingerprint64::UpdateField(const void* data, size_t n) {
  unsigned char len[8];
  uint64_t v = n;
  for (int i = 0; i < 8; ++i, v >>= 8) len[i] = static_cast<unsigned char>(v & 0xff);
  Update(len, 8);
  Update(data, n);
}

uint64_t Fingerprint64::Finish() const {
  uint64_t h = h_;
  uint64_t t = 0;
  for (size_t i = tail_n_; i > 0; --i) t = (t << 8) | tail_[i - 1];
  h ^= Rotl(t * kMul1, 31) * kMul2;
  h ^= total_;
  // splitmix64 finaliser.
  h ^= h >> 30;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 27;
  h *= 0x94D049BB133111EBull;
  h ^= h >> 31;
  return h;
}

namespace {

absl::StatusOr<std::string> ReadConfigText(const std::string& dir) {
  const std::string config_path = dir + "/config.json";
  std::ifstream f(config_path, std::ios::binary);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot read ", config_path));
  std::stringstream config;
  config << f.rdbuf();
  return config.str();
}

}  // namespace

absl::StatusOr<uint64_t> SyntheticModelFingerprint(const std::string& dir, uint64_t seed) {
  ASSIGN_OR_RETURN(const std::string config, ReadConfigText(dir));
  Fingerprint64 fp;
  fp.UpdateField("synthetic weights");
  fp.UpdateField(config);
  unsigned char le[8];
  for (int i = 0; i < 8; ++i) le[i] = static_cast<unsigned char>(seed >> (8 * i));
  fp.UpdateField(le, sizeof(le));
  return fp.Finish();
}

namespace {

void UpdateU64Field(Fingerprint64& fp, uint64_t v) {
  unsigned char le[8];
  for (int i = 0; i < 8; ++i) le[i] = static_cast<unsigned char>(v >> (8 * i));
  fp.UpdateField(le, sizeof(le));
}

// The digest of one tensor's sample (full: every byte), and the bytes hashed.
uint64_t TensorDigest(absl::Span<const uint8_t> bytes, bool full, uint64_t* read) {
  Fingerprint64 fp;
  const uint64_t n = bytes.size();
  if (full || n <= kFullTensorBytes) {
    fp.UpdateField(bytes.data(), n);
    *read = n;
    return fp.Finish();
  }
  for (int i = 0; i < kSampleWindows; ++i) {
    const uint64_t at = static_cast<uint64_t>(i) * (n - kSampleWindowBytes) / (kSampleWindows - 1);
    fp.UpdateField(bytes.data() + at, kSampleWindowBytes);
  }
  *read = uint64_t{kSampleWindows} * kSampleWindowBytes;
  return fp.Finish();
}

// Version 2 (full = false) or the model digest (full = true).
absl::StatusOr<uint64_t> EveryTensor(const std::string& dir, bool full, FingerprintStats* stats) {
  ASSIGN_OR_RETURN(const std::string config, ReadConfigText(dir));
  ASSIGN_OR_RETURN(std::unique_ptr<TensorStore> store, TensorStore::OpenDir(dir));
  const std::vector<std::string> names = store->Names();
  std::vector<absl::Span<const uint8_t>> views(names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    ASSIGN_OR_RETURN(views[i], store->View(names[i]));
  }
  // Per-tensor digests in parallel (page faults on a cold checkpoint are the
  // cost), combined in name order: the value does not depend on the threads.
  std::vector<uint64_t> digests(names.size()), read(names.size());
  ThreadPool::Default().ParallelFor(static_cast<int64_t>(names.size()), 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      digests[static_cast<size_t>(i)] = TensorDigest(views[static_cast<size_t>(i)], full, &read[static_cast<size_t>(i)]);
    }
  });
  Fingerprint64 fp;
  fp.UpdateField(full ? "strata model digest v2" : "strata model fingerprint v2");
  fp.UpdateField(config);
  for (const std::string& header : store->HeaderTexts()) fp.UpdateField(header);
  FingerprintStats st;
  for (size_t i = 0; i < names.size(); ++i) {
    fp.UpdateField(names[i]);
    UpdateU64Field(fp, digests[i]);
    st.tensors += 1;
    st.tensor_bytes += views[i].size();
    st.bytes_read += read[i];
  }
  if (stats != nullptr) *stats = st;
  return fp.Finish();
}

}  // namespace

absl::StatusOr<uint64_t> ModelFingerprint(const std::string& dir, FingerprintStats* stats) {
  return EveryTensor(dir, /*full=*/false, stats);
}

absl::StatusOr<uint64_t> ModelDigest(const std::string& dir, FingerprintStats* stats) {
  return EveryTensor(dir, /*full=*/true, stats);
}

absl::StatusOr<uint64_t> LegacyModelFingerprint(const std::string& dir) {
  ASSIGN_OR_RETURN(const std::string config, ReadConfigText(dir));
  ASSIGN_OR_RETURN(std::unique_ptr<TensorStore> store, TensorStore::OpenDir(dir));
  Fingerprint64 fp;
  fp.UpdateField(config);
  for (const std::string& header : store->HeaderTexts()) fp.UpdateField(header);
  for (const char* name : {"model.embed_tokens.weight", "model.layers.0.self_attn.kv_a_proj_with_mqa.weight"}) {
    absl::StatusOr<absl::Span<const uint8_t>> bytes = store->ReadRaw(name);
    if (!bytes.ok()) {
      return absl::NotFoundError(absl::StrCat("model fingerprint of ", dir, ": ", bytes.status().message()));
    }
    fp.UpdateField(bytes->data(), bytes->size());
  }
  return fp.Finish();
}

absl::StatusOr<ModelIdentityValues> FingerprintModel(const std::string& dir,
                                                     std::optional<uint64_t> synthetic_seed) {
  ModelIdentityValues v;
  if (synthetic_seed.has_value()) {
    ASSIGN_OR_RETURN(v.fingerprint, SyntheticModelFingerprint(dir, *synthetic_seed));
    v.legacy_fingerprint = v.fingerprint;
    v.what = absl::StrCat("synthetic weights from seed ", *synthetic_seed);
    return v;
  }
  FingerprintStats stats;
  ASSIGN_OR_RETURN(v.fingerprint, ModelFingerprint(dir, &stats));
  absl::StatusOr<uint64_t> legacy = LegacyModelFingerprint(dir);
  if (legacy.ok()) {
    v.legacy_fingerprint = *legacy;
  } else if (!absl::IsNotFound(legacy.status())) {
    return legacy.status();
  }
  v.what = absl::StrFormat("%d tensors sampled, %.1f MB of %.1f MB read", stats.tensors,
                           static_cast<double>(stats.bytes_read) / 1e6,
                           static_cast<double>(stats.tensor_bytes) / 1e6);
  return v;
}

}  // namespace strata
