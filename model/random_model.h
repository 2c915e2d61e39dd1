// Writes a model directory (config.json + model.safetensors) with random
// weights for a given config, or lists a config's tensors. Used by tests and benchmarks that need a model
// of a chosen shape without a checkpoint; norms and biases are randomised
// too (weights of 1 and biases of 0 hide bugs).
//
// Thread-safety: stateless.
#ifndef STRATA_MODEL_RANDOM_MODEL_H_
#define STRATA_MODEL_RANDOM_MODEL_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "model/config.h"

namespace strata {

struct RandomModelOptions {
  uint64_t seed = 1;
  // Store routed experts fused (gate_up_proj/down_proj 3-D tensors) instead
  // of one tensor per expert.
  bool fused_experts = false;
};

// A tensor of a checkpoint: its name and shape.
using TensorShape = std::pair<std::string, std::vector<int64_t>>;

// The tensors of a checkpoint of `config` (one tensor per routed expert),
// names and shapes only: what placement needs for a model whose weights are
// generated on the device (--synthetic-weights).
std::vector<TensorShape> CheckpointTensorShapes(const ModelConfig& config);

// Parses config_json (which must be a supported config), then writes
// <dir>/config.json and <dir>/model.safetensors. `dir` must exist.
absl::Status WriteRandomModel(const std::string& dir, const std::string& config_json,
                              const RandomModelOptions& options = {});

}  // namespace strata

#endif  // STRATA_MODEL_RANDOM_MODEL_H_
