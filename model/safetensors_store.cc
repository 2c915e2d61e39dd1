// TensorStore: a model directory of safetensors shards, and the conversions
// to f32 (see model/safetensors.h).
#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/fp8.h"
#include "model/safetensors.h"
#include "model/safetensors_internal.h"
#include "nlohmann/json.hpp"

namespace strata {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using safetensors_internal::Bf16ToF32;
using safetensors_internal::Brief;
using safetensors_internal::F16ToF32;
using safetensors_internal::ParseJsonObject;
using safetensors_internal::Sv;
using safetensors_internal::TensorMsg;

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; a big-endian host needs byte swaps here");

constexpr uint64_t kMaxIndexBytes = 100ull * 1000 * 1000;

absl::StatusOr<std::string> ReadSmallFile(const fs::path& path, uint64_t limit) {
  std::error_code ec;
  const uint64_t size = fs::file_size(path, ec);
  if (ec) return absl::NotFoundError(absl::StrCat(path.string(), ": ", ec.message()));
  if (size > limit) {
    return absl::InvalidArgumentError(
        absl::StrCat(path.string(), ": ", size, " bytes exceeds the limit of ", limit));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path.string(), ": cannot open"));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(path.string(), ": read failed"));
  return std::move(text).str();
}

// A weight_map value must name a file inside the model directory.
bool IsSafeShardName(const std::string& name) {
  if (name.empty()) return false;
  const fs::path p(name);
  if (p.is_absolute() || p.has_root_name() || p.has_root_directory()) return false;
  for (const fs::path& part : p) {
    if (part == "..") return false;
  }
  return true;
}

uint16_t Load16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// Converts F32 / BF16 / F16 bytes (`n` elements) into `out`.
void WidenFloats(DType dtype, const uint8_t* src, size_t n, float* out) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(out, src, n * sizeof(float));
      break;
    case DType::kBF16:
      for (size_t i = 0; i < n; ++i) out[i] = Bf16ToF32(Load16(src + 2 * i));
      break;
    case DType::kF16:
      for (size_t i = 0; i < n; ++i) out[i] = F16ToF32(Load16(src + 2 * i));
      break;
    default:
      break;  // callers pass only the three types above
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<TensorStore>> TensorStore::OpenDir(const std::string& dir) {
  std::unique_ptr<TensorStore> store(new TensorStore());
  store->dir_ = dir;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat(dir, ": not a directory"));
  }
  const fs::path index_path = fs::path(dir) / kIndexFileName;
  const std::string index_str = index_path.string();

  if (fs::exists(index_path, ec)) {
    ASSIGN_OR_RETURN(std::string text, ReadSmallFile(index_path, kMaxIndexBytes));
    ASSIGN_OR_RETURN(Json root, ParseJsonObject(text, index_str, "index"));
    const auto map_it = root.find("weight_map");
    if (map_it == root.end() || !map_it->is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_str, ": \"weight_map\" is missing or not a JSON object"));
    }
    if (map_it->empty()) {
      return absl::InvalidArgumentError(absl::StrCat(index_str, ": \"weight_map\" is empty"));
    }
    for (auto it = map_it->begin(); it != map_it->end(); ++it) {
      const std::string& name = it.key();
      if (!it->is_string() || !IsSafeShardName(it->get<std::string>())) {
        return absl::InvalidArgumentError(
            TensorMsg(index_str, name,
                      absl::StrCat("shard is not a file name inside the directory: ", Brief(*it))));
      }
      const std::string shard = it->get<std::string>();
      auto shard_it = store->shards_.find(shard);
      if (shard_it == store->shards_.end()) {
        const fs::path shard_path = fs::path(dir) / shard;
        if (!fs::exists(shard_path, ec)) {
          return absl::NotFoundError(TensorMsg(
              index_str, name, absl::StrCat("shard ", shard_path.string(), " does not exist")));
        }
        ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(shard_path.string()));
        shard_it = store->shards_.emplace(shard, std::move(file)).first;
      }
      const SafetensorsFile* file = shard_it->second.get();
      const TensorInfo* info = file->Find(name);
      if (info == nullptr) {
        return absl::NotFoundError(
            TensorMsg(file->path(), name,
                      absl::StrCat("named by ", index_str, " but absent from the shard")));
      }
      store->tensors_.emplace(name, Location{file, info});
    }
  } else {
    std::vector<std::string> files;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string fname = it->path().filename().string();
      if (fname.empty() || fname[0] == '.' || it->path().extension() != ".safetensors") continue;
      std::error_code type_ec;
      if (!fs::is_regular_file(it->path(), type_ec)) continue;  // follows symlinks
      files.push_back(fname);
    }
    if (ec) return absl::NotFoundError(absl::StrCat(dir, ": cannot list: ", ec.message()));
    if (files.empty()) {
      return absl::NotFoundError(
          absl::StrCat(dir, ": no ", Sv(kIndexFileName), " and no *.safetensors file"));
    }
    std::sort(files.begin(), files.end());
    for (const std::string& fname : files) {
      ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open((fs::path(dir) / fname).string()));
      const SafetensorsFile* f = file.get();
      store->shards_.emplace(fname, std::move(file));
      for (const std::string& name : f->Names()) {
        const auto [slot, inserted] = store->tensors_.emplace(name, Location{f, f->Find(name)});
        if (!inserted) {
          return absl::InvalidArgumentError(TensorMsg(
              f->path(), name, absl::StrCat("also present in ", slot->second.file->path())));
        }
      }
    }
  }

  // Check every fp8 weight's block scales now, so a broken checkpoint fails
  // at startup; ReadF32 checks again (cheaply) before using them.
  for (const auto& [name, loc] : store->tensors_) {
    if (loc.info->dtype == DType::kF8E4M3) RETURN_IF_ERROR(store->ScaleFor(loc).status());
  }
  return store;
}

