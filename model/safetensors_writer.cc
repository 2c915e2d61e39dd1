#include "model/safetensors_writer.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <set>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace strata {

absl::StatusOr<std::string> SerializeSafetensors(
    const std::vector<TensorToWrite>& tensors, const std::map<std::string, std::string>& metadata) {
  std::set<std::string_view> seen;
  for (const TensorToWrite& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__" || !seen.insert(t.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", t.name, "\": name is empty, reserved or repeated"));
    }
    uint64_t bytes = DTypeSize(t.dtype);
    for (int64_t d : t.shape) {
      if (d < 0 || __builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor \"", t.name, "\": shape ", ShapeString(t.shape), " is negative or too large"));
      }
    }
    if (bytes != t.data.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", t.name, "\": ", std::string(DTypeName(t.dtype)), " ",
                       ShapeString(t.shape), " needs ", bytes, " bytes, got ", t.data.size()));
    }
  }

  std::vector<const TensorToWrite*> order;
  for (const TensorToWrite& t : tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const TensorToWrite* a, const TensorToWrite* b) {
    const size_t sa = DTypeSize(a->dtype), sb = DTypeSize(b->dtype);
    return sa != sb ? sa > sb : a->name < b->name;
  });

  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const TensorToWrite* t : order) {
    header[t->name] = {{"dtype", std::string(DTypeName(t->dtype))},
                       {"shape", t->shape},
                       {"data_offsets", nlohmann::json::array({offset, offset + t->data.size()})}};
    offset += t->data.size();
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {  // a name or value that is not UTF-8
    return absl::InvalidArgumentError(absl::StrCat("cannot encode the header: ", e.what()));
  }
  text.resize((text.size() + 7) / 8 * 8, ' ');

  std::string out;
  out.reserve(8 + text.size() + offset);
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((text.size() >> (8 * i)) & 0xFF));
  out += text;
  for (const TensorToWrite* t : order) out.append(t->data.begin(), t->data.end());
  return out;
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  absl::StatusOr<std::string> bytes = SerializeSafetensors(tensors, metadata);
  if (!bytes.ok()) {
    return absl::Status(bytes.status().code(), absl::StrCat(path, ": ", bytes.status().message()));
  }
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) return absl::ErrnoToStatus(errno, absl::StrCat(tmp, ": cannot create"));
  const bool wrote = std::fwrite(bytes->data(), 1, bytes->size(), f) == bytes->size();
  const int write_err = errno;
  if (std::fclose(f) != 0 || !wrote) {
    const int err = wrote ? errno : write_err;
    std::remove(tmp.c_str());
    return absl::ErrnoToStatus(err, absl::StrCat(tmp, ": write failed"));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return absl::ErrnoToStatus(err, absl::StrCat(path, ": cannot rename ", tmp, " into place"));
  }
  return absl::OkStatus();
}

}  // namespace strata
