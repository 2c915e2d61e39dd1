#include "coordinator/placement.h"

#include <algorithm>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "model/random_model.h"
#include "model/safetensors.h"

namespace strata::coordinator {
namespace {

uint64_t KvPerToken(const ModelConfig& c, KvDtype dtype, int layer) {
  // deepseek_v4 keeps f32 state whose growth per token is at most a CSA
  // layer's: a compressed row and an index key every 4 tokens
  // (docs/deepseek-v4.md §4.3); the window is bounded.
  if (c.family == ModelFamily::kDeepseekV4) return static_cast<uint64_t>(c.kv_lora_rank + c.index_head_dim);
  uint64_t b = dtype == KvDtype::kFp8 ? static_cast<uint64_t>(c.kv_lora_rank + c.qk_rope_head_dim + 8)
                                      : 4ull * (c.kv_lora_rank + c.qk_rope_head_dim);
  if (c.layers[layer].indexer == IndexerMode::kFull) b += 4ull * c.index_head_dim;
  return b;
}

StageAssignment MakeStage(const ModelLayout& m, const PlacementOptions& o, const std::vector<WorkerSlot>& workers,
                          int worker, int b, int e) {
  StageAssignment s;
  s.worker = worker;
  s.layer_begin = b;
  s.layer_end = e;
  for (int l = b; l < e; ++l) {
    s.weight_bytes += m.layer_weight_bytes[l];
    s.kv_bytes += m.kv_bytes_per_token[l] * static_cast<uint64_t>(o.max_sessions) *
                  static_cast<uint64_t>(o.max_context);
  }
  if (workers[worker].kv_pool_bytes > 0) s.kv_bytes = workers[worker].kv_pool_bytes;
  if (b == 0) s.weight_bytes += m.embed_bytes;
  if (e == m.num_layers) s.weight_bytes += m.head_bytes;
  return s;
}

std::string Bytes(uint64_t b) {
  if (b >= (1ull << 30)) return absl::StrFormat("%.2f GiB", b / double(1ull << 30));
  if (b >= (1ull << 20)) return absl::StrFormat("%.2f MiB", b / double(1ull << 20));
  if (b >= (1ull << 10)) return absl::StrFormat("%.1f KiB", b / 1024.0);
  return absl::StrCat(b, " B");
}

void FitNotes(Plan* plan, const std::vector<WorkerSlot>& workers) {
  for (const auto& s : plan->stages) {
    const WorkerSlot& w = workers[s.worker];
    if (w.free_bytes > 0 && s.total_bytes() > w.free_bytes) {
      plan->notes.push_back(absl::StrCat("warning: stage on ", w.name, " needs ", Bytes(s.total_bytes()),
                                         " but the worker reports ", Bytes(w.free_bytes), " free"));
    }
  }
}

}  // namespace

ModelLayout LayoutFromTensors(const ModelConfig& c, KvDtype kv_dtype,
                              const std::vector<std::pair<std::string, uint64_t>>& tensors) {
  ModelLayout m;
  m.num_layers = c.num_layers;
  m.layer_weight_bytes.assign(c.num_layers, 0);
  const bool v4 = c.family == ModelFamily::kDeepseekV4;
  auto starts = [](const std::string& name, std::string_view prefix) { return name.rfind(prefix, 0) == 0; };
  for (const auto& [name, bytes] : tensors) {
    // DeepSeek-V4 checkpoints also come with DeepSeek's own names (layers.N.,
    // embed., head., norm., hc_head_*; docs/deepseek-v4.md §2.1).
    const std::string_view layers = starts(name, "model.layers.") ? "model.layers."
                                    : v4 && starts(name, "layers.")  ? "layers."
                                                                     : "";
    if (!layers.empty()) {
      const std::string rest = name.substr(layers.size());
      int layer = 0;
      if (absl::SimpleAtoi(rest.substr(0, rest.find('.')), &layer) && layer >= 0 && layer < c.num_layers) {
        m.layer_weight_bytes[layer] += bytes;
      }  // an MTP layer after num_layers is not served
    } else if (starts(name, "model.embed_tokens.") || (v4 && starts(name, "embed."))) {
      m.embed_bytes += bytes;
    } else if (starts(name, "model.norm.") || starts(name, "lm_head.") ||
               (v4 && (starts(name, "norm.") || starts(name, "head.") || starts(name, "model.hc_head.") ||
                       starts(name, "hc_head_")))) {
      m.head_bytes += bytes;
    }
  }
  for (int l = 0; l < c.num_layers; ++l) {
    m.can_cut_before.push_back(l == 0 || c.can_cut_before(l));
    m.kv_bytes_per_token.push_back(KvPerToken(c, kv_dtype, l));
  }
  return m;
}

ModelLayout SyntheticModelLayout(const ModelConfig& config, KvDtype kv_dtype) {
  std::vector<std::pair<std::string, uint64_t>> tensors;
  for (const auto& [name, shape] : CheckpointTensorShapes(config)) {
    uint64_t n = 1;
    for (int64_t d : shape) n *= static_cast<uint64_t>(d);
    tensors.emplace_back(name, 2 * n);
  }
  return LayoutFromTensors(config, kv_dtype, tensors);
}

absl::StatusOr<ModelLayout> ReadModelLayout(const std::string& model_dir, KvDtype kv_dtype) {
  ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(model_dir));
  ASSIGN_OR_RETURN(auto store, TensorStore::OpenDir(model_dir));
  std::vector<std::pair<std::string, uint64_t>> tensors;
  for (const std::string& n : store->Names()) {
    ASSIGN_OR_RETURN(TensorInfo info, store->Info(n));
    tensors.emplace_back(n, info.nbytes);
  }
  return LayoutFromTensors(config, kv_dtype, tensors);
}

