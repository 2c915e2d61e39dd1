// Metrics and logs of a real cluster (docs/metrics.md, docs/logging.md): a
// generation moves the counters every worker and the KV store serve on
// --metrics-listen, and the daemons' structured logs carry each request,
// session and worker event with its ids, never an API token, and the prompt
// and completion text only with the coordinator's --log-prompts.
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/testing/metrics_text.h"
#include "common/testing/scratch_dir.h"
#include "common/testing/test_certs.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/e2e/cluster_harness.h"

namespace strata::e2e {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;
using strata::testing::MetricValue;

// Sums every series of family `name` (any labels; histograms: pass the
// `_count` or `_sum` name) whose labels contain `filter`.
double Sum(const std::string& body, const std::string& name, const std::string& filter = "") {
  double total = 0;
  std::istringstream in(body);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name, 0) != 0 || line.size() <= name.size()) continue;
    const char next = line[name.size()];
    if (next != ' ' && next != '{') continue;
    const size_t space = line.rfind(' ');
    if (!filter.empty() && line.substr(0, space).find(filter) == std::string::npos) continue;
    total += std::stod(line.substr(space + 1));
  }
  return total;
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Every daemon's output in the harness's log folder, by file name (the
// tokens file the harness writes for the coordinator is not a log).
std::vector<std::pair<std::string, std::string>> Logs(const ClusterHarness& c) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& e : fs::directory_iterator(c.log_dir())) {
    const std::string name = e.path().filename().string();
    if (name.size() > 4 && (name.ends_with(".log") || name.ends_with(".out"))) {
      out.emplace_back(name, ReadFile(e.path().string()));
    }
  }
  return out;
}

// The log lines (ts=... level=... event=EVENT ...) of one event.
std::vector<std::string> Events(const std::string& log, const std::string& event) {
  std::vector<std::string> out;
  std::istringstream in(log);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("ts=", 0) == 0 && line.find(" event=" + event + " ") != std::string::npos) out.push_back(line);
  }
  return out;
}

TEST(ObservabilityTest, AGenerationMovesTheWorkersAndTheKvStoresCounters) {
  const std::string kv = MakeScratchDir("observability_kv_");
  HarnessOptions o;
  o.model_dir = (fs::path(STRATA_SOURCE_DIR) / "tests/data/models/deepseek_v3").string();
  o.workers = 2;
  o.kv_dir = kv;
  o.metrics = true;
  ClusterHarness c(o);
  ASSERT_TRUE(c.ok()) << c.error();
  const std::string w0 = c.WorkerMetricsAddress(0), w1 = c.WorkerMetricsAddress(1), store = c.KvStoreMetricsAddress();
  ASSERT_FALSE(w0.empty() || w1.empty() || store.empty()) << "no metrics line in " << c.log_dir();

  auto workers = [&] { return ClusterHarness::Scrape(w0) + ClusterHarness::Scrape(w1); };
  const std::string before = workers(), kv_before = ClusterHarness::Scrape(store);
  ASSERT_FALSE(before.empty() || kv_before.empty());
  // Both stages are assigned and ready; nothing ran yet.
  EXPECT_EQ(Sum(before, "strata_worker_ready"), 2);
  EXPECT_EQ(MetricValue(before, R"(strata_worker_ready{stage="0"})").has_value() +
                MetricValue(before, R"(strata_worker_ready{stage="1"})").has_value(),
            2);
  EXPECT_EQ(Sum(before, "strata_worker_steps_total"), 0);
  EXPECT_EQ(Sum(kv_before, "strata_kvstore_appended_bytes_total"), 0);

  v1::GenerateRequest req = ClusterHarness::Greedy({1, 2, 3, 4, 5, 6}, 5);
  req.set_session_id("metrics-1");
  GenerateResult r = c.Generate(req);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  ASSERT_EQ(r.tokens.size(), 5u);
  v1::SessionState saved;
  ASSERT_TRUE(c.SaveSession("metrics-1", &saved).ok());  // every row committed in the store

  const std::string after = workers(), kv_after = ClusterHarness::Scrape(store);
  // Each stage ran the prompt once and then four decode steps (the fifth
  // token is sampled, never fed).
  for (const char* stage : {"0", "1"}) {
    SCOPED_TRACE(absl::StrCat("stage ", stage));
    const std::string s = absl::StrCat("stage=\"", stage, "\"");
    EXPECT_EQ(MetricValue(after, absl::StrCat("strata_worker_steps_total{", s, ",kind=\"prefill\"}")), 1);
    EXPECT_EQ(MetricValue(after, absl::StrCat("strata_worker_steps_total{", s, ",kind=\"decode\"}")), 4);
    EXPECT_EQ(MetricValue(after, absl::StrCat("strata_worker_batch_rows_sum{", s, "}")), 6 + 4);
    EXPECT_EQ(MetricValue(after, absl::StrCat("strata_worker_batch_sequences_sum{", s, "}")), 5);
    EXPECT_EQ(MetricValue(after, absl::StrCat("strata_worker_hop_seconds_count{", s, "}")), 5);
    EXPECT_GT(MetricValue(after, absl::StrCat("strata_worker_busy_seconds_total{", s, "}")).value_or(0), 0);
    EXPECT_EQ(MetricValue(after, absl::StrCat("strata_worker_sequences{", s, "}")), 1) << "the session stays resident";
    EXPECT_GT(MetricValue(after, absl::StrCat("strata_worker_kv_pages_used{", s, "}")).value_or(0), 0);
  }
  // Stage 0 waits for stage 1's answers; the last stage answers itself.
  EXPECT_EQ(MetricValue(after, R"(strata_worker_downstream_seconds_count{stage="0"})"), 5);
  EXPECT_EQ(MetricValue(after, R"(strata_worker_downstream_seconds_count{stage="1"})"), 0);
  EXPECT_EQ(Sum(after, "strata_worker_errors_total"), 0);

  // 6 prompt tokens and 4 decoded ones have rows; both stages appended them.
  EXPECT_GT(Sum(kv_after, "strata_kvstore_appended_bytes_total"), 0);
  EXPECT_GE(Sum(kv_after, "strata_kvstore_append_seconds_count"), 2);
  EXPECT_GT(Sum(kv_after, "strata_kvstore_fsync_seconds_count"), Sum(kv_before, "strata_kvstore_fsync_seconds_count"));
  EXPECT_EQ(MetricValue(kv_after, R"(strata_kvstore_rpcs_total{method="CreateSession",code="OK"})"), 1);
  EXPECT_EQ(MetricValue(kv_after, "strata_kvstore_sessions_stored"), 1);
  EXPECT_EQ(Sum(kv_after, "strata_kvstore_read_bytes_total"), 0) << "nothing loaded yet";
  fs::remove_all(kv);
}

