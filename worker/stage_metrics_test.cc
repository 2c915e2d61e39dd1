// The worker's metrics (docs/metrics.md §3) as a stage host runs: steps by
// kind, batch sizes, busy time, hop and downstream latencies, gauges of
// sequences and KV pages (and their reset on re-assignment), errors by
// operation and code; and the events the host logs.
#include "worker/stage_metrics.h"

#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/log.h"
#include "common/testing/metrics_text.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/testing/stage_host_fixture.h"

namespace strata::worker {
namespace {

using ::testing::HasSubstr;
using strata::testing::HasFamily;
using strata::testing::MetricValue;

// The value of `series` in the host's registry (-1 when absent).
double Value(StageHost& host, const std::string& series) {
  return MetricValue(host.metrics_registry()->Render(), series).value_or(-1);
}

// Waits (5 s at most) until `series` reaches `want`: some series are updated
// just after the result is handed on.
double WaitValue(StageHost& host, const std::string& series, double want) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  double v = Value(host, series);
  while (v < want && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    v = Value(host, series);
  }
  return v;
}

// A batch whose chunks carry generated (not prompt) tokens.
Batch Decode(int64_t epoch, uint64_t id, const std::vector<ChunkSpec>& chunks) {
  Batch b = MakeBatch(epoch, id, chunks);
  for (auto& c : *b.header.mutable_chunks()) c.set_prompt(false);
  return b;
}

TEST(StageMetricsTest, NamesLabelsAndKinds) {
  metrics::Registry reg;
  StageMetrics m(&reg);
  const StageMetrics::Series* s0 = m.ForStage(0);
  EXPECT_EQ(m.ForStage(0), s0) << "one set of series per stage";
  EXPECT_NE(m.ForStage(1), s0);
  EXPECT_EQ(m.ForStage(-5), m.ForStage(-1));
  s0->steps[static_cast<int>(StepKind::kMixed)]->Inc();
  m.CountError(2, "batch", absl::StatusCode::kOutOfRange);
  m.SetGauges(3, {.kv_pages_used = 12, .kv_pages_free = 40, .kv_bytes_used = 999, .sequences = 2,
                  .queue_depth = 1, .ready = true});
  const std::string body = reg.Render();
  EXPECT_EQ(MetricValue(body, R"(strata_worker_steps_total{stage="0",kind="mixed"})"), 1);
  EXPECT_EQ(MetricValue(body, R"(strata_worker_steps_total{stage="none",kind="free"})"), 0);
  EXPECT_EQ(MetricValue(body, R"(strata_worker_errors_total{stage="2",op="batch",code="OUT_OF_RANGE"})"), 1);
  EXPECT_EQ(MetricValue(body, R"(strata_worker_kv_pages_used{stage="3"})"), 12);
  EXPECT_EQ(MetricValue(body, R"(strata_worker_kv_pages_free{stage="3"})"), 40);
  EXPECT_EQ(MetricValue(body, R"(strata_worker_kv_bytes_used{stage="3"})"), 999);
  EXPECT_EQ(MetricValue(body, R"(strata_worker_sequences{stage="3"})"), 2);
  EXPECT_EQ(MetricValue(body, R"(strata_worker_queue_depth{stage="3"})"), 1);
  EXPECT_EQ(MetricValue(body, R"(strata_worker_ready{stage="3"})"), 1);
  for (const char* f : {"strata_worker_batch_rows", "strata_worker_batch_sequences", "strata_worker_busy_seconds_total",
                        "strata_worker_hop_seconds", "strata_worker_downstream_seconds"}) {
    EXPECT_TRUE(HasFamily(body, f)) << f;
  }
  EXPECT_NE(body.find(R"(strata_worker_hop_seconds_bucket{stage="0",le=")" + metrics::FormatValue(0.0001) + "\"} 0"),
            std::string::npos)
      << body;

  // A re-assignment zeroes the old stage's gauges; a CPU stage has no free pages.
  m.SetGauges(1, {.kv_pages_used = 4, .sequences = 1, .ready = true});
  const std::string after = reg.Render();
  EXPECT_EQ(MetricValue(after, R"(strata_worker_kv_pages_used{stage="3"})"), 0);
  EXPECT_EQ(MetricValue(after, R"(strata_worker_kv_pages_free{stage="3"})"), 0);
  EXPECT_EQ(MetricValue(after, R"(strata_worker_ready{stage="3"})"), 0);
  EXPECT_EQ(MetricValue(after, R"(strata_worker_kv_pages_used{stage="1"})"), 4);
  EXPECT_FALSE(MetricValue(after, R"(strata_worker_kv_pages_free{stage="1"})").has_value());
}

