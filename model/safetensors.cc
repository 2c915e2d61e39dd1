#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <set>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "model/safetensors_internal.h"
#include "nlohmann/json.hpp"

namespace strata {
namespace {

using Json = nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100ull * 1000 * 1000;
constexpr std::string_view kMetadataKey = "__metadata__";

constexpr DType kAllDTypes[] = {DType::kF32, DType::kBF16, DType::kF16,    DType::kF8E4M3,
                                DType::kI32, DType::kI64,  DType::kU8,     DType::kBool,
                                DType::kF8E8M0, DType::kI8};

uint64_t LoadLe64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

struct FdCloser {
  int fd;
  ~FdCloser() { ::close(fd); }
};

// Reads exactly n bytes at `offset`; DATA_LOSS if the file ends first.
absl::Status PreadFully(int fd, uint64_t offset, uint64_t n, void* out, const std::string& path) {
  auto* dst = static_cast<char*>(out);
  while (n > 0) {
    const ssize_t got = ::pread(fd, dst, n, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return absl::ErrnoToStatus(errno, absl::StrCat(path, ": read failed"));
    if (got == 0) {
      return absl::DataLossError(absl::StrCat(path, ": file ended early at offset ", offset));
    }
    dst += got;
    offset += static_cast<uint64_t>(got);
    n -= static_cast<uint64_t>(got);
  }
  return absl::OkStatus();
}

float BitsToFloat(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

}  // namespace

namespace safetensors_internal {

std::string TensorMsg(std::string_view path, std::string_view name, std::string_view what) {
  return absl::StrCat(Sv(path), ": tensor \"", Sv(name), "\": ", Sv(what));
}

std::string Brief(const Json& v) {
  // Never dump a nested value: the serializer recurses, and a hostile header
  // can nest millions of levels deep.
  auto scalar = [](const Json& x) {
    std::string s = x.dump(-1, ' ', false, Json::error_handler_t::replace);
    return s.size() > 60 ? s.substr(0, 57) + "..." : s;
  };
  if (v.is_object()) return absl::StrCat("an object of ", v.size(), " keys");
  if (!v.is_array()) return scalar(v);
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i == 8) return out + ", ...]";
    if (v[i].is_structured()) return absl::StrCat("an array of ", v.size(), " elements");
    absl::StrAppend(&out, i > 0 ? ", " : "", scalar(v[i]));
  }
  return out + "]";
}

absl::StatusOr<Json> ParseJsonObject(std::string_view text, std::string_view path,
                                     std::string_view what) {
  // nlohmann keeps the last of duplicate keys silently; a duplicated tensor
  // name would make the file mean two things, so duplicates are rejected.
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  auto on_event = [&](int /*depth*/, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
        open_objects.emplace_back();
        break;
      case Json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case Json::parse_event_t::key:
        if (!open_objects.empty() && parsed.is_string() &&
            !open_objects.back().insert(parsed.get<std::string>()).second && duplicate.empty()) {
          duplicate = parsed.get<std::string>();
        }
        break;
      default:
        break;
    }
    return true;
  };
  Json root;
  try {
    root = Json::parse(text.begin(), text.end(), on_event, /*allow_exceptions=*/true,
                       /*ignore_comments=*/false);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(Sv(path), ": ", Sv(what), " is not valid JSON: ", e.what()));
  }
  if (!duplicate.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Sv(path), ": ", Sv(what), " has the key \"", duplicate, "\" more than once"));
  }
  if (!root.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Sv(path), ": ", Sv(what), " is not a JSON object: ", Brief(root)));
  }
  return root;
}

float Bf16ToF32(uint16_t bits) { return BitsToFloat(static_cast<uint32_t>(bits) << 16); }

float F16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1Fu;
  uint32_t mantissa = h & 0x3FFu;
  if (exponent == 0x1F) return BitsToFloat(sign | 0x7F800000u | (mantissa << 13));  // inf/NaN
  if (exponent == 0) {
    if (mantissa == 0) return BitsToFloat(sign);
    // Subnormal half: shift the mantissa up until its leading bit becomes
    // the implicit one, lowering the exponent once per shift.
    exponent = 113;  // 127 - 15 + 1
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    mantissa &= 0x3FFu;
    return BitsToFloat(sign | (exponent << 23) | (mantissa << 13));
  }
  return BitsToFloat(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

}  // namespace safetensors_internal

using safetensors_internal::Brief;
using safetensors_internal::ParseJsonObject;
using safetensors_internal::Sv;
using safetensors_internal::TensorMsg;

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kF8E4M3:
      return "F8_E4M3";
    case DType::kI32:
      return "I32";
    case DType::kI64:
      return "I64";
    case DType::kU8:
      return "U8";
    case DType::kBool:
      return "BOOL";
    case DType::kF8E8M0:
      return "F8_E8M0";
    case DType::kI8:
      return "I8";
  }
  return "?";
}

