// Writes safetensors files (format: model/safetensors.h). Used by tests and
// tools to build fixtures; not on any serving path.
//
// Output is deterministic: the same tensors and metadata give the same bytes
// whatever their order in the input. Tensors are laid out by decreasing
// element size, then by name, so each is aligned to its element size; the
// header is compact JSON with sorted keys, padded with spaces to a multiple
// of 8 bytes. The functions are thread-safe (they share no state).
#ifndef STRATA_MODEL_SAFETENSORS_WRITER_H_
#define STRATA_MODEL_SAFETENSORS_WRITER_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/safetensors.h"

namespace strata {

struct TensorToWrite {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // empty for a scalar
  std::vector<uint8_t> data;   // row-major, little-endian; product(shape) * DTypeSize(dtype) bytes
};

// The whole file as bytes. INVALID_ARGUMENT naming the tensor when a name is
// empty, "__metadata__" or repeated, a dimension is negative, or the data size
// does not match dtype and shape.
absl::StatusOr<std::string> SerializeSafetensors(
    const std::vector<TensorToWrite>& tensors,
    const std::map<std::string, std::string>& metadata = {});

// Serializes and writes to `path` (through `path`.tmp and a rename, so a
// reader never sees a half-written file). Errors as above, or the I/O error.
absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

}  // namespace strata

#endif  // STRATA_MODEL_SAFETENSORS_WRITER_H_
