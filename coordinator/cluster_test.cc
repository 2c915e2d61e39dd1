// Membership and the pipeline (docs/service.md, "Membership") with fake
// workers (coordinator/testing/fake_worker_client.h) and a fake clock:
// register and heartbeat, a worker silent for longer than down_after is down
// (and told to register again), re-registration replaces the old entry,
// placement over the alive workers, and the three ways a pipeline goes down —
// a placed worker silent, the stream to stage 0 broken, a stage that lost its
// successor — each ending the running requests with UNAVAILABLE naming the
// stage, then re-placement. AssignLayers failures evict a worker only when it
// cannot be reached.
//
// The cluster's control thread reads the clock once per round; after moving
// the clock a test waits until it has been read twice (FakeClock::AwaitReads)
// — the round that saw the new time has then finished — instead of sleeping.
#include "coordinator/cluster.h"

#include <memory>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/testing/fake_clock.h"
#include "common/testing/scratch_dir.h"
#include "coordinator/testing/fake_worker_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/random_model.h"

namespace strata::coordinator {
namespace {

using ::testing::HasSubstr;
using worker::testing::FakeStagePeer;

constexpr const char* kConfig = R"({
  "model_type": "deepseek_v32", "vocab_size": 97, "hidden_size": 48, "intermediate_size": 64,
  "moe_intermediate_size": 16, "num_hidden_layers": 4, "num_attention_heads": 3,
  "num_key_value_heads": 3, "q_lora_rank": 24, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
  "qk_rope_head_dim": 8, "v_head_dim": 12, "n_routed_experts": 8, "n_shared_experts": 1,
  "num_experts_per_tok": 3, "n_group": 4, "topk_group": 2, "first_k_dense_replace": 1,
  "max_position_embeddings": 64, "index_n_heads": 4, "index_head_dim": 16, "index_topk": 8
})";
constexpr auto kWait = std::chrono::seconds(20);
constexpr char kW0[] = "10.0.0.1:50061";
constexpr char kW1[] = "10.0.0.2:50061";
constexpr char kW2[] = "10.0.0.3:50061";

v1::RegisterRequest Worker(const std::string& name, const std::string& address, int64_t free = 1 << 30) {
  v1::RegisterRequest r;
  r.set_address(address);
  r.set_name(name);
  v1::Device* d = r.add_devices();
  d->set_name("cpu");
  d->set_total_bytes(free * 2);
  d->set_free_bytes(free);
  return r;
}

