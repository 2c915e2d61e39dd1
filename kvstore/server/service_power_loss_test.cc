// Power loss under the KV store *service*: several sessions, two append
// streams each (the halves of the layers), metadata updates, and the store's
// commit threads, all over gRPC on the fault-injection file system. The file
// system "crashes" at a random mutating operation, the server is shut down,
// power is lost (unsynced data dropped, some of it kept, some writes torn),
// and a new server opens the same files. Then every acknowledged fact must
// be there: a created session exists and opens with its checksums verified;
// nrec is at least the largest Committed nrec any stream was told; every
// committed record is byte for byte the one written, token id included; the
// manifest's metadata and turn watermark are the last acknowledged
// UpdateSession's (or the one in flight).
//
// (A SIGKILL test cannot see a missing sync — the page cache survives a
// killed process — so this is the test of the acknowledgement path's syncs.)
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "kvstore/fault_injection_env.h"
#include "kvstore/server/server.h"
#include "kvstore/test_util.h"
#include "strata/v1/kvstore.grpc.pb.h"

namespace strata::kv {
namespace {

namespace pb = strata::v1;

constexpr int kSessions = 3;
constexpr int64_t kTokens = 24;
constexpr int kUpdates = 4;
constexpr int kIterations = 250;

// What clients were told about one session.
struct Acks {
  std::atomic<bool> created{false};
  std::atomic<int64_t> nrec{0};  // largest Committed nrec of any of its streams
  std::mutex mu;
  std::optional<std::string> acked_k, pending_k;  // metadata "k"
  int64_t acked_watermark = 0;
  std::optional<int64_t> pending_watermark;
};

class ServicePowerLossTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dims_ = testing::RandomDims(rng_);
    dims_.n_layers = 2 + static_cast<int32_t>(rng_() % 4);
    dims_.index_hd = 1 + static_cast<int32_t>(rng_() % 4);
    dims_.nic = 1;
    indexer_layers_ = {dims_.n_layers - 1};
    for (int s = 0; s < kSessions; ++s) {
      models_.push_back(std::make_unique<testing::RecordModel>(rng_, dims_, indexer_layers_));
      for (int64_t p = 0; p < kTokens; ++p) models_.back()->Record(p);  // no lazy growth in threads
      splits_.push_back(1 + static_cast<int>(rng_() % (dims_.n_layers - 1)));
    }
  }

  static std::string Id(int s) { return absl::StrCat("s", s); }

  ServerOptions Options() const {
    ServerOptions o;
    o.store.dir = "/kv";
    o.store.commit_threads = 2;
    o.store.chunk_records = 4;
    return o;
  }

  pb::AppendRequest Rows(int s, int64_t from, int64_t to, int b, int e) const {
    pb::AppendRequest req;
    req.mutable_rows()->set_position(from);
    for (int64_t p = from; p < to; ++p) {
      req.mutable_rows()->add_token_ids(models_[s]->Token(p));
      req.mutable_rows()->mutable_rows()->append(models_[s]->Slice(p, b, e));
    }
    return req;
  }

  // One append stream of layers [b, e): random batches until every token is
  // sent or the stream breaks; a reader records every Committed nrec.
  void Stream(pb::KVStore::Stub* stub, int s, int b, int e, uint64_t seed, Acks* acks) const {
    std::mt19937_64 rng(seed);
    grpc::ClientContext ctx;
    auto rw = stub->Append(&ctx);
    pb::AppendRequest open;
    open.mutable_open()->set_session_id(Id(s));
    open.mutable_open()->set_layer_begin(b);
    open.mutable_open()->set_layer_end(e);
    open.mutable_open()->set_fingerprint(kFingerprint);
    if (!rw->Write(open)) {
      (void)rw->Finish();
      return;
    }
    pb::AppendResponse resp;
    if (!rw->Read(&resp) || !resp.has_opened()) {
      (void)rw->Finish();
      return;
    }
    std::thread reader([&] {
      pb::AppendResponse r;
      while (rw->Read(&r)) {
        if (!r.has_committed()) continue;
        int64_t seen = acks->nrec.load();
        while (r.committed().nrec() > seen && !acks->nrec.compare_exchange_weak(seen, r.committed().nrec())) {
        }
      }
    });
    for (int64_t p = resp.opened().next_position(); p < kTokens;) {
      const int64_t k = std::min<int64_t>(kTokens - p, 1 + static_cast<int64_t>(rng() % 6));
      if (!rw->Write(Rows(s, p, p + k, b, e))) break;
      p += k;
    }
    rw->WritesDone();
    reader.join();
    (void)rw->Finish();
  }

