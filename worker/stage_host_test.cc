// The stage host on the CPU with a tiny random model, its next stage behind a
// fake link (worker/testing/fake_stage_stream.h): the last stage samples what
// the engine computes, a first stage forwards its rows bit-exactly in chunks
// and passes the result back, in-band and explicit frees, a next stage that
// goes away or cannot be reached, malformed batches (each fails with its own
// code, the stage forgets the batch's sequences and keeps serving),
// re-assignment, and LoadSession's refusals.
#include "worker/stage_host.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/testing/scratch_dir.h"
#include "common/testing/test_seed.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/engine.h"
#include "model/random_model.h"
#include "worker/testing/stage_host_fixture.h"

namespace strata::worker {
namespace {

using ::testing::HasSubstr;

TEST_F(StageHostTest, TheLastStageSamplesWhatTheEngineComputes) {
  std::mt19937_64 rng(strata::testing::TestSeed());
  auto host = Host();
  Assign(host.get(), Assignment(1, 0, kLayers, 0, 1));
  auto ref = Reference(0, kLayers);
  ASSERT_NE(ref, nullptr);
  auto kv1 = ref->NewSequence(), kv2 = ref->NewSequence();
  const std::vector<int> p1 = RandomTokens(rng, 5), p2 = RandomTokens(rng, 7);
  auto sink = std::make_shared<RecordingSink>();

  // Sequence 1 prefills and samples; sequence 2 sends the first 3 of its 7.
  host->Submit(MakeBatch(1, 10, {{1, 0, p1}, {2, 0, {p2.begin(), p2.begin() + 3}, false}}), sink);
  v1::StageResult r = sink->Wait(10);
  EXPECT_EQ(r.code(), 0) << r.error();
  std::vector<float> logits;
  const std::vector<int> head(p2.begin(), p2.begin() + 3);
  SeqChunk c1{kv1.get(), p1}, c2{kv2.get(), head};
  ASSERT_TRUE(ref->Forward({c1, c2}, false, &logits).ok());
  ASSERT_EQ(r.tokens_size(), 1);
  EXPECT_EQ(r.tokens(0).seq_id(), 1u);
  const int t1 = Argmax(logits.data());
  EXPECT_EQ(r.tokens(0).token(), t1);

  // Sequence 1 decodes its token; sequence 2 finishes its prompt.
  const std::vector<int> rest(p2.begin() + 3, p2.end());
  Batch b = MakeBatch(1, 11, {{1, 5, {t1}, true, false}, {2, 3, rest, true, false}});
  host->Submit(std::move(b), sink);
  r = sink->Wait(11);
  EXPECT_EQ(r.code(), 0) << r.error();
  const std::vector<int> decode = {t1};
  SeqChunk d1{kv1.get(), decode}, d2{kv2.get(), rest};
  ASSERT_TRUE(ref->Forward({d1, d2}, false, &logits).ok());
  ASSERT_EQ(r.tokens_size(), 2);
  EXPECT_EQ(r.tokens(0).seq_id(), 1u);
  EXPECT_EQ(r.tokens(0).token(), Argmax(logits.data()));
  EXPECT_EQ(r.tokens(1).seq_id(), 2u);
  EXPECT_EQ(r.tokens(1).token(), Argmax(logits.data() + kVocab));

  const v1::WorkerStatsResponse st = host->Stats();
  EXPECT_EQ(st.epoch(), 1);
  EXPECT_EQ(st.sequences(), 2);
  EXPECT_EQ(st.batches(), 2);
  EXPECT_EQ(st.kv_pages(), 2 * kLayers);  // one 64-token page per layer and sequence
  EXPECT_GT(st.kv_bytes(), 0);
}

TEST_F(StageHostTest, LogprobsComeWithTheTokenWhenAsked) {
  auto host = Host();
  Assign(host.get(), Assignment(1, 0, kLayers, 0, 1));
  Batch b = MakeBatch(1, 1, {{1, 0, {3, 4, 5}}});
  *b.header.mutable_chunks(0)->mutable_sampling() = Greedy(/*logprobs=*/3);
  auto sink = std::make_shared<RecordingSink>();
  host->Submit(std::move(b), sink);
  const v1::StageResult r = sink->Wait(1);
  ASSERT_EQ(r.tokens_size(), 1);
  EXPECT_EQ(r.tokens(0).rank(), 1);  // greedy takes the most likely token
  EXPECT_LT(r.tokens(0).logprob(), 0);
  ASSERT_EQ(r.tokens(0).top_tokens_size(), 3);
  EXPECT_EQ(r.tokens(0).top_tokens(0), r.tokens(0).token());
  EXPECT_EQ(r.tokens(0).top_logprobs(0), r.tokens(0).logprob());
}

TEST_F(StageHostTest, AFirstStageForwardsItsRowsInChunksAndPassesTheResultBack) {
  std::mt19937_64 rng(strata::testing::TestSeed());
  auto host = Host(/*max_chunk_bytes=*/2 * kHidden * 4);
  Assign(host.get(), Assignment(1, 0, 2, 0, 2));
  const std::vector<int> prompt = RandomTokens(rng, 5);
  auto sink = std::make_shared<RecordingSink>();
  host->Submit(MakeBatch(1, 5, {{1, 0, prompt}}), sink);

  auto peer = net_.WaitPeer(kNext);
  ASSERT_NE(peer, nullptr);
  ASSERT_TRUE(peer->WaitBatches(1));
  const auto msgs = peer->written();
  ASSERT_EQ(msgs.size(), 4u);  // the header, then 2 + 2 + 1 rows
  for (size_t i = 1; i < msgs.size(); ++i) EXPECT_LE(msgs[i].hidden().data().size(), 2u * kHidden * 4);
  auto batches = peer->Batches();
  ASSERT_TRUE(batches.ok()) << batches.status();
  ASSERT_EQ(batches->size(), 1u);
  const Batch& fwd = (*batches)[0];
  EXPECT_EQ(fwd.header.batch_id(), 5u);
  EXPECT_EQ(fwd.header.epoch(), 1);
  EXPECT_EQ(fwd.header.hidden_size(), kHidden);
  EXPECT_EQ(fwd.header.total_rows(), 5);
  ASSERT_EQ(fwd.header.chunks_size(), 1);
  EXPECT_EQ(fwd.header.chunks(0).seq_id(), 1u);
  EXPECT_TRUE(fwd.header.chunks(0).has_sampling());  // for the last stage
  auto ref = Reference(0, 2);
  ASSERT_NE(ref, nullptr);
  auto kv = ref->NewSequence();
  const std::vector<float> want = FirstStageRows(*ref, kv.get(), prompt);
  ASSERT_EQ(fwd.hidden.size(), want.size());
  EXPECT_EQ(std::memcmp(fwd.hidden.data(), want.data(), want.size() * 4), 0) << "rows must pass bit-exactly";
  EXPECT_TRUE(sink->results().empty()) << "the batch's answer comes from the next stage";

  // Results coming back are passed to the stream the batch came from; one
  // for a batch this stage never forwarded is dropped.
  v1::StageResult stray;
  stray.set_batch_id(99);
  peer->Reply(stray);
  v1::StageResult back;
  back.set_batch_id(5);
  back.add_tokens()->set_token(42);
  peer->Reply(back);
  const v1::StageResult r = sink->Wait(5);
  ASSERT_EQ(r.tokens_size(), 1);
  EXPECT_EQ(r.tokens(0).token(), 42);
  EXPECT_EQ(sink->results().size(), 1u);

  // The next batch goes through the same link.
  host->Submit(MakeBatch(1, 6, {{1, 5, {7}, true, false}}), sink);
  ASSERT_TRUE(peer->WaitBatches(2));
  EXPECT_EQ(net_.streams(kNext), 1u);
}

TEST_F(StageHostTest, ALastStageTakesTheRowsItIsSentAndChecksTheirWidth) {
  std::mt19937_64 rng(strata::testing::TestSeed());
  auto host = Host();
  Assign(host.get(), Assignment(1, 2, kLayers, 1, 2));
  auto first = Reference(0, 2), whole = Reference(0, kLayers);
  ASSERT_TRUE(first && whole);
  const std::vector<int> prompt = RandomTokens(rng, 6);
  auto kv0 = first->NewSequence(), kv = whole->NewSequence();
  std::vector<float> rows = FirstStageRows(*first, kv0.get(), prompt);
  auto sink = std::make_shared<RecordingSink>();
  host->Submit(MakeBatch(1, 1, {{3, 0, prompt}}, rows), sink);
  const v1::StageResult r = sink->Wait(1);
  EXPECT_EQ(r.code(), 0) << r.error();
  std::vector<float> logits;
  SeqChunk c{kv.get(), prompt};
  ASSERT_TRUE(whole->Forward({c}, false, &logits).ok());
  ASSERT_EQ(r.tokens_size(), 1);
  EXPECT_EQ(r.tokens(0).token(), Argmax(logits.data()));  // two stages give the bits of one engine

  Batch narrow = MakeBatch(1, 2, {{4, 0, {1, 2}}}, std::vector<float>(2 * (kHidden - 1)));
  narrow.header.set_hidden_size(kHidden - 1);
  host->Submit(std::move(narrow), sink);
  const v1::StageResult bad = sink->Wait(2);
  EXPECT_EQ(bad.code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(bad.failed_stage(), 1);
  EXPECT_THAT(bad.error(), HasSubstr("hidden size is 48"));
}

TEST_F(StageHostTest, TheNextStageGoingAwayFailsTheBatchesItHeldAndTheLinkIsDialedAgain) {
  auto host = Host();
  Assign(host.get(), Assignment(1, 0, 2, 0, 2));
  auto sink = std::make_shared<RecordingSink>();
  host->Submit(MakeBatch(1, 1, {{1, 0, {1, 2, 3}}}), sink);
  auto peer = net_.WaitPeer(kNext);
  ASSERT_NE(peer, nullptr);
  ASSERT_TRUE(peer->WaitBatches(1));
  peer->End(absl::UnavailableError("Connection reset by peer"));
  const v1::StageResult r = sink->Wait(1);
  EXPECT_EQ(r.code(), static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_EQ(r.failed_stage(), 1);
  EXPECT_EQ(r.error(), absl::StrCat("stage 1 at ", kNext, " is unreachable (Connection reset by peer)"));

  host->Submit(MakeBatch(1, 2, {{2, 0, {4, 5}}}), sink);
  auto again = net_.WaitPeer(kNext, 1);
  ASSERT_NE(again, nullptr) << "the broken link was not replaced";
  ASSERT_TRUE(again->WaitBatches(1));
  EXPECT_EQ((*again->Batches())[0].header.batch_id(), 2u);
}

TEST_F(StageHostTest, ANextStageThatCannotBeReachedFailsTheBatchThere) {
  auto host = Host();
  Assign(host.get(), Assignment(1, 0, 2, 0, 2));
  net_.Refuse(kNext);
  auto sink = std::make_shared<RecordingSink>();
  host->Submit(MakeBatch(1, 1, {{1, 0, {1, 2, 3}}}), sink);
  v1::StageResult r = sink->Wait(1);
  EXPECT_EQ(r.code(), static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_EQ(r.failed_stage(), 1);
  EXPECT_EQ(r.error(), absl::StrCat("stage 1 at ", kNext, " is not reachable"));

  // Reachable, but the write fails.
  net_.Refuse(kNext, false);
  host->Submit(MakeBatch(1, 2, {{2, 0, {1}}}), sink);
  auto peer = net_.WaitPeer(kNext);
  ASSERT_NE(peer, nullptr);
  ASSERT_TRUE(peer->WaitBatches(1));
  peer->BreakWrites();
  host->Submit(MakeBatch(1, 3, {{3, 0, {1}}}), sink);
  r = sink->Wait(3);
  EXPECT_EQ(r.code(), static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_EQ(r.failed_stage(), 1);
}

TEST_F(StageHostTest, MalformedBatchesFailWithTheirCodeAndTheStageKeepsServing) {
  auto host = Host();
  auto sink = std::make_shared<RecordingSink>();
  host->Submit(MakeBatch(1, 1, {{1, 0, {1, 2}}}), sink);
  v1::StageResult none = sink->Wait(1);
  EXPECT_EQ(none.code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(none.error(), HasSubstr("w-test has no layers assigned"));

  Assign(host.get(), Assignment(4, 0, kLayers, 0, 1));
  host->Submit(MakeBatch(4, 2, {{7, 0, {1, 2, 3}}}), sink);  // sequence 7 holds 3 tokens
  ASSERT_EQ(sink->Wait(2).code(), 0);

  struct Case {
    std::string what;
    Batch batch;
    absl::StatusCode code;
    std::string says;
  };
  std::vector<Case> cases;
  cases.push_back({"another epoch", MakeBatch(3, 0, {{8, 0, {1}}}), absl::StatusCode::kAborted,
                   "batch of epoch 3 reached stage 0 of epoch 4"});
  cases.push_back({"a gap", MakeBatch(4, 0, {{7, 5, {1}, true, false}}), absl::StatusCode::kFailedPrecondition,
                   "holds 3 tokens"});
  cases.push_back({"unknown, not at 0", MakeBatch(4, 0, {{9, 2, {1}}}), absl::StatusCode::kFailedPrecondition,
                   "is unknown"});
  cases.push_back({"an empty chunk", MakeBatch(4, 0, {{9, 0, {}}}), absl::StatusCode::kInvalidArgument,
                   "empty chunk"});
  cases.push_back({"a token outside the vocabulary", MakeBatch(4, 0, {{9, 0, {1, kVocab}}}),
                   absl::StatusCode::kInvalidArgument, ""});
  cases.push_back({"beyond the context", MakeBatch(4, 0, {{9, 0, std::vector<int>(kContext + 1, 1)}}),
                   absl::StatusCode::kOutOfRange, "exceed the context"});
  cases.push_back({"one sequence twice", MakeBatch(4, 0, {{9, 0, {1}}, {9, 0, {2}}}),
                   absl::StatusCode::kInvalidArgument, "twice"});
  cases.push_back({"a sample without sampling parameters", MakeBatch(4, 0, {{9, 0, {1}, true, false}}),
                   absl::StatusCode::kFailedPrecondition, "without sampling parameters"});
  Batch bad_rows = MakeBatch(4, 0, {{9, 0, {1, 2}}});
  bad_rows.header.set_total_rows(3);
  cases.push_back({"rows that are not the chunks' tokens", std::move(bad_rows), absl::StatusCode::kInvalidArgument,
                   "says 3 rows"});
  Batch bad_top_p = MakeBatch(4, 0, {{9, 0, {1}}});
  bad_top_p.header.mutable_chunks(0)->mutable_sampling()->set_top_p(1.5f);
  cases.push_back({"an invalid top_p", std::move(bad_top_p), absl::StatusCode::kInvalidArgument, "top_p"});

  uint64_t id = 100;
  for (Case& c : cases) {
    SCOPED_TRACE(c.what);
    c.batch.header.set_batch_id(++id);
    host->Submit(std::move(c.batch), sink);
    const v1::StageResult r = sink->Wait(id);
    EXPECT_EQ(r.code(), static_cast<int>(c.code)) << r.error();
    EXPECT_EQ(r.failed_stage(), 0);
    EXPECT_THAT(r.error(), HasSubstr(c.says));
    EXPECT_EQ(r.tokens_size(), 0);
  }
  // The failed gap forgot sequence 7 (its next step starts over); the rest of
  // the failed batches left nothing behind.
  EXPECT_EQ(host->Stats().sequences(), 0);
  host->Submit(MakeBatch(4, 200, {{7, 0, {1, 2, 3}}}), sink);
  const v1::StageResult ok = sink->Wait(200);
  EXPECT_EQ(ok.code(), 0) << ok.error();
  EXPECT_EQ(ok.tokens_size(), 1);
}

TEST_F(StageHostTest, FreesDropSequencesAndAFreeOnlyBatchHasNoAnswer) {
  auto host = Host();
  Assign(host.get(), Assignment(1, 0, kLayers, 0, 1));
  auto sink = std::make_shared<RecordingSink>();
  host->Submit(MakeBatch(1, 1, {{1, 0, {1, 2, 3}}, {2, 0, {4}}, {3, 0, {5}}}), sink);
  ASSERT_EQ(sink->Wait(1).code(), 0);
  EXPECT_EQ(host->Stats().sequences(), 3);

  // Dropped before the batch runs: sequence 1 starts again at 0.
  Batch b = MakeBatch(1, 2, {{1, 0, {6}}});
  b.header.add_free_seq_ids(1);
  host->Submit(std::move(b), sink);
  const v1::StageResult r = sink->Wait(2);
  EXPECT_EQ(r.code(), 0) << r.error();

  v1::StageBatch free_only;
  free_only.set_epoch(1);
  free_only.add_free_seq_ids(2);
  free_only.add_free_seq_ids(12345);  // unknown: nothing to do
  host->Submit(Batch{free_only, {}}, sink);
  host->Submit(MakeBatch(1, 3, {{3, 1, {7}, true, false}}), sink);  // runs after the free
  ASSERT_EQ(sink->Wait(3).code(), 0);
  EXPECT_EQ(host->Stats().sequences(), 2);
  for (const auto& res : sink->results()) EXPECT_NE(res.batch_id(), 0u) << "a free-only batch was answered";

  EXPECT_EQ(host->Free({3, 777}, false), 1);
  EXPECT_EQ(host->Free({}, true), 1);
  EXPECT_EQ(host->Stats().sequences(), 0);
  EXPECT_EQ(host->Stats().kv_pages(), 0);
}

TEST_F(StageHostTest, ReassigningFailsWhatTheNextStageHeldAndForgetsEverySequence) {
  auto host = Host();
  Assign(host.get(), Assignment(1, 0, 2, 0, 2));
  auto sink = std::make_shared<RecordingSink>();
  host->Submit(MakeBatch(1, 1, {{1, 0, {1, 2, 3}}}), sink);
  auto peer = net_.WaitPeer(kNext);
  ASSERT_NE(peer, nullptr);
  ASSERT_TRUE(peer->WaitBatches(1));
  EXPECT_EQ(host->Stats().sequences(), 1);

  Assign(host.get(), Assignment(2, 0, 2, 0, 2));  // a new epoch, the same layers
  const v1::StageResult r = sink->Wait(1);
  EXPECT_EQ(r.code(), static_cast<int>(absl::StatusCode::kAborted));
  EXPECT_THAT(r.error(), HasSubstr("re-assigned"));
  EXPECT_TRUE(peer->cancelled()) << "the stream to the old successor stays open";
  EXPECT_EQ(host->epoch(), 2);
  EXPECT_EQ(host->Stats().sequences(), 0);

  host->Submit(MakeBatch(1, 2, {{1, 0, {1}}}), sink);
  EXPECT_EQ(sink->Wait(2).code(), static_cast<int>(absl::StatusCode::kAborted));
  host->Submit(MakeBatch(2, 3, {{1, 0, {1}}}), sink);
  auto fresh = net_.WaitPeer(kNext, 1);
  ASSERT_NE(fresh, nullptr);
  EXPECT_TRUE(fresh->WaitBatches(1));
}

TEST_F(StageHostTest, AssignRefusesWhatItCannotLoad) {
  auto host = Host();
  v1::AssignLayersResponse resp;
  v1::AssignLayersRequest missing = Assignment(1, 0, kLayers, 0, 1);
  missing.set_model_dir(dir_->path() + "/no-such-model");
  EXPECT_EQ(host->Assign(missing, &resp).code(), absl::StatusCode::kNotFound);
  v1::AssignLayersRequest synthetic = Assignment(1, 0, kLayers, 0, 1);
  synthetic.set_synthetic_weights(true);
  const absl::Status st = host->Assign(synthetic, &resp);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(), HasSubstr("--device gpu"));
  v1::AssignLayersRequest beyond = Assignment(1, 0, kLayers + 1, 0, 1);
  EXPECT_FALSE(host->Assign(beyond, &resp).ok());
  EXPECT_FALSE(host->ready());
}

TEST_F(StageHostTest, LoadSessionRefusesBadRequestsAndAStageWithoutAStore) {
  auto host = Host();
  v1::LoadSessionRequest req;
  req.set_epoch(1);
  req.set_seq_id(3);
  req.set_session_id("s");
  req.set_tokens(4);
  v1::LoadSessionResponse resp;
  EXPECT_EQ(host->LoadSession(req, &resp).code(), absl::StatusCode::kFailedPrecondition);  // no layers
  Assign(host.get(), Assignment(1, 0, kLayers, 0, 1));
  EXPECT_EQ(host->LoadSession(req, &resp).code(), absl::StatusCode::kFailedPrecondition);  // no KV store
  v1::LoadSessionRequest other = req;
  other.set_epoch(2);
  EXPECT_EQ(host->LoadSession(other, &resp).code(), absl::StatusCode::kAborted);
  v1::LoadSessionRequest bad = req;
  bad.set_session_id("");
  EXPECT_EQ(host->LoadSession(bad, &resp).code(), absl::StatusCode::kInvalidArgument);
  bad = req;
  bad.set_tokens(-1);
  EXPECT_EQ(host->LoadSession(bad, &resp).code(), absl::StatusCode::kInvalidArgument);
  bad = req;
  bad.set_persist(true);
  bad.set_append_from(3);  // below the tokens loaded
  EXPECT_EQ(host->LoadSession(bad, &resp).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(host->Stats().sequences(), 0);
}

// A worker loads only model directories under its --model-root: after
// resolving links and "..", anything outside is PERMISSION_DENIED.
TEST(ModelRootTest, OnlyDirectoriesUnderTheRootLoad) {
  namespace fs = std::filesystem;
  const std::string top = MakeScratchDir("model_root_");
  const fs::path root = fs::path(top) / "models", inside = root / "demo", outside = fs::path(top) / "secret";
  fs::create_directories(inside);
  fs::create_directories(outside);
  fs::create_directory_symlink(outside, root / "link");
  EXPECT_TRUE(CheckModelRoot(inside.string(), root.string()).ok());
  EXPECT_TRUE(CheckModelRoot(root.string(), root.string()).ok());
  const auto denied = absl::StatusCode::kPermissionDenied;
  EXPECT_EQ(CheckModelRoot(outside.string(), root.string()).code(), denied);
  EXPECT_EQ(CheckModelRoot((inside / ".." / ".." / "secret").string(), root.string()).code(), denied);
  EXPECT_EQ(CheckModelRoot((root / "link").string(), root.string()).code(), denied) << "a link out of the root";
  EXPECT_EQ(CheckModelRoot((fs::path(top) / "models-evil").string(), root.string()).code(),
            absl::StatusCode::kNotFound);
  fs::create_directories(fs::path(top) / "models-evil");
  EXPECT_EQ(CheckModelRoot((fs::path(top) / "models-evil").string(), root.string()).code(), denied)
      << "a sibling sharing the root's name as a prefix";
  EXPECT_EQ(CheckModelRoot(inside.string(), "").code(), denied) << "no root: nothing loads";
  EXPECT_EQ(CheckModelRoot((root / "missing").string(), root.string()).code(), absl::StatusCode::kNotFound);
  fs::remove_all(top);
}

}  // namespace
}  // namespace strata::worker