absl::StatusOr<DType> ParseDType(std::string_view name) {
  for (DType d : kAllDTypes) {
    if (DTypeName(d) == name) return d;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported dtype \"", Sv(name),
                   "\" (supported: F32, BF16, F16, F8_E4M3, I32, I64, U8, BOOL, F8_E8M0, I8)"));
}

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kBF16:
      return 2;
    case DType::kF16:
      return 2;
    case DType::kF8E4M3:
      return 1;
    case DType::kI32:
      return 4;
    case DType::kI64:
      return 8;
    case DType::kU8:
      return 1;
    case DType::kBool:
    case DType::kF8E8M0:
    case DType::kI8:
      return 1;
  }
  return 0;
}

bool DTypeIsFloat(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16 ||
         dtype == DType::kF8E4M3;
}

std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

int64_t TensorInfo::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // validated at Open not to overflow
  return n;
}

// ---------------------------------------------------------------------------
// SafetensorsFile

namespace {

// Validates one header entry and fills `info` (name already set).
absl::Status ParseEntry(const std::string& path, const Json& v, uint64_t data_size,
                        TensorInfo& info) {
  const std::string& name = info.name;
  if (!v.is_object()) {
    return absl::InvalidArgumentError(
        TensorMsg(path, name, absl::StrCat("entry is not a JSON object: ", Brief(v))));
  }
  const auto dtype_it = v.find("dtype");
  const auto shape_it = v.find("shape");
  const auto offsets_it = v.find("data_offsets");
  if (dtype_it == v.end() || shape_it == v.end() || offsets_it == v.end()) {
    return absl::InvalidArgumentError(
        TensorMsg(path, name, "entry needs \"dtype\", \"shape\" and \"data_offsets\""));
  }
  if (!dtype_it->is_string()) {
    return absl::InvalidArgumentError(
        TensorMsg(path, name, absl::StrCat("dtype is not a string: ", Brief(*dtype_it))));
  }
  absl::StatusOr<DType> dtype = ParseDType(dtype_it->get<std::string>());
  if (!dtype.ok()) {
    return absl::InvalidArgumentError(TensorMsg(path, name, std::string(dtype.status().message())));
  }
  info.dtype = *dtype;

  if (!shape_it->is_array()) {
    return absl::InvalidArgumentError(
        TensorMsg(path, name, absl::StrCat("shape is not an array: ", Brief(*shape_it))));
  }
  uint64_t elements = 1;
  for (const Json& d : *shape_it) {
    if (!d.is_number_unsigned() ||
        d.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return absl::InvalidArgumentError(
          TensorMsg(path, name,
                    absl::StrCat("shape ", Brief(*shape_it),
                                 " has a dimension that is not an integer in "
                                 "[0, 2^63): ",
                                 Brief(d))));
    }
    const uint64_t dim = d.get<uint64_t>();
    if (__builtin_mul_overflow(elements, dim, &elements)) {
      return absl::InvalidArgumentError(TensorMsg(
          path, name, absl::StrCat("element count of shape ", Brief(*shape_it), " overflows")));
    }
    info.shape.push_back(static_cast<int64_t>(dim));
  }
  if (elements > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
      __builtin_mul_overflow(elements, static_cast<uint64_t>(DTypeSize(info.dtype)),
                             &info.nbytes)) {
    return absl::InvalidArgumentError(
        TensorMsg(path, name, absl::StrCat("byte size of shape ", Brief(*shape_it), " overflows")));
  }

  if (!offsets_it->is_array() || offsets_it->size() != 2 ||
      !(*offsets_it)[0].is_number_unsigned() || !(*offsets_it)[1].is_number_unsigned()) {
    return absl::InvalidArgumentError(TensorMsg(
        path, name,
        absl::StrCat("data_offsets is not two non-negative integers: ", Brief(*offsets_it))));
  }
  const uint64_t begin = (*offsets_it)[0].get<uint64_t>();
  const uint64_t end = (*offsets_it)[1].get<uint64_t>();
  if (begin > end) {
    return absl::InvalidArgumentError(
        TensorMsg(path, name, absl::StrCat("data_offsets [", begin, ", ", end, "] run backwards")));
  }
  if (end > data_size) {
    return absl::DataLossError(TensorMsg(
        path, name,
        absl::StrCat("data_offsets [", begin, ", ", end, "] go past the end of the data area (",
                     data_size, " bytes); the file may be truncated")));
  }
  if (end - begin != info.nbytes) {
    return absl::InvalidArgumentError(
        TensorMsg(path, name,
                  absl::StrCat("data_offsets [", begin, ", ", end, "] hold ", end - begin,
                               " bytes but ", Sv(DTypeName(info.dtype)), " ",
                               ShapeString(info.shape), " needs ", info.nbytes)));
  }
  info.data_offset = begin;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;

  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    return absl::ErrnoToStatus(err, absl::StrCat(path, ": cannot open safetensors file"));
  }
  const FdCloser closer{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat(path, ": cannot stat"));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  file->size_ = static_cast<uint64_t>(st.st_size);
  if (file->size_ < 8) {
    return absl::DataLossError(absl::StrCat(path, ": file has ", file->size_,
                                            " bytes, fewer than the 8-byte header length"));
  }
  // The header is read with pread and no readahead, so opening a shard
  // brings in no tensor bytes beyond the header's last page.
  (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
  uint8_t len_bytes[8];
  RETURN_IF_ERROR(PreadFully(fd, 0, 8, len_bytes, path));
  const uint64_t header_len = LoadLe64(len_bytes);
  if (header_len > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": header length ", header_len, " exceeds the limit of ", kMaxHeaderBytes, " bytes"));
  }
  if (header_len > file->size_ - 8) {
    return absl::DataLossError(absl::StrCat(path, ": header length ", header_len,
                                            " goes past the end of the file (", file->size_,
                                            " bytes); the file may be truncated"));
  }
  file->data_start_ = 8 + header_len;
  file->header_json_.resize(header_len);
  RETURN_IF_ERROR(PreadFully(fd, 8, header_len, file->header_json_.data(), path));
  const uint64_t data_size = file->size_ - file->data_start_;

  void* map = ::mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd, 0);
  if (map == MAP_FAILED) {
    return absl::ErrnoToStatus(errno, absl::StrCat(path, ": mmap failed"));
  }
  file->map_ = static_cast<const uint8_t*>(map);
  // Touching one tensor must not pull its neighbours in through fault
  // readahead; Prefetch asks for exactly the tensors that are read.
  (void)::madvise(map, file->size_, MADV_RANDOM);

  ASSIGN_OR_RETURN(Json root, ParseJsonObject(file->header_json_, path, "header"));

  std::vector<std::tuple<uint64_t, uint64_t, const std::string*>> extents;
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string& key = it.key();
    if (key == kMetadataKey) {
      if (!it->is_object()) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": __metadata__ is not a JSON object: ", Brief(*it)));
      }
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) {
          return absl::InvalidArgumentError(absl::StrCat(
              path, ": __metadata__ value of \"", m.key(), "\" is not a string: ", Brief(*m)));
        }
        file->metadata_[m.key()] = m->get<std::string>();
      }
      continue;
    }
    TensorInfo info;
    info.name = key;
    RETURN_IF_ERROR(ParseEntry(path, *it, data_size, info));
    auto [slot, inserted] = file->tensors_.emplace(key, std::move(info));
    if (slot->second.nbytes > 0) {
      extents.emplace_back(slot->second.data_offset, slot->second.data_offset + slot->second.nbytes,
                           &slot->first);
    }
  }

  std::sort(extents.begin(), extents.end(), [](const auto& a, const auto& b) {
    return std::tie(std::get<0>(a), std::get<1>(a), *std::get<2>(a)) <
           std::tie(std::get<0>(b), std::get<1>(b), *std::get<2>(b));
  });
  for (size_t i = 1; i < extents.size(); ++i) {
    const auto& [prev_begin, prev_end, prev_name] = extents[i - 1];
    const auto& [begin, end, name] = extents[i];
    if (begin < prev_end) {
      return absl::InvalidArgumentError(
          TensorMsg(path, *name,
                    absl::StrCat("bytes [", begin, ", ", end, ") overlap tensor \"", *prev_name,
                                 "\" [", prev_begin, ", ", prev_end, ")")));
    }
  }
  return file;
}

void SafetensorsFile::Prefetch(const TensorInfo& info) const {
  const absl::Span<const uint8_t> bytes = Data(info);
  if (bytes.empty()) return;
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(bytes.data()) / page * page;
  const uintptr_t end = reinterpret_cast<uintptr_t>(bytes.data() + bytes.size());
  (void)::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_WILLNEED);
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(const_cast<uint8_t*>(map_), size_);
}

const TensorInfo* SafetensorsFile::Find(std::string_view name) const {
  const auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

std::vector<std::string> SafetensorsFile::Names() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [name, info] : tensors_) names.push_back(name);
  return names;
}

absl::Span<const uint8_t> SafetensorsFile::Data(const TensorInfo& info) const {
  const uint64_t data_size = size_ - data_start_;
  if (info.data_offset > data_size || info.nbytes > data_size - info.data_offset) {
    return {};  // not an entry of this file; see REQUIRES
  }
  return absl::Span<const uint8_t>(map_ + data_start_ + info.data_offset, info.nbytes);
}

}  // namespace strata