  // UpdateSession calls one after another, each recorded as pending before
  // it is sent and as acknowledged once it returned OK.
  void Updates(pb::KVStore::Stub* stub, int s, Acks* acks) const {
    for (int i = 1; i <= kUpdates; ++i) {
      pb::UpdateSessionRequest req;
      req.set_session_id(Id(s));
      const int64_t watermark = acks->nrec.load();
      req.set_turn_watermark(watermark);
      (*req.mutable_set_metadata())["k"] = std::to_string(i);
      {
        std::lock_guard<std::mutex> l(acks->mu);
        acks->pending_k = std::to_string(i);
        acks->pending_watermark = watermark;
      }
      grpc::ClientContext ctx;
      pb::SessionInfo info;
      if (!stub->UpdateSession(&ctx, req, &info).ok()) return;
      std::lock_guard<std::mutex> l(acks->mu);
      acks->acked_k = acks->pending_k;
      acks->acked_watermark = watermark;
      acks->pending_k.reset();
      acks->pending_watermark.reset();
    }
  }

  // Runs the clients against a server on `env` until they are done or the
  // file system has crashed; returns what they were told.
  std::vector<std::unique_ptr<Acks>> Work(FaultInjectionEnv& env) const {
    std::vector<std::unique_ptr<Acks>> acks;
    for (int s = 0; s < kSessions; ++s) acks.push_back(std::make_unique<Acks>());
    auto server = KvStoreServer::Start(&env, Options());
    if (!server.ok()) return acks;
    auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", (*server)->port()), grpc::InsecureChannelCredentials());
    auto stub = pb::KVStore::NewStub(channel);
    std::vector<std::thread> threads;
    for (int s = 0; s < kSessions; ++s) {
      threads.emplace_back([&, s, seed = seed_ + static_cast<uint64_t>(s)] {
        pb::CreateSessionRequest req;
        req.set_session_id(Id(s));
        pb::KvDims* d = req.mutable_dims();
        d->set_n_layers(dims_.n_layers);
        d->set_kv_lora(dims_.kv_lora);
        d->set_qk_rope(dims_.qk_rope);
        d->set_index_hd(dims_.index_hd);
        d->set_nic(dims_.nic);
        d->set_vocab(dims_.vocab);
        for (int32_t l : indexer_layers_) req.add_indexer_layers(l);
        req.set_fingerprint(kFingerprint);
        grpc::ClientContext ctx;
        pb::SessionInfo info;
        if (!stub->CreateSession(&ctx, req, &info).ok()) return;
        acks[s]->created = true;
        std::thread a([&] { Stream(stub.get(), s, 0, splits_[s], seed * 3, acks[s].get()); });
        std::thread b([&] { Stream(stub.get(), s, splits_[s], dims_.n_layers, seed * 3 + 1, acks[s].get()); });
        Updates(stub.get(), s, acks[s].get());
        a.join();
        b.join();
      });
    }
    for (auto& t : threads) t.join();
    (*server)->Shutdown();
    return acks;
  }

