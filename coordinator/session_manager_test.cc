// The session manager's contract (coordinator/session_manager.h) with an
// in-memory KV store (a KvSessionClient whose store calls are overridden),
// fake workers behind a real cluster and scheduler: creating and reserving
// sessions, leaving nothing behind when Prepare fails, what is loaded onto the
// stages after a restart, after a crash mid-turn and after a worker failure,
// load failures, Save, the background finaliser, List, Delete, and which
// requests need a Prepare.
#include "coordinator/session_manager.h"

#include <future>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/testing/fake_clock.h"
#include "common/testing/scratch_dir.h"
#include "coordinator/testing/fake_kv_store.h"
#include "coordinator/testing/fake_worker_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/random_model.h"

namespace strata::coordinator {
namespace {

using ::testing::HasSubstr;
using testing::FakeKvStore;

constexpr const char* kConfig = R"({
  "model_type": "deepseek_v32", "vocab_size": 97, "hidden_size": 48, "intermediate_size": 64,
  "moe_intermediate_size": 16, "num_hidden_layers": 4, "num_attention_heads": 3,
  "num_key_value_heads": 3, "q_lora_rank": 24, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
  "qk_rope_head_dim": 8, "v_head_dim": 12, "n_routed_experts": 8, "n_shared_experts": 1,
  "num_experts_per_tok": 3, "n_group": 4, "topk_group": 2, "first_k_dense_replace": 1,
  "max_position_embeddings": 64, "index_n_heads": 4, "index_head_dim": 16, "index_topk": 8
})";
constexpr auto kWait = std::chrono::seconds(20);
constexpr uint64_t kFingerprint = 0x5eed0000cafef00dull;
constexpr char kStore[] = "kvstore.test:50070";
constexpr char kW0[] = "10.0.0.1:50061";
constexpr char kW1[] = "10.0.0.2:50061";

RequestSpec Spec(const std::string& session, bool persist = true, bool continue_turn = false) {
  RequestSpec s;
  s.session_id = session;
  s.persist = persist;
  s.continue_turn = continue_turn;
  s.sampling.seed = 1;
  s.sampling.max_tokens = 2;
  return s;
}

class SessionManagerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScratchDir("session_manager_");
    ASSERT_TRUE(WriteRandomModel(dir_->path(), kConfig).ok());
    auto m = LoadModelContext(dir_->path());
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = m->release();
  }
  static void TearDownTestSuite() {
    delete model_;
    delete dir_;
  }

  void SetUp() override {
    ClusterOptions o;
    o.model_dir = dir_->path();
    o.workers = 2;
    o.worker_client = client_;
    o.clock = &clock_;  // never moves: no worker goes down
    auto c = Cluster::Create(o);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = std::move(*c);
    cluster_->Register(Worker("w0", kW0));
    cluster_->Register(Worker("w1", kW1));
    scheduler_ = std::make_unique<Scheduler>(SchedulerOptions{}, model_, cluster_.get(), &sessions_);
    cluster_->Start(scheduler_.get(), [this](bool ready) {
      std::lock_guard<std::mutex> l(mu_);
      ready_ = ready;
      cv_.notify_all();
    });
    std::unique_lock<std::mutex> l(mu_);
    ASSERT_TRUE(cv_.wait_for(l, kWait, [&] { return ready_; }));
    // Every stage loads what the store holds.
    client_->SetLoad([this](const std::string&, const v1::LoadSessionRequest& req, v1::LoadSessionResponse* resp) {
      auto ids = store_->TokenIds(req.session_id(), 0, req.tokens());
      if (!ids.ok()) return ids.status();
      resp->set_tokens(req.tokens());
      for (int t : *ids) resp->add_token_ids(t);
      return absl::OkStatus();
    });
  }
  void TearDown() override {
    manager_.reset();
    cluster_->Stop();
    scheduler_.reset();
    cluster_.reset();
  }

  static v1::RegisterRequest Worker(const std::string& name, const std::string& address) {
    v1::RegisterRequest r;
    r.set_address(address);
    r.set_name(name);
    r.add_devices()->set_free_bytes(int64_t{1} << 30);
    return r;
  }
  void Manage(bool with_store = true, SessionManagerOptions o = {}) {
    std::unique_ptr<FakeKvStore> store;
    if (with_store) {
      store = std::make_unique<FakeKvStore>(kStore, ShapeOf(model_->config, kFingerprint, 0));
      store_ = store.get();
    }
    manager_ = std::make_unique<SessionManager>(o, &sessions_, scheduler_.get(), cluster_.get(), std::move(store));
  }
  // A session the coordinator holds in memory (what a finished request leaves).
  void Remember(const std::string& id, std::vector<int> tokens, std::optional<int> pending, bool resident,
                bool persist = true, int64_t watermark = 0) {
    sessions_.Update(id, true, [&](SessionEntry& s) {
      s.tokens = std::move(tokens);
      s.pending = pending;
      s.persist = persist;
      s.turn_watermark = watermark;
      s.seq_id = resident ? 77 : 0;
      s.epoch = cluster_->epoch();
    });
  }
  std::vector<testing::FakeWorkerClient::Call<v1::LoadSessionRequest>> Loads() { return client_->loads(); }

  static ScratchDir* dir_;
  static ModelContext* model_;
  strata::testing::FakeClock clock_;
  std::shared_ptr<testing::FakeWorkerClient> client_ = std::make_shared<testing::FakeWorkerClient>();
  SessionTable sessions_;
  std::unique_ptr<Cluster> cluster_;
  std::unique_ptr<Scheduler> scheduler_;
  FakeKvStore* store_ = nullptr;  // owned by the manager
  std::unique_ptr<SessionManager> manager_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool ready_ = false;
};

