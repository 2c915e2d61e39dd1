// DeepSeek-V4 served by a local cluster of real processes (docs/service.md,
// "DeepSeek-V4"): strata-coordinator, strata-worker(s) and strata-kvstore on
// loopback with the deepseek_v4 fixture. Greedy text equals transformers'
// continuation (reference.json); a session's turns equal an uninterrupted
// run of the in-process V4 engine, and it continues exactly from the KV store
// after its last worker is gone, across a restart of the KV store, and after
// a restart of the whole cluster under the other number of workers.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "common/testing/scratch_dir.h"
#include "gtest/gtest.h"
#include "kvstore/env.h"
#include "kvstore/inspect.h"
#include "model/v4/engine.h"
#include "nlohmann/json.hpp"
#include "tests/e2e/cluster_harness.h"

namespace strata::e2e {
namespace {

namespace fs = std::filesystem;

std::string Fixture() { return (fs::path(STRATA_SOURCE_DIR) / "tests/data/models/deepseek_v4").string(); }

nlohmann::json Reference() {
  std::ifstream f(fs::path(Fixture()) / "reference.json");
  return nlohmann::json::parse(f);
}

// The oracle: the in-process V4 engine, greedy (the first largest logit).
std::vector<int> V4Greedy(const std::vector<int>& prompt, int max_tokens) {
  auto engine = v4::V4Engine::Load(Fixture(), v4::V4EngineOptions{1});
  if (!engine.ok()) return {};
  auto seq = (*engine)->NewSequence();
  std::vector<int> out;
  std::vector<int> step = prompt;
  for (int i = 0; i < max_tokens; ++i) {
    std::vector<float> logits;
    v4::V4Chunk ch{seq.get(), step};
    if (!(*engine)->Forward({&ch, 1}, false, &logits).ok()) return {};
    const int best = static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    out.push_back(best);
    step = {best};
  }
  return out;
}

std::vector<int> Slice(const std::vector<int>& v, size_t a, size_t b) { return {v.begin() + a, v.begin() + b}; }

class V4ClusterTest : public ::testing::TestWithParam<int> {};

TEST_P(V4ClusterTest, GreedySessionsAndRestarts) {
  const int workers = GetParam();
  const nlohmann::json ref = Reference();
  const std::vector<int> prompt = ref["greedy_prompt"].get<std::vector<int>>();
  const std::vector<int> greedy = ref["greedy_f32"].get<std::vector<int>>();
  const ScratchDir scratch("v4_cluster_");
  HarnessOptions o;
  o.model_dir = Fixture();
  o.workers = workers;
  o.kv_dir = scratch.path();
  if (workers > 1) o.coordinator_flags = {"--min-workers", "1"};
  ClusterHarness c(o);
  ASSERT_TRUE(c.ok()) << c.error();

  // transformers' greedy continuation (teacher-free, f32).
  GenerateResult g = c.Generate(ClusterHarness::Greedy(prompt, static_cast<int>(greedy.size())));
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  EXPECT_EQ(g.tokens, greedy);

  // A session of two turns equals one uninterrupted run of the engine.
  const std::vector<int> p1 = Slice(prompt, 0, 40), p2 = Slice(prompt, 40, 50), p3 = Slice(prompt, 50, 53);
  v1::GenerateRequest t1 = ClusterHarness::Greedy(p1, 6);
  t1.set_session_id("chat");
  GenerateResult r1 = c.Generate(t1);
  ASSERT_TRUE(r1.status.ok()) << r1.status.error_message();
  EXPECT_EQ(r1.tokens, V4Greedy(p1, 6));
  v1::GenerateRequest t2 = ClusterHarness::Greedy(p2, 6);
  t2.set_session_id("chat");
  GenerateResult r2 = c.Generate(t2);
  ASSERT_TRUE(r2.status.ok()) << r2.status.error_message();
  std::vector<int> history = Concat(Concat(p1, r1.tokens), p2);
  EXPECT_EQ(r2.tokens, V4Greedy(history, 6));
  EXPECT_GE(r2.final_msg.usage().cached_tokens(), 40);  // only the new tokens were run

  // Saved: every token the stages hold is committed in the KV store.
  v1::SessionState state;
  ASSERT_TRUE(c.SaveSession("chat", &state).ok());
  const int64_t held = static_cast<int64_t>(history.size() + r2.tokens.size()) - 1;  // the last sampled is pending
  EXPECT_EQ(state.tokens(), held);

  // The last worker dies: with two workers the cluster goes on with one
  // (--min-workers 1), with one it waits for the restart; the session is
  // loaded onto the new placement from the store and its next turn equals
  // the uninterrupted run.
  c.KillWorker(workers - 1);
  if (workers == 1) {
    ASSERT_TRUE(c.WaitReady(false, 10));
    c.RestartWorker(0);
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(3500));  // the coordinator's --down-after-ms is 3 s
  }
  ASSERT_TRUE(c.WaitReady(true, 30));
  v1::GenerateRequest t3 = ClusterHarness::Greedy(p3, 6);
  t3.set_session_id("chat");
  GenerateResult r3;
  for (int attempt = 0; attempt < 20; ++attempt) {  // until the new placement is up
    r3 = c.Generate(t3);
    if (r3.status.error_code() != grpc::StatusCode::UNAVAILABLE) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  ASSERT_TRUE(r3.status.ok()) << r3.status.error_message();
  history = Concat(Concat(history, r2.tokens), p3);
  EXPECT_EQ(r3.tokens, V4Greedy(history, 6));
  EXPECT_GE(r3.final_msg.usage().cached_tokens(), 40);

  // The KV store is killed and restarted: the stages' appenders reconnect and
  // send again what it had not committed; the next turn is saved in full.
  c.KillKvStore();
  ASSERT_TRUE(c.RestartKvStore());
  const std::vector<int> p3b = Slice(prompt, 57, 60);
  v1::GenerateRequest t3b = ClusterHarness::Greedy(p3b, 6);
  t3b.set_session_id("chat");
  GenerateResult r3b = c.Generate(t3b);
  ASSERT_TRUE(r3b.status.ok()) << r3b.status.error_message();
  history = Concat(Concat(history, r3.tokens), p3b);
  EXPECT_EQ(r3b.tokens, V4Greedy(history, 6));
  // (The coordinator's channel reconnects within its 1 s backoff.)
  grpc::Status saved = c.SaveSession("chat", &state);
  for (int i = 0; i < 100 && saved.error_code() == grpc::StatusCode::UNAVAILABLE; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    saved = c.SaveSession("chat", &state);
  }
  ASSERT_TRUE(saved.ok()) << saved.error_message();
  EXPECT_EQ(state.tokens(), static_cast<int64_t>(history.size() + r3b.tokens.size()) - 1);
  c.Stop();

  // The whole cluster restarts with the other number of workers: the
  // session loads from the store (no recomputation) and continues exactly.
  HarnessOptions o2 = o;
  o2.workers = 3 - workers;
  o2.coordinator_flags.clear();
  ClusterHarness d(o2);
  ASSERT_TRUE(d.ok()) << d.error();
  const std::vector<int> p4 = Slice(prompt, 53, 57);  // (a fourth prompt; any ids do)
  v1::GenerateRequest t4 = ClusterHarness::Greedy(p4, 6);
  t4.set_session_id("chat");
  GenerateResult r4 = d.Generate(t4);
  ASSERT_TRUE(r4.status.ok()) << r4.status.error_message();
  history = Concat(Concat(history, r3b.tokens), p4);
  EXPECT_EQ(r4.tokens, V4Greedy(history, 6));
  EXPECT_EQ(r4.final_msg.usage().cached_tokens(), state.tokens());
  ASSERT_TRUE(d.SaveSession("chat", &state).ok());
  d.Stop();
  // The store's file is a v3 session with its manifest.
  kv::InspectOptions io;
  EXPECT_TRUE(kv::VerifyFile(kv::Env::Default(), scratch.path() + "/chat.coli_kv", io).ok())
      << kv::VerifyFile(kv::Env::Default(), scratch.path() + "/chat.coli_kv", io);
}

INSTANTIATE_TEST_SUITE_P(Workers, V4ClusterTest, ::testing::Values(1, 2));

}  // namespace
}  // namespace strata::e2e
