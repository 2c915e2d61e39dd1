#include "common/health_port.h"

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

// A unary call of `method` with `request` bytes; the status and the reply.
grpc::Status Call(int port, const std::string& method, const std::string& request, std::string* reply) {
  auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
  grpc::GenericStub generic(channel);
  grpc::Slice slice(request);
  grpc::ByteBuffer in(&slice, 1), out;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::Status st;
  bool done = false;
  std::mutex mu;
  std::condition_variable cv;
  generic.UnaryCall(&ctx, method, grpc::StubOptions(), &in, &out, [&](grpc::Status s) {
    std::lock_guard<std::mutex> l(mu);
    st = s;
    done = true;
    cv.notify_one();
  });
  std::unique_lock<std::mutex> l(mu);
  cv.wait(l, [&] { return done; });
  std::vector<grpc::Slice> slices;
  reply->clear();
  if (st.ok() && out.Dump(&slices).ok()) {
    for (auto& s : slices) reply->append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return st;
}

// HealthCheckRequest{service} and the status field of the response.
std::string Request(const std::string& service) {
  return service.empty() ? std::string() : std::string("\x0a", 1) + static_cast<char>(service.size()) + service;
}
constexpr char kServing[] = "\x08\x01";
constexpr char kNotServing[] = "\x08\x02";

TEST(HealthPortTest, ServesOnlyHealthAndFollowsSet) {
  auto h = HealthPort::Start("127.0.0.1:0", {});
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_GT((*h)->port(), 0);
  std::string reply;
  ASSERT_TRUE(Call((*h)->port(), "/grpc.health.v1.Health/Check", Request(""), &reply).ok());
  EXPECT_EQ(reply, std::string(kNotServing, 2)) << "not ready until the daemon says so";
  (*h)->Set("strata.v1.Test", false);
  (*h)->Set("", true);
  ASSERT_TRUE(Call((*h)->port(), "/grpc.health.v1.Health/Check", Request("strata.v1.Test"), &reply).ok());
  EXPECT_EQ(reply, std::string(kNotServing, 2)) << "the server as a whole is not every service";
  (*h)->Set("strata.v1.Test", true);
  ASSERT_TRUE(Call((*h)->port(), "/grpc.health.v1.Health/Check", Request(""), &reply).ok());
  EXPECT_EQ(reply, std::string(kServing, 2));
  ASSERT_TRUE(Call((*h)->port(), "/grpc.health.v1.Health/Check", Request("strata.v1.Test"), &reply).ok());
  EXPECT_EQ(reply, std::string(kServing, 2));
  (*h)->Set("strata.v1.Test", false);
  ASSERT_TRUE(Call((*h)->port(), "/grpc.health.v1.Health/Check", Request("strata.v1.Test"), &reply).ok());
  EXPECT_EQ(reply, std::string(kNotServing, 2));
  (*h)->Set("strata.v1.Test", true);
  (*h)->SetAll(false);
  ASSERT_TRUE(Call((*h)->port(), "/grpc.health.v1.Health/Check", Request("strata.v1.Test"), &reply).ok());
  EXPECT_EQ(reply, std::string(kNotServing, 2)) << "SetAll reaches the named services";
  // Nothing but health: any other method is UNIMPLEMENTED.
  for (const char* method : {"/strata.v1.Coordinator/Register", "/strata.v1.KVStore/Delete", "/x/y"}) {
    EXPECT_EQ(Call((*h)->port(), method, "", &reply).error_code(), grpc::StatusCode::UNIMPLEMENTED) << method;
  }
}

TEST(HealthPortTest, WithoutAnAddressItOnlyMirrors) {
  auto h = HealthPort::Start("", {nullptr});
  ASSERT_TRUE(h.ok());
  EXPECT_EQ((*h)->port(), 0);
  (*h)->Set("", true);  // nothing to update, and no crash
  EXPECT_EQ(HealthPort::Start("256.0.0.1:1", {}).status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace strata
