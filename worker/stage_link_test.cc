// StageLink over a fake transport (worker/testing/fake_stage_stream.h): a
// batch goes out as its header and then its rows in chunks under the message
// limits, results reach the callback in order, the end of the stream is
// reported once and names the peer, a failed write sticks, concurrent senders
// never interleave two batches, and destroying a link cancels its stream. One
// test dials a closed port through gRPC.
#include "worker/stage_link.h"

#include <cmath>
#include <cstring>
#include <latch>
#include <random>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/testing/test_seed.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/testing/fake_stage_stream.h"

namespace strata::worker {
namespace {

using ::testing::HasSubstr;
using testing::FakeStagePeer;
using testing::FakeStageStream;

constexpr char kAddress[] = "10.0.0.2:50061";

// Results and ends a link reported.
struct Reports {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<uint64_t> results;
  std::vector<absl::Status> ends;

  StageLink::ResultFn OnResult() {
    return [this](v1::StageResult&& r) {
      std::lock_guard<std::mutex> l(mu);
      results.push_back(r.batch_id());
      cv.notify_all();
    };
  }
  StageLink::BrokenFn OnBroken() {
    return [this](const absl::Status& s) {
      std::lock_guard<std::mutex> l(mu);
      ends.push_back(s);
      cv.notify_all();
    };
  }
  bool WaitEnd() {
    std::unique_lock<std::mutex> l(mu);
    return cv.wait_for(l, testing::kFakeWait, [&] { return !ends.empty(); });
  }
};

std::unique_ptr<StageLink> Link(const std::shared_ptr<FakeStagePeer>& peer, Reports* reports) {
  return StageLink::Start(kAddress, "stage 1", std::make_unique<FakeStageStream>(peer), reports->OnResult(),
                          reports->OnBroken());
}

v1::StageBatch Header(uint64_t id, int rows, int hidden) {
  v1::StageBatch h;
  h.set_epoch(3);
  h.set_batch_id(id);
  v1::StageChunk* c = h.add_chunks();
  c->set_seq_id(11);
  c->set_start(5);
  for (int i = 0; i < rows; ++i) c->add_tokens(100 + i);
  c->set_sample(true);
  h.add_free_seq_ids(4);
  h.set_total_rows(rows);
  h.set_hidden_size(hidden);
  return h;
}

int64_t ChannelArg(const grpc::ChannelArguments& args, const char* key) {
  const grpc_channel_args c = args.c_channel_args();
  for (size_t i = 0; i < c.num_args; ++i) {
    if (std::string(c.args[i].key) == key && c.args[i].type == GRPC_ARG_INTEGER) return c.args[i].value.integer;
  }
  return -1;
}

TEST(StageLinkTest, ABatchLargerThanTheMessageLimitGoesOutInChunksBitExactly) {
  // DeepSeek-V3's hidden size; 300 rows are 8.6 MB, more than one message may hold.
  const int rows = 300, hidden = 7168;
  const int64_t limit = ChannelArg(InternalChannelArgs(), GRPC_ARG_MAX_SEND_MESSAGE_LENGTH);
  ASSERT_EQ(limit, 8 << 20);
  EXPECT_EQ(ChannelArg(InternalChannelArgs(), GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH), limit);
  ASSERT_GT(int64_t{rows} * hidden * 4, limit);

  std::mt19937_64 rng(strata::testing::TestSeed());
  std::vector<float> x(static_cast<size_t>(rows) * hidden);
  std::uniform_int_distribution<uint32_t> bits;
  for (float& f : x) {
    const uint32_t b = bits(rng);
    std::memcpy(&f, &b, 4);  // any bit pattern, NaN payloads included, must arrive unchanged
  }
  auto peer = std::make_shared<FakeStagePeer>();
  Reports reports;
  auto link = Link(peer, &reports);
  ASSERT_TRUE(link->Send(Header(9, rows, hidden), x.data(), kDefaultMaxChunkBytes).ok());

  const std::vector<v1::StageMessage> msgs = peer->written();
  ASSERT_GE(msgs.size(), 2u);
  ASSERT_TRUE(msgs[0].has_batch());
  int64_t next_row = 0;
  for (size_t i = 1; i < msgs.size(); ++i) {
    ASSERT_TRUE(msgs[i].has_hidden()) << i;
    EXPECT_LE(msgs[i].hidden().data().size(), kDefaultMaxChunkBytes);
    EXPECT_EQ(msgs[i].hidden().data().size() % (hidden * 4), 0u) << "whole rows only";
    EXPECT_LT(static_cast<int64_t>(msgs[i].ByteSizeLong()), limit);
    EXPECT_EQ(msgs[i].hidden().batch_id(), 9u);
    EXPECT_EQ(msgs[i].hidden().row_offset(), next_row);
    next_row += static_cast<int64_t>(msgs[i].hidden().data().size() / (hidden * 4));
  }
  EXPECT_EQ(next_row, rows);
  auto batches = peer->Batches();
  ASSERT_TRUE(batches.ok()) << batches.status();
  ASSERT_EQ(batches->size(), 1u);
  const Batch& b = (*batches)[0];
  EXPECT_EQ(b.header.SerializeAsString(), Header(9, rows, hidden).SerializeAsString());
  ASSERT_EQ(b.hidden.size(), x.size());
  EXPECT_EQ(std::memcmp(b.hidden.data(), x.data(), x.size() * 4), 0);
}

TEST(StageLinkTest, AHeaderWithoutRowsIsOneMessage) {
  auto peer = std::make_shared<FakeStagePeer>();
  Reports reports;
  auto link = Link(peer, &reports);
  v1::StageBatch free_only;
  free_only.set_epoch(3);
  free_only.add_free_seq_ids(8);
  ASSERT_TRUE(link->Send(free_only, nullptr, kDefaultMaxChunkBytes).ok());
  ASSERT_TRUE(link->Send(Header(2, 4, 0), nullptr, kDefaultMaxChunkBytes).ok());  // stage 0 embeds
  const auto msgs = peer->written();
  ASSERT_EQ(msgs.size(), 2u);
  EXPECT_TRUE(msgs[0].has_batch());
  EXPECT_TRUE(msgs[1].has_batch());
}

TEST(StageLinkTest, ResultsArriveInOrderAndTheEndIsReportedOnce) {
  auto peer = std::make_shared<FakeStagePeer>();
  Reports reports;
  auto link = Link(peer, &reports);
  for (uint64_t id : {5, 3, 8}) {
    v1::StageResult r;
    r.set_batch_id(id);
    peer->Reply(r);
  }
  peer->End(absl::OkStatus());
  ASSERT_TRUE(reports.WaitEnd());
  link.reset();  // joins the reader: nothing more is reported
  EXPECT_EQ(reports.results, (std::vector<uint64_t>{5, 3, 8}));
  ASSERT_EQ(reports.ends.size(), 1u);
  EXPECT_EQ(reports.ends[0].code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(reports.ends[0].message(), absl::StrCat("stage 1 at ", kAddress, " is unreachable (stream closed)"));
}

TEST(StageLinkTest, TheEndNamesThePeerAndKeepsCodesOtherThanALostConnection) {
  struct Case {
    absl::Status end;
    absl::StatusCode code;
    std::string message;
  };
  const std::string peer_at = absl::StrCat("stage 1 at ", kAddress);
  const Case cases[] = {
      {absl::UnavailableError("Connection reset by peer"), absl::StatusCode::kUnavailable,
       peer_at + " is unreachable (Connection reset by peer)"},
      {absl::CancelledError("Cancelled"), absl::StatusCode::kUnavailable, peer_at + " is unreachable (Cancelled)"},
      {absl::InvalidArgumentError("rows of batch 3 without its header"), absl::StatusCode::kInvalidArgument,
       peer_at + ": rows of batch 3 without its header"},
      {absl::ResourceExhaustedError("message larger than max"), absl::StatusCode::kResourceExhausted,
       peer_at + ": message larger than max"},
  };
  for (const Case& c : cases) {
    auto peer = std::make_shared<FakeStagePeer>();
    Reports reports;
    auto link = Link(peer, &reports);
    peer->End(c.end);
    ASSERT_TRUE(reports.WaitEnd());
    link.reset();
    ASSERT_EQ(reports.ends.size(), 1u);
    EXPECT_EQ(reports.ends[0].code(), c.code) << c.end;
    EXPECT_EQ(reports.ends[0].message(), c.message);
  }
}

TEST(StageLinkTest, AFailedWriteIsUnavailableAndNoLaterBatchIsWritten) {
  auto peer = std::make_shared<FakeStagePeer>();
  Reports reports;
  auto link = Link(peer, &reports);
  std::vector<float> x(4 * 8, 1.0f);
  ASSERT_TRUE(link->Send(Header(1, 4, 8), x.data(), 64).ok());
  const int attempts = peer->write_attempts();
  peer->BreakWrites();
  absl::Status st = link->Send(Header(2, 4, 8), x.data(), 64);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(st.message(), absl::StrCat("stage 1 at ", kAddress, " is unreachable"));
  EXPECT_EQ(peer->write_attempts(), attempts + 1) << "the rest of the batch must not be written";
  st = link->Send(Header(3, 4, 8), x.data(), 64);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(peer->write_attempts(), attempts + 1);
}

TEST(StageLinkTest, ConcurrentSendersNeverInterleaveTwoBatches) {
  auto peer = std::make_shared<FakeStagePeer>();
  Reports reports;
  auto link = Link(peer, &reports);
  // Without the link's write lock the batches interleave almost surely; with
  // it they never do.
  constexpr int kThreads = 4, kPerThread = 50, kRows = 6, kHidden = 16;
  std::latch start(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      start.arrive_and_wait();
      for (int i = 0; i < kPerThread; ++i) {
        const uint64_t id = 1 + t * kPerThread + i;
        std::vector<float> x(kRows * kHidden, static_cast<float>(id));
        EXPECT_TRUE(link->Send(Header(id, kRows, kHidden), x.data(), 2 * kHidden * 4).ok());  // 3 chunks
      }
    });
  }
  for (auto& t : threads) t.join();
  auto batches = peer->Batches();
  ASSERT_TRUE(batches.ok()) << batches.status();
  ASSERT_EQ(batches->size(), static_cast<size_t>(kThreads * kPerThread));
  std::set<uint64_t> ids;
  for (const Batch& b : *batches) {
    ids.insert(b.header.batch_id());
    for (float f : b.hidden) ASSERT_EQ(f, static_cast<float>(b.header.batch_id()));
  }
  EXPECT_EQ(ids.size(), batches->size());
}

TEST(StageLinkTest, DestroyingALinkCancelsItsStreamAndJoinsTheReader) {
  auto peer = std::make_shared<FakeStagePeer>();
  Reports reports;
  auto link = Link(peer, &reports);
  link.reset();  // the reader was blocked in Read
  EXPECT_TRUE(peer->cancelled());
  ASSERT_EQ(reports.ends.size(), 1u);
  EXPECT_EQ(reports.ends[0].code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(reports.ends[0].message(), HasSubstr(kAddress));
}

TEST(StageLinkTest, OpenNamesThePeerWhenTheDialFails) {
  testing::FakeStageNetwork net;
  net.Refuse(kAddress);
  Reports reports;
  auto link = StageLink::Open(kAddress, "stage 2", absl::Seconds(2), reports.OnResult(), reports.OnBroken(),
                              net.Dialer());
  ASSERT_EQ(link.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(link.status().message(), absl::StrCat("stage 2 at ", kAddress, " is not reachable"));
  EXPECT_EQ(net.dials(kAddress), 1);
  net.Refuse(kAddress, false);
  link = StageLink::Open(kAddress, "stage 2", absl::Seconds(2), reports.OnResult(), reports.OnBroken(), net.Dialer());
  ASSERT_TRUE(link.ok()) << link.status();
  EXPECT_EQ((*link)->address(), kAddress);
}

TEST(StageLinkTest, TheGrpcDialerGivesUpOnAClosedPort) {
  // Port 1 on loopback refuses connections; the dial gives up by its timeout.
  Reports reports;
  auto link = StageLink::Open("127.0.0.1:1", "stage 1", absl::Milliseconds(300), reports.OnResult(),
                              reports.OnBroken(), GrpcStageDialer(grpc::InsecureChannelCredentials()));
  ASSERT_EQ(link.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(link.status().message(), "stage 1 at 127.0.0.1:1 is not reachable");
}

}  // namespace
}  // namespace strata::worker