ScratchDir* SessionManagerTest::dir_ = nullptr;
ModelContext* SessionManagerTest::model_ = nullptr;

TEST_F(SessionManagerTest, WithoutAStoreSessionsLiveInMemory) {
  Manage(/*with_store=*/false);
  EXPECT_FALSE(manager_->persistent());
  RequestSpec spec = Spec("m1");
  EXPECT_FALSE(manager_->NeedsPrepare(spec));
  ASSERT_TRUE(manager_->Prepare(&spec).ok());
  EXPECT_FALSE(spec.session_reserved);
  EXPECT_FALSE(sessions_.Get("m1").has_value());  // Submit makes the entry

  EXPECT_EQ(manager_->Save("m1", absl::InfiniteFuture()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(manager_->Save("no spaces!", absl::InfiniteFuture()).status().code(),
            absl::StatusCode::kInvalidArgument);
  Remember("m1", {1, 2, 3}, 4, /*resident=*/true, /*persist=*/false, /*watermark=*/2);
  auto saved = manager_->Save("m1", absl::InfiniteFuture());
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(saved->tokens(), 3);
  EXPECT_EQ(saved->turn_watermark(), 2);
  EXPECT_TRUE(saved->resident());
  EXPECT_FALSE(saved->persistent());
  auto resumed = manager_->Resume("m1");
  ASSERT_TRUE(resumed.ok());
  EXPECT_EQ(resumed->tokens(), 3);
  EXPECT_EQ(manager_->Resume("m2").status().code(), absl::StatusCode::kNotFound);
  auto list = manager_->List("m");
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].session_id(), "m1");
  EXPECT_EQ(manager_->Delete("m2").code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(manager_->Delete("m1").ok());
  EXPECT_FALSE(sessions_.Get("m1").has_value());
}

TEST_F(SessionManagerTest, ANewPersistentSessionIsCreatedInTheStoreAndReserved) {
  Manage();
  RequestSpec spec = Spec("s1");
  EXPECT_TRUE(manager_->NeedsPrepare(spec));
  ASSERT_TRUE(manager_->Prepare(&spec).ok());
  EXPECT_TRUE(spec.session_reserved);
  EXPECT_TRUE(store_->Has("s1"));
  auto entry = sessions_.Get("s1");
  ASSERT_TRUE(entry);
  EXPECT_TRUE(entry->busy);
  EXPECT_TRUE(entry->persist);

  RequestSpec other = Spec("s1");
  absl::Status st = manager_->Prepare(&other);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(), HasSubstr("already has a request running"));
  EXPECT_FALSE(other.session_reserved);
  st = manager_->Delete("s1");
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(), HasSubstr("abort it first"));
  EXPECT_TRUE(store_->Has("s1"));
  st = manager_->Resume("s1").status();
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);

  manager_->Release("s1");
  EXPECT_FALSE(sessions_.Get("s1")->busy);
}

