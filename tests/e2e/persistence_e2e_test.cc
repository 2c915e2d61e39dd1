// End-to-end tests of session persistence: real strata-coordinator,
// strata-worker and strata-kvstore processes on loopback. Sessions survive a
// stop of the whole cluster, a restart under another worker count and a
// crash of every process; the stored file verifies and holds exactly the
// engine's cache rows.
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/testing/scratch_dir.h"
#include "gtest/gtest.h"
#include "kvstore/coli_kv_file.h"
#include "kvstore/env.h"
#include "kvstore/inspect.h"
#include "kvstore/manifest.h"
#include "model/engine.h"
#include "nlohmann/json.hpp"
#include "tests/e2e/cluster_harness.h"

namespace strata::e2e {
namespace {

namespace fs = std::filesystem;

std::string Fixture(const std::string& name) {
  return (fs::path(STRATA_SOURCE_DIR) / "tests/data/models" / name).string();
}

std::vector<int> ReferenceTokens(const std::string& name) {
  std::ifstream f(fs::path(Fixture(name)) / "reference.json");
  return nlohmann::json::parse(f)["tokens"].get<std::vector<int>>();
}

const v1::SessionState* Find(const v1::ListSessionsResponse& list, const std::string& id) {
  for (const auto& s : list.sessions()) {
    if (s.session_id() == id) return &s;
  }
  return nullptr;
}

// The records of `path` must hold exactly the in-process engine's fp8 cache
// rows for `tokens`, at the offsets docs/coli-kv.md gives (kv::RecordLayout):
// the token id, per layer the latent codes, latent scale, rope codes and rope
// scale, and the f32 keys of every indexer layer in slot order.
void ExpectFileHoldsTheEngineRows(const std::string& model, const std::string& path, const std::vector<int>& tokens) {
  auto reader = kv::ColiKvReader::Open(kv::Env::Default(), path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  ASSERT_EQ((*reader)->nrec(), static_cast<int64_t>(tokens.size()));
  EngineOptions o;
  o.kv_dtype = KvDtype::kFp8;
  o.num_threads = 1;
  auto engine = Engine::Load(model, o);
  ASSERT_TRUE(engine.ok());
  auto seq = (*engine)->NewSequence();
  std::vector<float> logits;
  SeqChunk ch{seq.get(), tokens};
  ASSERT_TRUE((*engine)->Forward({ch}, false, &logits).ok());
  const ModelConfig& cfg = (*engine)->config();
  const kv::RecordLayout& layout = (*reader)->layout();
  ASSERT_EQ(layout.dims().n_layers, cfg.num_layers);
  std::string records;
  ASSERT_TRUE((*reader)->ReadRecords(0, (*reader)->nrec(), kv::RecordFormat::kStored, &records).ok());
  const int64_t rec = layout.record_bytes();
  const int C = cfg.kv_lora_rank, R = cfg.qk_rope_head_dim;
  for (size_t p = 0; p < tokens.size(); ++p) {
    const char* r = records.data() + p * rec;
    EXPECT_EQ(std::memcmp(r, &tokens[p], 4), 0) << "token of record " << p;
    int slot = 0;
    for (int l = 0; l < cfg.num_layers; ++l) {
      const LayerKv& L = seq->layer(l);
      ASSERT_EQ(std::memcmp(r + layout.latent_offset(l), &L.c_codes[p * C], C), 0) << "record " << p << " layer " << l;
      ASSERT_EQ(std::memcmp(r + layout.latent_scale_offset(l), &L.c_scale[p], 4), 0) << p << " " << l;
      ASSERT_EQ(std::memcmp(r + layout.rope_offset(l), &L.r_codes[p * R], R), 0) << p << " " << l;
      ASSERT_EQ(std::memcmp(r + layout.rope_scale_offset(l), &L.r_scale[p], 4), 0) << p << " " << l;
      if (cfg.indexer_slot(l) >= 0) {
        const int K = cfg.index_head_dim;
        ASSERT_EQ(std::memcmp(r + layout.indexer_offset(slot), &L.index_k[p * K], K * 4), 0) << p << " " << l;
        ++slot;
      }
    }
    EXPECT_EQ(slot, layout.dims().nic);
  }
}

TEST(PersistenceTest, StoppedClusterResumesUnderAnotherWorkerCountWithTheSameTokens) {
  const std::string model = "deepseek_v32";
  const std::vector<int> ref = ReferenceTokens(model);
  const std::vector<int> prompt(ref.begin(), ref.begin() + 8);
  const std::vector<int> want = InProcessGreedy(Fixture(model), prompt, 30);
  ASSERT_EQ(want.size(), 30u);
  const ScratchDir scratch("kv_restart_");
  const std::string& kv_dir = scratch.path();
  std::vector<int> first_tokens;
  {
    ClusterHarness c({Fixture(model), 2, kv_dir});
    ASSERT_TRUE(c.ok()) << c.error();
    v1::GenerateRequest req = ClusterHarness::Greedy(prompt, 10);
    req.set_session_id("saved");
    GenerateResult a = c.Generate(req);
    ASSERT_TRUE(a.status.ok()) << a.status.error_message();
    first_tokens = a.tokens;
    v1::SessionState st;
    ASSERT_TRUE(c.SaveSession("saved", &st).ok());
    EXPECT_EQ(st.tokens(), 8 + 9);  // the 10th token is sampled, not yet fed
    EXPECT_TRUE(st.persistent());
  }  // every process stopped
  EXPECT_TRUE(std::equal(first_tokens.begin(), first_tokens.end(), want.begin()));
  const std::string path = kv_dir + "/saved.coli_kv";
  kv::InspectOptions io;
  EXPECT_TRUE(kv::VerifyFile(kv::Env::Default(), path, io).ok())
      << kv::InspectFile(kv::Env::Default(), path, io).value_or("");
  std::vector<int> stored = prompt;
  stored.insert(stored.end(), want.begin(), want.begin() + 9);
  ExpectFileHoldsTheEngineRows(Fixture(model), path, stored);
  auto manifest = kv::ReadManifest(kv::Env::Default(), kv::ManifestPath(path));
  ASSERT_TRUE(manifest.ok());
  EXPECT_EQ(manifest->metadata["strata.pending"], absl::StrCat(17, ":", want[9]));

  ClusterHarness c({Fixture(model), 3, kv_dir});
  ASSERT_TRUE(c.ok()) << c.error();
  ASSERT_EQ(c.Stats().stages_size(), 3);
  v1::ListSessionsResponse list;
  ASSERT_TRUE(c.ListSessions("sa", &list).ok());
  ASSERT_NE(Find(list, "saved"), nullptr);
  EXPECT_EQ(Find(list, "saved")->tokens(), 17);
  v1::SessionState st;
  ASSERT_TRUE(c.ResumeSession("saved", &st).ok());
  EXPECT_TRUE(st.resident());
  EXPECT_EQ(st.tokens(), 17);
  v1::GenerateRequest next = ClusterHarness::ContinueTurn("saved", 20);
  GenerateResult b = c.Generate(next);
  ASSERT_TRUE(b.status.ok()) << b.status.error_message();
  EXPECT_EQ(b.final_msg.usage().cached_tokens(), 17);  // loaded from the store, not recomputed
  EXPECT_EQ(Concat(first_tokens, b.tokens), want);
  // Delete goes through the store.
  ASSERT_TRUE(c.DeleteSession("saved").ok());
  EXPECT_FALSE(fs::exists(path));
  ASSERT_TRUE(c.ListSessions("", &list).ok());
  EXPECT_EQ(Find(list, "saved"), nullptr);
  EXPECT_EQ(c.DeleteSession("saved").error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(c.ResumeSession("saved", &st).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST(PersistenceTest, CrashOfEveryProcessMidTurnContinuesFromTheLastCommittedToken) {
  const std::string model = "deepseek_v3";
  const std::vector<int> ref = ReferenceTokens(model);
  const std::vector<int> prompt(ref.begin(), ref.begin() + 8);
  constexpr int kTotal = 90;
  const std::vector<int> want = InProcessGreedy(Fixture(model), prompt, kTotal);
  const ScratchDir scratch("kv_crash_");
  const std::string& kv_dir = scratch.path();
  GenerateResult got;
  {
    ClusterHarness c({Fixture(model), 2, kv_dir, {}, 1, {"--debug-step-delay-ms", "5"}});
    ASSERT_TRUE(c.ok()) << c.error();
    v1::GenerateRequest req = ClusterHarness::Greedy(prompt, kTotal);
    req.set_session_id("cut");
    std::thread t([&] { got = c.Generate(req); });
    for (int i = 0; i < 300 && c.Stats().generated_tokens() < 25; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    c.KillAll();
    t.join();
  }
  ASSERT_FALSE(got.status.ok());
  ASSERT_GE(got.tokens.size(), 20u);
  EXPECT_TRUE(std::equal(got.tokens.begin(), got.tokens.end(), want.begin()));
  ClusterHarness c({Fixture(model), 1, kv_dir});
  ASSERT_TRUE(c.ok()) << c.error();
  v1::ListSessionsResponse list;
  ASSERT_TRUE(c.ListSessions("", &list).ok());
  ASSERT_NE(Find(list, "cut"), nullptr);
  const int64_t nrec = Find(list, "cut")->tokens();
  ASSERT_GT(nrec, 8);  // the prompt and some generated tokens were committed
  ASSERT_LE(nrec, 8 + static_cast<int64_t>(got.tokens.size()));
  const int m = static_cast<int>(nrec - 8);  // generated tokens that were stored
  v1::SessionState st;
  ASSERT_TRUE(c.ResumeSession("cut", &st).ok());
  EXPECT_TRUE(st.resident());
  EXPECT_EQ(st.tokens(), nrec);
  v1::GenerateRequest cont = ClusterHarness::ContinueTurn("cut", kTotal - m);
  GenerateResult rest = c.Generate(cont);
  ASSERT_TRUE(rest.status.ok()) << rest.status.error_message();
  // Everything but the last stored token was loaded; that one was fed again.
  EXPECT_EQ(rest.final_msg.usage().cached_tokens(), nrec - 1);
  EXPECT_EQ(Concat(std::vector<int>(want.begin(), want.begin() + m), rest.tokens), want);
}

TEST(PersistenceTest, SessionsOfAnotherCheckpointAreRefusedWithAClearError) {
  // A copy of a fixture whose config.json differs by one byte: equal
  // dimensions, another model fingerprint.
  const ScratchDir scratch("kv_fingerprint_"), model_copy("kv_fingerprint_model_");
  const std::string& kv_dir = scratch.path();
  const std::string other = model_copy.path() + "/deepseek_v3";
  fs::copy(Fixture("deepseek_v3"), other, fs::copy_options::recursive);
  std::ofstream(other + "/config.json", std::ios::app) << "\n";
  const std::vector<int> prompt = {3, 1, 4, 1, 5};
  {
    ClusterHarness c({Fixture("deepseek_v3"), 1, kv_dir});
    ASSERT_TRUE(c.ok()) << c.error();
    v1::GenerateRequest req = ClusterHarness::Greedy(prompt, 4);
    req.set_session_id("mine");
    ASSERT_TRUE(c.Generate(req).status.ok());
    v1::SessionState st;
    ASSERT_TRUE(c.SaveSession("mine", &st).ok());
    // A session with persist=false cannot be saved.
    req.set_session_id("volatile");
    req.set_persist(false);
    ASSERT_TRUE(c.Generate(req).status.ok());
    EXPECT_EQ(c.SaveSession("volatile", &st).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_EQ(c.SaveSession("nobody", &st).error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_EQ(c.SaveSession("../x", &st).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  ClusterHarness c({other, 1, kv_dir});
  ASSERT_TRUE(c.ok()) << c.error();
  v1::SessionState st;
  grpc::Status s = c.ResumeSession("mine", &st);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("fingerprint"), std::string::npos) << s.error_message();
  v1::GenerateRequest req = ClusterHarness::ContinueTurn("mine", 4);
  GenerateResult r = c.Generate(req);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << r.status.error_message();
  // The cluster keeps serving, and the stored session is untouched.
  EXPECT_TRUE(c.Generate(ClusterHarness::Greedy(prompt, 4)).status.ok());
  c.Stop();
  EXPECT_TRUE(kv::VerifyFile(kv::Env::Default(), kv_dir + "/mine.coli_kv", kv::InspectOptions()).ok());
}

// A DeleteSession that fails (the KV store is down) frees the session's
// sequence on the stages but keeps the session: its next turn must reload the
// rows from the store, once it is back, and continue exactly (not feed a
// sequence the stages dropped).
TEST(PersistenceTest, AFailedDeleteLeavesASessionThatReloadsItsRows) {
  const std::string model = "deepseek_v32";
  const std::vector<int> ref = ReferenceTokens(model);
  const std::vector<int> prompt(ref.begin(), ref.begin() + 8);
  const std::vector<int> want = InProcessGreedy(Fixture(model), prompt, 20);
  const ScratchDir scratch("kv_failed_delete_");
  ClusterHarness c({Fixture(model), 2, scratch.path()});
  ASSERT_TRUE(c.ok()) << c.error();
  v1::GenerateRequest first = ClusterHarness::Greedy(prompt, 10);
  first.set_session_id("kept");
  GenerateResult a = c.Generate(first);
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  v1::SessionState saved;
  ASSERT_TRUE(c.SaveSession("kept", &saved).ok());
  c.KillKvStore();
  const grpc::Status deleted = c.DeleteSession("kept");
  EXPECT_EQ(deleted.error_code(), grpc::StatusCode::UNAVAILABLE) << deleted.error_message();
  ASSERT_TRUE(c.RestartKvStore());
  // The coordinator reconnects within its 1 s reconnect backoff.
  v1::ListSessionsResponse list;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!c.ListSessions("", &list).ok() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_NE(Find(list, "kept"), nullptr);
  v1::GenerateRequest next = ClusterHarness::ContinueTurn("kept", 10);
  GenerateResult b = c.Generate(next);
  ASSERT_TRUE(b.status.ok()) << b.status.error_message();
  EXPECT_EQ(Concat(a.tokens, b.tokens), want);
  // Loaded from the store, not recomputed: the prompt and 9 fed tokens.
  EXPECT_EQ(b.final_msg.usage().cached_tokens(), 8 + 9);
}

}  // namespace
}  // namespace strata::e2e
