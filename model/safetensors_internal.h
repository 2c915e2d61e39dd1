// Helpers shared by the safetensors reader's source files. Not part of the
// public API: include only from model/safetensors*.cc. All functions are pure
// and thread-safe.
#ifndef STRATA_MODEL_SAFETENSORS_INTERNAL_H_
#define STRATA_MODEL_SAFETENSORS_INTERNAL_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace strata::safetensors_internal {

// Parses `text` as a JSON object. INVALID_ARGUMENT naming `path` and `what`
// ("header", "index") when it is not JSON, not an object, or repeats a key
// within one object (nlohmann would keep the last silently).
absl::StatusOr<nlohmann::json> ParseJsonObject(std::string_view text, std::string_view path,
                                               std::string_view what);

// "<path>: tensor "<name>": <what>", the shape of every per-tensor message.
std::string TensorMsg(std::string_view path, std::string_view name, std::string_view what);

// A JSON value rendered for a message: scalars and flat arrays (up to 8
// elements) as JSON, anything nested only by its kind and size. Safe on
// arbitrarily deep values.
std::string Brief(const nlohmann::json& v);

// std::string_view as absl::string_view (this absl build keeps its own
// string_view type), for absl::StrCat and friends.
inline absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// Exact widenings of the 16-bit float formats.
float Bf16ToF32(uint16_t bits);
float F16ToF32(uint16_t bits);

}  // namespace strata::safetensors_internal

#endif  // STRATA_MODEL_SAFETENSORS_INTERNAL_H_
