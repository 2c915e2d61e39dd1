// How the scheduler's requests end (docs/service.md, "Scheduling"), against a
// fake pipeline and a fake clock: EOS, stop tokens and strings, max_tokens and
// a full context; timings and deadlines; aborts and cancels, whose free waits
// for the step in flight; a pipeline that goes down; failed and unsendable
// batches; session turns kept resident; shutdown. The fixture is in
// scheduler_test_util.h.
#include <string>
#include <vector>

#include "coordinator/scheduler_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata::coordinator::testing {
namespace {

using ::testing::HasSubstr;

TEST_F(SchedulerTest, EosEndsTheTurnAndIsNotSent) {
  Make();
  auto sink = Submit(Spec({5}, 10));
  sched_->OnResult(Result(NextBatch(), 50));
  const v1::StageBatch b2 = NextBatch();
  sched_->OnResult(Result(b2, kEos));
  ASSERT_TRUE(sink->WaitClosed());
  EXPECT_TRUE(sink->status().ok());
  EXPECT_EQ(sink->tokens(), std::vector<int>{50});
  EXPECT_EQ(sink->final_msg().finish_reason(), v1::FINISH_REASON_EOS);
  EXPECT_EQ(sink->final_msg().usage().completion_tokens(), 1);
  EXPECT_TRUE(WaitFreed(b2.chunks(0).seq_id()));
}

TEST_F(SchedulerTest, IgnoreEosStreamsTheEosToken) {
  Make();
  RequestSpec s = Spec({5}, 2);
  s.sampling.ignore_eos = true;
  auto sink = Submit(s);
  sched_->OnResult(Result(NextBatch(), kEos));
  sched_->OnResult(Result(NextBatch(), 7));
  ASSERT_TRUE(sink->WaitClosed());
  EXPECT_EQ(sink->tokens(), (std::vector<int>{kEos, 7}));
  EXPECT_EQ(sink->final_msg().finish_reason(), v1::FINISH_REASON_LENGTH);
}

TEST_F(SchedulerTest, AStopTokenEndsWithStopAndIsNotSent) {
  Make();
  RequestSpec s = Spec({5}, 10);
  s.sampling.stop_token_ids = {9};
  auto sink = Submit(s);
  sched_->OnResult(Result(NextBatch(), 8));
  sched_->OnResult(Result(NextBatch(), 9));
  ASSERT_TRUE(sink->WaitClosed());
  EXPECT_EQ(sink->tokens(), std::vector<int>{8});
  EXPECT_EQ(sink->final_msg().finish_reason(), v1::FINISH_REASON_STOP);
}

TEST_F(SchedulerTest, AStopStringEndsTheTextBeforeIt) {
  Make();
  auto ids = model_->tokenizer->Encode("one two three four five", /*add_special_tokens=*/false);
  ASSERT_TRUE(ids.ok());
  RequestSpec s = Spec({5}, 50);
  s.sampling.stop = {" three"};
  auto sink = Submit(s);
  uint64_t seq = 0;
  for (int id : *ids) {
    if (sink->closed()) break;
    const v1::StageBatch b = NextBatch();
    seq = b.chunks(0).seq_id();
    sched_->OnResult(Result(b, id));
  }
  ASSERT_TRUE(sink->WaitClosed());
  EXPECT_EQ(sink->text(), "one two");
  EXPECT_EQ(sink->final_msg().finish_reason(), v1::FINISH_REASON_STOP);
  EXPECT_LT(sink->tokens().size(), ids->size());  // the rest was never asked for
  Barrier();
  EXPECT_EQ(BatchesOf(seq), static_cast<int>(sink->tokens().size()));
}

TEST_F(SchedulerTest, AFullContextEndsWithLength) {
  auto small = LoadModelContext(std::string(STRATA_SOURCE_DIR) + "/models/demo");
  ASSERT_TRUE(small.ok());
  (*small)->config.max_position_embeddings = 8;
  Make({}, 1, true, small->get());
  auto sink = Submit(Spec({10, 11, 12, 13, 14, 15}, std::nullopt));  // room for 2
  sched_->OnResult(Result(NextBatch(), 20));
  sched_->OnResult(Result(NextBatch(), 21));
  ASSERT_TRUE(sink->WaitClosed());
  EXPECT_EQ(sink->tokens(), (std::vector<int>{20, 21}));
  EXPECT_EQ(sink->final_msg().finish_reason(), v1::FINISH_REASON_LENGTH);
  sched_.reset();  // before `small` goes
}

TEST_F(SchedulerTest, TimingsComeFromTheClock) {
  Make();
  auto sink = Submit(Spec({5}, 3));
  clock_.Advance(absl::Milliseconds(100));
  sched_->OnResult(Result(NextBatch(), 50));  // first token at 100 ms
  clock_.Advance(absl::Milliseconds(100));
  sched_->OnResult(Result(NextBatch(), 51));
  clock_.Advance(absl::Milliseconds(100));
  sched_->OnResult(Result(NextBatch(), 52));  // last at 300 ms: 2 tokens in 0.2 s
  ASSERT_TRUE(sink->WaitClosed());
  const auto t = sink->final_msg().timings();
  EXPECT_EQ(t.queue_ms(), 0);
  EXPECT_EQ(t.ttft_ms(), 100);
  EXPECT_EQ(t.total_ms(), 300);
  EXPECT_DOUBLE_EQ(t.tokens_per_s(), 10);
}

TEST_F(SchedulerTest, ADeadlineEndsTheRequestAndTheFreeWaitsForItsStep) {
  Make();
  auto sink = Submit(Spec({5}, 10), clock_.Now() + absl::Seconds(5));
  const v1::StageBatch b1 = NextBatch();
  const uint64_t seq = b1.chunks(0).seq_id();
  clock_.Advance(absl::Seconds(4));
  ASSERT_TRUE(clock_.AwaitReads(2));  // the scheduler thread checked at +4 s
  EXPECT_FALSE(sink->closed());
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(sink->WaitClosed());
  EXPECT_EQ(sink->status().code(), absl::StatusCode::kDeadlineExceeded) << sink->status();
  EXPECT_EQ(sink->finals(), 0);
  Barrier();
  EXPECT_FALSE(Freed(seq)) << "freed while its step was in flight";
  sched_->OnResult(Result(b1, 60));
  EXPECT_TRUE(WaitFreed(seq));
  EXPECT_TRUE(sink->tokens().empty());
  EXPECT_EQ(sink->sends_after_close(), 0);
  EXPECT_EQ(sink->closes(), 1);
  EXPECT_EQ(sched_->Stats().running, 0);
}

TEST_F(SchedulerTest, AQueuedRequestsDeadlineEndsItBeforeItRuns) {
  SchedulerOptions o;
  o.max_running = 1;
  Make(o);
  auto a = Submit(Spec({5}, 10));
  auto b = Submit(Spec({6}, 10), clock_.Now() + absl::Seconds(1));
  EXPECT_EQ(sched_->Stats().queued, 1);
  clock_.Advance(absl::Seconds(2));
  ASSERT_TRUE(b->WaitClosed());
  EXPECT_EQ(b->status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(sched_->Stats().queued, 0);
  EXPECT_FALSE(a->closed());
}

TEST_F(SchedulerTest, AbortIsIdempotentAndFreesOnceTheStepIsBack) {
  Make();
  auto sink = Submit(Spec({5}, 10, "abc"));
  const v1::StageBatch b1 = NextBatch();
  const uint64_t seq = b1.chunks(0).seq_id();
  EXPECT_TRUE(sched_->Abort("abc"));
  EXPECT_FALSE(sched_->Abort("abc"));
  EXPECT_FALSE(sched_->Abort("nope"));
  ASSERT_TRUE(sink->closed());
  EXPECT_TRUE(sink->status().ok());
  EXPECT_EQ(sink->final_msg().finish_reason(), v1::FINISH_REASON_ABORT);
  EXPECT_EQ(sink->final_msg().request_id(), "abc");
  Barrier();
  EXPECT_FALSE(Freed(seq)) << "freed while its step was in flight";
  sched_->OnResult(Result(b1, 66));
  EXPECT_TRUE(WaitFreed(seq));
  EXPECT_TRUE(sink->tokens().empty());  // the step's token is not sent
  EXPECT_EQ(sink->closes(), 1);
  EXPECT_EQ(sink->sends_after_close(), 0);
  const SchedulerStats st = sched_->Stats();
  EXPECT_EQ(st.running, 0);
  EXPECT_EQ(st.completed, 1);
}

TEST_F(SchedulerTest, AbortingAQueuedRequestNeverReachesTheStages) {
  SchedulerOptions o;
  o.max_running = 1;
  Make(o);
  auto a = Submit(Spec({5}, 10));
  auto b = Submit(Spec({6}, 10, "queued"));
  EXPECT_TRUE(sched_->Abort("queued"));
  ASSERT_TRUE(b->closed());
  EXPECT_EQ(b->final_msg().finish_reason(), v1::FINISH_REASON_ABORT);
  EXPECT_EQ(sched_->Stats().queued, 0);
  sched_->OnResult(Result(NextBatch(), 50));
  NextBatch();
  Barrier();
  for (const auto& batch : pipeline_.sent()) {
    for (const auto& c : batch.chunks()) EXPECT_NE(c.tokens(0), 6) << "the aborted request was sent";
  }
}

TEST_F(SchedulerTest, CancelEndsWithoutAFinalMessage) {
  Make();
  auto sink = Submit(Spec({5}, 10));
  const v1::StageBatch b1 = NextBatch();
  sched_->Cancel(sink.get());
  ASSERT_TRUE(sink->closed());
  EXPECT_EQ(sink->status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(sink->finals(), 0);
  sched_->OnResult(Result(b1, 1));
  EXPECT_TRUE(WaitFreed(b1.chunks(0).seq_id()));
}

TEST_F(SchedulerTest, APipelineDownEndsEveryRequestWithTheStagesStatus) {
  SchedulerOptions o;
  o.max_running = 2;
  Make(o);
  auto a = Submit(Spec({5}, 10));
  const v1::StageBatch b1 = NextBatch();
  auto b = Submit(Spec({6}, 10));
  auto c = Submit(Spec({7}, 10));  // queued
  const absl::Status down = absl::UnavailableError("stage 1 (w1 at 127.0.0.1:9) is down: no heartbeat for 3s");
  sched_->OnPipelineDown(down);
  for (auto* s : {&a, &b, &c}) {
    ASSERT_TRUE((*s)->closed());
    EXPECT_EQ((*s)->status(), down);
    EXPECT_EQ((*s)->finals(), 0);
  }
  EXPECT_EQ(sched_->Stats().running, 0);
  EXPECT_EQ(sched_->Stats().queued, 0);
  sched_->OnResult(Result(b1, 50));  // a late result of the old epoch is ignored
  EXPECT_TRUE(a->tokens().empty());
  absl::Status st = sched_->Submit(Spec({8}), std::make_shared<FakeSink>(), std::nullopt);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);

  // The new placement gets batches of its epoch and no frees of the old one
  // (its workers forgot those sequences).
  sched_->OnPipelineUp(1, kEpoch + 1);
  auto d = Submit(Spec({9}, 1));
  const v1::StageBatch nb = NextBatch();
  EXPECT_EQ(nb.epoch(), kEpoch + 1);
  Barrier();
  EXPECT_FALSE(Freed(b1.chunks(0).seq_id()));
}

TEST_F(SchedulerTest, AFailedBatchEndsItsRequestsWithItsStatusAndTheOthersGoOn) {
  Make({}, /*stages=*/2);
  auto a = Submit(Spec({5}, 10));
  const v1::StageBatch b1 = NextBatch();
  auto b = Submit(Spec({6}, 1));
  const v1::StageBatch b2 = NextBatch();
  sched_->OnResult(Failed(b1, absl::StatusCode::kResourceExhausted, 1, "GPU KV cache is full: 3 pages free"));
  ASSERT_TRUE(a->closed());
  EXPECT_EQ(a->status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(a->status().message(), "stage 1: GPU KV cache is full: 3 pages free");
  EXPECT_TRUE(WaitFreed(b1.chunks(0).seq_id()));  // the stages that ran it hold rows
  sched_->OnResult(Result(b2, 70));
  ASSERT_TRUE(b->WaitClosed());
  EXPECT_TRUE(b->status().ok());
  EXPECT_EQ(b->tokens(), std::vector<int>{70});
}

TEST_F(SchedulerTest, ABatchThePipelineCannotSendFailsItsRequests) {
  Make();
  pipeline_.FailSends(absl::UnavailableError("stage 0 (w0) at 127.0.0.1:9 is unreachable"));
  auto a = Submit(Spec({5}, 10));
  ASSERT_TRUE(a->WaitClosed());
  EXPECT_EQ(a->status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(a->status().message(), HasSubstr("stage 0 (w0) at 127.0.0.1:9 is unreachable"));
}

TEST_F(SchedulerTest, ASessionTurnKeepsItsSequenceAndTheNextTurnSendsOnlyNewTokens) {
  Make();
  std::vector<TurnEnd> turns;
  sched_->SetTurnListener([&](const TurnEnd& t) { turns.push_back(t); });
  RequestSpec s = Spec({5, 6}, 10);
  s.session_id = "s1";
  auto first = Submit(s);
  const v1::StageBatch b1 = NextBatch();
  const uint64_t seq = b1.chunks(0).seq_id();
  EXPECT_EQ(b1.chunks(0).session_id(), "s1");
  absl::Status busy = sched_->Submit(s, std::make_shared<FakeSink>(), std::nullopt);
  EXPECT_EQ(busy.code(), absl::StatusCode::kFailedPrecondition) << busy;
  EXPECT_THAT(busy.message(), HasSubstr("already has a request running"));
  sched_->OnResult(Result(b1, 7));
  sched_->OnResult(Result(NextBatch(), kEos));
  ASSERT_TRUE(first->WaitClosed());
  EXPECT_EQ(first->final_msg().session_tokens(), 3);
  ASSERT_EQ(turns.size(), 1u);
  EXPECT_EQ(turns[0].session_id, "s1");
  EXPECT_EQ(turns[0].tokens, 3);
  EXPECT_EQ(turns[0].pending, kEos);  // sampled, not fed
  EXPECT_EQ(turns[0].turn_watermark, 3);
  Barrier();
  EXPECT_FALSE(Freed(seq)) << "a session's sequence stays resident";
  EXPECT_EQ(sched_->Stats().resident_sessions, 1);

  RequestSpec next = Spec({8}, 1);
  next.session_id = "s1";
  auto second = Submit(next);
  const v1::StageBatch b3 = NextBatch();
  ASSERT_EQ(b3.chunks_size(), 1);
  EXPECT_EQ(b3.chunks(0).seq_id(), seq);
  EXPECT_EQ(b3.chunks(0).start(), 3);
  EXPECT_EQ(Tokens(b3.chunks(0)), (std::vector<int>{kEos, 8}));
  EXPECT_TRUE(b3.chunks(0).has_sampling());  // a new sampler for the new turn
  sched_->OnResult(Result(b3, 9));
  ASSERT_TRUE(second->WaitClosed());
  EXPECT_EQ(second->final_msg().usage().cached_tokens(), 3);

  // After a re-placement the stages hold nothing: the conversation is fed again.
  sched_->OnPipelineDown(absl::UnavailableError("stage 0 is down"));
  sched_->OnPipelineUp(1, kEpoch + 1);
  EXPECT_EQ(sched_->Stats().resident_sessions, 0);
  RequestSpec third = Spec({10}, 1);
  third.session_id = "s1";
  auto after = Submit(third);
  const v1::StageBatch b4 = NextBatch();
  ASSERT_EQ(b4.chunks_size(), 1);
  EXPECT_NE(b4.chunks(0).seq_id(), seq);
  EXPECT_EQ(b4.chunks(0).start(), 0);
  EXPECT_EQ(Tokens(b4.chunks(0)), (std::vector<int>{5, 6, 7, kEos, 8, 9, 10}));
}

TEST_F(SchedulerTest, ContinuingAnUnknownSessionIsNotFound) {
  Make();
  RequestSpec s = Spec({}, 1);
  s.session_id = "ghost";
  s.continue_turn = true;
  absl::Status st = sched_->Submit(s, std::make_shared<FakeSink>(), std::nullopt);
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound) << st;
  EXPECT_FALSE(sessions_.Get("ghost").has_value());
}

TEST_F(SchedulerTest, DestroyingTheSchedulerEndsEveryRequest) {
  Make();
  auto a = Submit(Spec({5}, 10));
  NextBatch();
  sched_.reset();
  ASSERT_TRUE(a->closed());
  EXPECT_EQ(a->status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(a->status().message(), HasSubstr("shutting down"));
}

}  // namespace
}  // namespace strata::coordinator::testing
