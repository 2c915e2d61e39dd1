// Read-only access to model weights stored in the safetensors format: one
// memory-mapped file (SafetensorsFile) and a whole model directory, single
// file or sharded with `model.safetensors.index.json` (TensorStore).
//
// File layout (the upstream safetensors format, little-endian):
//   bytes [0, 8)        uint64 N, the length of the JSON header
//   bytes [8, 8 + N)    the header: a JSON object mapping each tensor name to
//                       {"dtype": "BF16", "shape": [rows, cols],
//                        "data_offsets": [begin, end]}, plus an optional
//                       "__metadata__" object of string values; the header
//                       may be padded with trailing spaces
//   bytes [8 + N, EOF)  the data area; a tensor's bytes are
//                       [8 + N + begin, 8 + N + end), row-major (C order)
// Reference: the format description in the README of the huggingface
// safetensors project.
//
// Validation at Open (nothing in the file is trusted): N <= 100 MB and
// N <= file size - 8; the header is a UTF-8 JSON object without duplicate
// keys; every entry has a known dtype, a shape of non-negative integers and
// two offsets with begin <= end <= size of the data area; end - begin equals
// product(shape) * dtype size, computed with overflow checks; no two
// non-empty tensors overlap. Gaps between tensors are allowed.
//
// Error codes (every message names the file, and the tensor when one is
// involved):
//   NOT_FOUND         a missing file, shard, directory or tensor
//   DATA_LOSS         the file is shorter than its header says (fewer than 8
//                     bytes, header length past the end, data offsets past
//                     the end): typically a truncated download
//   INVALID_ARGUMENT  any other malformed content, and requests that do not
//                     fit the tensor (wrong expected shape, raw-only dtype
//                     read as f32, inconsistent fp8 scales)
//
// fp8 block scales (DeepSeek-V3's release format): an F8_E4M3 weight `W` of
// shape [rows, cols] may have a companion tensor `W_scale_inv` (F32, BF16 or
// F16) of shape [ceil(rows/128), ceil(cols/128)];
// ReadF32 returns W[r][c] = fp8::Decode(code) * scale_inv[r/128][c/128], with
// partial blocks at the right and bottom edges. An F8_E4M3 tensor without a
// companion is read with scale 1 (also when it is not 2-D); a companion next
// to a weight that is not 2-D, or of the wrong shape or dtype, is an error.
// fp8 NaN codes read as 0 (kernels/fp8.h).
//
// The mapped files must not be truncated or rewritten while open (that would
// fault on access, as with any mmap reader).
#ifndef STRATA_MODEL_SAFETENSORS_H_
#define STRATA_MODEL_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace strata {

// Element types Strata reads. The integer types are readable only as raw
// bytes (ReadRaw), e.g. token ids in reference fixtures. F8_E8M0 (power-of-two
// block scales) and I8 (DeepSeek-V4's packed FP4 experts) are raw-only too:
// model/v4/quant.h decodes them.
enum class DType { kF32, kBF16, kF16, kF8E4M3, kI32, kI64, kU8, kBool, kF8E8M0, kI8 };

// The safetensors spelling: "F32", "BF16", "F16", "F8_E4M3", "I32", "I64",
// "U8", "BOOL", "F8_E8M0", "I8".
std::string_view DTypeName(DType dtype);
// Inverse of DTypeName; INVALID_ARGUMENT for any other string.
absl::StatusOr<DType> ParseDType(std::string_view name);
// Bytes per element (1 for F8_E4M3, F8_E8M0, I8, U8 and BOOL).
size_t DTypeSize(DType dtype);
// True for the dtypes ReadF32 converts: F32, BF16, F16, F8_E4M3.
bool DTypeIsFloat(DType dtype);

// "[200, 330]"; "[]" for a scalar.
std::string ShapeString(absl::Span<const int64_t> shape);

// One tensor's header entry.
struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // each dim >= 0; empty for a scalar
  uint64_t nbytes = 0;         // product(shape) * DTypeSize(dtype)
  uint64_t data_offset = 0;    // begin, relative to the start of the data area

  int64_t num_elements() const;
};

// One memory-mapped, validated .safetensors file. Immutable after Open:
// every method is const and safe to call from any number of threads at once.
// Open reads only the 8-byte length and the header (with pread); tensor bytes
// are paged in by the kernel when (and only when) a caller reads them.
class SafetensorsFile {
 public:
  // Maps `path` read-only and validates its header (see the top of this
  // file). NOT_FOUND when the file does not exist.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);

  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  // The entry of tensor `name`, or nullptr. The pointer lives as long as
  // this object.
  const TensorInfo* Find(std::string_view name) const;

  // Tensor names in ascending byte order.
  std::vector<std::string> Names() const;

  // The tensor's bytes inside the mapping (valid while this object lives).
  // A view: no I/O happens until the bytes are accessed.
  // REQUIRES: `info` was returned by Find on this object (or is a copy of it).
  absl::Span<const uint8_t> Data(const TensorInfo& info) const;

  // Asks the kernel to start reading the tensor's pages (madvise WILLNEED).
  // The mapping is advised MADV_RANDOM, so accessing one tensor does not pull
  // its neighbours in through readahead; call this before reading a whole
  // tensor to get large sequential reads. Never fails (it is advice).
  // REQUIRES: as for Data.
  void Prefetch(const TensorInfo& info) const;

