// Small helpers for reading tokenizer.json with errors that name the JSON path
// and the offending value. Internal to model/tokenizer*.
//
// Thread-safety: pure functions.
#ifndef STRATA_MODEL_TOKENIZER_JSON_UTIL_H_
#define STRATA_MODEL_TOKENIZER_JSON_UTIL_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace strata::tokenizer_internal {

// A short rendering of a JSON value for error messages.
inline std::string DescribeJson(const nlohmann::json& value) {
  std::string text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (text.size() > 80) text = text.substr(0, 77) + "...";
  return text;
}

inline absl::Status JsonTypeError(const std::string& path, const char* expected,
                                  const nlohmann::json& value) {
  return absl::InvalidArgumentError(
      absl::StrCat("tokenizer.json: ", path, " must be ", expected, ", got ", DescribeJson(value)));
}

inline absl::Status JsonInvalid(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: ", path, ": ", what));
}

inline absl::Status JsonUnsupported(const std::string& path, const nlohmann::json& value,
                                    const std::string& what) {
  return absl::UnimplementedError(absl::StrCat("tokenizer.json: ", path, " = ",
                                               DescribeJson(value), " is not supported: ", what));
}

// obj[key] as a bool; a missing key or null gives `fallback`.
// REQUIRES: obj is an object.
inline absl::StatusOr<bool> JsonBool(const nlohmann::json& obj, const char* key,
                                     const std::string& path, bool fallback) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) return JsonTypeError(absl::StrCat(path, ".", key), "a boolean", *it);
  return it->get<bool>();
}

// obj[key] as a string; a missing key or null gives `fallback`.
// REQUIRES: obj is an object.
inline absl::StatusOr<std::string> JsonString(const nlohmann::json& obj, const char* key,
                                              const std::string& path,
                                              const std::string& fallback) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_string()) return JsonTypeError(absl::StrCat(path, ".", key), "a string", *it);
  return it->get<std::string>();
}

// The "type" member of an object (required).
inline absl::StatusOr<std::string> JsonTypeName(const nlohmann::json& obj,
                                                const std::string& path) {
  if (!obj.is_object()) return JsonTypeError(path, "an object", obj);
  auto it = obj.find("type");
  if (it == obj.end()) return JsonInvalid(path, "missing \"type\"");
  if (!it->is_string()) return JsonTypeError(path + ".type", "a string", *it);
  return it->get<std::string>();
}

}  // namespace strata::tokenizer_internal

#endif  // STRATA_MODEL_TOKENIZER_JSON_UTIL_H_