bool TensorStore::Has(std::string_view name) const { return tensors_.find(name) != tensors_.end(); }

absl::StatusOr<TensorStore::Location> TensorStore::Locate(std::string_view name) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return absl::NotFoundError(absl::StrCat(dir_, ": no tensor \"", Sv(name), "\""));
  }
  return it->second;
}

absl::StatusOr<TensorInfo> TensorStore::Info(std::string_view name) const {
  ASSIGN_OR_RETURN(const Location loc, Locate(name));
  return *loc.info;
}

absl::StatusOr<const TensorStore::Location*> TensorStore::ScaleFor(const Location& weight) const {
  const TensorInfo& w = *weight.info;
  const std::string scale_name = absl::StrCat(w.name, Sv(kScaleSuffix));
  const auto it = tensors_.find(scale_name);
  if (it == tensors_.end()) {
    if (weight.file->Find(scale_name) != nullptr) {
      // Present in the shard but hidden by the index: reading the weight with
      // scale 1 would silently give wrong values.
      return absl::InvalidArgumentError(
          TensorMsg(weight.file->path(), w.name,
                    absl::StrCat("its block scales \"", scale_name,
                                 "\" are in the shard but not in ", Sv(kIndexFileName))));
    }
    return nullptr;
  }
  const TensorInfo& s = *it->second.info;
  if (w.shape.size() != 2) {
    return absl::InvalidArgumentError(
        TensorMsg(weight.file->path(), w.name,
                  absl::StrCat("has block scales \"", scale_name, "\" but shape ",
                               ShapeString(w.shape), " is not 2-D")));
  }
  if (s.dtype != DType::kF32 && s.dtype != DType::kBF16 && s.dtype != DType::kF16) {
    return absl::InvalidArgumentError(
        TensorMsg(it->second.file->path(), scale_name,
                  absl::StrCat("block scales of \"", w.name, "\" must be F32, BF16 or F16, not ",
                               Sv(DTypeName(s.dtype)))));
  }
  const int64_t expected[2] = {(w.shape[0] + kFp8BlockSize - 1) / kFp8BlockSize,
                               (w.shape[1] + kFp8BlockSize - 1) / kFp8BlockSize};
  if (absl::Span<const int64_t>(s.shape) != absl::Span<const int64_t>(expected)) {
    return absl::InvalidArgumentError(TensorMsg(
        it->second.file->path(), scale_name,
        absl::StrCat("block scales of \"", w.name, "\" ", ShapeString(w.shape), " have shape ",
                     ShapeString(s.shape), ", expected ", ShapeString(expected))));
  }
  return &it->second;
}

