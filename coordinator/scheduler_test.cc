// The scheduler's admission and batching (docs/service.md, "Scheduling")
// against a fake pipeline: max_running + max_queued, prefill chunks and decode
// steps under prefill_chunk and batch_tokens, one batch per stage and one step
// per sequence in flight, and a seeded random load checked batch by batch.
// How requests end is in scheduler_end_test.cc; the fixture in
// scheduler_test_util.h.
#include <algorithm>
#include <deque>
#include <map>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/testing/test_seed.h"
#include "coordinator/scheduler_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata::coordinator::testing {
namespace {

using ::testing::HasSubstr;

TEST_F(SchedulerTest, AdmitsUpToMaxRunningPlusMaxQueuedAndRefusesTheRest) {
  SchedulerOptions o;
  o.max_running = 2;
  o.max_queued = 1;
  Make(o, 1, /*up=*/false);
  auto early = std::make_shared<FakeSink>();
  absl::Status st = sched_->Submit(Spec({5}), early, std::nullopt);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_THAT(st.message(), HasSubstr("not ready"));
  sched_->OnPipelineUp(1, kEpoch);

  auto a = Submit(Spec({10}, 4, "a"));
  auto b = Submit(Spec({11}));
  auto c = Submit(Spec({12}));
  EXPECT_EQ(sched_->Stats().running, 2);
  EXPECT_EQ(sched_->Stats().queued, 1);
  auto d = std::make_shared<FakeSink>();
  st = sched_->Submit(Spec({13}), d, std::nullopt);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_THAT(st.message(), HasSubstr("2 requests running and 1 queued"));

  // A finished request hands its slot to the queued one once its step is back.
  ASSERT_TRUE(sched_->Abort("a"));
  sched_->OnResult(Result(NextBatch(), 100));
  EXPECT_EQ(sched_->Stats().running, 2);
  EXPECT_EQ(sched_->Stats().queued, 0);
  auto e = Submit(Spec({14}));  // queued again
  st = sched_->Submit(Spec({15}), std::make_shared<FakeSink>(), std::nullopt);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  // Refused requests' sinks are never used.
  EXPECT_EQ(early->closes() + d->closes(), 0);
}

TEST_F(SchedulerTest, ARunningRequestIdIsAlreadyExists) {
  Make();
  auto a = Submit(Spec({10}, 4, "dup"));
  absl::Status st = sched_->Submit(Spec({11}, 4, "dup"), std::make_shared<FakeSink>(), std::nullopt);
  EXPECT_EQ(st.code(), absl::StatusCode::kAlreadyExists) << st;
  EXPECT_THAT(st.message(), HasSubstr("'dup'"));
  ASSERT_TRUE(sched_->Abort("dup"));
  auto again = Submit(Spec({12}, 4, "dup"));  // the id is free once its request ended
  // Without an id the coordinator names the request.
  auto named = Submit(Spec({13}, 1));
  ASSERT_TRUE(sched_->Abort("dup"));
  for (int i = 0; i < 4 && !named->closed(); ++i) sched_->OnResult(Result(NextBatch(), 100));
  ASSERT_TRUE(named->closed());
  EXPECT_THAT(named->final_msg().request_id(), ::testing::StartsWith("req-"));
}

TEST_F(SchedulerTest, APromptIsSentInChunksAndOnlyTheLastOneSamples) {
  SchedulerOptions o;
  o.prefill_chunk = 4;
  Make(o);
  std::vector<int> prompt;
  for (int i = 0; i < 10; ++i) prompt.push_back(100 + i);
  auto sink = Submit(Spec(prompt, 2));

  const v1::StageBatch b1 = NextBatch();
  EXPECT_EQ(b1.epoch(), kEpoch);
  EXPECT_EQ(b1.hidden_size(), 0);
  ASSERT_EQ(b1.chunks_size(), 1);
  const uint64_t seq = b1.chunks(0).seq_id();
  EXPECT_NE(seq, 0u);
  EXPECT_EQ(b1.chunks(0).start(), 0);
  EXPECT_EQ(Tokens(b1.chunks(0)), std::vector<int>(prompt.begin(), prompt.begin() + 4));
  EXPECT_EQ(b1.total_rows(), 4);
  EXPECT_FALSE(b1.chunks(0).sample());
  EXPECT_TRUE(b1.chunks(0).prompt());
  ASSERT_TRUE(b1.chunks(0).has_sampling());  // the last stage creates the sampler from the first chunk
  EXPECT_EQ(b1.chunks(0).sampling().seed(), 42u);
  sched_->OnResult(Result(b1, 0));

  const v1::StageBatch b2 = NextBatch();
  ASSERT_EQ(b2.chunks_size(), 1);
  EXPECT_EQ(b2.chunks(0).start(), 4);
  EXPECT_EQ(Tokens(b2.chunks(0)), std::vector<int>(prompt.begin() + 4, prompt.begin() + 8));
  EXPECT_FALSE(b2.chunks(0).sample());
  EXPECT_FALSE(b2.chunks(0).has_sampling());
  sched_->OnResult(Result(b2, 0));

  const v1::StageBatch b3 = NextBatch();
  ASSERT_EQ(b3.chunks_size(), 1);
  EXPECT_EQ(b3.chunks(0).start(), 8);
  EXPECT_EQ(Tokens(b3.chunks(0)), std::vector<int>(prompt.begin() + 8, prompt.end()));
  EXPECT_TRUE(b3.chunks(0).sample());
  sched_->OnResult(Result(b3, 777));

  const v1::StageBatch b4 = NextBatch();  // decode: the sampled token, after the prompt
  ASSERT_EQ(b4.chunks_size(), 1);
  EXPECT_EQ(b4.chunks(0).seq_id(), seq);
  EXPECT_EQ(b4.chunks(0).start(), 10);
  EXPECT_EQ(Tokens(b4.chunks(0)), std::vector<int>{777});
  EXPECT_TRUE(b4.chunks(0).sample());
  EXPECT_FALSE(b4.chunks(0).prompt());
  sched_->OnResult(Result(b4, 778));

  ASSERT_TRUE(sink->WaitClosed());
  EXPECT_TRUE(sink->status().ok()) << sink->status();
  EXPECT_EQ(sink->tokens(), (std::vector<int>{777, 778}));
  const v1::GenerateFinal f = sink->final_msg();
  EXPECT_EQ(f.finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(f.usage().prompt_tokens(), 10);
  EXPECT_EQ(f.usage().completion_tokens(), 2);
  EXPECT_EQ(f.seed(), 42u);
  EXPECT_TRUE(WaitFreed(seq));  // a finished sequence is dropped on every stage
}

TEST_F(SchedulerTest, DecodeStepsAndPrefillChunksShareABatchUpToTheTokenBudget) {
  SchedulerOptions o;
  o.prefill_chunk = 4;
  o.batch_tokens = 3;
  Make(o);
  auto a = Submit(Spec({200}, 3));
  const v1::StageBatch b1 = NextBatch();
  ASSERT_EQ(b1.chunks_size(), 1);
  const uint64_t seq_a = b1.chunks(0).seq_id();
  std::vector<int> prompt_b;
  for (int i = 0; i < 12; ++i) prompt_b.push_back(300 + i);
  auto b = Submit(Spec(prompt_b, 1));
  auto c = Submit(Spec({400}, 1));
  sched_->OnResult(Result(b1, 201));

  // A's decode step (1 token) and 2 of B's prompt tokens fill the budget of 3;
  // C waits for the next batch.
  const v1::StageBatch b2 = NextBatch();
  ASSERT_EQ(b2.chunks_size(), 2) << b2.ShortDebugString();
  EXPECT_EQ(b2.chunks(0).seq_id(), seq_a);
  EXPECT_EQ(Tokens(b2.chunks(0)), std::vector<int>{201});
  EXPECT_EQ(Tokens(b2.chunks(1)), (std::vector<int>{300, 301}));
  EXPECT_FALSE(b2.chunks(1).sample());
  EXPECT_EQ(b2.total_rows(), 3);
  sched_->OnResult(Result(b2, 202));
  const v1::StageBatch b3 = NextBatch();
  ASSERT_EQ(b3.chunks_size(), 2) << b3.ShortDebugString();
  EXPECT_EQ(Tokens(b3.chunks(1)), (std::vector<int>{302, 303}));
  EXPECT_EQ(b3.chunks(1).start(), 2);
}

TEST_F(SchedulerTest, KeepsOneBatchPerStageAndOneStepPerSequenceInFlight) {
  Make({}, /*stages=*/2);
  pipeline_.Hold();
  auto a = Submit(Spec({10}, 3));
  ASSERT_TRUE(pipeline_.WaitSent(1));  // the scheduler thread waits in Send with [A]
  auto b = Submit(Spec({11}, 3));
  auto c = Submit(Spec({12}, 3));
  auto d = Submit(Spec({13}, 3));
  pipeline_.Release();
  const v1::StageBatch b1 = NextBatch();
  const v1::StageBatch b2 = NextBatch();  // the second stage's slot: everyone ready
  EXPECT_EQ(b1.chunks_size(), 1);
  EXPECT_EQ(b2.chunks_size(), 3);
  // Both slots are taken: nothing else goes out.
  Barrier();
  // Answer both while the scheduler thread waits in a Send: the next round
  // sees four ready sequences and two free slots, and splits them.
  pipeline_.Hold();
  sched_->FreeSequence(uint64_t{1} << 41);
  ASSERT_TRUE(pipeline_.WaitUntil(
      [](const std::vector<v1::StageBatch>& s) { return !s.empty() && Frees(s.back(), uint64_t{1} << 41); }));
  sched_->OnResult(Result(b1, 50));
  sched_->OnResult(Result(b2, 51));
  pipeline_.Release();
  const v1::StageBatch b3 = NextBatch();
  const v1::StageBatch b4 = NextBatch();
  ASSERT_EQ(b3.chunks_size(), 2) << b3.ShortDebugString();
  ASSERT_EQ(b4.chunks_size(), 2) << b4.ShortDebugString();
  std::set<uint64_t> seqs;
  for (const auto* b : {&b3, &b4}) {
    for (const auto& ch : b->chunks()) {
      EXPECT_EQ(ch.start(), 1);
      EXPECT_EQ(ch.tokens_size(), 1);
      seqs.insert(ch.seq_id());
    }
  }
  EXPECT_EQ(seqs.size(), 4u);
  Barrier();
  for (const auto& batch : pipeline_.sent()) {
    EXPECT_TRUE(batch.batch_id() == 0 || batch.batch_id() <= b4.batch_id()) << "a third batch in flight";
  }
}

// Random requests, chunk sizes, budgets and stage counts, answered by a model
// of the stages that checks every batch: at most S in flight, the budgets, one
// step per sequence, positions that continue what the stages hold, the tokens
// of the conversation, and frees that never overtake a sequence's own step.
TEST_F(SchedulerTest, RandomLoadKeepsEveryBatchingRule) {
  std::mt19937_64 rng(strata::testing::TestSeed());
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int round = 0; round < 6; ++round) {
    SchedulerOptions o;
    const int stages = uniform(1, 4);
    o.prefill_chunk = uniform(1, 8);
    o.batch_tokens = uniform(1, 16);
    const int n = uniform(1, 12);
    o.max_running = uniform(1, n);
    o.max_queued = n;
    o.clock = &clock_;
    SCOPED_TRACE(absl::StrCat("round ", round, ": ", stages, " stages, chunk ", o.prefill_chunk, ", budget ",
                              o.batch_tokens, ", ", n, " requests, ", o.max_running, " running"));
    FakePipeline pipeline;
    SessionTable sessions;
    Scheduler sched(o, model_, &pipeline, &sessions);
    sched.OnPipelineUp(stages, kEpoch);

    struct Req {
      std::vector<int> prompt;
      int max_tokens = 0;
      std::shared_ptr<FakeSink> sink;
      std::vector<int> sampled;
    };
    std::vector<Req> reqs(n);
    int64_t total_tokens = 0;
    for (int i = 0; i < n; ++i) {
      reqs[i].prompt.push_back(1000 + i);  // names the request in its first chunk
      const int len = uniform(1, 20);
      for (int k = 1; k < len; ++k) reqs[i].prompt.push_back(uniform(2, 2047));
      reqs[i].max_tokens = uniform(1, 6);
      total_tokens += reqs[i].max_tokens;
      reqs[i].sink = std::make_shared<FakeSink>();
      ASSERT_TRUE(sched.Submit(Spec(reqs[i].prompt, reqs[i].max_tokens), reqs[i].sink, std::nullopt).ok());
    }

    std::map<uint64_t, int> held;   // tokens each sequence holds on the stages
    std::map<uint64_t, int> owner;  // sequence -> request
    std::deque<v1::StageBatch> in_flight;
    size_t seen = 0;
    auto apply = [&](const v1::StageBatch& b) {
      EXPECT_EQ(b.epoch(), kEpoch);
      for (uint64_t f : b.free_seq_ids()) {
        for (const auto& u : in_flight) EXPECT_FALSE(HasSeq(u, f)) << "the free of " << f << " overtook its step";
        if (owner.count(f)) {
          EXPECT_TRUE(reqs[owner[f]].sink->closed()) << "freed a running sequence";
        }
        held.erase(f);
      }
      if (b.batch_id() == 0) {
        EXPECT_EQ(b.chunks_size(), 0);
        return;
      }
      EXPECT_LT(static_cast<int>(in_flight.size()), stages) << "more batches in flight than stages";
      EXPECT_GT(b.chunks_size(), 0);
      int rows = 0;
      std::set<uint64_t> in_batch;
      for (const auto& c : b.chunks()) {
        const uint64_t seq = c.seq_id();
        EXPECT_TRUE(in_batch.insert(seq).second) << "sequence twice in one batch";
        for (const auto& u : in_flight) EXPECT_FALSE(HasSeq(u, seq)) << "two steps of one sequence in flight";
        EXPECT_GE(c.tokens_size(), 1);
        EXPECT_LE(c.tokens_size(), o.prefill_chunk);
        rows += c.tokens_size();
        const int start = held.count(seq) ? held[seq] : 0;
        ASSERT_EQ(c.start(), start) << "the chunk does not continue what the stages hold";
        EXPECT_EQ(c.has_sampling(), start == 0);
        if (start == 0) {
          ASSERT_GE(c.tokens(0), 1000);
          owner[seq] = c.tokens(0) - 1000;
        }
        ASSERT_TRUE(owner.count(seq));
        Req& r = reqs[owner[seq]];
        std::vector<int> conversation = r.prompt;
        conversation.insert(conversation.end(), r.sampled.begin(), r.sampled.end());
        ASSERT_LE(start + c.tokens_size(), static_cast<int>(conversation.size()));
        EXPECT_EQ(Tokens(c), std::vector<int>(conversation.begin() + start,
                                              conversation.begin() + start + c.tokens_size()));
        EXPECT_EQ(c.sample(), start + c.tokens_size() == static_cast<int>(conversation.size()));
        EXPECT_EQ(c.prompt(), start < static_cast<int>(r.prompt.size()));
        held[seq] = start + c.tokens_size();
      }
      EXPECT_EQ(b.total_rows(), rows);
      EXPECT_LE(rows, o.batch_tokens);
      in_flight.push_back(b);
    };
    auto answer = [&](const v1::StageBatch& b) {
      v1::StageResult res;
      res.set_batch_id(b.batch_id());
      for (const auto& c : b.chunks()) {
        if (!c.sample()) continue;
        const int token = uniform(2, 2047);
        reqs[owner[c.seq_id()]].sampled.push_back(token);
        auto* t = res.add_tokens();
        t->set_seq_id(c.seq_id());
        t->set_token(token);
      }
      sched.OnResult(std::move(res));
    };
    auto finished = [&] {
      return held.empty() && std::all_of(reqs.begin(), reqs.end(), [](Req& r) { return r.sink->closed(); });
    };
    while (!finished() && !::testing::Test::HasFatalFailure()) {
      const std::vector<v1::StageBatch> sent = pipeline.sent();
      for (; seen < sent.size(); ++seen) apply(sent[seen]);
      if (!in_flight.empty()) {
        answer(in_flight.front());  // results come back in the order of the batches
        in_flight.pop_front();
        continue;
      }
      if (finished()) break;
      ASSERT_TRUE(pipeline.WaitSent(seen + 1)) << "the scheduler stalled";
    }
    for (int i = 0; i < n; ++i) {
      SCOPED_TRACE(absl::StrCat("request ", i));
      EXPECT_TRUE(reqs[i].sink->status().ok()) << reqs[i].sink->status();
      EXPECT_EQ(reqs[i].sink->closes(), 1);
      EXPECT_EQ(reqs[i].sink->tokens(), reqs[i].sampled);
      EXPECT_EQ(static_cast<int>(reqs[i].sampled.size()), reqs[i].max_tokens);
      EXPECT_EQ(reqs[i].sink->final_msg().finish_reason(), v1::FINISH_REASON_LENGTH);
      EXPECT_EQ(reqs[i].sink->final_msg().usage().prompt_tokens(), static_cast<int>(reqs[i].prompt.size()));
    }
    const SchedulerStats st = sched.Stats();
    EXPECT_EQ(st.running, 0);
    EXPECT_EQ(st.queued, 0);
    EXPECT_EQ(st.completed, n);
    EXPECT_EQ(st.generated_tokens, total_tokens);
  }
}

}  // namespace
}  // namespace strata::coordinator::testing
