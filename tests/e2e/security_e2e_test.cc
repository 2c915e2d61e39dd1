// A cluster with every port secured (docs/deploy.md §6): the KV store, the
// coordinator and two workers speak mutual TLS to each other, the public API
// TLS with API tokens. Generation works for a caller with a token; nobody
// without one gets in, plaintext does not reach either port, the public port
// never answers the internal services, and a worker's certificate must come
// from the cluster's CA.
#include <sys/wait.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/testing/scratch_dir.h"
#include "common/testing/test_certs.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "strata/v1/worker.grpc.pb.h"
#include "tests/e2e/cluster_harness.h"

namespace strata::e2e {
namespace {

namespace fs = std::filesystem;

constexpr char kAlice[] = "alice-0123456789abcdef";
constexpr char kBob[] = "bob-fedcba9876543210";

std::string Fixture() { return (fs::path(STRATA_SOURCE_DIR) / "tests/data/models/deepseek_v3").string(); }

// Runs a shell command, its output discarded; the exit code.
int RunShell(const std::string& cmd) {
  const int rc = std::system((cmd + " > /dev/null 2>&1").c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

class SecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeScratchDir("security_");
    auto certs = testing::MakeTestCerts(dir_);
    ASSERT_TRUE(certs.ok()) << certs.status();
    certs_ = *certs;
    fs::create_directories(dir_ + "/kv");
  }
  void TearDown() override { fs::remove_all(dir_); }

  HarnessOptions Options() {
    HarnessOptions o;
    o.model_dir = Fixture();
    o.workers = 2;
    o.kv_dir = dir_ + "/kv";
    o.tls = certs_;
    o.api_tokens = absl::StrCat("alice:", kAlice, "\nbob:", kBob, "\n");
    o.token = kAlice;
    return o;
  }

  // A call on the public port with `token` ("" for none).
  grpc::Status StatsWith(ClusterHarness& c, const std::string& token) {
    auto stub = v1::Generation::NewStub(c.NewChannel());
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
    v1::StatsResponse resp;
    return stub->Stats(&ctx, v1::StatsRequest(), &resp);
  }

  std::string dir_;
  testing::TestCerts certs_;
};

TEST_F(SecurityTest, OnlyTokensGetInAndOnlyTheClustersCertificatesInside) {
  ClusterHarness c(Options());
  ASSERT_TRUE(c.ok()) << c.error();  // workers registered, layers assigned, all over mutual TLS

  // A caller with a token generates, into a persisted session (KV store over mutual TLS).
  v1::GenerateRequest req = ClusterHarness::Greedy({1, 2, 3, 4}, 6);
  req.set_session_id("tls-session");
  GenerateResult r = c.Generate(req);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.tokens.size(), 6u);
  v1::SessionState saved;
  ASSERT_TRUE(c.SaveSession("tls-session", &saved).ok());