  // Opens the files after the power loss and checks them against the acks.
  void Check(FaultInjectionEnv& env, const std::vector<std::unique_ptr<Acks>>& acks) {
    auto server = KvStoreServer::Start(&env, Options());
    ASSERT_TRUE(server.ok()) << server.status();
    for (int s = 0; s < kSessions; ++s) {
      SCOPED_TRACE(Id(s));
      auto session = (*server)->store()->Get(Id(s), kFingerprint);
      if (!acks[s]->created) {
        if (session.ok()) EXPECT_LE((*session)->nrec(), kTokens);
        continue;
      }
      ASSERT_TRUE(session.ok()) << "an acknowledged session does not open: " << session.status();
      const int64_t n = (*session)->nrec();
      ASSERT_GE(n, acks[s]->nrec.load()) << "an acknowledged token was lost";
      ASSERT_LE(n, kTokens);
      std::vector<int32_t> tokens;
      std::string rows;
      ASSERT_TRUE((*session)->Read(0, n, 0, dims_.n_layers, &tokens, &rows).ok());
      for (int64_t p = 0; p < n; ++p) {
        ASSERT_EQ(tokens[static_cast<size_t>(p)], models_[s]->Token(p)) << "token id of record " << p;
        ASSERT_TRUE(std::string_view(rows).substr(static_cast<size_t>(p) * rows.size() / n, rows.size() / n) ==
                    models_[s]->Slice(p, 0, dims_.n_layers))
            << "record " << p << " is not what was written";
      }
      const Manifest m = (*session)->Info().manifest;
      std::lock_guard<std::mutex> l(acks[s]->mu);
      const auto k = m.metadata.find("k");
      const std::optional<std::string> have = k == m.metadata.end() ? std::nullopt : std::optional(k->second);
      EXPECT_TRUE(have == acks[s]->acked_k || (acks[s]->pending_k && have == acks[s]->pending_k))
          << "metadata k " << have.value_or("(absent)") << ", acknowledged " << acks[s]->acked_k.value_or("(absent)");
      EXPECT_TRUE(m.turn_watermark == acks[s]->acked_watermark ||
                  (acks[s]->pending_watermark && m.turn_watermark == *acks[s]->pending_watermark))
          << "turn watermark " << m.turn_watermark << ", acknowledged " << acks[s]->acked_watermark;
    }
    (*server)->Shutdown();
  }

  static constexpr uint64_t kFingerprint = 0x5eed5eed5eed5eedull;
  std::mt19937_64 rng_ = testing::FreshRng();
  const uint64_t seed_ = rng_();
  Dims dims_;
  std::vector<int32_t> indexer_layers_;
  std::vector<std::unique_ptr<testing::RecordModel>> models_;
  std::vector<int> splits_;
};

TEST_F(ServicePowerLossTest, AcknowledgedRecordsAndUpdatesSurvive) {
  // A run without a crash: every token committed, and how many mutating
  // operations such a run takes (the range of crash points).
  int64_t ops;
  {
    FaultInjectionEnv env;
    ASSERT_TRUE(env.CreateDir("/kv").ok());
    const auto acks = Work(env);
    ops = env.operation_count();
    for (int s = 0; s < kSessions; ++s) EXPECT_EQ(acks[s]->nrec.load(), kTokens);
    env.DropUnsyncedData();
    Check(env, acks);
  }
  ASSERT_GT(ops, 20);
  std::mt19937_64 rng(seed_);
  int after_acks = 0, before_the_end = 0;  // crashes that found acknowledged tokens / unfinished work
  for (int i = 0; i < kIterations && !HasFatalFailure(); ++i) {
    FaultInjectionEnv env;
    ASSERT_TRUE(env.CreateDir("/kv").ok());
    const int64_t crash_at = env.operation_count() + static_cast<int64_t>(rng() % static_cast<uint64_t>(ops));
    env.CrashAtOperation(crash_at);
    const auto acks = Work(env);
    const bool harsh = i % 4 != 0;
    if (harsh) {
      env.DropSomeUnsyncedData(rng());
    } else {
      env.DropUnsyncedData();
    }
    int64_t acked = 0;
    for (const auto& a : acks) acked += a->nrec.load();
    after_acks += acked > 0;
    before_the_end += acked < kSessions * kTokens;
    SCOPED_TRACE(::testing::Message() << "iteration " << i << ": crash at operation " << crash_at << " of about "
                                      << ops << ", " << (harsh ? "some unsynced data kept or torn" : "all unsynced data lost")
                                      << ", " << acked << " tokens acknowledged");
    Check(env, acks);
  }
  std::fprintf(stderr, "%d of %d crashes came after acknowledged tokens, %d before every token was\n", after_acks,
               kIterations, before_the_end);
  EXPECT_GT(after_acks, kIterations / 4);
  EXPECT_GT(before_the_end, kIterations / 4);
}

}  // namespace
}  // namespace strata::kv
