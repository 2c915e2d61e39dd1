// Fuzzes the .coli_kv reader, the writer's open/repair path and the inspect
// report with arbitrary file bytes. Allocations must stay bounded by the
// input's size (run with -malloc_limit_mb).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "kvstore/coli_kv_file.h"
#include "kvstore/fault_injection_env.h"
#include "kvstore/inspect.h"

namespace {

using strata::kv::ColiKvReader;
using strata::kv::ColiKvWriter;
using strata::kv::FaultInjectionEnv;
using strata::kv::OpenMode;
using strata::kv::RecordFormat;

void ReadAll(const ColiKvReader& r) {
  std::string buf;
  const RecordFormat formats[] = {RecordFormat::kStored, RecordFormat::kV2,
                                  RecordFormat::kV2Sanitized, RecordFormat::kV1};
  for (RecordFormat f : formats) {
    for (int64_t p = 0; p < r.nrec(); p += 7) {
      const int64_t k = std::min<int64_t>(7, r.nrec() - p);
      if (!r.ReadRecords(p, k, f, &buf).ok()) abort();  // in range: must succeed
      if (static_cast<int64_t>(buf.size()) != k * r.RecordBytes(f)) abort();
    }
  }
  if (r.ReadRecords(r.nrec(), 1, RecordFormat::kStored, &buf).ok()) abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FaultInjectionEnv env;
  if (!env.CreateDir("/f").ok()) abort();
  const std::string path = "/f/x.coli_kv";
  {
    auto f = env.Open(path, OpenMode::kCreate);
    if (!f.ok() || !(*f)->Write(0, std::string_view(reinterpret_cast<const char*>(data), size)).ok()) {
      abort();
    }
  }
  auto r = ColiKvReader::Open(&env, path);
  if (r.ok()) {
    ReadAll(**r);
    // The writer opens the same bytes (repairing a torn header), truncates and
    // appends; the result must read back consistently.
    auto w = ColiKvWriter::Open(&env, path);
    if (!w.ok()) abort();
    if ((*w)->nrec() != (*r)->nrec()) abort();
    if (!(*w)->Truncate((*w)->nrec() / 2).ok()) abort();
    if ((*w)->layout().record_bytes() <= (1 << 16)) {
      std::string rec(static_cast<size_t>((*w)->layout().record_bytes()), '\0');
      if (!(*w)->Append(rec).ok()) abort();
    }
    auto again = ColiKvReader::Open(&env, path);
    if (!again.ok() || (*again)->torn()) abort();
    ReadAll(**again);
  }
  // The inspect report never fails on a readable path, whatever the bytes.
  strata::kv::InspectOptions options;
  if (!strata::kv::InspectFile(&env, path, options).ok()) abort();
  return 0;
}
