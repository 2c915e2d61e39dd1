// The byte layout of a stage batch on the wire (docs/protocol.md, "Execute"):
// one StageBatch header followed by the hidden rows as little-endian float32
// in TensorChunk messages of at most `max_chunk_bytes` each, so that no
// message comes near gRPC's 4 MiB default limit.
//
// Thread-safety: EncodeBatch is a pure function; a BatchAssembler belongs to
// one stream and is used by one thread at a time.
#ifndef STRATA_WORKER_STAGE_WIRE_H_
#define STRATA_WORKER_STAGE_WIRE_H_

#include <bit>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "strata/v1/worker.pb.h"

namespace strata::worker {

static_assert(std::endian::native == std::endian::little, "the wire format is little-endian");

// 1 MiB of float32 per message by default.
inline constexpr size_t kDefaultMaxChunkBytes = size_t{1} << 20;
// Limits a receiver enforces on a header (a batch larger than this is refused).
inline constexpr int kMaxBatchRows = 1 << 20;
inline constexpr int kMaxHiddenSize = 1 << 16;

// A batch with its hidden rows ([total_rows, hidden_size] float32, empty when
// header.hidden_size() == 0).
struct Batch {
  v1::StageBatch header;
  std::vector<float> hidden;
};

// Splits a batch into messages: the header first, then the rows. `hidden`
// holds header.total_rows() * header.hidden_size() floats (may be null when
// hidden_size is 0). REQUIRES: max_chunk_bytes >= 4 * hidden_size.
std::vector<v1::StageMessage> EncodeBatch(const v1::StageBatch& header, const float* hidden,
                                          size_t max_chunk_bytes);

// Rebuilds batches from a stream of messages. Errors are INVALID_ARGUMENT
// naming the problem (a chunk before its header, rows out of order, a header
// beyond the limits); the stream that sent them should then be ended.
class BatchAssembler {
 public:
  // Consumes one message; returns a batch once its last row has arrived.
  absl::StatusOr<std::optional<Batch>> Add(v1::StageMessage&& msg);

 private:
  std::optional<Batch> current_;
  int64_t next_float_ = 0;
};

}  // namespace strata::worker

#endif  // STRATA_WORKER_STAGE_WIRE_H_
