// Fuzzes the .coli_kv v3 reader (header, commit records, token records, block
// log), the writer's open and append, and the inspect report with arbitrary
// file bytes (docs/coli-kv.md, "Version 3"). Whatever reads back cleanly must
// take one more append and then read back as exactly the old state plus it.
// Allocations must stay bounded by the input's size (run with
// -malloc_limit_mb).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "kvstore/coli_kv.h"
#include "kvstore/coli_kv3_file.h"
#include "kvstore/fault_injection_env.h"
#include "kvstore/inspect.h"

namespace {

using strata::kv::ColiKv3Reader;
using strata::kv::ColiKv3Writer;
using strata::kv::FaultInjectionEnv;
using strata::kv::OpenMode;

// Bytes the one-token append may make the file reach (the in-memory Env
// stores holes as zeros).
constexpr int64_t kMaxGrownFile = int64_t{8} << 20;

struct Read {
  bool ok = true;
  std::vector<std::string> tokens;  // positions [first_live, T)
  std::string log;
};

Read ReadEverything(const ColiKv3Reader& r) {
  Read out;
  std::string buf;
  for (int64_t p = r.first_live(); p < r.num_tokens(); ++p) {
    if (!r.ReadTokenRecord(p, &buf).ok()) {
      out.ok = false;
      continue;
    }
    out.tokens.push_back(buf);
  }
  if (r.ReadTokenRecord(r.num_tokens(), &buf).ok()) abort();  // past the end: never
  if (!r.ReadBlockLog(&out.log).ok()) out.ok = false;
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FaultInjectionEnv env;
  if (!env.CreateDir("/f").ok()) abort();
  const std::string path = "/f/x.coli_kv";
  {
    auto f = env.Open(path, OpenMode::kCreate);
    if (!f.ok() || !(*f)->Write(0, std::string_view(reinterpret_cast<const char*>(data), size)).ok()) abort();
    if (!(*f)->Sync().ok() || !env.SyncDir("/f").ok()) abort();  // the input survives the power loss below
  }
  auto r = ColiKv3Reader::Open(&env, path);
  if (r.ok()) {
    const Read before = ReadEverything(**r);
    auto w = ColiKv3Writer::Open(&env, path);
    if (!w.ok() || (*w)->num_tokens() != (*r)->num_tokens()) abort();
    const strata::kv::V3Layout& L = (*w)->layout();
    const int64_t t = (*w)->num_tokens();
    const int64_t grown = L.log_offset() + static_cast<int64_t>(L.LogBytes(t + 1));
    if (before.ok && t < strata::kv::kV3MaxTokens && grown <= kMaxGrownFile) {
      std::vector<std::string> recs;
      if (L.live_tokens() > 0) {
        std::string rec(static_cast<size_t>(L.token_bytes()), '\x01');
        strata::kv::StoreI32(rec.data(), static_cast<int32_t>(t));
        strata::kv::StoreI32(rec.data() + 4, 0);
        strata::kv::SealV3Record(rec.data(), L.token_bytes());
        recs.push_back(rec);
      }
      std::string blocks;
      for (const auto& [l, b] : L.Closes(t, t + 1)) {
        std::string rec(static_cast<size_t>(L.block_bytes(l)), '\x02');
        strata::kv::StoreI32(rec.data(), l);
        strata::kv::StoreI32(rec.data() + 4, b);
        strata::kv::SealV3Record(rec.data(), L.block_bytes(l));
        blocks += rec;
      }
      if (!(*w)->Append(t + 1, recs, blocks).ok()) abort();
      env.DropUnsyncedData();  // acknowledged: durable
      auto again = ColiKv3Reader::Open(&env, path);
      if (!again.ok() || (*again)->num_tokens() != t + 1) abort();
      const Read after = ReadEverything(**again);
      if (!after.ok || after.log != before.log + blocks) abort();
      // The positions still live are the old records, then the new one.
      const size_t kept = after.tokens.size() - recs.size();
      for (size_t i = 0; i < kept; ++i) {
        if (after.tokens[i] != before.tokens[before.tokens.size() - kept + i]) abort();
      }
      if (!recs.empty() && after.tokens.back() != recs[0]) abort();
    }
  }
  // The inspect report never fails on a readable path, whatever the bytes.
  strata::kv::InspectOptions options;
  if (!strata::kv::InspectFile(&env, path, options).ok()) abort();
  return 0;
}