  // The header exactly as stored (N bytes, including any padding).
  const std::string& header_json() const { return header_json_; }
  // The "__metadata__" map (empty when absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return path_; }
  uint64_t file_size() const { return size_; }

 private:
  SafetensorsFile() = default;

  std::string path_;
  const uint8_t* map_ = nullptr;  // whole file, PROT_READ; null when size_ == 0
  uint64_t size_ = 0;
  uint64_t data_start_ = 0;  // 8 + N
  std::string header_json_;
  std::map<std::string, std::string> metadata_;
  std::map<std::string, TensorInfo, std::less<>> tensors_;
};

// All tensors of one model directory. Immutable after OpenDir: every method
// is const and safe to call from any number of threads at once.
//
// Which files: `model.safetensors.index.json` when present (its "weight_map"
// is authoritative: a tensor is visible iff the index names it, and tensors
// of a shard that the index does not name are ignored); otherwise every
// regular file `*.safetensors` in the directory (not recursive, names
// starting with '.' skipped), whose tensor names must be disjoint.
//
// Shards are opened eagerly: OpenDir maps every shard and validates every
// header, every index entry and every fp8 weight's block scales, so a broken
// or incomplete checkpoint fails at startup rather than mid-load. Mapping
// costs address space only; tensor bytes are read from disk only for the
// tensors a caller reads.
class TensorStore {
 public:
  static constexpr std::string_view kIndexFileName = "model.safetensors.index.json";
  static constexpr std::string_view kScaleSuffix = "_scale_inv";
  static constexpr int64_t kFp8BlockSize = 128;

  // NOT_FOUND when `dir` does not exist, holds no safetensors file, or the
  // index names a shard that does not exist or a tensor its shard lacks.
  static absl::StatusOr<std::unique_ptr<TensorStore>> OpenDir(const std::string& dir);

  bool Has(std::string_view name) const;
  // NOT_FOUND when absent.
  absl::StatusOr<TensorInfo> Info(std::string_view name) const;

  // The tensor converted to f32, row-major. F32/BF16/F16 convert exactly;
  // F8_E4M3 decodes and applies the `<name>_scale_inv` block scales when that
  // tensor exists (see the top of this file). INVALID_ARGUMENT for the
  // raw-only dtypes. Allocates product(shape) floats.
  absl::StatusOr<std::vector<float>> ReadF32(std::string_view name) const;
  // Same, after checking that the shape equals `expected_shape` (the error
  // names the tensor, the expected and the actual shape).
  absl::StatusOr<std::vector<float>> ReadF32(std::string_view name,
                                             absl::Span<const int64_t> expected_shape) const;

  // An F8_E4M3 weight with 128×128 block scales as stored: its codes
  // [rows][cols] and its scales widened to f32 [ceil(rows/128)][ceil(cols/128)]
  // (nothing decoded). FAILED_PRECONDITION when the tensor is not F8_E4M3 or
  // has no `<name>_scale_inv` (callers then read it with ReadF32); the
  // shape is checked as ReadF32 checks it.
  struct Fp8Blocks {
    std::vector<uint8_t> codes;
    std::vector<float> scales;
  };
  absl::StatusOr<Fp8Blocks> ReadFp8Blocks(std::string_view name, absl::Span<const int64_t> expected_shape) const;

  // The stored bytes, any dtype (valid while this object lives); starts the
  // kernel reading them (SafetensorsFile::Prefetch).
  absl::StatusOr<absl::Span<const uint8_t>> ReadRaw(std::string_view name) const;

  // The stored bytes without asking the kernel to read them ahead: only the
  // pages a caller touches are read (the mapping is MADV_RANDOM). For callers
  // that sample a few bytes of a tensor (the model fingerprint).
  absl::StatusOr<absl::Span<const uint8_t>> View(std::string_view name) const;

  // Visible tensor names in ascending byte order.
  std::vector<std::string> Names() const;

  // The path of the shard file holding the tensor (for messages about its
  // contents). NOT_FOUND when absent.
  absl::StatusOr<std::string> PathOf(std::string_view name) const;

  // The header text of every shard, ordered by shard file name (for a model
  // fingerprint).
  std::vector<std::string> HeaderTexts() const;

  // Shard file names (relative to the directory), in the HeaderTexts order.
  std::vector<std::string> ShardNames() const;

  const std::string& dir() const { return dir_; }

 private:
  struct Location {
    const SafetensorsFile* file;
    const TensorInfo* info;
  };

  TensorStore() = default;

  // NOT_FOUND naming the directory and the tensor when absent.
  absl::StatusOr<Location> Locate(std::string_view name) const;
  // The `<name>_scale_inv` companion of an F8_E4M3 weight: nullptr when there
  // is none, INVALID_ARGUMENT when it does not fit the weight.
  // REQUIRES: weight.info->dtype == DType::kF8E4M3.
  absl::StatusOr<const Location*> ScaleFor(const Location& weight) const;
  absl::StatusOr<std::vector<float>> ConvertF32(const Location& loc) const;
  // INVALID_ARGUMENT naming the tensor when its shape is not `expected_shape`.
  static absl::Status CheckShape(const Location& loc, std::string_view name, absl::Span<const int64_t> expected_shape);

  std::string dir_;
  // Shard file name -> file, ordered by name.
  std::map<std::string, std::unique_ptr<SafetensorsFile>> shards_;
  std::map<std::string, Location, std::less<>> tensors_;
};

}  // namespace strata

#endif  // STRATA_MODEL_SAFETENSORS_H_