TEST_F(SessionManagerTest, APrepareThatFailsLeavesNothingBehind) {
  Manage();
  store_->Fail("Stat", absl::UnavailableError("KV store at kvstore.test:50070 is unreachable"));
  RequestSpec a = Spec("s2");
  EXPECT_EQ(manager_->Prepare(&a).code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(a.session_reserved);
  EXPECT_FALSE(sessions_.Get("s2").has_value());
  store_->Fail("Stat", absl::OkStatus());

  RequestSpec cont = Spec("s2", true, /*continue_turn=*/true);
  absl::Status st = manager_->Prepare(&cont);
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(st.message(), HasSubstr(kStore));
  EXPECT_FALSE(sessions_.Get("s2").has_value());

  RequestSpec volatile_one = Spec("s2", /*persist=*/false);
  ASSERT_TRUE(manager_->Prepare(&volatile_one).ok());
  EXPECT_FALSE(volatile_one.session_reserved);
  EXPECT_FALSE(sessions_.Get("s2").has_value());
  EXPECT_EQ(store_->creates(), 0);

  store_->Fail("Create", absl::UnavailableError("disk full"));
  RequestSpec create = Spec("s2");
  EXPECT_EQ(manager_->Prepare(&create).code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(sessions_.Get("s2").has_value());
  store_->Fail("Create", absl::OkStatus());

  // Stored by another checkpoint.
  store_->Put("s3", {1, 2}, 0, {}, /*fingerprint=*/0x1234);
  RequestSpec foreign = Spec("s3");
  st = manager_->Prepare(&foreign);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(), HasSubstr("0000000000001234"));
  EXPECT_THAT(st.message(), HasSubstr(absl::StrFormat("%016x", kFingerprint)));
  EXPECT_FALSE(sessions_.Get("s3").has_value());
  EXPECT_TRUE(Loads().empty());

  // Nothing was left busy: the id works now.
  RequestSpec fine = Spec("s2");
  EXPECT_TRUE(manager_->Prepare(&fine).ok());
}

TEST_F(SessionManagerTest, AfterARestartAStoredTurnIsLoadedOntoEveryStageWithItsPendingToken) {
  Manage();
  store_->Put("s4", {5, 6, 7, 8}, /*watermark=*/4, {{kPendingKey, "4:9"}});
  RequestSpec spec = Spec("s4");
  spec.prompt = {10, 11};
  ASSERT_TRUE(manager_->NeedsPrepare(spec));
  ASSERT_TRUE(manager_->Prepare(&spec).ok());
  EXPECT_TRUE(spec.session_reserved);
  EXPECT_EQ(store_->truncates(), (std::vector<std::pair<std::string, int64_t>>{{"s4", 4}}));
  const auto loads = Loads();
  ASSERT_EQ(loads.size(), 2u);
  std::set<std::string> addresses;
  for (const auto& c : loads) {
    addresses.insert(c.address);
    EXPECT_EQ(c.req.epoch(), cluster_->epoch());
    EXPECT_EQ(c.req.seq_id(), loads[0].req.seq_id());
    EXPECT_EQ(c.req.session_id(), "s4");
    EXPECT_EQ(c.req.tokens(), 4);
    EXPECT_TRUE(c.req.persist());
    EXPECT_EQ(c.req.append_from(), 4);
  }
  EXPECT_EQ(addresses, (std::set<std::string>{kW0, kW1}));
  const uint64_t seq = loads[0].req.seq_id();
  EXPECT_NE(seq, 0u);
  auto s = sessions_.Get("s4");
  ASSERT_TRUE(s);
  EXPECT_EQ(s->tokens, (std::vector<int>{5, 6, 7, 8}));
  EXPECT_EQ(s->pending, 9);
  EXPECT_FALSE(s->pending_stored);
  EXPECT_EQ(s->seq_id, seq);
  EXPECT_EQ(s->turn_watermark, 4);
  EXPECT_TRUE(s->busy);

  // The request sends only what the stages do not hold: the pending token
  // and the new prompt, on the loaded sequence.
  class Quiet final : public GenerateSink {
    void Send(v1::GenerateResponse) override {}
    void Close(const absl::Status&) override {}
  };
  ASSERT_TRUE(scheduler_->Submit(spec, std::make_shared<Quiet>(), std::nullopt).ok());
  auto peer = client_->network().WaitPeer(kW0);
  ASSERT_NE(peer, nullptr);
  ASSERT_TRUE(peer->WaitBatches(1));
  auto batches = peer->Batches();
  ASSERT_TRUE(batches.ok());
  const v1::StageChunk& c = (*batches)[0].header.chunks(0);
  EXPECT_EQ(c.seq_id(), seq);
  EXPECT_EQ(c.start(), 4);
  EXPECT_EQ(std::vector<int>(c.tokens().begin(), c.tokens().end()), (std::vector<int>{9, 10, 11}));
}

TEST_F(SessionManagerTest, AfterATurnCutOffByACrashTheLastStoredTokenIsFedAgain) {
  Manage();
  // No pending token recorded, or one recorded at another position (stale).
  for (const auto& metadata : std::vector<std::map<std::string, std::string>>{{}, {{kPendingKey, "2:9"}}}) {
    sessions_.Erase("s5");
    store_->Put("s5", {5, 6, 7, 8}, 2, metadata);
    const size_t before = Loads().size();
    RequestSpec spec = Spec("s5");
    ASSERT_TRUE(manager_->Prepare(&spec).ok());
    const auto loads = Loads();
    ASSERT_EQ(loads.size(), before + 2);
    for (size_t i = before; i < loads.size(); ++i) {
      EXPECT_EQ(loads[i].req.tokens(), 3);       // one record fewer
      EXPECT_EQ(loads[i].req.append_from(), 4);  // its rows are not sent again
    }
    auto s = sessions_.Get("s5");
    ASSERT_TRUE(s);
    EXPECT_EQ(s->tokens, (std::vector<int>{5, 6, 7}));
    EXPECT_EQ(s->pending, 8);
    EXPECT_TRUE(s->pending_stored);
    EXPECT_EQ(s->turn_watermark, 2);
    manager_->Release("s5");
    auto state = manager_->Resume("s5");  // resident already: nothing loaded again
    ASSERT_TRUE(state.ok()) << state.status();
    EXPECT_EQ(state->tokens(), 4);
    EXPECT_TRUE(state->resident());
    EXPECT_EQ(Loads().size(), before + 2);
  }
}

TEST_F(SessionManagerTest, AfterAWorkerFailureTheCoordinatorsCopyDecidesWhatIsLoaded) {
  Manage();
  // It knows more than the store committed: the rest is fed again.
  Remember("s6", {5, 6, 7, 8, 9, 10}, 11, /*resident=*/false);
  store_->Put("s6", {5, 6, 7, 8});
  RequestSpec spec = Spec("s6");
  ASSERT_TRUE(manager_->NeedsPrepare(spec));
  ASSERT_TRUE(manager_->Prepare(&spec).ok());
  EXPECT_TRUE(spec.session_reserved);
  ASSERT_EQ(Loads().size(), 2u);
  EXPECT_EQ(Loads()[0].req.tokens(), 4);
  auto s = sessions_.Get("s6");
  EXPECT_EQ(s->tokens, (std::vector<int>{5, 6, 7, 8}));
  EXPECT_EQ(s->unfed, (std::vector<int>{9, 10}));
  EXPECT_EQ(s->pending, 11);
  manager_->Release("s6");

  // It knows less: the store's extra records are dropped.
  Remember("s7", {5, 6}, 7, /*resident=*/false);
  store_->Put("s7", {5, 6, 7, 8});
  RequestSpec fewer = Spec("s7");
  ASSERT_TRUE(manager_->Prepare(&fewer).ok());
  ASSERT_FALSE(store_->truncates().empty());
  EXPECT_EQ(store_->truncates().back(), (std::pair<std::string, int64_t>{"s7", 2}));
  EXPECT_EQ(store_->Tokens("s7"), (std::vector<int>{5, 6}));
  EXPECT_EQ(Loads().back().req.tokens(), 2);
  EXPECT_EQ(sessions_.Get("s7")->tokens, (std::vector<int>{5, 6}));
}

TEST_F(SessionManagerTest, AStoreThatHoldsOtherTokensIsRefusedAndTheLoadIsFreed) {
  Manage();
  Remember("s8", {5, 6, 7, 99}, std::nullopt, /*resident=*/false);
  store_->Put("s8", {5, 6, 7, 8});
  RequestSpec spec = Spec("s8");
  const absl::Status st = manager_->Prepare(&spec);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(), HasSubstr("other tokens"));
  ASSERT_EQ(Loads().size(), 2u);
  const uint64_t seq = Loads()[0].req.seq_id();
  std::set<std::string> freed;
  for (const auto& f : client_->frees()) {
    ASSERT_EQ(f.req.seq_ids_size(), 1);
    EXPECT_EQ(f.req.seq_ids(0), seq);
    freed.insert(f.address);
  }
  EXPECT_EQ(freed, (std::set<std::string>{kW0, kW1}));
  auto s = sessions_.Get("s8");
  ASSERT_TRUE(s);
  EXPECT_FALSE(s->busy);
  EXPECT_EQ(s->seq_id, 0u);
  EXPECT_EQ(s->tokens, (std::vector<int>{5, 6, 7, 99}));  // the coordinator's copy is kept
}

