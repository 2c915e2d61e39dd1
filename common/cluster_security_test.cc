#include "common/cluster_security.h"

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "common/testing/scratch_dir.h"
#include "common/testing/test_certs.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

// A health check over `channel`: OK when the call gets through (transport
// security accepted both ways).
grpc::Status HealthCheck(const std::shared_ptr<grpc::Channel>& channel) {
  grpc::GenericStub generic(channel);
  grpc::Slice empty("");
  grpc::ByteBuffer in(&empty, 1), out;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::Status st;
  bool done = false;
  std::mutex mu;
  std::condition_variable cv;
  generic.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &in, &out, [&](grpc::Status s) {
    std::lock_guard<std::mutex> l(mu);
    st = s;
    done = true;
    cv.notify_one();
  });
  std::unique_lock<std::mutex> l(mu);
  cv.wait(l, [&] { return done; });
  return st;
}

class ClusterSecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeScratchDir("tls_");
    auto c = testing::MakeTestCerts(dir_);
    ASSERT_TRUE(c.ok()) << c.status();
    certs_ = *c;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A server with the health service on a free loopback port.
  std::unique_ptr<grpc::Server> Serve(std::shared_ptr<grpc::ServerCredentials> creds, int* port) {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", std::move(creds), port);
    b.RegisterCallbackGenericService(&generic_);  // a polled queue for the health service
    return b.BuildAndStart();
  }

  std::shared_ptr<grpc::Channel> Dial(int port, std::shared_ptr<grpc::ChannelCredentials> creds) {
    return grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), std::move(creds));
  }

  ClusterCredentials Mtls(const std::string& ca, const std::string& cert, const std::string& key) {
    auto c = ClusterCredentials::Create({ca, cert, key, false});
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *c : ClusterCredentials::Insecure();
  }

  std::string dir_;
  testing::TestCerts certs_;
  grpc::CallbackGenericService generic_;
};

TEST_F(ClusterSecurityTest, MutualTlsAcceptsOnlyTheClustersCertificates) {
  const ClusterCredentials ours = Mtls(certs_.ca, certs_.cert, certs_.key);
  ASSERT_FALSE(ours.insecure());
  int port = 0;
  auto server = Serve(ours.server(), &port);
  ASSERT_NE(server, nullptr);
  EXPECT_TRUE(HealthCheck(Dial(port, ours.channel())).ok());
  // No client certificate, plaintext, another CA's certificate: refused.
  EXPECT_FALSE(HealthCheck(Dial(port, grpc::InsecureChannelCredentials())).ok());
  grpc::SslCredentialsOptions no_cert;
  no_cert.pem_root_certs = *ReadSecretFile(certs_.ca, "ca");
  EXPECT_FALSE(HealthCheck(Dial(port, grpc::SslCredentials(no_cert))).ok()) << "a client without a certificate";
  const ClusterCredentials stranger = Mtls(certs_.ca, certs_.other_cert, certs_.other_key);
  EXPECT_FALSE(HealthCheck(Dial(port, stranger.channel())).ok()) << "a certificate of another CA";
  // A client that trusts another CA does not accept our server.
  const ClusterCredentials elsewhere = Mtls(certs_.other_ca, certs_.cert, certs_.key);
  EXPECT_FALSE(HealthCheck(Dial(port, elsewhere.channel())).ok());
  server->Shutdown();
}

TEST_F(ClusterSecurityTest, PublicTlsNeedsNoClientCertificate) {
  auto creds = PublicServerCredentials(certs_.cert, certs_.key);
  ASSERT_TRUE(creds.ok()) << creds.status();
  int port = 0;
  auto server = Serve(*creds, &port);
  ASSERT_NE(server, nullptr);
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = *ReadSecretFile(certs_.ca, "ca");
  EXPECT_TRUE(HealthCheck(Dial(port, grpc::SslCredentials(o))).ok());
  EXPECT_FALSE(HealthCheck(Dial(port, grpc::InsecureChannelCredentials())).ok()) << "plaintext on a TLS port";
  server->Shutdown();
}

TEST_F(ClusterSecurityTest, InsecureIsPlaintextBothWays) {
  const ClusterCredentials c = ClusterCredentials::Insecure();
  EXPECT_TRUE(c.insecure());
  int port = 0;
  auto server = Serve(c.server(), &port);
  ASSERT_NE(server, nullptr);
  EXPECT_TRUE(HealthCheck(Dial(port, c.channel())).ok());
  server->Shutdown();
}

TEST_F(ClusterSecurityTest, OptionErrorsSayWhatIsMissing) {
  auto code = [](const ClusterSecurityOptions& o) { return ClusterCredentials::Create(o).status().code(); };
  EXPECT_EQ(code({}), absl::StatusCode::kInvalidArgument);  // neither TLS nor --insecure-cluster
  EXPECT_EQ(code({certs_.ca, "", "", false}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({certs_.ca, certs_.cert, certs_.key, true}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({dir_ + "/missing.pem", certs_.cert, certs_.key, false}), absl::StatusCode::kNotFound);
  std::ofstream(dir_ + "/empty.pem").close();
  EXPECT_EQ(code({dir_ + "/empty.pem", certs_.cert, certs_.key, false}), absl::StatusCode::kInvalidArgument);
  std::ofstream(dir_ + "/junk.pem") << "not a certificate\n";
  const absl::Status junk = ClusterCredentials::Create({dir_ + "/junk.pem", certs_.cert, certs_.key, false}).status();
  EXPECT_EQ(junk.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(junk.message().find("--cluster-ca"), absl::string_view::npos) << junk;
  EXPECT_EQ(code({certs_.ca, certs_.cert, certs_.ca, false}), absl::StatusCode::kInvalidArgument);  // no key
  EXPECT_EQ(PublicServerCredentials(certs_.cert, dir_ + "/missing.key").status().code(), absl::StatusCode::kNotFound);

  FlagSet flags;
  DeclareClusterSecurityFlags(flags);
  ASSERT_TRUE(flags.Parse({"--cluster-ca", certs_.ca}).ok());
  EXPECT_EQ(ClusterCredentialsFromFlags(flags, "test").status().code(), absl::StatusCode::kInvalidArgument);
  FlagSet insecure;
  DeclareClusterSecurityFlags(insecure);
  ASSERT_TRUE(insecure.Parse({"--insecure-cluster"}).ok());
  auto c = ClusterCredentialsFromFlags(insecure, "test");
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->insecure());
}

}  // namespace
}  // namespace strata
