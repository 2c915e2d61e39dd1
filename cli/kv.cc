// `strata kv inspect|verify|convert|import`: offline tools for .coli_kv
// session files (docs/coli-kv.md). The logic lives in kvstore/; this file
// parses flags and prints.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cli/commands.h"
#include "common/flags.h"
#include "kvstore/env.h"
#include "kvstore/inspect.h"
#include "kvstore/manifest.h"
#include "kvstore/session_file.h"
#include "model/config.h"
#include "model/fingerprint.h"

namespace strata::cli {
namespace {

constexpr const char* kUsage = R"(usage:
  strata kv inspect FILE [--model DIR] [--tokens N]   print what the file holds, as JSON
  strata kv verify FILE [--model DIR [--full]]        exit 0 when the file and its manifest are sound
  strata kv convert --to v1|v2 IN OUT                 rewrite a session file in the other version
  strata kv import --model DIR [--full] FILE          take in a file without a manifest (written by
                                                      colibri): check its dimensions, write the manifest
With --model, the manifest's model fingerprint must match that model (a sample of every tensor).
--full also hashes every byte of the model: verify compares that digest with the one the
manifest records; import records it.
)";

int Fail(const std::string& sub, const absl::Status& s, int code = 1) {
  std::fprintf(stderr, "strata kv %s: %s\n", sub.c_str(), std::string(s.message()).c_str());
  return code;
}

// The .coli_kv dimensions of a model: every layer, with an indexer cache for
// the layers that run their own DSA indexer.
absl::StatusOr<std::pair<kv::Dims, std::vector<int32_t>>> ModelDims(const std::string& dir) {
  auto cfg = LoadModelConfig(dir);
  if (!cfg.ok()) return cfg.status();
  kv::Dims d;
  d.n_layers = cfg->num_layers;
  d.kv_lora = cfg->kv_lora_rank;
  d.qk_rope = cfg->qk_rope_head_dim;
  d.index_hd = cfg->has_dsa ? cfg->index_head_dim : 0;
  d.nic = cfg->num_indexer_layers();
  d.vocab = cfg->vocab_size;
  std::vector<int32_t> layers;
  for (int l = 0; l < cfg->num_layers; ++l) {
    if (cfg->indexer_slot(l) >= 0) layers.push_back(l);
  }
  return std::make_pair(d, layers);
}

}  // namespace

int Kv(const std::vector<std::string>& args) {
  if (args.empty() || args[0] == "--help" || args[0] == "help") {
    std::fputs(kUsage, args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }
  const std::string sub = args[0];
  FlagSet flags;
  flags.Declare("model", "model directory (its fingerprint and dimensions)");
  flags.Declare("tokens", "inspect: how many leading token ids to print (default 16)");
  flags.Declare("to", "convert: target version, v1 or v2");
  flags.Declare("full", "with --model: hash every byte of the model (the model digest)", true);
  if (auto st = flags.Parse(std::vector<std::string>(args.begin() + 1, args.end())); !st.ok()) {
    return Fail(sub, st, 2);
  }
  const auto& pos = flags.positional();
  kv::Env* env = kv::Env::Default();
  kv::InspectOptions opt;
  if (flags.Has("model") && sub != "import") {
    auto ids = FingerprintModel(flags.Get("model"), std::nullopt);
    if (!ids.ok()) return Fail(sub, ids.status());
    opt.expected_fingerprint = kv::ModelIdentity(
        ids->fingerprint, ids->legacy_fingerprint != 0 ? std::optional<uint64_t>(ids->legacy_fingerprint) : std::nullopt);
  }
  if (flags.Has("full") && !flags.Has("model")) {
    return Fail(sub, absl::InvalidArgumentError("--full needs --model DIR"), 2);
  }
  std::optional<uint64_t> digest;
  if (flags.Has("full")) {
    FingerprintStats stats;
    auto d = ModelDigest(flags.Get("model"), &stats);
    if (!d.ok()) return Fail(sub, d.status());
    std::fprintf(stderr, "strata kv %s: model digest %016llx (%lld tensors, %.1f MB read)\n", sub.c_str(),
                 static_cast<unsigned long long>(*d), static_cast<long long>(stats.tensors),
                 static_cast<double>(stats.bytes_read) / 1e6);
    digest = *d;
    opt.expected_model_digest = digest;
  }
  if (sub == "inspect" || sub == "verify") {
    if (pos.size() != 1) return Fail(sub, absl::InvalidArgumentError("needs exactly one FILE"), 2);
    auto n = flags.GetInt("tokens", 16);
    if (!n.ok() || *n < 0 || *n > 1000000) return Fail(sub, absl::InvalidArgumentError("--tokens must be in [0, 1000000]"), 2);
    opt.max_tokens = static_cast<int>(*n);
    if (sub == "inspect") {
      auto json = kv::InspectFile(env, pos[0], opt);
      if (!json.ok()) return Fail(sub, json.status());
      std::printf("%s\n", json->c_str());
      return 0;
    }
    auto st = kv::VerifyFile(env, pos[0], opt);
    if (!st.ok()) return Fail(sub, st);
    std::printf("ok\n");
    return 0;
  }
  if (sub == "convert") {
    if (pos.size() != 2) return Fail(sub, absl::InvalidArgumentError("needs IN and OUT"), 2);
    const std::string to = flags.Get("to");
    if (to != "v1" && to != "v2") return Fail(sub, absl::InvalidArgumentError("--to must be v1 or v2"), 2);
    auto st = kv::ConvertSessionFile(env, pos[0], pos[1], to == "v1" ? kv::Version::kV1 : kv::Version::kV2);
    if (!st.ok()) return Fail(sub, st);
    return 0;
  }
  if (sub == "import") {
    if (pos.size() != 1 || !flags.Has("model")) {
      return Fail(sub, absl::InvalidArgumentError("usage: strata kv import --model DIR FILE"), 2);
    }
    auto dims = ModelDims(flags.Get("model"));
    if (!dims.ok()) return Fail(sub, dims.status());
    auto fp = ModelFingerprint(flags.Get("model"));
    if (!fp.ok()) return Fail(sub, fp.status());
    kv::ImportOptions io;
    io.dims = dims->first;
    io.indexer_layers = dims->second;
    io.fingerprint = *fp;
    io.model_digest = digest;
    auto st = kv::ImportSession(env, pos[0], io);
    if (!st.ok()) return Fail(sub, st);
    std::printf("imported %s\n", pos[0].c_str());
    return 0;
  }
  std::fprintf(stderr, "strata kv: unknown subcommand '%s'\n\n%s", sub.c_str(), kUsage);
  return 2;
}

}  // namespace strata::cli
