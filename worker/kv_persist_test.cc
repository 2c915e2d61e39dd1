// The worker's KV store client against a real in-process strata-kvstore:
// rows appended by two pipeline stages come back bit for bit (also under
// another layer split), the stored file verifies, and appenders survive a
// store restart.
#include "worker/kv_persist.h"

#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "common/testing/scratch_dir.h"
#include "gtest/gtest.h"
#include "kvstore/env.h"
#include "kvstore/inspect.h"
#include "kvstore/server/server.h"
#include "model/engine.h"
#include "model/random_model.h"
#include "strata/v1/kvstore.grpc.pb.h"

namespace strata::worker {
namespace {

namespace fs = std::filesystem;

constexpr const char* kConfig = R"({
  "model_type": "deepseek_v32", "vocab_size": 97, "hidden_size": 48, "intermediate_size": 64,
  "moe_intermediate_size": 16, "num_hidden_layers": 4, "num_attention_heads": 3,
  "num_key_value_heads": 3, "q_lora_rank": 24, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
  "qk_rope_head_dim": 8, "v_head_dim": 12, "n_routed_experts": 8, "n_shared_experts": 1,
  "num_experts_per_tok": 3, "n_group": 4, "topk_group": 2, "first_k_dense_replace": 1,
  "max_position_embeddings": 512, "index_n_heads": 4, "index_head_dim": 16, "index_topk": 8
})";
constexpr uint64_t kFingerprint = 0x1234abcd5678ef00ull;
constexpr KvModelId kModel{kFingerprint, 0};

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
}

void ExpectSameRows(const SequenceKv& a, int a_first_layer, const SequenceKv& b, int b_first_layer, int layers,
                    int tokens) {
  for (int l = 0; l < layers; ++l) {
    const LayerKv& x = a.layer(a_first_layer + l);
    const LayerKv& y = b.layer(b_first_layer + l);
    auto prefix = [&](const auto& v, size_t per) { return std::vector(v.begin(), v.begin() + per * tokens); };
    EXPECT_EQ(prefix(x.c_codes, a.kv_lora()), prefix(y.c_codes, b.kv_lora())) << l;
    EXPECT_EQ(prefix(x.r_codes, a.rope()), prefix(y.r_codes, b.rope())) << l;
    EXPECT_TRUE(SameBits(prefix(x.c_scale, 1), prefix(y.c_scale, 1))) << l;
    EXPECT_TRUE(SameBits(prefix(x.c, a.kv_lora()), prefix(y.c, b.kv_lora()))) << l;
    EXPECT_TRUE(SameBits(prefix(x.r, a.rope()), prefix(y.r, b.rope()))) << l;
    EXPECT_EQ(x.index_k.empty(), y.index_k.empty()) << l;
    if (!x.index_k.empty()) {
      EXPECT_TRUE(SameBits(prefix(x.index_k, a.index_dim()), prefix(y.index_k, b.index_dim()))) << l;
    }
  }
}

class KvPersistTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = MakeScratchDir("kv_persist_");
    fs::create_directories(root_ + "/model");
    ASSERT_TRUE(WriteRandomModel(root_ + "/model", kConfig).ok());
    EngineOptions o;
    o.kv_dtype = KvDtype::kFp8;
    o.num_threads = 1;
    o.layer_end = 2;
    stage0_ = *Engine::Load(root_ + "/model", o);
    o.layer_begin = 2;
    o.layer_end = -1;
    stage1_ = *Engine::Load(root_ + "/model", o);
    StartStore(0);
  }
  void TearDown() override {
    server_.reset();
    fs::remove_all(root_);
  }

  void StartStore(int port) {
    kv::ServerOptions so;
    so.listen_address = absl::StrCat("127.0.0.1:", port);
    so.store.dir = root_ + "/kv";
    so.store.commit_threads = 1;
    auto s = kv::KvStoreServer::Start(kv::Env::Default(), so);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
    address_ = absl::StrCat("127.0.0.1:", server_->port());
  }

  v1::SessionInfo Create(const std::string& id) {
    auto stub = v1::KVStore::NewStub(grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
    const ModelConfig& c = stage0_->config();
    v1::CreateSessionRequest req;
    req.set_session_id(id);
    req.mutable_dims()->set_n_layers(c.num_layers);
    req.mutable_dims()->set_kv_lora(c.kv_lora_rank);
    req.mutable_dims()->set_qk_rope(c.qk_rope_head_dim);
    req.mutable_dims()->set_index_hd(c.index_head_dim);
    req.mutable_dims()->set_nic(c.num_indexer_layers());
    req.mutable_dims()->set_vocab(c.vocab_size);
    for (int l = 0; l < c.num_layers; ++l) {
      if (c.indexer_slot(l) >= 0) req.add_indexer_layers(l);
    }
    req.set_fingerprint(kFingerprint);
    grpc::ClientContext ctx;
    v1::SessionInfo info;
    EXPECT_TRUE(stub->CreateSession(&ctx, req, &info).ok());
    return info;
  }

  // Runs `tokens` through both stages (one pipeline step).
  void Step(SequenceKv* k0, SequenceKv* k1, const std::vector<int>& tokens) {
    std::vector<float> hidden(tokens.size() * stage0_->config().hidden_size);
    ASSERT_TRUE(stage0_->Embed(tokens, hidden.data()).ok());
    SeqChunk c0{k0, tokens}, c1{k1, tokens};
    ASSERT_TRUE(stage0_->RunLayers({c0}, hidden.data()).ok());
    ASSERT_TRUE(stage1_->RunLayers({c1}, hidden.data()).ok());
  }

  static bool WaitCommitted(const KvAppender& a, int64_t n) {
    for (int i = 0; i < 1000; ++i) {
      if (a.committed() >= n) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

  static std::vector<int> Tokens(int n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<int> t(n);
    for (auto& x : t) x = static_cast<int>(rng() % 97);
    return t;
  }

  std::string root_, address_;
  std::unique_ptr<Engine> stage0_, stage1_;
  std::unique_ptr<kv::KvStoreServer> server_;
};

TEST_F(KvPersistTest, TwoStagesAppendAndTheRowsComeBackBitExactUnderAnotherSplit) {
  Create("chat");
  auto client = *KvStoreClient::Connect({address_});
  const SliceLayout l0 = MakeSliceLayout(stage0_->config(), 0, 2), l1 = MakeSliceLayout(stage1_->config(), 2, 4);
  auto k0 = stage0_->NewSequence(), k1 = stage1_->NewSequence();
  AppenderSpec s0{"chat", kModel, l0, 0, 0, std::nullopt};
  AppenderSpec s1{"chat", kModel, l1, 0, 0, std::nullopt};
  auto a0 = client->OpenAppender(s0);
  auto a1 = client->OpenAppender(s1);
  const std::vector<int> prompt = Tokens(13, 1);
  Step(k0.get(), k1.get(), prompt);
  a0->Append(0, prompt, *k0);
  a1->Append(0, prompt, *k1);
  std::vector<int> all = prompt;
  for (int i = 0; i < 6; ++i) {  // decode steps
    const std::vector<int> t = {static_cast<int>((i * 31 + 5) % 97)};
    const int at = k0->num_tokens();
    Step(k0.get(), k1.get(), t);
    a0->Append(at, t, *k0);
    a1->Append(at, t, *k1);
    all.push_back(t[0]);
  }
  const int n = static_cast<int>(all.size());
  ASSERT_TRUE(WaitCommitted(*a0, n) && WaitCommitted(*a1, n)) << a0->status() << a1->status();
  EXPECT_TRUE(a0->status().ok() && a1->status().ok());

  // Back into the same split.
  auto r0 = stage0_->NewSequence();
  std::vector<int> ids;
  ASSERT_TRUE(client->Load("chat", kModel, l0, n, r0.get(), &ids).ok());
  EXPECT_EQ(ids, all);
  ASSERT_EQ(r0->num_tokens(), n);
  ExpectSameRows(*k0, 0, *r0, 0, 2, n);
  // Under another split: layers [0, 3) and [3, 4).
  EngineOptions o;
  o.kv_dtype = KvDtype::kFp8;
  o.num_threads = 1;
  o.layer_end = 3;
  auto e03 = *Engine::Load(root_ + "/model", o);
  auto r03 = e03->NewSequence();
  ASSERT_TRUE(client->Load("chat", kModel, MakeSliceLayout(e03->config(), 0, 3), n, r03.get(), &ids).ok());
  ExpectSameRows(*k0, 0, *r03, 0, 2, n);
  ExpectSameRows(*k1, 0, *r03, 2, 1, n);
  // A fresh sequence continued from loaded rows gives the same next rows as
  // the original (nothing about the cache was lost).
  auto c1 = stage1_->NewSequence();
  ASSERT_TRUE(client->Load("chat", kModel, l1, n, c1.get(), &ids).ok());
  Step(r0.get(), c1.get(), {7});
  Step(k0.get(), k1.get(), {7});
  ExpectSameRows(*k1, 0, *c1, 0, 2, n + 1);
  // Another model's fingerprint is refused.
  auto bad = stage0_->NewSequence();
  EXPECT_EQ(client->Load("chat", KvModelId{kFingerprint + 1, 0}, l0, n, bad.get(), &ids).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(client->Load("nope", kModel, l0, 1, bad.get(), &ids).code(), absl::StatusCode::kNotFound);

  // Dropping the appenders closes their streams; the file verifies.
  a0.reset();
  a1.reset();
  client.reset();
  server_->Shutdown();
  kv::InspectOptions io;
  io.expected_fingerprint = kFingerprint;
  EXPECT_TRUE(kv::VerifyFile(kv::Env::Default(), root_ + "/kv/chat.coli_kv", io).ok());
}

TEST_F(KvPersistTest, AppendersSurviveAStoreRestart) {
  Create("resilient");
  KvStoreClientOptions co;
  co.address = address_;
  co.retry_max = absl::Milliseconds(200);
  auto client = *KvStoreClient::Connect(co);
  const SliceLayout l0 = MakeSliceLayout(stage0_->config(), 0, 2), l1 = MakeSliceLayout(stage1_->config(), 2, 4);
  auto k0 = stage0_->NewSequence(), k1 = stage1_->NewSequence();
  auto a0 = client->OpenAppender({"resilient", kModel, l0, 0, 0, std::nullopt});
  auto a1 = client->OpenAppender({"resilient", kModel, l1, 0, 0, std::nullopt});
  const std::vector<int> prompt = Tokens(9, 2);
  Step(k0.get(), k1.get(), prompt);
  a0->Append(0, prompt, *k0);
  a1->Append(0, prompt, *k1);
  ASSERT_TRUE(WaitCommitted(*a0, 9) && WaitCommitted(*a1, 9));
  const int port = server_->port();
  server_.reset();  // the store goes away
  const std::vector<int> more = Tokens(5, 3);
  Step(k0.get(), k1.get(), more);
  a0->Append(9, more, *k0);
  a1->Append(9, more, *k1);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(a0->status().ok());  // retrying, and saying why
  StartStore(port);
  ASSERT_TRUE(WaitCommitted(*a0, 14) && WaitCommitted(*a1, 14)) << a0->status();
  EXPECT_TRUE(a0->status().ok()) << a0->status();
  auto r1 = stage1_->NewSequence();
  std::vector<int> ids;
  ASSERT_TRUE(client->Load("resilient", kModel, l1, 14, r1.get(), &ids).ok());
  ExpectSameRows(*k1, 0, *r1, 0, 2, 14);
}

TEST_F(KvPersistTest, LoadedSessionContinuesAtAppendFromSkippingRecomputedRows) {
  Create("refeed");
  auto client = *KvStoreClient::Connect({address_});
  const SliceLayout l0 = MakeSliceLayout(stage0_->config(), 0, 2), l1 = MakeSliceLayout(stage1_->config(), 2, 4);
  auto k0 = stage0_->NewSequence(), k1 = stage1_->NewSequence();
  const std::vector<int> prompt = Tokens(10, 4);
  {
    auto a0 = client->OpenAppender({"refeed", kModel, l0, 0, 0, std::nullopt});
    auto a1 = client->OpenAppender({"refeed", kModel, l1, 0, 0, std::nullopt});
    Step(k0.get(), k1.get(), prompt);
    a0->Append(0, prompt, *k0);
    a1->Append(0, prompt, *k1);
    ASSERT_TRUE(WaitCommitted(*a0, 10) && WaitCommitted(*a1, 10));
  }
  // Resume as the coordinator does after a crash: load 9 records, feed the
  // 10th token again (its rows are not sent: append_from = 10), go on.
  auto r0 = stage0_->NewSequence(), r1 = stage1_->NewSequence();
  std::vector<int> ids;
  ASSERT_TRUE(client->Load("refeed", kModel, l0, 9, r0.get(), &ids).ok());
  ASSERT_TRUE(client->Load("refeed", kModel, l1, 9, r1.get(), &ids).ok());
  // (The first appenders' streams may still be closing: the new ones retry.)
  auto b0 = client->OpenAppender({"refeed", kModel, l0, 9, 10, 10});
  auto b1 = client->OpenAppender({"refeed", kModel, l1, 9, 10, 10});
  Step(r0.get(), r1.get(), {prompt[9]});
  b0->Append(9, {prompt[9]}, *r0);
  b1->Append(9, {prompt[9]}, *r1);
  Step(r0.get(), r1.get(), {42});
  Step(k0.get(), k1.get(), {42});
  b0->Append(10, {42}, *r0);
  b1->Append(10, {42}, *r1);
  ASSERT_TRUE(WaitCommitted(*b0, 11) && WaitCommitted(*b1, 11)) << b0->status() << b1->status();
  auto f1 = stage1_->NewSequence();
  ASSERT_TRUE(client->Load("refeed", kModel, l1, 11, f1.get(), &ids).ok());
  EXPECT_EQ(ids.back(), 42);
  ExpectSameRows(*k1, 0, *f1, 0, 2, 11);
}

}  // namespace
}  // namespace strata::worker
