#include "worker/stage_wire.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace strata::worker {

std::vector<v1::StageMessage> EncodeBatch(const v1::StageBatch& header, const float* hidden,
                                          size_t max_chunk_bytes) {
  std::vector<v1::StageMessage> out;
  out.emplace_back();
  *out.back().mutable_batch() = header;
  const int64_t h = header.hidden_size();
  if (h == 0 || header.total_rows() == 0) return out;
  const int64_t rows_per_msg = std::max<int64_t>(1, static_cast<int64_t>(max_chunk_bytes) / (h * 4));
  for (int64_t r = 0; r < header.total_rows(); r += rows_per_msg) {
    const int64_t n = std::min<int64_t>(rows_per_msg, header.total_rows() - r);
    out.emplace_back();
    v1::TensorChunk* c = out.back().mutable_hidden();
    c->set_batch_id(header.batch_id());
    c->set_row_offset(r);
    c->mutable_data()->assign(reinterpret_cast<const char*>(hidden + r * h), n * h * sizeof(float));
  }
  return out;
}

absl::StatusOr<std::optional<Batch>> BatchAssembler::Add(v1::StageMessage&& msg) {
  if (msg.has_batch()) {
    if (current_) {
      return absl::InvalidArgumentError(absl::StrCat("batch ", msg.batch().batch_id(),
                                                     " started before batch ", current_->header.batch_id(),
                                                     " received all its rows"));
    }
    const v1::StageBatch& b = msg.batch();
    if (b.total_rows() < 0 || b.total_rows() > kMaxBatchRows || b.hidden_size() < 0 ||
        b.hidden_size() > kMaxHiddenSize) {
      return absl::InvalidArgumentError(absl::StrCat("batch ", b.batch_id(), " has ", b.total_rows(),
                                                     " rows of ", b.hidden_size(),
                                                     " floats; limits are ", kMaxBatchRows, " and ",
                                                     kMaxHiddenSize));
    }
    Batch batch;
    batch.header = std::move(*msg.mutable_batch());
    if (batch.header.hidden_size() == 0 || batch.header.total_rows() == 0) {
      return std::optional<Batch>(std::move(batch));
    }
    batch.hidden.resize(static_cast<size_t>(batch.header.total_rows()) * batch.header.hidden_size());
    current_ = std::move(batch);
    next_float_ = 0;
    return std::optional<Batch>();
  }
  if (!msg.has_hidden()) return absl::InvalidArgumentError("empty stage message");
  const v1::TensorChunk& c = msg.hidden();
  if (!current_ || c.batch_id() != current_->header.batch_id()) {
    return absl::InvalidArgumentError(absl::StrCat("rows of batch ", c.batch_id(), " without its header"));
  }
  const int64_t h = current_->header.hidden_size();
  // next_float_ is a whole number of rows; comparing rows never overflows.
  if (c.row_offset() != next_float_ / h || c.data().size() % (h * sizeof(float)) != 0 ||
      next_float_ + static_cast<int64_t>(c.data().size() / sizeof(float)) >
          static_cast<int64_t>(current_->hidden.size())) {
    return absl::InvalidArgumentError(absl::StrCat("rows of batch ", c.batch_id(), " at row ", c.row_offset(),
                                                   " (", c.data().size(), " bytes) do not continue the batch"));
  }
  std::memcpy(current_->hidden.data() + next_float_, c.data().data(), c.data().size());
  next_float_ += static_cast<int64_t>(c.data().size() / sizeof(float));
  if (next_float_ < static_cast<int64_t>(current_->hidden.size())) return std::optional<Batch>();
  std::optional<Batch> done = std::move(current_);
  current_.reset();
  return done;
}

}  // namespace strata::worker