TEST_F(StageHostTest, ALastStageCountsStepsRowsBusyTimeAndItsSequences) {
  metrics::Registry reg;
  StageHostOptions o;
  o.threads = 1;
  o.model_root = dir_->path();
  o.metrics = &reg;
  StageHost host(o);
  EXPECT_EQ(host.metrics_registry(), &reg);
  EXPECT_EQ(Value(host, R"(strata_worker_ready{stage="none"})"), 0);
  Assign(&host, Assignment(1, 0, kLayers, 0, 1));
  EXPECT_EQ(Value(host, R"(strata_worker_ready{stage="0"})"), 1);
  EXPECT_EQ(Value(host, R"(strata_worker_steps_total{stage="0",kind="prefill"})"), -1) << "nothing ran yet";

  auto sink = std::make_shared<RecordingSink>();
  host.Submit(MakeBatch(1, 1, {{1, 0, {1, 2, 3, 4, 5}}, {2, 0, {6, 7, 8}}}), sink);
  const v1::StageResult r = sink->Wait(1);
  ASSERT_EQ(r.tokens_size(), 2);
  host.Submit(Decode(1, 2, {{1, 5, {r.tokens(0).token()}, true, false}, {2, 3, {r.tokens(1).token()}, true, false}}),
              sink);
  ASSERT_EQ(sink->Wait(2).code(), 0);
  Batch mixed = MakeBatch(1, 3, {{1, 6, {9}, false, false}, {3, 0, {1, 2}}});
  mixed.header.mutable_chunks(0)->set_prompt(false);
  host.Submit(std::move(mixed), sink);
  ASSERT_EQ(sink->Wait(3).code(), 0);

  EXPECT_EQ(WaitValue(host, R"(strata_worker_hop_seconds_count{stage="0"})", 3), 3);
  const std::string body = host.metrics_registry()->Render();
  EXPECT_EQ(MetricValue(body, R"(strata_worker_steps_total{stage="0",kind="prefill"})"), 1);
  EXPECT_EQ(MetricValue(body, R"(strata_worker_steps_total{stage="0",kind="decode"})"), 1);
  EXPECT_EQ(MetricValue(body, R"(strata_worker_steps_total{stage="0",kind="mixed"})"), 1);
  EXPECT_EQ(MetricValue(body, R"(strata_worker_batch_rows_count{stage="0"})"), 3);
  EXPECT_EQ(MetricValue(body, R"(strata_worker_batch_rows_sum{stage="0"})"), 8 + 2 + 3);
  EXPECT_EQ(MetricValue(body, R"(strata_worker_batch_rows_bucket{stage="0",le="2"})"), 1);
  EXPECT_EQ(MetricValue(body, R"(strata_worker_batch_sequences_sum{stage="0"})"), 6);
  EXPECT_GT(MetricValue(body, R"(strata_worker_busy_seconds_total{stage="0"})").value_or(0), 0);
  EXPECT_GT(MetricValue(body, R"(strata_worker_hop_seconds_sum{stage="0"})").value_or(0), 0);
  EXPECT_EQ(MetricValue(body, R"(strata_worker_downstream_seconds_count{stage="0"})"), 0) << "no next stage";
  EXPECT_EQ(MetricValue(body, R"(strata_worker_sequences{stage="0"})"), 3);
  EXPECT_EQ(MetricValue(body, R"(strata_worker_kv_pages_used{stage="0"})"), 3 * kLayers);
  EXPECT_EQ(MetricValue(body, R"(strata_worker_kv_bytes_used{stage="0"})"), host.Stats().kv_bytes());
  EXPECT_FALSE(MetricValue(body, R"(strata_worker_kv_pages_free{stage="0"})").has_value()) << "a CPU stage";
  EXPECT_EQ(body.find("strata_worker_errors_total"), std::string::npos) << body;

  v1::StageBatch free_only;
  free_only.set_epoch(1);
  free_only.add_free_seq_ids(2);
  host.Submit(Batch{free_only, {}}, sink);
  EXPECT_EQ(WaitValue(host, R"(strata_worker_steps_total{stage="0",kind="free"})", 1), 1);
  EXPECT_EQ(Value(host, R"(strata_worker_sequences{stage="0"})"), 2);
  host.Free({}, true);
  EXPECT_EQ(Value(host, R"(strata_worker_sequences{stage="0"})"), 0);
  EXPECT_EQ(Value(host, R"(strata_worker_kv_pages_used{stage="0"})"), 0);
  EXPECT_EQ(Value(host, R"(strata_worker_batch_rows_count{stage="0"})"), 3) << "a free is not a computed batch";
}

