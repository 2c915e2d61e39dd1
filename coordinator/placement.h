// Placement: which worker hosts which layers (docs/service.md, "Placement").
//
// A plan gives each stage a contiguous layer range; stage i+1 starts where
// stage i ends, stage 0 also holds the embedding and the last stage the final
// norm and lm_head. A stage may start only before a layer that computes its
// own DSA selection (ModelConfig::can_cut_before). The balanced plan
// minimises the largest stage's memory relative to its worker's free memory
// (all workers alike when they report none), where a stage's memory is its
// weight bytes (from the safetensors headers, tensors grouped by layer
// prefix) plus its KV budget: max_sessions × max_context × KV bytes per token
// of each of its layers, or the fixed KV pool its worker reserves (GPU
// workers report theirs). Every worker gets at least one layer when the model
// has enough cut points; otherwise the plan uses as many workers as it can
// and says so.
//
// Thread-safety: pure functions.
#ifndef STRATA_COORDINATOR_PLACEMENT_H_
#define STRATA_COORDINATOR_PLACEMENT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/config.h"
#include "model/kv_cache.h"

namespace strata::coordinator {

// What placement needs to know about a model.
struct ModelLayout {
  int num_layers = 0;
  std::vector<uint64_t> layer_weight_bytes;    // per layer, as stored
  uint64_t embed_bytes = 0;                    // model.embed_tokens.*
  uint64_t head_bytes = 0;                     // model.norm.* and lm_head.*
  std::vector<bool> can_cut_before;            // per layer (entry 0 is true)
  std::vector<uint64_t> kv_bytes_per_token;    // per layer, for the chosen KV dtype
};

// Reads config.json and the safetensors headers of `model_dir` (no tensor
// data). KV bytes per token per layer: fp8 kv_lora + rope + 8 (two f32
// scales), f32 4 × (kv_lora + rope); plus 4 × index_head_dim for a layer
// with its own DSA indexer.
absl::StatusOr<ModelLayout> ReadModelLayout(const std::string& model_dir, KvDtype kv_dtype);
// The same for a model whose weights are generated on the GPU workers
// (--synthetic-weights): the tensors a checkpoint of `config` would hold
// (CheckpointTensorShapes), at 2 bytes per value (bf16, as the GPU holds
// them). Reads nothing.
ModelLayout SyntheticModelLayout(const ModelConfig& config, KvDtype kv_dtype);
// The same from a parsed config and a tensor name → bytes map (tests).
ModelLayout LayoutFromTensors(const ModelConfig& config, KvDtype kv_dtype,
                              const std::vector<std::pair<std::string, uint64_t>>& tensors);

struct WorkerSlot {
  std::string name;         // used by overrides and in messages
  uint64_t free_bytes = 0;  // 0: unknown (treated as equal to the others)
  // A KV cache the worker reserves whatever it hosts (a GPU worker's pool):
  // counted as its stage's KV bytes instead of the sessions x context
  // estimate. 0: use the estimate.
  uint64_t kv_pool_bytes = 0;
};

struct PlacementOptions {
  int64_t max_sessions = 64;   // sequences whose KV must fit at once
  int64_t max_context = 4096;  // tokens per sequence
};

struct StageAssignment {
  int worker = 0;  // index into the workers given to the planner
  int layer_begin = 0, layer_end = 0;
  uint64_t weight_bytes = 0;
  uint64_t kv_bytes = 0;
  uint64_t total_bytes() const { return weight_bytes + kv_bytes; }
};

struct Plan {
  std::vector<StageAssignment> stages;
  std::vector<std::string> notes;  // why: cut points, spare workers, memory fit
};

// The balanced plan over `workers` (in the given order).
// INVALID_ARGUMENT with no workers or an empty model.
absl::StatusOr<Plan> PlanBalanced(const ModelLayout& layout, const std::vector<WorkerSlot>& workers,
                                  const PlacementOptions& options);

// A manual plan: "0-30:w0,31-60:w1" — inclusive layer ranges, each naming a
// worker (by name, or by index as "#1"). The ranges must cover every layer
// in order without gaps, start at allowed cut points, and name each worker at
// most once. INVALID_ARGUMENT saying which rule is broken.
absl::StatusOr<Plan> PlanOverride(const ModelLayout& layout, const std::vector<WorkerSlot>& workers,
                                  const PlacementOptions& options, const std::string& spec);

// A human-readable table of the plan and its notes.
std::string DescribePlan(const Plan& plan, const std::vector<WorkerSlot>& workers);

}  // namespace strata::coordinator

#endif  // STRATA_COORDINATOR_PLACEMENT_H_