absl::StatusOr<Plan> PlanBalanced(const ModelLayout& m, const std::vector<WorkerSlot>& workers,
                                  const PlacementOptions& o) {
  if (workers.empty()) return absl::InvalidArgumentError("placement needs at least one worker");
  if (m.num_layers <= 0) return absl::InvalidArgumentError("the model has no layers");
  const int L = m.num_layers;
  std::vector<int> cuts;  // allowed stage starts
  for (int l = 0; l < L; ++l) {
    if (l == 0 || m.can_cut_before[l]) cuts.push_back(l);
  }
  const int S = std::min<int>(static_cast<int>(workers.size()), static_cast<int>(cuts.size()));
  // cost(s, b, e): stage s on workers[s] holding [b, e), relative to its memory.
  uint64_t max_free = 0;
  for (const auto& w : workers) max_free = std::max(max_free, w.free_bytes);
  auto cost = [&](int s, int b, int e) {
    const double bytes = static_cast<double>(MakeStage(m, o, workers, s, b, e).total_bytes());
    const uint64_t cap = workers[s].free_bytes > 0 ? workers[s].free_bytes : (max_free > 0 ? max_free : 1);
    return bytes / static_cast<double>(cap);
  };
  // best[s][i]: the smallest achievable max cost placing stages 0..s-1 over
  // layers [0, cuts[i]) (i == cuts.size() means all layers).
  const int C = static_cast<int>(cuts.size());
  auto at = [&](int i) { return i == C ? L : cuts[i]; };
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(S + 1, std::vector<double>(C + 1, inf));
  std::vector<std::vector<int>> from(S + 1, std::vector<int>(C + 1, -1));
  best[0][0] = 0;
  for (int s = 1; s <= S; ++s) {
    for (int i = s; i <= C; ++i) {
      for (int j = s - 1; j < i; ++j) {
        if (best[s - 1][j] == inf) continue;
        const double v = std::max(best[s - 1][j], cost(s - 1, at(j), at(i)));
        if (v < best[s][i]) {
          best[s][i] = v;
          from[s][i] = j;
        }
      }
    }
  }
  Plan plan;
  std::vector<int> bounds{C};
  for (int s = S, i = C; s > 0; --s) {
    i = from[s][i];
    bounds.push_back(i);
  }
  std::reverse(bounds.begin(), bounds.end());
  for (int s = 0; s < S; ++s) plan.stages.push_back(MakeStage(m, o, workers, s, at(bounds[s]), at(bounds[s + 1])));
  plan.notes.push_back(absl::StrCat(L, " layers, ", C, " allowed cut points; ", S, " stage(s) over ",
                                    workers.size(), " worker(s), balanced by weights + KV budget (",
                                    o.max_sessions, " sessions x ", o.max_context, " tokens)"));
  if (C < L) {
    std::vector<std::string> no;
    for (int l = 1; l < L; ++l) {
      if (!m.can_cut_before[l]) no.push_back(absl::StrCat(l));
    }
    plan.notes.push_back(absl::StrCat("no stage may start at layer(s) ", absl::StrJoin(no, ","),
                                      " (they reuse the previous layer's DSA selection)"));
  }
  for (size_t w = S; w < workers.size(); ++w) {
    plan.notes.push_back(absl::StrCat(workers[w].name, " gets no layers: the model has only ", C,
                                      " allowed cut points (spare)"));
  }
  FitNotes(&plan, workers);
  return plan;
}

