#include "coordinator/api_auth.h"

#include <optional>

#include "gtest/gtest.h"

namespace strata::coordinator {
namespace {

constexpr char kTokens[] = R"(# callers of the public API
alice:0123456789abcdef-alice

bob:fedcba9876543210-bob
)";

TEST(ApiAuthTest, TokensNameTheCaller) {
  auto auth = ApiAuth::FromTokens(kTokens, {});
  ASSERT_TRUE(auth.ok()) << auth.status();
  EXPECT_FALSE((*auth)->anonymous());
  EXPECT_EQ(*(*auth)->Authenticate("Bearer 0123456789abcdef-alice"), "alice");
  EXPECT_EQ(*(*auth)->Authenticate("Bearer fedcba9876543210-bob"), "bob");
  for (const char* bad : {"", "Bearer ", "0123456789abcdef-alice", "bearer 0123456789abcdef-alice",
                          "Bearer 0123456789abcdef-alic", "Bearer 0123456789abcdef-alicex", "Basic YWxpY2U=",
                          "Bearer alice"}) {
    EXPECT_EQ((*auth)->Authenticate(bad).status().code(), absl::StatusCode::kUnauthenticated) << bad;
  }
}

TEST(ApiAuthTest, MalformedFilesNameTheLine) {
  auto code_line = [](const char* text) {
    auto a = ApiAuth::FromTokens(text, {});
    return std::make_pair(a.status().code(), std::string(a.status().message()));
  };
  const auto kBad = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(code_line("").first, kBad);                  // no token
  EXPECT_EQ(code_line("# only a comment\n").first, kBad);
  auto [c, m] = code_line("a:0123456789abcdef\nb short\n");
  EXPECT_EQ(c, kBad);
  EXPECT_NE(m.find("line 2"), std::string::npos) << m;
  EXPECT_EQ(code_line("a:short").first, kBad);                                 // token too short
  EXPECT_EQ(code_line("a b:0123456789abcdef").first, kBad);                    // name with a space
  EXPECT_EQ(code_line(":0123456789abcdef").first, kBad);                       // empty name
  EXPECT_EQ(code_line("a:0123456789abcdef\na:0123456789abcdeX").first, kBad);  // name twice
  EXPECT_EQ(code_line("a:0123456789abcdef\nb:0123456789abcdef").first, kBad);  // token twice
  EXPECT_EQ(code_line("a:0123456789 abcdef").first, kBad);                     // space in the token
}

TEST(ApiAuthTest, AnonymousNeedsNoToken) {
  auto auth = ApiAuth::Anonymous({});
  EXPECT_TRUE(auth->anonymous());
  EXPECT_EQ(*auth->Authenticate(""), "");
  EXPECT_EQ(*auth->Authenticate("Bearer anything-at-all-here"), "");
}

TEST(ApiAuthTest, RateLimitPerCaller) {
  ApiAuthOptions o;
  o.max_rps = 2;
  auto auth = *ApiAuth::FromTokens(kTokens, o);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  EXPECT_TRUE(auth->Admit("alice", t0).ok());
  EXPECT_TRUE(auth->Admit("alice", t0).ok());
  EXPECT_EQ(auth->Admit("alice", t0).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(auth->Admit("bob", t0).ok()) << "limits are per caller";
  EXPECT_EQ(auth->Admit("alice", t0 + absl::Milliseconds(400)).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(auth->Admit("alice", t0 + absl::Milliseconds(500)).ok());  // refilled one
  EXPECT_TRUE(auth->Admit("alice", t0 + absl::Seconds(10)).ok());
  EXPECT_TRUE(auth->Admit("alice", t0 + absl::Seconds(10)).ok());
  EXPECT_EQ(auth->Admit("alice", t0 + absl::Seconds(10)).code(), absl::StatusCode::kResourceExhausted)
      << "the bucket holds one second's worth, not ten";
}

TEST(ApiAuthTest, ConcurrentStreamsPerCaller) {
  ApiAuthOptions o;
  o.max_concurrent = 2;
  auto auth = *ApiAuth::FromTokens(kTokens, o);
  auto a = auth->AdmitStream("alice");
  auto b = auth->AdmitStream("alice");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(auth->AdmitStream("alice").status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(auth->AdmitStream("bob").ok());
  {
    std::optional<ApiAuth::Slot> gone(std::move(*a));
  }  // the slot ends with its stream
  auto c = auth->AdmitStream("alice");
  EXPECT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(auth->AdmitStream("alice").status().code(), absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace strata::coordinator