  // No token, a wrong one, one of the right length but another value.
  EXPECT_EQ(StatsWith(c, "").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(StatsWith(c, "not-a-token-at-all").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(StatsWith(c, "alice-0123456789abcdeX").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(StatsWith(c, kBob).ok());
  {
    auto stub = v1::Generation::NewStub(c.NewChannel());
    grpc::ClientContext ctx;
    auto reader = stub->Generate(&ctx, ClusterHarness::Greedy({1, 2}, 2));
    v1::GenerateResponse resp;
    while (reader->Read(&resp)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED) << "Generate without a token";
  }

  // Plaintext reaches neither the public nor the internal port.
  for (const std::string& address : {c.address(), c.internal_address()}) {
    auto plain = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
    EXPECT_FALSE(plain->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(2))) << address;
  }

  // The public port does not answer the cluster's internal services, even with a token.
  {
    auto stub = v1::Coordinator::NewStub(c.NewChannel());
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", std::string("Bearer ") + kAlice);
    v1::RegisterRequest reg;
    reg.set_address("127.0.0.1:1");
    reg.set_name("intruder");
    v1::RegisterResponse resp;
    EXPECT_EQ(stub->Register(&ctx, reg, &resp).error_code(), grpc::StatusCode::UNIMPLEMENTED);
  }

  // The internal port accepts only certificates of the cluster's CA.
  auto internal_call = [&](std::shared_ptr<grpc::ChannelCredentials> creds) {
    auto stub = v1::Coordinator::NewStub(grpc::CreateChannel(c.internal_address(), creds));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(3));
    v1::HeartbeatRequest hb;
    hb.set_worker_id("nobody");
    v1::HeartbeatResponse resp;
    return stub->Heartbeat(&ctx, hb, &resp);
  };
  grpc::SslCredentialsOptions no_cert;
  no_cert.pem_root_certs = ReadFile(certs_.ca);
  EXPECT_FALSE(internal_call(grpc::SslCredentials(no_cert)).ok()) << "no client certificate";
  grpc::SslCredentialsOptions stranger = no_cert;
  stranger.pem_cert_chain = ReadFile(certs_.other_cert);
  stranger.pem_private_key = ReadFile(certs_.other_key);
  EXPECT_FALSE(internal_call(grpc::SslCredentials(stranger)).ok()) << "a certificate of another CA";
  grpc::SslCredentialsOptions member = no_cert;
  member.pem_cert_chain = ReadFile(certs_.cert);
  member.pem_private_key = ReadFile(certs_.key);
  EXPECT_TRUE(internal_call(grpc::SslCredentials(member)).ok()) << "the cluster's own certificate";

  // The cluster still serves.
  r = c.Generate(ClusterHarness::Greedy({5, 6, 7}, 4));
  EXPECT_TRUE(r.status.ok()) << r.status.error_message();

  // The command-line client: TLS with --ca, the token from --token-file.
  std::ofstream(dir_ + "/alice.token") << kAlice << "\n";
  const std::string cli = std::string(STRATA_BINARY_DIR) + "/cli/strata generate --server " + c.address() +
                          " --ca " + certs_.ca + " --tokens 1,2,3 --max-tokens 3 --temperature 0 --json";
  EXPECT_EQ(RunShell(cli + " --token-file " + dir_ + "/alice.token"), 0);
  EXPECT_EQ(RunShell(cli), 1) << "no token: UNAUTHENTICATED";
  EXPECT_EQ(RunShell(cli + " --token-file " + dir_ + "/missing.token"), 2);
}

// Requests belong to their caller, and each caller has its limits.
TEST_F(SecurityTest, CallersOwnTheirRequestsAndHaveLimits) {
  HarnessOptions o = Options();
  o.kv_dir.clear();
  o.coordinator_flags = {"--max-concurrent-per-token", "1"};
  o.worker_flags = {"--debug-step-delay-ms", "20"};
  ClusterHarness c(o);
  ASSERT_TRUE(c.ok()) << c.error();
  v1::GenerateRequest slow = ClusterHarness::Greedy({1, 2, 3}, 100);
  slow.set_request_id("shared-id");
  std::atomic<bool> done{false};
  GenerateResult first;
  std::thread t([&] {
    first = c.Generate(slow, 30);
    done = true;
  });
  // Wait until alice's request runs.
  bool running = false;
  for (int i = 0; i < 200 && !running; ++i) {
    running = c.Stats().active_requests() == 1;
    if (!running) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(running);
  // A second stream of alice's is over her limit of one; bob may run his own.
  GenerateResult second = c.Generate(ClusterHarness::Greedy({1}, 2), 10);
  EXPECT_EQ(second.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << second.status.error_message();
  // Bob cannot abort alice's request, even knowing its id; alice can.
  auto abort_as = [&](const char* token) {
    auto stub = v1::Generation::NewStub(c.NewChannel());
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", std::string("Bearer ") + token);
    v1::AbortRequest ar;
    ar.set_request_id("shared-id");
    v1::AbortResponse resp;
    EXPECT_TRUE(stub->Abort(&ctx, ar, &resp).ok());
    return resp.found();
  };
  EXPECT_FALSE(abort_as(kBob));
  EXPECT_FALSE(done);
  EXPECT_TRUE(abort_as(kAlice));
  t.join();
  EXPECT_TRUE(first.status.ok()) << first.status.error_message();
  EXPECT_EQ(first.final_msg.finish_reason(), v1::FINISH_REASON_ABORT);
  // Requests without an id get unguessable ones.
  GenerateResult r = c.Generate(ClusterHarness::Greedy({4, 5}, 2));
  ASSERT_TRUE(r.got_final);
  const std::string id = r.final_msg.request_id();
  EXPECT_EQ(id.size(), 4u + 32u) << id;
  EXPECT_EQ(id.rfind("req-", 0), 0u) << id;
}

}  // namespace
}  // namespace strata::e2e
