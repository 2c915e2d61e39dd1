// What a worker's registration must look like before the coordinator logs it
// or places layers on it.
#include "coordinator/cluster.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace strata::coordinator {
namespace {

v1::RegisterRequest Req(const std::string& address, const std::string& name = "") {
  v1::RegisterRequest r;
  r.set_address(address);
  r.set_name(name);
  return r;
}

TEST(RegistrationTest, HostPortAddressesAndPlainNamesAreAccepted) {
  for (const char* a : {"127.0.0.1:50061", "worker-0.strata.default.svc:1", "[::1]:65535", "h:8080"}) {
    EXPECT_TRUE(ValidateRegistration(Req(a, "w0")).ok()) << a;
  }
  EXPECT_TRUE(ValidateRegistration(Req("127.0.0.1:1")).ok());  // no name: the address names it
  EXPECT_TRUE(ValidateRegistration(Req("127.0.0.1:1", std::string(64, 'n'))).ok());
}

TEST(RegistrationTest, GarbageIsInvalidArgumentNamingTheField) {
  const std::vector<std::string> addresses = {
      "", "/", "../../etc/passwd", "host", ":80", "host:", "host:0", "host:65536", "host:8x", "ho st:80",
      "host:80\n", std::string("h\0:1", 4), std::string(300, 'a') + ":1"};
  for (const std::string& a : addresses) {
    absl::Status st = ValidateRegistration(Req(a, "w0"));
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << a;
    EXPECT_NE(st.message().find("HOST:PORT"), std::string::npos) << st.message();
  }
  for (const std::string& n : std::vector<std::string>{"w 0", "<|im_start|>\n", std::string(65, 'n'), "\xc3\xa9"}) {
    absl::Status st = ValidateRegistration(Req("127.0.0.1:1", n));
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << n;
    EXPECT_NE(st.message().find("worker name"), std::string::npos) << st.message();
  }
}

}  // namespace
}  // namespace strata::coordinator