class Sink final : public GenerateSink {
 public:
  void Send(v1::GenerateResponse) override {}
  void Close(const absl::Status& status) override {
    std::lock_guard<std::mutex> l(mu_);
    if (closed_) return;
    closed_ = true;
    status_ = status;
    cv_.notify_all();
  }
  absl::Status Wait() {
    std::unique_lock<std::mutex> l(mu_);
    if (!cv_.wait_for(l, kWait, [&] { return closed_; })) return absl::UnknownError("never closed");
    return status_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool closed_ = false;
  absl::Status status_;
};

class ClusterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScratchDir("cluster_");
    ASSERT_TRUE(WriteRandomModel(dir_->path(), kConfig).ok());
    auto m = LoadModelContext(dir_->path());
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = m->release();
  }
  static void TearDownTestSuite() {
    delete model_;
    delete dir_;
  }
  void TearDown() override {
    if (cluster_) cluster_->Stop();  // before the scheduler it reports to
    scheduler_.reset();
    cluster_.reset();
  }

  // Creates the cluster (not started).
  void Make(int workers = 2, int min_workers = 0) {
    ClusterOptions o;
    o.model_dir = dir_->path();
    o.workers = workers;
    o.min_workers = min_workers;
    o.worker_client = client_;
    o.clock = &clock_;
    auto c = Cluster::Create(o);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = std::move(*c);
  }
  void Start() {
    scheduler_ = std::make_unique<Scheduler>(SchedulerOptions{}, model_, cluster_.get(), &sessions_);
    cluster_->Start(scheduler_.get(), [this](bool ready) {
      std::lock_guard<std::mutex> l(mu_);
      readiness_.push_back(ready);
      cv_.notify_all();
    });
  }
  // Waits until readiness was reported `n` times in all and returns the
  // n-th report.
  bool WaitReadiness(size_t n) {
    std::unique_lock<std::mutex> l(mu_);
    EXPECT_TRUE(cv_.wait_for(l, kWait, [&] { return readiness_.size() >= n; })) << "readiness reported "
                                                                                  << readiness_.size() << " times";
    return readiness_.size() >= n && readiness_[n - 1];
  }
  std::string Register(const std::string& name, const std::string& address) {
    return cluster_->Register(Worker(name, address)).worker_id();
  }
  bool Known(const std::string& id) {
    v1::HeartbeatRequest hb;
    hb.set_worker_id(id);
    return cluster_->Heartbeat(hb).known();
  }
  std::optional<WorkerInfo> Info(const std::string& address) {
    for (const WorkerInfo& w : cluster_->workers()) {
      if (w.address == address) return w;
    }
    return std::nullopt;
  }
  // Moves the clock and waits until the control thread has acted on it.
  void Advance(absl::Duration d) {
    clock_.Advance(d);
    ASSERT_TRUE(clock_.AwaitReads(2));
  }
  // A running request whose first batch reached stage 0's peer `peer`.
  std::shared_ptr<Sink> Running(FakeStagePeer& peer, size_t batches_before) {
    auto sink = std::make_shared<Sink>();
    RequestSpec spec;
    spec.prompt = {1, 2, 3};
    spec.sampling.seed = 1;
    spec.sampling.max_tokens = 5;
    EXPECT_TRUE(scheduler_->Submit(spec, sink, std::nullopt).ok());
    EXPECT_TRUE(peer.WaitBatches(batches_before + 1));
    return sink;
  }

  static ScratchDir* dir_;
  static ModelContext* model_;
  strata::testing::FakeClock clock_;
  std::shared_ptr<testing::FakeWorkerClient> client_ = std::make_shared<testing::FakeWorkerClient>();
  SessionTable sessions_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<bool> readiness_;
  std::unique_ptr<Cluster> cluster_;
  std::unique_ptr<Scheduler> scheduler_;
};

ScratchDir* ClusterTest::dir_ = nullptr;
ModelContext* ClusterTest::model_ = nullptr;

TEST_F(ClusterTest, RegisterAnswersAnIdAndTheIntervalAndHeartbeatsKnowIt) {
  Make();
  v1::RegisterRequest req = Worker("w0", kW0, 1000);
  v1::Device* gpu = req.add_devices();
  gpu->set_name("cuda:0");
  gpu->set_free_bytes(500);
  gpu->set_kv_pool_bytes(64);
  const v1::RegisterResponse resp = cluster_->Register(req);
  EXPECT_FALSE(resp.worker_id().empty());
  EXPECT_EQ(resp.heartbeat_interval_ms(), 500);
  EXPECT_TRUE(Known(resp.worker_id()));
  EXPECT_FALSE(Known("worker-999"));
  auto w = Info(kW0);
  ASSERT_TRUE(w);
  EXPECT_EQ(w->id, resp.worker_id());
  EXPECT_EQ(w->name, "w0");
  EXPECT_EQ(w->free_bytes, 1500u);
  EXPECT_EQ(w->kv_pool_bytes, 64u);
  EXPECT_TRUE(w->alive);
  // Without a name the address names the worker.
  cluster_->Register(Worker("", kW1));
  EXPECT_EQ(Info(kW1)->name, kW1);
}

TEST_F(ClusterTest, AWorkerSilentLongerThanDownAfterIsDownAndMustRegisterAgain) {
  Make(/*workers=*/3);  // never placed: only membership runs
  const std::string a = Register("w0", kW0);
  const std::string b = Register("w1", kW1);
  Start();
  Advance(absl::Seconds(2));
  ASSERT_TRUE(Known(b));  // w1 heartbeats at +2 s
  Advance(absl::Seconds(1));  // w0 silent for exactly 3 s: not yet down
  EXPECT_TRUE(Info(kW0)->alive);
  Advance(absl::Milliseconds(1));
  EXPECT_FALSE(Info(kW0)->alive);
  EXPECT_TRUE(Info(kW1)->alive);
  EXPECT_FALSE(Known(a)) << "a worker declared down is told to register again";
  Advance(absl::Seconds(2));  // w1 silent for 3.001 s now
  EXPECT_FALSE(Info(kW1)->alive);

  // Registering again at the same address replaces the entry.
  const std::string again = Register("w0", kW0);
  EXPECT_NE(again, a);
  EXPECT_TRUE(Known(again));
  EXPECT_FALSE(Known(a));
  int at_w0 = 0;
  for (const WorkerInfo& w : cluster_->workers()) at_w0 += w.address == kW0;
  EXPECT_EQ(at_w0, 1);
  EXPECT_TRUE(Info(kW0)->alive);
  EXPECT_FALSE(cluster_->ready());
  EXPECT_TRUE(client_->assigns().empty());
}