TEST_F(SessionManagerTest, ALoadThatFailsOnAStageNamesItAndFreesTheOthers) {
  Manage();
  store_->Put("s9", {5, 6, 7, 8}, 0, {{kPendingKey, "4:9"}});
  client_->SetLoad([](const std::string& address, const v1::LoadSessionRequest& req, v1::LoadSessionResponse* resp) {
    if (address == kW1) return absl::AbortedError("LoadSession for epoch 1 on a stage of epoch 2");
    resp->set_tokens(req.tokens());
    for (int t : {5, 6, 7, 8}) resp->add_token_ids(t);
    return absl::OkStatus();
  });
  RequestSpec spec = Spec("s9");
  absl::Status st = manager_->Prepare(&spec);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;  // re-assigned meanwhile: retry
  EXPECT_EQ(st.message(), absl::StrCat("loading session 's9' on stage 1 (w1 at ", kW1,
                                       "): LoadSession for epoch 1 on a stage of epoch 2"));
  EXPECT_EQ(client_->frees().size(), 2u);
  EXPECT_FALSE(sessions_.Get("s9").has_value()) << "a session the coordinator did not know is forgotten again";

  // Stage 0 answers fewer records than asked: DATA_LOSS.
  client_->SetLoad([](const std::string&, const v1::LoadSessionRequest& req, v1::LoadSessionResponse* resp) {
    resp->set_tokens(req.tokens());
    resp->add_token_ids(5);
    return absl::OkStatus();
  });
  st = manager_->Prepare(&spec);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_THAT(st.message(), HasSubstr("stage 0 loaded 1 of 4 records"));

  // The store's own codes are kept.
  client_->SetLoad([](const std::string&, const v1::LoadSessionRequest&, v1::LoadSessionResponse*) {
    return absl::OutOfRangeError("records [0, 4) of layers [0, 2): the store holds 3");
  });
  st = manager_->Prepare(&spec);
  EXPECT_EQ(st.code(), absl::StatusCode::kOutOfRange) << st;
  EXPECT_FALSE(sessions_.Get("s9").has_value());
}

