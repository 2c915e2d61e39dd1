// `strata plan`: prints the placement a cluster would use for a model, and
// why, without starting anything (docs/service.md, "Placement").
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cli/commands.h"
#include "common/flags.h"
#include "coordinator/placement.h"

namespace strata::cli {

int Plan(const std::vector<std::string>& args) {
  FlagSet flags;
  flags.Declare("model", "model directory (config.json + safetensors headers are read)");
  flags.Declare("workers", "number of workers, named w0, w1, ... (default 2)");
  flags.Declare("memory", "free memory per worker in GiB, comma-separated (default: all equal)");
  flags.Declare("override", "manual placement, e.g. 0-30:w0,31-60:w1");
  flags.Declare("kv-dtype", "fp8 (default) or f32");
  flags.Declare("max-sessions", "sessions whose KV must fit (default 64)");
  flags.Declare("max-context", "tokens per session (default: the model's context)");
  flags.Declare("help", "show this help", true);
  auto fail = [](const std::string& m, int code) {
    std::fprintf(stderr, "strata plan: %s\n", m.c_str());
    return code;
  };
  if (auto st = flags.Parse(args); !st.ok()) return fail(std::string(st.message()), 2);
  if (flags.Has("help")) {
    std::printf("usage: strata plan --model DIR [--workers N] [--override SPEC] [flags]\n%s", flags.Help().c_str());
    return 0;
  }
  if (!flags.Has("model")) return fail("--model is required", 2);
  auto workers = flags.GetInt("workers", 2), sessions = flags.GetInt("max-sessions", 64),
       context = flags.GetInt("max-context", 0);
  for (const auto* v : {&workers, &sessions, &context}) {
    if (!v->ok()) return fail(std::string(v->status().message()), 2);
  }
  if (*workers < 1 || *workers > 1024) return fail("--workers must be in [1, 1024]", 2);
  const std::string kv = flags.Get("kv-dtype", "fp8");
  if (kv != "fp8" && kv != "f32") return fail("--kv-dtype must be fp8 or f32", 2);
  const KvDtype dtype = kv == "f32" ? KvDtype::kF32 : KvDtype::kFp8;
  auto layout = coordinator::ReadModelLayout(flags.Get("model"), dtype);
  if (!layout.ok()) return fail(std::string(layout.status().message()), 1);
  auto config = LoadModelConfig(flags.Get("model"));
  if (!config.ok()) return fail(std::string(config.status().message()), 1);
  std::vector<coordinator::WorkerSlot> slots;
  std::vector<std::string> mem;
  if (flags.Has("memory")) mem = absl::StrSplit(flags.Get("memory"), ',');
  if (!mem.empty() && static_cast<int64_t>(mem.size()) != *workers) {
    return fail(absl::StrCat("--memory lists ", mem.size(), " values for ", *workers, " workers"), 2);
  }
  for (int i = 0; i < *workers; ++i) {
    double gib = 0;
    if (!mem.empty() && (!absl::SimpleAtod(mem[i], &gib) || gib <= 0)) {
      return fail(absl::StrCat("--memory value '", mem[i], "' is not a positive number of GiB"), 2);
    }
    slots.push_back({absl::StrCat("w", i), static_cast<uint64_t>(gib * (1ull << 30))});
  }
  coordinator::PlacementOptions po;
  po.max_sessions = *sessions;
  po.max_context = *context > 0 ? *context : config->max_position_embeddings;
  auto plan = flags.Has("override") ? coordinator::PlanOverride(*layout, slots, po, flags.Get("override"))
                                    : coordinator::PlanBalanced(*layout, slots, po);
  if (!plan.ok()) return fail(std::string(plan.status().message()), 2);
  std::printf("model %s: %d layers, KV %s\n%s", flags.Get("model").c_str(), layout->num_layers, kv.c_str(),
              coordinator::DescribePlan(*plan, slots).c_str());
  return 0;
}

}  // namespace strata::cli