absl::StatusOr<Plan> PlanOverride(const ModelLayout& m, const std::vector<WorkerSlot>& workers,
                                  const PlacementOptions& o, const std::string& spec) {
  Plan plan;
  int next = 0;
  std::vector<bool> used(workers.size(), false);
  for (absl::string_view part : absl::StrSplit(spec, ',', absl::SkipWhitespace())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(part, absl::MaxSplits(':', 1));
    std::pair<std::string, std::string> range = absl::StrSplit(kv.first, absl::MaxSplits('-', 1));
    int b = 0, e = 0;
    if (kv.second.empty() || !absl::SimpleAtoi(range.first, &b) ||
        !absl::SimpleAtoi(range.second.empty() ? range.first : range.second, &e)) {
      return absl::InvalidArgumentError(absl::StrCat("placement override part '", part,
                                                     "' is not FIRST-LAST:WORKER (e.g. 0-30:w0)"));
    }
    if (b != next) {
      return absl::InvalidArgumentError(absl::StrCat("placement override part '", part, "' starts at layer ", b,
                                                     "; the next unplaced layer is ", next));
    }
    if (e < b || e >= m.num_layers) {
      return absl::InvalidArgumentError(absl::StrCat("placement override part '", part, "' ends at layer ", e,
                                                     "; the model has layers 0-", m.num_layers - 1));
    }
    if (b > 0 && !m.can_cut_before[b]) {
      return absl::InvalidArgumentError(absl::StrCat("placement override part '", part,
                                                     "': no stage may start at layer ", b,
                                                     " (it reuses the previous layer's DSA selection)"));
    }
    int w = -1;
    for (size_t i = 0; i < workers.size(); ++i) {
      if (workers[i].name == kv.second) w = static_cast<int>(i);
    }
    int idx = 0;
    if (w < 0 && kv.second.size() > 1 && kv.second[0] == '#' && absl::SimpleAtoi(kv.second.substr(1), &idx) &&
        idx >= 0 && idx < static_cast<int>(workers.size())) {
      w = idx;
    }
    if (w < 0) {
      std::vector<std::string> names;
      for (const auto& x : workers) names.push_back(x.name);
      return absl::InvalidArgumentError(absl::StrCat("placement override names worker '", kv.second,
                                                     "'; known workers: ", absl::StrJoin(names, ", ")));
    }
    if (used[w]) {
      return absl::InvalidArgumentError(absl::StrCat("placement override gives worker '", kv.second,
                                                     "' two ranges; ranges must be contiguous per worker"));
    }
    used[w] = true;
    plan.stages.push_back(MakeStage(m, o, workers, w, b, e + 1));
    next = e + 1;
  }
  if (next != m.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("placement override covers layers 0-", next - 1,
                                                   "; the model has ", m.num_layers, " layers"));
  }
  plan.notes.push_back(absl::StrCat("manual placement '", spec, "'"));
  FitNotes(&plan, workers);
  return plan;
}

std::string DescribePlan(const Plan& plan, const std::vector<WorkerSlot>& workers) {
  std::string out = "stage  worker           layers      weights       KV budget     total\n";
  for (size_t i = 0; i < plan.stages.size(); ++i) {
    const auto& s = plan.stages[i];
    absl::StrAppendFormat(&out, "%-6d %-16s %-11s %-13s %-13s %s\n", i, workers[s.worker].name,
                          absl::StrCat(s.layer_begin, "-", s.layer_end - 1), Bytes(s.weight_bytes),
                          Bytes(s.kv_bytes), Bytes(s.total_bytes()));
  }
  for (const auto& n : plan.notes) absl::StrAppend(&out, "note: ", n, "\n");
  return out;
}

}  // namespace strata::coordinator