TEST_F(StageHostTest, AFirstStageTimesTheRestOfThePipelineAndCountsErrors) {
  std::mutex mu;
  std::vector<std::string> lines;
  log::Configure({"strata-worker", [&](std::string_view l) {
                    std::lock_guard<std::mutex> g(mu);
                    lines.emplace_back(l);
                  }});
  auto host = Host();
  auto sink = std::make_shared<RecordingSink>();
  host->Submit(MakeBatch(1, 1, {{1, 0, {1}}}), sink);  // before any assignment
  ASSERT_EQ(sink->Wait(1).code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(Value(*host, R"(strata_worker_errors_total{stage="none",op="batch",code="FAILED_PRECONDITION"})"), 1);

  Assign(host.get(), Assignment(1, 0, 2, 0, 2));
  host->Submit(MakeBatch(1, 2, {{1, 0, {1, 2, 3}}}), sink);
  auto peer = net_.WaitPeer(kNext);
  ASSERT_NE(peer, nullptr);
  ASSERT_TRUE(peer->WaitBatches(1));
  EXPECT_EQ(WaitValue(*host, R"(strata_worker_hop_seconds_count{stage="0"})", 1), 1) << "rows handed on";
  EXPECT_EQ(Value(*host, R"(strata_worker_downstream_seconds_count{stage="0"})"), 0) << "no result back yet";
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  v1::StageResult back;
  back.set_batch_id(2);
  peer->Reply(back);
  ASSERT_EQ(sink->Wait(2).code(), 0);
  EXPECT_EQ(WaitValue(*host, R"(strata_worker_downstream_seconds_count{stage="0"})", 1), 1);
  EXPECT_GE(Value(*host, R"(strata_worker_downstream_seconds_sum{stage="0"})"), 0.02);

  host->Submit(MakeBatch(1, 3, {{9, 0, {}}}), sink);  // an empty chunk
  EXPECT_EQ(sink->Wait(3).code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  host->Submit(MakeBatch(7, 4, {{9, 0, {1}}}), sink);  // another epoch
  EXPECT_EQ(sink->Wait(4).code(), static_cast<int>(absl::StatusCode::kAborted));
  host->Submit(MakeBatch(1, 5, {{2, 0, {4, 5}}}), sink);
  ASSERT_TRUE(peer->WaitBatches(2));
  peer->End(absl::UnavailableError("Connection reset by peer"));
  EXPECT_EQ(sink->Wait(5).code(), static_cast<int>(absl::StatusCode::kUnavailable));

  const std::string body = host->metrics_registry()->Render();
  EXPECT_EQ(MetricValue(body, R"(strata_worker_errors_total{stage="0",op="batch",code="INVALID_ARGUMENT"})"), 1);
  EXPECT_EQ(MetricValue(body, R"(strata_worker_errors_total{stage="0",op="batch",code="ABORTED"})"), 1);
  EXPECT_EQ(MetricValue(body, R"(strata_worker_errors_total{stage="0",op="downstream",code="UNAVAILABLE"})"), 1);
  EXPECT_EQ(MetricValue(body, R"(strata_worker_steps_total{stage="0",kind="prefill"})"), 2) << "failed ones not counted";

  v1::AssignLayersResponse resp;
  v1::AssignLayersRequest bad = Assignment(2, 0, 2, 0, 2);
  bad.set_layer_end(0);
  EXPECT_FALSE(host->Assign(bad, &resp).ok());
  EXPECT_EQ(Value(*host, R"(strata_worker_errors_total{stage="0",op="assign",code="INVALID_ARGUMENT"})"), 1);
  v1::LoadSessionRequest load;
  load.set_session_id("s1");
  load.set_epoch(1);
  v1::LoadSessionResponse lresp;
  EXPECT_EQ(host->LoadSession(load, &lresp).code(), absl::StatusCode::kFailedPrecondition);  // no KV store
  EXPECT_EQ(Value(*host, R"(strata_worker_errors_total{stage="0",op="load_session",code="FAILED_PRECONDITION"})"), 1);
  host.reset();
  log::Configure({});

  std::string all;
  for (const std::string& l : lines) all += l;
  EXPECT_THAT(all, HasSubstr("event=assign worker=w-test stage=0 stages=2 layer_begin=0 layer_end=2 epoch=1"));
  EXPECT_THAT(all, HasSubstr("event=batch_failed worker=w-test stage=0 batch_id=3 code=INVALID_ARGUMENT"));
  EXPECT_THAT(all, HasSubstr("event=downstream_broken worker=w-test stage=0 batches=1 code=UNAVAILABLE"));
  EXPECT_THAT(all, HasSubstr("event=assign_failed worker=w-test stage=0 epoch=2 code=INVALID_ARGUMENT"));
  EXPECT_THAT(all, HasSubstr("event=session_load_failed worker=w-test stage=0 session_id=s1 code=FAILED_PRECONDITION"));
  for (const std::string& l : lines) EXPECT_EQ(l.find('\n'), l.size() - 1) << l;
}

TEST_F(StageHostTest, ReassignmentMovesTheGaugesToTheNewStage) {
  auto host = Host();
  Assign(host.get(), Assignment(1, 0, kLayers, 0, 1));
  auto sink = std::make_shared<RecordingSink>();
  host->Submit(MakeBatch(1, 1, {{1, 0, {1, 2, 3}}}), sink);
  ASSERT_EQ(sink->Wait(1).code(), 0);
  EXPECT_EQ(Value(*host, R"(strata_worker_sequences{stage="0"})"), 1);
  Assign(host.get(), Assignment(2, 2, kLayers, 1, 2));
  EXPECT_EQ(Value(*host, R"(strata_worker_sequences{stage="0"})"), 0);
  EXPECT_EQ(Value(*host, R"(strata_worker_ready{stage="0"})"), 0);
  EXPECT_EQ(Value(*host, R"(strata_worker_ready{stage="1"})"), 1);
  EXPECT_EQ(Value(*host, R"(strata_worker_steps_total{stage="0",kind="prefill"})"), 1) << "counters stay";
}

}  // namespace
}  // namespace strata::worker