TEST_F(ClusterTest, EnoughAliveWorkersArePlacedAndStageZeroGetsTheStream) {
  Make();
  Register("w1", kW1);  // placement orders workers by name, not by arrival
  Register("w0", kW0);
  Start();
  ASSERT_TRUE(WaitReadiness(1));
  EXPECT_TRUE(cluster_->ready());
  EXPECT_EQ(cluster_->epoch(), 1);
  const auto assigns = client_->assigns();
  ASSERT_EQ(assigns.size(), 2u);
  std::map<std::string, v1::AssignLayersRequest> by;
  for (const auto& a : assigns) by[a.address] = a.req;
  ASSERT_TRUE(by.count(kW0) && by.count(kW1));
  const v1::AssignLayersRequest& s0 = by[kW0];
  const v1::AssignLayersRequest& s1 = by[kW1];
  EXPECT_EQ(s0.epoch(), 1);
  EXPECT_EQ(s1.epoch(), 1);
  EXPECT_EQ(s0.stage(), 0);
  EXPECT_EQ(s1.stage(), 1);
  EXPECT_EQ(s0.num_stages(), 2);
  EXPECT_EQ(s0.layer_begin(), 0);
  EXPECT_EQ(s0.layer_end(), s1.layer_begin());
  EXPECT_EQ(s1.layer_end(), 4);
  EXPECT_EQ(s0.next_address(), kW1);
  EXPECT_EQ(s1.next_address(), "");
  EXPECT_EQ(s0.model_dir(), dir_->path());
  EXPECT_EQ(client_->network().dials(kW0), 1);
  EXPECT_EQ(client_->network().dials(kW1), 0);
  const auto stages = cluster_->stages();
  ASSERT_EQ(stages.size(), 2u);
  EXPECT_EQ(stages[0].worker, "w0");
  EXPECT_EQ(stages[1].address, kW1);

  // The scheduler is up and its batches reach stage 0.
  auto peer = client_->network().WaitPeer(kW0);
  ASSERT_NE(peer, nullptr);
  auto sink = Running(*peer, 0);
  auto batches = peer->Batches();
  ASSERT_TRUE(batches.ok());
  EXPECT_EQ((*batches)[0].header.epoch(), 1);
}

TEST_F(ClusterTest, APlacedWorkerGoingSilentEndsRunningRequestsNamingItsStageUntilAReplacementIsPlaced) {
  Make();
  const std::string a = Register("w0", kW0);
  Register("w1", kW1);
  Start();
  ASSERT_TRUE(WaitReadiness(1));
  auto peer = client_->network().WaitPeer(kW0);
  ASSERT_NE(peer, nullptr);
  auto sink = Running(*peer, 0);

  Advance(absl::Seconds(2));
  ASSERT_TRUE(Known(a));
  Advance(absl::Milliseconds(1500));  // w1 silent for 3.5 s
  EXPECT_FALSE(WaitReadiness(2));
  const absl::Status st = sink->Wait();
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(st.message(), absl::StrCat("stage 1 (w1 at ", kW1, ") is down: no heartbeat for 3s"));
  EXPECT_FALSE(cluster_->ready());
  EXPECT_TRUE(cluster_->stages().empty());
  EXPECT_EQ(scheduler_->Submit(RequestSpec{}, std::make_shared<Sink>(), std::nullopt).code(),
            absl::StatusCode::kUnavailable);

  Register("w2", kW2);
  Advance(absl::Milliseconds(500));  // placement is retried every 0.5 s
  ASSERT_TRUE(WaitReadiness(3));
  EXPECT_EQ(cluster_->epoch(), 2);
  const auto assigns = client_->assigns();
  ASSERT_EQ(assigns.size(), 4u);
  std::set<std::string> placed;
  for (size_t i = 2; i < 4; ++i) {
    EXPECT_EQ(assigns[i].req.epoch(), 2);
    placed.insert(assigns[i].address);
  }
  EXPECT_EQ(placed, (std::set<std::string>{kW0, kW2}));
  EXPECT_TRUE(peer->WaitCancelled()) << "the old stream to stage 0 stays open";
  EXPECT_NE(client_->network().WaitPeer(kW0, 1), nullptr);
}