TEST_F(SessionManagerTest, SaveWaitsForTheRowsThenWritesTheWatermarkAndThePendingToken) {
  Manage();
  Remember("s10", {1, 2, 3, 4, 5}, 6, /*resident=*/true, /*persist=*/true, /*watermark=*/5);
  store_->Put("s10", {1, 2, 3});
  auto saving = std::async(std::launch::async, [&] { return manager_->Save("s10", absl::InfiniteFuture()); });
  ASSERT_TRUE(store_->WaitStats("s10", 2));  // it is waiting for the rows
  EXPECT_EQ(store_->Updates("s10"), 0);
  store_->Commit("s10", {4, 5});
  auto state = saving.get();
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(state->tokens(), 5);
  EXPECT_EQ(state->turn_watermark(), 5);
  EXPECT_TRUE(state->resident());
  EXPECT_TRUE(state->persistent());
  EXPECT_EQ(store_->Watermark("s10"), 5);
  EXPECT_EQ(store_->Metadata("s10")[kPendingKey], "5:6");

  // Rows that do not arrive: DEADLINE_EXCEEDED saying how many did.
  Remember("s11", {1, 2, 3, 4, 5}, std::nullopt, /*resident=*/true);
  store_->Put("s11", {1, 2, 3});
  auto late = manager_->Save("s11", absl::Now() + absl::Milliseconds(50));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(late.status().message(), HasSubstr("3 of 5 tokens are committed"));
  EXPECT_EQ(store_->Updates("s11"), 0);

  Remember("s12", {1}, std::nullopt, /*resident=*/true, /*persist=*/false);
  EXPECT_EQ(manager_->Save("s12", absl::InfiniteFuture()).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(manager_->Save("s13", absl::InfiniteFuture()).status().code(), absl::StatusCode::kNotFound);

  // Stored only (after a restart): its committed records.
  store_->Put("s14", {1, 2, 3}, 2);
  auto stored = manager_->Save("s14", absl::InfiniteFuture());
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->tokens(), 3);
  EXPECT_EQ(stored->turn_watermark(), 2);
  EXPECT_FALSE(stored->resident());
}