class LogTest : public ::testing::Test {
 protected:
  static constexpr char kToken[] = "sk-strata-Xq7Rr2Lw9Zp4Tt6Vv8Nn0";
  static constexpr char kPrompt[] = "The zebra quietly lists every tuple";

  void SetUp() override {
    dir_ = MakeScratchDir("observability_logs_");
    auto certs = testing::MakeTestCerts(dir_);
    ASSERT_TRUE(certs.ok()) << certs.status();
    certs_ = *certs;
    fs::create_directories(dir_ + "/kv");
  }
  void TearDown() override { fs::remove_all(dir_); }

  HarnessOptions Options(std::vector<std::string> coordinator_flags) {
    HarnessOptions o;
    o.model_dir = std::string(STRATA_SOURCE_DIR) + "/models/demo";
    o.workers = 1;
    o.kv_dir = dir_ + "/kv";
    o.tls = certs_;
    o.api_tokens = absl::StrCat("alice:", kToken, "\n");
    o.token = kToken;
    o.coordinator_flags = std::move(coordinator_flags);
    return o;
  }

  // A text request on session `session`, one refused request, a save; then
  // the cluster stops (its drain is logged too) and the logs are returned.
  std::vector<std::pair<std::string, std::string>> Run(ClusterHarness& c, const std::string& session,
                                                       GenerateResult* result) {
    v1::GenerateRequest req;
    req.set_prompt(kPrompt);
    req.mutable_sampling()->set_temperature(0);
    req.mutable_stopping()->set_max_tokens(6);
    req.mutable_stopping()->set_ignore_eos(true);
    req.set_session_id(session);
    req.set_request_id(session + "-req");
    *result = c.Generate(req);
    EXPECT_TRUE(result->status.ok()) << result->status.error_message();
    v1::GenerateRequest bad = req;
    bad.set_request_id(session + "-bad");
    bad.mutable_sampling()->set_top_p(7);
    EXPECT_EQ(c.Generate(bad).status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    v1::SessionState saved;
    EXPECT_TRUE(c.SaveSession(session, &saved).ok());
    c.Stop();
    return Logs(c);
  }

  std::string dir_;
  testing::TestCerts certs_;
};

TEST_F(LogTest, EventsCarryIdsAndCountsButNeverTheTokenOrThePrompt) {
  ClusterHarness c(Options({}));
  ASSERT_TRUE(c.ok()) << c.error();
  GenerateResult r;
  const auto logs = Run(c, "log-s1", &r);
  ASSERT_FALSE(r.text.empty());
  std::string coordinator, worker, kvstore;
  for (const auto& [name, text] : logs) {
    SCOPED_TRACE(name);
    EXPECT_THAT(text, Not(HasSubstr(kToken))) << "an API token reached a log";
    EXPECT_THAT(text, Not(HasSubstr(kPrompt))) << "the prompt reached a log without --log-prompts";
    EXPECT_THAT(text, Not(HasSubstr(" completion="))) << "the completion reached a log";
    EXPECT_THAT(text, Not(HasSubstr(" prompt="))) << "the prompt reached a log";
    if (name == "coordinator.out") coordinator = text;
    if (name == "w0.log") worker = text;
    if (name == "kvstore.log") kvstore = text;
  }
  const auto start = Events(coordinator, "request_start");
  ASSERT_EQ(start.size(), 1u) << coordinator;
  EXPECT_THAT(start[0], HasSubstr(" level=info daemon=strata-coordinator event=request_start request_id=log-s1-req "
                                  "session_id=log-s1 caller=alice prompt_tokens="));
  EXPECT_THAT(start[0], Not(HasSubstr("prompt=")));
  const auto finish = Events(coordinator, "request_finish");
  ASSERT_EQ(finish.size(), 1u);
  EXPECT_THAT(finish[0], HasSubstr("request_id=log-s1-req session_id=log-s1 caller=alice finish_reason=length "));
  EXPECT_THAT(finish[0], HasSubstr(" completion_tokens=6 "));
  EXPECT_THAT(finish[0], HasSubstr(" latency_ms="));
  EXPECT_THAT(finish[0], HasSubstr(" code=OK"));
  EXPECT_THAT(finish[0], Not(HasSubstr("completion=")));
  const auto rejected = Events(coordinator, "request_rejected");
  ASSERT_EQ(rejected.size(), 1u);
  EXPECT_THAT(rejected[0], HasSubstr("request_id=log-s1-bad session_id=log-s1 caller=alice code=INVALID_ARGUMENT"));
  EXPECT_EQ(Events(coordinator, "session_save").size(), 1u);
  EXPECT_THAT(Events(coordinator, "session_save")[0], HasSubstr("session_id=log-s1 tokens="));
  EXPECT_EQ(Events(coordinator, "worker_register").size(), 1u);
  EXPECT_THAT(Events(coordinator, "worker_register")[0], HasSubstr("worker=w0 "));
  EXPECT_EQ(Events(coordinator, "drain").size(), 1u);
  EXPECT_EQ(Events(worker, "registered").size(), 1u) << worker;
  EXPECT_THAT(Events(worker, "assign").at(0), HasSubstr("worker=w0 stage=0 stages=1"));
  EXPECT_EQ(Events(worker, "drain").size(), 1u);
  EXPECT_EQ(Events(kvstore, "session_create").size(), 1u) << kvstore;
  EXPECT_THAT(Events(kvstore, "session_create")[0], HasSubstr("session_id=log-s1"));
  // Every stderr line of the daemons is one event (stdout has only the
  // address lines the harness reads).
  for (const std::string& text : {coordinator, worker, kvstore}) {
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) {
      const bool address = line.rfind("listening ", 0) == 0 || line.rfind("internal ", 0) == 0 ||
                           line.rfind("metrics ", 0) == 0;
      if (address || line.empty()) continue;
      EXPECT_EQ(line.rfind("ts=", 0), 0u) << "not a log event: " << line;
      EXPECT_THAT(line, HasSubstr(" event=")) << line;
    }
  }
}