absl::StatusOr<std::vector<float>> TensorStore::ConvertF32(const Location& loc) const {
  const TensorInfo& info = *loc.info;
  if (!DTypeIsFloat(info.dtype)) {
    return absl::InvalidArgumentError(TensorMsg(
        loc.file->path(), info.name,
        absl::StrCat("dtype ", Sv(DTypeName(info.dtype)), " cannot be read as f32; use ReadRaw")));
  }
  loc.file->Prefetch(info);
  const absl::Span<const uint8_t> bytes = loc.file->Data(info);
  const size_t n = static_cast<size_t>(info.num_elements());
  std::vector<float> out(n);
  if (n == 0) return out;
  if (info.dtype != DType::kF8E4M3) {
    WidenFloats(info.dtype, bytes.data(), n, out.data());
    return out;
  }

  const float* table = fp8::DecodeTable();
  ASSIGN_OR_RETURN(const Location* scale_loc, ScaleFor(loc));
  if (scale_loc == nullptr) {
    for (size_t i = 0; i < n; ++i) out[i] = table[bytes[i]];
    return out;
  }
  const TensorInfo& s = *scale_loc->info;
  scale_loc->file->Prefetch(s);
  std::vector<float> scales(static_cast<size_t>(s.num_elements()));
  WidenFloats(s.dtype, scale_loc->file->Data(s).data(), scales.size(), scales.data());
  const size_t rows = static_cast<size_t>(info.shape[0]);
  const size_t cols = static_cast<size_t>(info.shape[1]);
  const size_t scale_cols = static_cast<size_t>(s.shape[1]);
  for (size_t r = 0; r < rows; ++r) {
    const float* scale_row = scales.data() + (r / kFp8BlockSize) * scale_cols;
    const uint8_t* src = bytes.data() + r * cols;
    float* dst = out.data() + r * cols;
    for (size_t c = 0; c < cols; ++c) dst[c] = table[src[c]] * scale_row[c / kFp8BlockSize];
  }
  return out;
}

absl::Status TensorStore::CheckShape(const Location& loc, std::string_view name,
                                 absl::Span<const int64_t> expected_shape) {
  if (absl::Span<const int64_t>(loc.info->shape) == expected_shape) return absl::OkStatus();
  return absl::InvalidArgumentError(
      TensorMsg(loc.file->path(), name,
                absl::StrCat("expected shape ", ShapeString(expected_shape), ", found ", ShapeString(loc.info->shape))));
}

absl::StatusOr<TensorStore::Fp8Blocks> TensorStore::ReadFp8Blocks(std::string_view name,
                                                                  absl::Span<const int64_t> expected_shape) const {
  ASSIGN_OR_RETURN(const Location loc, Locate(name));
  const TensorInfo& info = *loc.info;
  RETURN_IF_ERROR(CheckShape(loc, name, expected_shape));
  if (info.dtype != DType::kF8E4M3) {
    return absl::FailedPreconditionError(
        TensorMsg(loc.file->path(), info.name, absl::StrCat("is ", Sv(DTypeName(info.dtype)), ", not F8_E4M3")));
  }
  ASSIGN_OR_RETURN(const Location* scale_loc, ScaleFor(loc));
  if (scale_loc == nullptr) {
    return absl::FailedPreconditionError(TensorMsg(loc.file->path(), info.name, "has no block scales"));
  }
  loc.file->Prefetch(info);
  const absl::Span<const uint8_t> bytes = loc.file->Data(info);
  const TensorInfo& s = *scale_loc->info;
  scale_loc->file->Prefetch(s);
  Fp8Blocks out;
  out.codes.assign(bytes.begin(), bytes.end());
  out.scales.resize(static_cast<size_t>(s.num_elements()));
  WidenFloats(s.dtype, scale_loc->file->Data(s).data(), out.scales.size(), out.scales.data());
  return out;
}

absl::StatusOr<std::vector<float>> TensorStore::ReadF32(std::string_view name) const {
  ASSIGN_OR_RETURN(const Location loc, Locate(name));
  return ConvertF32(loc);
}

absl::StatusOr<std::vector<float>> TensorStore::ReadF32(
    std::string_view name, absl::Span<const int64_t> expected_shape) const {
  ASSIGN_OR_RETURN(const Location loc, Locate(name));
  RETURN_IF_ERROR(CheckShape(loc, name, expected_shape));
  return ConvertF32(loc);
}

absl::StatusOr<absl::Span<const uint8_t>> TensorStore::ReadRaw(std::string_view name) const {
  ASSIGN_OR_RETURN(const Location loc, Locate(name));
  loc.file->Prefetch(*loc.info);
  return loc.file->Data(*loc.info);
}

absl::StatusOr<absl::Span<const uint8_t>> TensorStore::View(std::string_view name) const {
  ASSIGN_OR_RETURN(const Location loc, Locate(name));
  return loc.file->Data(*loc.info);
}

std::vector<std::string> TensorStore::Names() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [name, loc] : tensors_) names.push_back(name);
  return names;
}

absl::StatusOr<std::string> TensorStore::PathOf(std::string_view name) const {
  ASSIGN_OR_RETURN(const Location loc, Locate(name));
  return loc.file->path();
}

std::vector<std::string> TensorStore::HeaderTexts() const {
  std::vector<std::string> texts;
  texts.reserve(shards_.size());
  for (const auto& [fname, file] : shards_) texts.push_back(file->header_json());
  return texts;
}

std::vector<std::string> TensorStore::ShardNames() const {
  std::vector<std::string> names;
  names.reserve(shards_.size());
  for (const auto& [fname, file] : shards_) names.push_back(fname);
  return names;
}

}  // namespace strata
