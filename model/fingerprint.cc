#include "model/fingerprint.h"

#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
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

absl::StatusOr<uint64_t> ModelFingerprint(const std::string& dir) {
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

}  // namespace strata