TEST_F(ClusterTest, WithMinWorkersTheRestIsPlacedAgain) {
  Make(/*workers=*/2, /*min_workers=*/1);
  const std::string a = Register("w0", kW0);
  Register("w1", kW1);
  Start();
  ASSERT_TRUE(WaitReadiness(1));
  EXPECT_EQ(cluster_->stages().size(), 2u);
  Advance(absl::Seconds(2));
  ASSERT_TRUE(Known(a));
  Advance(absl::Milliseconds(1500));
  EXPECT_FALSE(WaitReadiness(2));
  ASSERT_TRUE(WaitReadiness(3));
  const auto stages = cluster_->stages();
  ASSERT_EQ(stages.size(), 1u);
  EXPECT_EQ(stages[0].address, kW0);
  EXPECT_EQ(stages[0].layer_begin, 0);
  EXPECT_EQ(stages[0].layer_end, 4);
}

TEST_F(ClusterTest, ABrokenStreamToStageZeroTakesThePipelineDown) {
  Make();
  Register("w0", kW0);
  Register("w1", kW1);
  Start();
  ASSERT_TRUE(WaitReadiness(1));
  auto peer = client_->network().WaitPeer(kW0);
  ASSERT_NE(peer, nullptr);
  auto sink = Running(*peer, 0);
  peer->End(absl::UnavailableError("Connection reset by peer"));
  const absl::Status st = sink->Wait();
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(st.message(), absl::StrCat("stage 0 (w0) at ", kW0, " is unreachable (Connection reset by peer)"));
  EXPECT_FALSE(WaitReadiness(2));
  ASSERT_TRUE(WaitReadiness(3));  // both workers are alive: placed again
  EXPECT_EQ(cluster_->epoch(), 2);
}

TEST_F(ClusterTest, AStageThatLostItsSuccessorTakesThePipelineDown) {
  Make();
  Register("w0", kW0);
  Register("w1", kW1);
  Start();
  ASSERT_TRUE(WaitReadiness(1));
  auto peer = client_->network().WaitPeer(kW0);
  ASSERT_NE(peer, nullptr);
  auto first = Running(*peer, 0);
  auto second = Running(*peer, 1);  // in its own batch: two stages, two slots
  auto batches = peer->Batches();
  ASSERT_TRUE(batches.ok());
  ASSERT_EQ(batches->size(), 2u);
  v1::StageResult r;
  r.set_batch_id((*batches)[0].header.batch_id());
  r.set_code(static_cast<int>(absl::StatusCode::kUnavailable));
  r.set_failed_stage(1);
  r.set_error(absl::StrCat("stage 2 at ", kW2, " is unreachable"));
  peer->Reply(r);
  absl::Status st = first->Wait();
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(st.message(), absl::StrCat("stage 1: stage 2 at ", kW2, " is unreachable"));
  st = second->Wait();
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(st.message(), absl::StrCat("stage 1 is unavailable: stage 2 at ", kW2, " is unreachable"));
  EXPECT_FALSE(WaitReadiness(2));
  EXPECT_TRUE(WaitReadiness(3));
}

// Regression: a placed worker that restarted and registered again before it
// was declared down (a restart faster than down_after) replaced its entry
// without taking the pipeline down. The placement then still counted on a
// worker without layers: with no batch in flight nobody noticed the broken
// link, every later batch failed at that stage with FAILED_PRECONDITION, and
// the cluster was never placed again.
TEST_F(ClusterTest, APlacedWorkerRegisteringAgainTakesThePipelineDown) {
  Make();
  Register("w0", kW0);
  const std::string old_id = Register("w1", kW1);
  Start();
  ASSERT_TRUE(WaitReadiness(1));
  auto peer = client_->network().WaitPeer(kW0);
  ASSERT_NE(peer, nullptr);
  auto sink = Running(*peer, 0);

  const std::string new_id = Register("w1", kW1);  // restarted within down_after
  EXPECT_NE(new_id, old_id);
  EXPECT_FALSE(WaitReadiness(2));
  const absl::Status st = sink->Wait();
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(st.message(), absl::StrCat("stage 1 (w1 at ", kW1, ") registered again: it restarted and lost its layers"));
  ASSERT_TRUE(WaitReadiness(3));  // placed again, on the new registration
  EXPECT_EQ(cluster_->epoch(), 2);
  const auto assigns = client_->assigns();
  ASSERT_EQ(assigns.size(), 4u);
  EXPECT_EQ(assigns[2].req.epoch(), 2);
}