TEST_F(LogTest, PromptsAndCompletionsAreLoggedOnlyWithTheFlag) {
  ClusterHarness c(Options({"--log-prompts"}));
  ASSERT_TRUE(c.ok()) << c.error();
  GenerateResult r;
  const auto logs = Run(c, "log-s2", &r);
  ASSERT_FALSE(r.text.empty());
  std::string coordinator;
  for (const auto& [name, text] : logs) {
    SCOPED_TRACE(name);
    EXPECT_THAT(text, Not(HasSubstr(kToken))) << "an API token reached a log";
    if (name == "coordinator.out") {
      coordinator = text;
    } else {
      EXPECT_THAT(text, Not(HasSubstr(kPrompt))) << "only the coordinator logs prompts";
    }
  }
  const auto start = Events(coordinator, "request_start");
  ASSERT_EQ(start.size(), 1u) << coordinator;
  // The prompt as the model saw it (the tokenizer's BOS decodes to text too).
  EXPECT_THAT(start[0], HasSubstr(kPrompt));
  EXPECT_THAT(start[0], HasSubstr(" prompt=\""));
  const auto finish = Events(coordinator, "request_finish");
  ASSERT_EQ(finish.size(), 1u);
  EXPECT_THAT(finish[0], HasSubstr(" completion=" + log::QuoteValue(r.text)));
  EXPECT_THAT(Events(coordinator, "listening").at(0), HasSubstr("log_prompts=true"));
}

}  // namespace
}  // namespace strata::e2e
