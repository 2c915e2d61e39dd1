// End-to-end tests of the distributed service: real strata-coordinator,
// strata-worker (and strata-kvstore) processes on loopback.
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/testing/scratch_dir.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "model/tokenizer.h"
#include "tests/e2e/cluster_harness.h"

namespace strata::e2e {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::string Fixture(const std::string& name) {
  return (fs::path(STRATA_SOURCE_DIR) / "tests/data/models" / name).string();
}

std::vector<int> ReferenceTokens(const std::string& name) {
  std::ifstream f(fs::path(Fixture(name)) / "reference.json");
  nlohmann::json j = nlohmann::json::parse(f);
  return j["tokens"].get<std::vector<int>>();
}

int CutPoints(const std::string& name) {
  // Fixtures with shared DSA layers allow fewer cuts (glm_moe_dsa: before 0 and 1).
  return name == "glm_moe_dsa" ? 2 : 4;
}

class StagesTest : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(StagesTest, GreedyTokensEqualTheInProcessEngine) {
  const auto& [model, workers] = GetParam();
  const std::vector<int> ref = ReferenceTokens(model);
  const std::vector<int> prompt(ref.begin(), ref.begin() + 8);
  const std::vector<int> want = InProcessGreedy(Fixture(model), prompt, 24);
  ASSERT_EQ(want.size(), 24u);
  ClusterHarness c({Fixture(model), workers});
  ASSERT_TRUE(c.ok()) << c.error();
  v1::StatsResponse stats = c.Stats();
  EXPECT_EQ(stats.stages_size(), std::min(workers, CutPoints(model)));
  int covered = 0;
  for (const auto& s : stats.stages()) {
    EXPECT_EQ(s.layer_begin(), covered);
    EXPECT_GT(s.layer_end(), s.layer_begin());
    covered = s.layer_end();
  }
  EXPECT_EQ(covered, 4);
  GenerateResult r = c.Generate(ClusterHarness::Greedy(prompt, 24));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.tokens, want);
  ASSERT_TRUE(r.got_final);
  EXPECT_EQ(r.final_msg.finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(r.final_msg.usage().prompt_tokens(), 8);
  EXPECT_EQ(r.final_msg.usage().completion_tokens(), 24);
  // A long prompt runs as several prefill chunks: same tokens as in-process.
  const std::vector<int> long_prompt(ref.begin(), ref.begin() + 40);
  v1::GenerateRequest lr = ClusterHarness::Greedy(long_prompt, 8);
  GenerateResult l = c.Generate(lr);
  ASSERT_TRUE(l.status.ok()) << l.status.error_message();
  EXPECT_EQ(l.tokens, InProcessGreedy(Fixture(model), long_prompt, 8));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, StagesTest,
                         ::testing::Combine(::testing::Values("deepseek_v3", "deepseek_v32", "glm_moe_dsa",
                                                              "glm4_moe_lite"),
                                            ::testing::Values(1, 2, 3)),
                         [](const auto& info) {
                           return absl::StrCat(std::get<0>(info.param), "_", std::get<1>(info.param), "workers");
                         });

TEST(ServiceTest, ConcurrentStreamsGiveTheTokensTheyGiveAlone) {
  const std::string model = "deepseek_v32";
  const std::vector<int> ref = ReferenceTokens(model);
  ClusterHarness c({Fixture(model), 3, "", {"--prefill-chunk", "7"}});
  ASSERT_TRUE(c.ok()) << c.error();
  constexpr int kStreams = 32;
  std::vector<std::vector<int>> prompts(kStreams), want(kStreams);
  for (int i = 0; i < kStreams; ++i) {
    const int len = 3 + i % 13;
    prompts[i].assign(ref.begin() + i, ref.begin() + i + len);
    want[i] = InProcessGreedy(Fixture(model), prompts[i], 12 + i % 5);
  }
  std::vector<GenerateResult> got(kStreams);
  std::vector<std::thread> threads;
  for (int i = 0; i < kStreams; ++i) {
    threads.emplace_back([&, i] { got[i] = c.Generate(ClusterHarness::Greedy(prompts[i], 12 + i % 5)); });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kStreams; ++i) {
    ASSERT_TRUE(got[i].status.ok()) << i << ": " << got[i].status.error_message();
    EXPECT_EQ(got[i].tokens, want[i]) << "stream " << i;
  }
  // The streams shared batches: fewer batches than generated tokens.
  v1::StatsResponse s = c.Stats();
  int64_t tokens = 0;
  for (int i = 0; i < kStreams; ++i) tokens += static_cast<int64_t>(want[i].size());
  ASSERT_EQ(s.stages_size(), 3);
  EXPECT_LT(s.stages(0).batches(), tokens);
  EXPECT_EQ(s.generated_tokens(), tokens);
}

bool WaitForBaseline(ClusterHarness& c, double timeout_s) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  while (Clock::now() < deadline) {
    v1::StatsResponse s = c.Stats();
    bool clean = s.active_requests() == 0 && s.stages_size() > 0;
    for (const auto& st : s.stages()) clean = clean && st.up() && st.sequences() == 0 && st.kv_pages() == 0;
    if (clean) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

TEST(ServiceTest, AbortAndCancellationFreeTheKvOnEveryStage) {
  const std::string model = "deepseek_v3";
  const std::vector<int> ref = ReferenceTokens(model);
  ClusterHarness c({Fixture(model), 2, "", {}, 1, {"--debug-step-delay-ms", "5"}});
  ASSERT_TRUE(c.ok()) << c.error();
  ASSERT_TRUE(WaitForBaseline(c, 5));
  constexpr int kAborted = 4;
  std::vector<GenerateResult> got(kAborted + 1);
  std::vector<std::thread> threads;
  for (int i = 0; i < kAborted; ++i) {
    threads.emplace_back([&, i] {
      v1::GenerateRequest req = ClusterHarness::Greedy({ref.begin() + i, ref.begin() + i + 6}, 200);
      req.set_request_id(absl::StrCat("abort-me-", i));
      got[i] = c.Generate(req);
    });
  }
  // One more stream whose client goes away (deadline) instead.
  threads.emplace_back([&] { got[kAborted] = c.Generate(ClusterHarness::Greedy({1, 2, 3}, 200), 0.3); });
  // Wait until the streams hold KV on every stage.
  bool busy = false;
  for (int i = 0; i < 100 && !busy; ++i) {
    v1::StatsResponse s = c.Stats();
    busy = s.stages_size() == 2 && s.stages(1).sequences() >= kAborted;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(busy);
  for (int i = 0; i < kAborted; ++i) {
    grpc::ClientContext ctx;
    v1::AbortRequest ar;
    ar.set_request_id(absl::StrCat("abort-me-", i));
    v1::AbortResponse resp;
    ASSERT_TRUE(c.stub().Abort(&ctx, ar, &resp).ok());
    EXPECT_TRUE(resp.found());
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kAborted; ++i) {
    ASSERT_TRUE(got[i].status.ok()) << got[i].status.error_message();
    ASSERT_TRUE(got[i].got_final);
    EXPECT_EQ(got[i].final_msg.finish_reason(), v1::FINISH_REASON_ABORT);
    EXPECT_LT(got[i].tokens.size(), 200u);
  }
  EXPECT_EQ(got[kAborted].status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  // Abort is idempotent.
  grpc::ClientContext ctx;
  v1::AbortRequest ar;
  ar.set_request_id("abort-me-0");
  v1::AbortResponse resp;
  ASSERT_TRUE(c.stub().Abort(&ctx, ar, &resp).ok());
  EXPECT_FALSE(resp.found());
  EXPECT_TRUE(WaitForBaseline(c, 5)) << c.Stats().DebugString();
}

grpc::StatusCode CodeOf(ClusterHarness& c, const v1::GenerateRequest& req, std::string* msg = nullptr) {
  GenerateResult r = c.Generate(req, 10);
  if (msg) *msg = r.status.error_message();
  return r.status.error_code();
}

TEST(ServiceTest, BadRequestsGetClearErrorsAndTheClusterKeepsServing) {
  const std::string model = "glm4_moe_lite";
  const std::vector<int> ref = ReferenceTokens(model);
  const std::vector<int> prompt(ref.begin(), ref.begin() + 8);
  ClusterHarness c({Fixture(model), 2, "", {"--max-running", "2", "--max-queued", "0"}});
  ASSERT_TRUE(c.ok()) << c.error();
  std::string msg;
  EXPECT_EQ(CodeOf(c, ClusterHarness::Greedy({}, 4), &msg), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(msg.find("prompt is empty"), std::string::npos) << msg;
  EXPECT_EQ(CodeOf(c, ClusterHarness::Greedy(prompt, 0), &msg), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(msg.find("max_tokens"), std::string::npos) << msg;
  EXPECT_EQ(CodeOf(c, ClusterHarness::Greedy(prompt, -3)), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(CodeOf(c, ClusterHarness::Greedy(prompt, 100000), &msg), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(msg.find("context"), std::string::npos) << msg;
  EXPECT_EQ(CodeOf(c, ClusterHarness::Greedy({1, 999999}, 4), &msg), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(msg.find("vocabulary"), std::string::npos) << msg;
  std::vector<int> too_long(300, 5);
  EXPECT_EQ(CodeOf(c, ClusterHarness::Greedy(too_long, 4)), grpc::StatusCode::INVALID_ARGUMENT);
  v1::GenerateRequest bad = ClusterHarness::Greedy(prompt, 4);
  bad.mutable_sampling()->set_temperature(-1);
  EXPECT_EQ(CodeOf(c, bad, &msg), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(msg.find("temperature"), std::string::npos) << msg;
  bad = ClusterHarness::Greedy(prompt, 4);
  bad.mutable_sampling()->set_top_p(1.5f);
  EXPECT_EQ(CodeOf(c, bad, &msg), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(msg.find("top_p"), std::string::npos) << msg;
  bad = ClusterHarness::Greedy(prompt, 4);
  bad.set_logprobs(1000);
  EXPECT_EQ(CodeOf(c, bad), grpc::StatusCode::INVALID_ARGUMENT);
  bad = ClusterHarness::Greedy(prompt, 4);
  bad.set_session_id("../etc/passwd");
  EXPECT_EQ(CodeOf(c, bad), grpc::StatusCode::INVALID_ARGUMENT);
  bad = ClusterHarness::ContinueTurn("no-such-session", 4);
  EXPECT_EQ(CodeOf(c, bad, &msg), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(msg.find("no-such-session"), std::string::npos) << msg;
  {
    grpc::ClientContext ctx;
    v1::ResumeSessionRequest r;
    r.set_session_id("no-such-session");
    v1::SessionState s;
    EXPECT_EQ(c.stub().ResumeSession(&ctx, r, &s).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  {
    grpc::ClientContext ctx;
    v1::DeleteSessionRequest r;
    r.set_session_id("no-such-session");
    v1::DeleteSessionResponse s;
    EXPECT_EQ(c.stub().DeleteSession(&ctx, r, &s).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  // Text needs a tokenizer, which this fixture does not have.
  bad = ClusterHarness::Greedy({}, 4);
  bad.set_prompt("hello");
  EXPECT_EQ(CodeOf(c, bad), grpc::StatusCode::FAILED_PRECONDITION);
  // An oversized message is refused by the transport (16 MiB limit).
  v1::GenerateRequest huge = ClusterHarness::Greedy({}, 4);
  huge.set_prompt(std::string(17 << 20, 'a'));
  EXPECT_EQ(CodeOf(c, huge), grpc::StatusCode::RESOURCE_EXHAUSTED);
  // Garbage bytes on the port.
  {
    const std::string addr = c.address();
    const int port = std::stoi(addr.substr(addr.rfind(':') + 1));
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(port);
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
    std::string junk(4096, '\0');
    for (size_t i = 0; i < junk.size(); ++i) junk[i] = static_cast<char>((i * 131 + 7) & 0xff);
    ASSERT_GT(write(fd, junk.data(), junk.size()), 0);
    close(fd);
  }
  // Admission: 2 running, no queue -> the third concurrent stream is refused.
  {
    ClusterHarness slow({Fixture(model), 1, "", {"--max-running", "2", "--max-queued", "0"}, 1,
                         {"--debug-step-delay-ms", "5"}});
    ASSERT_TRUE(slow.ok()) << slow.error();
    std::vector<GenerateResult> got(2);
    std::vector<std::thread> ts;
    for (int i = 0; i < 2; ++i) ts.emplace_back([&, i] { got[i] = slow.Generate(ClusterHarness::Greedy(prompt, 60)); });
    bool full = false;
    for (int i = 0; i < 100 && !full; ++i) {
      full = slow.Stats().active_requests() == 2;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_TRUE(full);
    EXPECT_EQ(CodeOf(slow, ClusterHarness::Greedy(prompt, 4), &msg), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_NE(msg.find("full"), std::string::npos) << msg;
    for (auto& t : ts) t.join();
    for (auto& g : got) EXPECT_TRUE(g.status.ok());
  }
  // After all of that the cluster still serves correct tokens.
  GenerateResult r = c.Generate(ClusterHarness::Greedy(prompt, 16));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.tokens, InProcessGreedy(Fixture(model), prompt, 16));
}

TEST(ServiceTest, SessionsContinueWithoutRecomputation) {
  const std::string model = "deepseek_v32";
  const std::vector<int> ref = ReferenceTokens(model);
  const std::vector<int> prompt(ref.begin(), ref.begin() + 8);
  const std::vector<int> want = InProcessGreedy(Fixture(model), prompt, 30);
  ClusterHarness c({Fixture(model), 2});
  ASSERT_TRUE(c.ok()) << c.error();
  v1::GenerateRequest first = ClusterHarness::Greedy(prompt, 10);
  first.set_session_id("chat-1");
  GenerateResult a = c.Generate(first);
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  v1::GenerateRequest next = ClusterHarness::ContinueTurn("chat-1", 20);
  GenerateResult b = c.Generate(next);
  ASSERT_TRUE(b.status.ok()) << b.status.error_message();
  EXPECT_EQ(Concat(a.tokens, b.tokens), want);
  // Prompt + 9 fed tokens were in the stages' KV already.
  EXPECT_EQ(b.final_msg.usage().cached_tokens(), 8 + 9);
  EXPECT_EQ(b.final_msg.session_tokens(), 8 + 29);
}

TEST(ServiceTest, KilledWorkerEndsStreamsWithUnavailableAndTheSessionResumesExactly) {
  const std::string model = "deepseek_v3";
  const std::vector<int> ref = ReferenceTokens(model);
  const std::vector<int> prompt(ref.begin(), ref.begin() + 8);
  constexpr int kTotal = 120;
  const std::vector<int> want = InProcessGreedy(Fixture(model), prompt, kTotal);
  // With a KV store: the session resumes from the stored rows.
  const ScratchDir scratch("kv_killed_");
  const std::string& kv_dir = scratch.path();
  ClusterHarness c({Fixture(model), 3, kv_dir, {}, 1, {"--debug-step-delay-ms", "4"}});
  ASSERT_TRUE(c.ok()) << c.error();
  v1::GenerateRequest req = ClusterHarness::Greedy(prompt, kTotal);
  req.set_session_id("survivor");
  GenerateResult got;
  std::thread t([&] { got = c.Generate(req); });
  // Let it produce some tokens, then kill the middle stage.
  for (int i = 0; i < 200; ++i) {
    if (c.Stats().generated_tokens() >= 15) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const auto killed_at = Clock::now();
  c.KillWorker(1);
  t.join();
  const double after_ms = std::chrono::duration<double, std::milli>(Clock::now() - killed_at).count();
  EXPECT_EQ(got.status.error_code(), grpc::StatusCode::UNAVAILABLE) << got.status.error_message();
  EXPECT_NE(got.status.error_message().find("stage"), std::string::npos) << got.status.error_message();
  EXPECT_LT(after_ms, 5000);
  ASSERT_GE(got.tokens.size(), 10u);
  ASSERT_LT(got.tokens.size(), static_cast<size_t>(kTotal));
  EXPECT_TRUE(std::equal(got.tokens.begin(), got.tokens.end(), want.begin()));
  // New requests are refused while the stage is missing.
  ASSERT_TRUE(c.WaitReady(false, 5));
  EXPECT_EQ(CodeOf(c, ClusterHarness::Greedy(prompt, 2)), grpc::StatusCode::UNAVAILABLE);
  c.RestartWorker(1);
  ASSERT_TRUE(c.WaitReady(true, 30));
  v1::GenerateRequest cont = ClusterHarness::ContinueTurn("survivor", kTotal - static_cast<int>(got.tokens.size()));
  GenerateResult rest = c.Generate(cont);
  ASSERT_TRUE(rest.status.ok()) << rest.status.error_message();
  EXPECT_EQ(Concat(got.tokens, rest.tokens), want);
  // The stages loaded what the KV store had committed (at least the prompt)
  // instead of recomputing the conversation.
  EXPECT_GE(rest.final_msg.usage().cached_tokens(), 8);
  EXPECT_LE(rest.final_msg.usage().cached_tokens(), 8 + static_cast<int>(got.tokens.size()));
}

}  // namespace
}  // namespace strata::e2e

namespace strata::e2e {
namespace {

// Regression: a text prompt appended to a session that already holds tokens
// must not carry the tokenizer's BOS again (it starts a conversation once).
TEST(ServiceTest, TextAppendedToASessionDropsTheBos) {
  const std::string demo = std::string(STRATA_SOURCE_DIR) + "/models/demo";
  auto tok = Tokenizer::FromFile(demo + "/tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.status();
  auto first_ids = (*tok)->Encode("The list type", true);
  auto next_ids = (*tok)->Encode(" and the dict type", true);
  ASSERT_TRUE(first_ids.ok() && next_ids.ok());
  ASSERT_EQ((*next_ids)[0], 0);  // the demo tokenizer adds BOS (id 0)
  ClusterHarness c({demo, 1});
  ASSERT_TRUE(c.ok()) << c.error();
  v1::GenerateRequest a;
  a.set_prompt("The list type");
  a.mutable_sampling()->set_temperature(0);
  a.mutable_stopping()->set_max_tokens(4);
  a.mutable_stopping()->set_ignore_eos(true);
  a.set_session_id("text-1");
  GenerateResult ra = c.Generate(a);
  ASSERT_TRUE(ra.status.ok()) << ra.status.error_message();
  // session_tokens counts the tokens the stages hold: all but the last sampled one.
  EXPECT_EQ(ra.final_msg.session_tokens(), static_cast<int64_t>(first_ids->size()) + 4 - 1);
  v1::GenerateRequest b = a;
  b.set_prompt(" and the dict type");
  GenerateResult rb = c.Generate(b);
  ASSERT_TRUE(rb.status.ok()) << rb.status.error_message();
  EXPECT_EQ(rb.final_msg.session_tokens(),
            static_cast<int64_t>(first_ids->size() + 4 + (next_ids->size() - 1) + 4 - 1));
}

}  // namespace
}  // namespace strata::e2e

namespace strata::e2e {
namespace {

// A worker that hangs (SIGSTOP: its connections stay open, only its
// heartbeats stop) is declared down after --down-after-ms (2 s here, four
// heartbeat intervals), and the streams that need it end with UNAVAILABLE
// naming the stage within 5 s of the pause.
TEST(ServiceTest, HungWorkerIsDeclaredDownByItsMissingHeartbeats) {
  const std::string model = "deepseek_v3";
  const std::vector<int> ref = ReferenceTokens(model);
  const std::vector<int> prompt(ref.begin(), ref.begin() + 8);
  ClusterHarness c({Fixture(model), 2, "", {"--down-after-ms", "2000"}, 1, {"--debug-step-delay-ms", "20"}});
  ASSERT_TRUE(c.ok()) << c.error();
  GenerateResult got;
  std::thread t([&] { got = c.Generate(ClusterHarness::Greedy(prompt, 240), 30); });
  for (int i = 0; i < 300; ++i) {
    if (c.Stats().generated_tokens() >= 5) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const auto paused_at = Clock::now();
  c.PauseWorker(1);
  t.join();
  const double after_ms = std::chrono::duration<double, std::milli>(Clock::now() - paused_at).count();
  c.ContinueWorker(1);
  EXPECT_EQ(got.status.error_code(), grpc::StatusCode::UNAVAILABLE) << got.status.error_message();
  EXPECT_NE(got.status.error_message().find("stage"), std::string::npos) << got.status.error_message();
  EXPECT_LT(after_ms, 5000.0);
  EXPECT_FALSE(got.tokens.empty());
}

}  // namespace
}  // namespace strata::e2e