TEST_F(SessionManagerTest, ATurnsWatermarkIsWrittenOnceItsRowsAreCommitted) {
  Manage();
  store_->Put("t1", {1, 2}, 0, {{kPendingKey, "1:5"}});
  TurnEnd t;
  t.session_id = "t1";
  t.tokens = 4;
  t.pending = 9;
  t.turn_watermark = 4;
  t.persist = true;
  manager_->OnTurnEnd(t);
  ASSERT_TRUE(store_->WaitStats("t1", 2));
  EXPECT_EQ(store_->Updates("t1"), 0) << "written before its rows were committed";
  store_->Commit("t1", {3, 4});
  ASSERT_TRUE(store_->WaitUpdates("t1", 1));
  EXPECT_EQ(store_->Watermark("t1"), 4);
  EXPECT_EQ(store_->Metadata("t1")[kPendingKey], "4:9");

  // A turn without a pending token removes a stale one.
  t.tokens = 4;
  t.pending.reset();
  manager_->OnTurnEnd(t);
  ASSERT_TRUE(store_->WaitUpdates("t1", 2));
  EXPECT_EQ(store_->Metadata("t1").count(kPendingKey), 0u);
}

TEST_F(SessionManagerTest, ATurnWhoseRowsDoNotArriveInTimeIsDropped) {
  SessionManagerOptions o;
  o.finalize_timeout = absl::ZeroDuration();
  Manage(true, o);
  store_->Put("a", {1, 2});
  TurnEnd t;
  t.session_id = "a";
  t.tokens = 4;
  t.turn_watermark = 4;
  t.persist = true;
  manager_->OnTurnEnd(t);
  ASSERT_TRUE(store_->WaitStats("a", 1));  // answered "2 records": too few, and expired
  store_->Commit("a", {3, 4});
  // The finaliser takes its sessions in order: once "b" (queued after the
  // drop) is written, "a" would have been written before it if it were queued.
  store_->Put("b", {1});
  TurnEnd u = t;
  u.session_id = "b";
  u.tokens = 1;
  u.turn_watermark = 1;
  manager_->OnTurnEnd(u);
  ASSERT_TRUE(store_->WaitUpdates("b", 1));
  EXPECT_EQ(store_->Updates("a"), 0);
  EXPECT_EQ(store_->Watermark("a"), 0);
}

