// Fuzzes the manifest parser. Each input is parsed twice: as a whole file,
// and as a JSON body given a correct CRC32C trailer (so that mutations reach
// the strict validation behind the checksum). Whatever parses must validate
// and round-trip through SerializeManifest unchanged.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "kvstore/crc32c.h"
#include "kvstore/manifest.h"

namespace {

void Check(std::string_view bytes) {
  auto m = strata::kv::ParseManifest(bytes);
  if (!m.ok()) return;
  if (!strata::kv::ValidateManifest(*m).ok()) abort();
  auto back = strata::kv::ParseManifest(strata::kv::SerializeManifest(*m));
  if (!back.ok() || !(*back == *m)) abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  Check(bytes);
  std::string body(bytes);
  body += '\n';
  char trailer[32];
  std::snprintf(trailer, sizeof(trailer), "crc32c %08x\n", strata::kv::crc32c::Value(body));
  Check(body + trailer);
  return 0;
}