// The same restart while the layers are being assigned: the placement must
// not complete on the entry that was replaced.
TEST_F(ClusterTest, AWorkerRegisteringAgainDuringPlacementIsNotPlacedOnItsOldEntry) {
  Make();
  Register("w0", kW0);
  Register("w1", kW1);
  bool restarted = false;
  client_->SetAssignHook([&](const std::string& address) {
    if (address == kW1 && !restarted) {
      restarted = true;  // only the first placement's call
      cluster_->Register(Worker("w1", kW1));
    }
  });
  Start();
  ASSERT_TRUE(client_->WaitAssigns(2));
  Advance(absl::Milliseconds(1));
  EXPECT_FALSE(cluster_->ready());
  Advance(absl::Milliseconds(500));  // the retry places the new registration
  ASSERT_TRUE(WaitReadiness(1));
  EXPECT_EQ(cluster_->epoch(), 2);
  for (const WorkerInfo& w : cluster_->workers()) EXPECT_TRUE(w.alive) << w.id;
}

TEST_F(ClusterTest, AWorkerThatCannotBeReachedForAssignLayersIsDownUntilItRegistersAgain) {
  Make();
  client_->SetAssignStatus(kW1, absl::UnavailableError("failed to connect to all addresses"));
  Register("w0", kW0);
  const std::string b = Register("w1", kW1);
  Start();
  ASSERT_TRUE(client_->WaitAssigns(2));
  Advance(absl::Milliseconds(1));  // the failed round has ended
  EXPECT_FALSE(Info(kW1)->alive);
  EXPECT_FALSE(Known(b));
  EXPECT_FALSE(cluster_->ready());

  client_->SetAssignStatus(kW1, absl::OkStatus());
  Register("w1", kW1);
  Advance(absl::Milliseconds(500));  // placement is retried every 0.5 s
  ASSERT_TRUE(WaitReadiness(1));
  EXPECT_EQ(cluster_->epoch(), 2);
}

TEST_F(ClusterTest, AnAssignLayersRefusalKeepsTheWorkerAndIsRetried) {
  Make();
  client_->SetAssignStatus(kW1, absl::InvalidArgumentError("layer range [2, 4) cannot be cut"));
  Register("w0", kW0);
  const std::string b = Register("w1", kW1);
  Start();
  ASSERT_TRUE(client_->WaitAssigns(2));
  Advance(absl::Milliseconds(1));
  EXPECT_TRUE(Info(kW1)->alive);
  EXPECT_TRUE(Known(b));
  // The failed round set its retry 0.5 s after +0 or +1 ms (whichever it read).
  Advance(absl::Milliseconds(498));
  EXPECT_EQ(client_->assigns().size(), 2u) << "retried before 0.5 s";
  client_->SetAssignStatus(kW1, absl::OkStatus());
  Advance(absl::Milliseconds(2));
  ASSERT_TRUE(WaitReadiness(1));
}

TEST_F(ClusterTest, StageStatsAskEveryStageAndReportASilentOneDown) {
  Make();
  Register("w0", kW0);
  Register("w1", kW1);
  Start();
  ASSERT_TRUE(WaitReadiness(1));
  v1::WorkerStatsResponse s0;
  s0.set_sequences(3);
  s0.set_batches(9);
  client_->SetStats(kW0, s0);
  const auto stats = cluster_->StageStats();
  ASSERT_EQ(stats.size(), 2u);
  EXPECT_TRUE(stats[0].up());
  EXPECT_EQ(stats[0].sequences(), 3);
  EXPECT_EQ(stats[0].batches(), 9);
  EXPECT_EQ(stats[0].worker(), "w0");
  EXPECT_FALSE(stats[1].up());
  EXPECT_EQ(stats[1].address(), kW1);
}

}  // namespace
}  // namespace strata::coordinator
