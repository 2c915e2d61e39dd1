#include "worker/stage_wire.h"

#include <cstdint>
#include <cstring>
#include <numeric>

#include "gtest/gtest.h"

namespace strata::worker {
namespace {

v1::StageBatch Header(uint64_t id, int rows, int hidden) {
  v1::StageBatch h;
  h.set_batch_id(id);
  h.set_total_rows(rows);
  h.set_hidden_size(hidden);
  return h;
}

TEST(StageWireTest, SplitsRowsIntoChunksAndReassemblesThemBitExactly) {
  const int rows = 37, hidden = 100;
  std::vector<float> x(rows * hidden);
  std::iota(x.begin(), x.end(), -1000.5f);
  x[5] = -0.0f;
  auto msgs = EncodeBatch(Header(7, rows, hidden), x.data(), /*max_chunk_bytes=*/4096);
  ASSERT_EQ(msgs.size(), 1u + (rows + 9) / 10);  // 10 rows of 400 bytes fit in 4096
  for (size_t i = 1; i < msgs.size(); ++i) EXPECT_LE(msgs[i].hidden().data().size(), 4096u);
  BatchAssembler a;
  std::optional<Batch> done;
  for (size_t i = 0; i < msgs.size(); ++i) {
    auto r = a.Add(std::move(msgs[i]));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->has_value(), i + 1 == msgs.size());
    if (r->has_value()) done = std::move(*r);
  }
  ASSERT_TRUE(done);
  EXPECT_EQ(done->header.batch_id(), 7u);
  ASSERT_EQ(done->hidden.size(), x.size());
  EXPECT_EQ(std::memcmp(done->hidden.data(), x.data(), x.size() * 4), 0);
}

TEST(StageWireTest, HeaderWithoutRowsIsCompleteAtOnce) {
  auto msgs = EncodeBatch(Header(3, 4, 0), nullptr, 4096);
  ASSERT_EQ(msgs.size(), 1u);
  BatchAssembler a;
  auto r = a.Add(std::move(msgs[0]));
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->has_value());
}

TEST(StageWireTest, RejectsRowsWithoutHeaderOrOutOfOrder) {
  std::vector<float> x(8 * 4, 1.0f);
  auto msgs = EncodeBatch(Header(1, 8, 4), x.data(), 32);
  BatchAssembler a;
  EXPECT_EQ(a.Add(v1::StageMessage(msgs[1])).status().code(), absl::StatusCode::kInvalidArgument);
  BatchAssembler b;
  ASSERT_TRUE(b.Add(v1::StageMessage(msgs[0])).ok());
  EXPECT_EQ(b.Add(v1::StageMessage(msgs[2])).status().code(), absl::StatusCode::kInvalidArgument);
  BatchAssembler c;
  EXPECT_EQ(c.Add(v1::StageMessage(msgs[0])).ok(), true);
  EXPECT_EQ(c.Add(v1::StageMessage(msgs[0])).status().code(), absl::StatusCode::kInvalidArgument);
  BatchAssembler d;
  v1::StageMessage huge;
  *huge.mutable_batch() = Header(2, kMaxBatchRows + 1, 4);
  EXPECT_EQ(d.Add(std::move(huge)).status().code(), absl::StatusCode::kInvalidArgument);
  BatchAssembler e;
  EXPECT_EQ(e.Add(v1::StageMessage()).status().code(), absl::StatusCode::kInvalidArgument);
}

// Regression: row_offset * hidden_size was computed in int64 before the
// check, so an offset like 2^62 with 4 floats per row overflowed (undefined
// behaviour; in practice it wrapped to 0 and the chunk was taken as the first
// rows) instead of ending the stream with INVALID_ARGUMENT.
TEST(StageWireTest, RowOffsetOverflowIsRejected) {
  std::vector<float> x(8 * 4, 1.0f);
  for (int64_t bogus : {int64_t{1} << 62, (int64_t{1} << 62) + 1, int64_t{-1}, INT64_MIN, INT64_MAX}) {
    auto msgs = EncodeBatch(Header(1, 8, 4), x.data(), 1024);
    ASSERT_EQ(msgs.size(), 2u);
    msgs[1].mutable_hidden()->set_row_offset(bogus);
    BatchAssembler a;
    ASSERT_TRUE(a.Add(std::move(msgs[0])).ok());
    EXPECT_EQ(a.Add(std::move(msgs[1])).status().code(), absl::StatusCode::kInvalidArgument) << bogus;
  }
}

}  // namespace
}  // namespace strata::worker