TEST_F(SessionManagerTest, ListMergesTheStoreWithMemory) {
  Manage();
  Remember("k1", {1, 2}, std::nullopt, /*resident=*/true, true, /*watermark=*/1);
  store_->Put("k1", {1, 2, 3, 4, 5});
  store_->Put("k2", {1, 2, 3}, /*watermark=*/2);
  store_->Put("k3", {1});
  store_->SetProblem("k3", "bad header");
  store_->Put("other", {1});
  auto list = manager_->List("k");
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 3u);
  EXPECT_EQ((*list)[0].session_id(), "k1");
  EXPECT_EQ((*list)[0].tokens(), 2);  // the coordinator's view wins
  EXPECT_TRUE((*list)[0].resident());
  EXPECT_EQ((*list)[1].session_id(), "k2");
  EXPECT_EQ((*list)[1].tokens(), 3);
  EXPECT_EQ((*list)[1].turn_watermark(), 2);
  EXPECT_TRUE((*list)[1].persistent());
  EXPECT_EQ((*list)[2].session_id(), "k3");
  store_->Fail("List", absl::UnavailableError("down"));
  EXPECT_EQ(manager_->List("k").status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(SessionManagerTest, DeleteFreesTheResidentSequenceInBandAndDeletesTheFiles) {
  Manage();
  Remember("d1", {1, 2, 3}, std::nullopt, /*resident=*/true);
  const uint64_t seq = sessions_.Get("d1")->seq_id;
  store_->Put("d1", {1, 2, 3});
  ASSERT_TRUE(manager_->Delete("d1").ok());
  EXPECT_FALSE(store_->Has("d1"));
  EXPECT_FALSE(sessions_.Get("d1").has_value());
  auto peer = client_->network().WaitPeer(kW0);
  ASSERT_NE(peer, nullptr);
  ASSERT_TRUE(peer->WaitBatches(1));
  const v1::StageBatch free = (*peer->Batches())[0].header;
  EXPECT_EQ(free.batch_id(), 0u);
  EXPECT_EQ(std::vector<uint64_t>(free.free_seq_ids().begin(), free.free_seq_ids().end()),
            std::vector<uint64_t>{seq});

  // The store fails: the session stays, not resident (its sequence is gone).
  Remember("d2", {1, 2}, std::nullopt, /*resident=*/true);
  store_->Put("d2", {1, 2});
  store_->Fail("Delete", absl::UnavailableError("down"));
  EXPECT_EQ(manager_->Delete("d2").code(), absl::StatusCode::kUnavailable);
  auto s = sessions_.Get("d2");
  ASSERT_TRUE(s);
  EXPECT_FALSE(s->busy);
  EXPECT_EQ(s->seq_id, 0u);
  store_->Fail("Delete", absl::OkStatus());

  // Known only here, or nowhere.
  Remember("d3", {1}, std::nullopt, /*resident=*/false);
  EXPECT_TRUE(manager_->Delete("d3").ok());
  EXPECT_EQ(manager_->Delete("d4").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(manager_->Delete("").code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(SessionManagerTest, OnlySessionsThatAreNotResidentNeedAPrepare) {
  Manage();
  Remember("r1", {1, 2}, std::nullopt, /*resident=*/true);
  Remember("r2", {1, 2}, std::nullopt, /*resident=*/false);
  Remember("r3", {1, 2}, std::nullopt, /*resident=*/false, /*persist=*/false);
  EXPECT_FALSE(manager_->NeedsPrepare(Spec("r1")));
  EXPECT_TRUE(manager_->NeedsPrepare(Spec("r2")));
  EXPECT_FALSE(manager_->NeedsPrepare(Spec("r3")));  // re-run from memory by the scheduler
  EXPECT_TRUE(manager_->NeedsPrepare(Spec("unknown")));
  EXPECT_FALSE(manager_->NeedsPrepare(Spec("")));

  RequestSpec spec = Spec("r1");
  manager_->ReserveResident(&spec);
  EXPECT_TRUE(spec.session_reserved);
  EXPECT_TRUE(sessions_.Get("r1")->busy);
  RequestSpec again = Spec("r1");
  manager_->ReserveResident(&again);
  EXPECT_FALSE(again.session_reserved);
  EXPECT_FALSE(manager_->NeedsPrepare(Spec("r1")));
  RequestSpec not_persist = Spec("r2", /*persist=*/false);
  manager_->ReserveResident(&not_persist);
  EXPECT_FALSE(not_persist.session_reserved);
}

}  // namespace
}  // namespace strata::coordinator
