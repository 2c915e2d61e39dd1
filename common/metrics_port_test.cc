#include "common/metrics_port.h"

#include "gtest/gtest.h"
#include "httplib.h"

namespace strata {
namespace {

TEST(MetricsPortTest, ServesTheRegistryAndNothingElse) {
  metrics::Registry reg;
  reg.GetCounter("strata_test_total", "A test counter.")->Inc(3);
  auto port = MetricsPort::Start("127.0.0.1:0", &reg);
  ASSERT_TRUE(port.ok()) << port.status();
  ASSERT_GT((*port)->port(), 0);
  httplib::Client c("127.0.0.1", (*port)->port());
  auto res = c.Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"), metrics::kContentType);
  EXPECT_NE(res->body.find("strata_test_total 3\n"), std::string::npos) << res->body;
  auto other = c.Get("/v1/models");
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 404);
  auto post = c.Post("/metrics", "x", "text/plain");
  ASSERT_TRUE(post);
  EXPECT_NE(post->status, 200);
}

TEST(MetricsPortTest, EmptyAddressStartsNothing) {
  metrics::Registry reg;
  auto port = MetricsPort::Start("", &reg);
  ASSERT_TRUE(port.ok());
  EXPECT_EQ((*port)->port(), 0);
}

TEST(MetricsPortTest, BadAddresses) {
  metrics::Registry reg;
  EXPECT_EQ(MetricsPort::Start("no-port", &reg).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MetricsPort::Start("127.0.0.1:99999", &reg).status().code(), absl::StatusCode::kInvalidArgument);
  auto first = MetricsPort::Start("127.0.0.1:0", &reg);
  ASSERT_TRUE(first.ok());
  const std::string taken = "127.0.0.1:" + std::to_string((*first)->port());
  EXPECT_EQ(MetricsPort::Start(taken, &reg).status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace strata
