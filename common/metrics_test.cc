#include "common/metrics.h"

#include <cmath>
#include <limits>
#include <regex>
#include <sstream>
#include <thread>

#include "gtest/gtest.h"

namespace strata::metrics {
namespace {

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// Every line is a HELP, a TYPE or a sample of the text format 0.0.4: name,
// optional {label="value",...} with escapes, one value.
void ExpectWellFormed(const std::string& text) {
  ASSERT_FALSE(text.empty());
  ASSERT_EQ(text.back(), '\n');
  static const std::regex help(R"(^# HELP [a-zA-Z_:][a-zA-Z0-9_:]* .*$)");
  static const std::regex type(R"(^# TYPE [a-zA-Z_:][a-zA-Z0-9_:]* (counter|gauge|histogram)$)");
  static const std::regex sample(
      R"(^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\[\\"n])*")"
      R"((,[a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\[\\"n])*")*\})? ([-+]?[0-9.e+-]+|\+Inf|-Inf|NaN)$)");
  for (const std::string& line : Lines(text)) {
    EXPECT_TRUE(std::regex_match(line, help) || std::regex_match(line, type) || std::regex_match(line, sample))
        << "not the text format: " << line;
  }
}

TEST(MetricsTest, CounterAndGaugeRender) {
  Registry r;
  r.GetCounter("strata_requests_total", "Requests that ended.", {{"finish_reason", "stop"}})->Inc(2);
  r.GetCounter("strata_requests_total", "Requests that ended.", {{"finish_reason", "length"}})->Inc();
  Gauge* g = r.GetGauge("strata_requests_running", "Requests generating now.");
  g->Set(5);
  g->Add(-2);
  const std::string text = r.Render();
  ExpectWellFormed(text);
  EXPECT_EQ(text,
            "# HELP strata_requests_running Requests generating now.\n"
            "# TYPE strata_requests_running gauge\n"
            "strata_requests_running 3\n"
            "# HELP strata_requests_total Requests that ended.\n"
            "# TYPE strata_requests_total counter\n"
            "strata_requests_total{finish_reason=\"length\"} 1\n"
            "strata_requests_total{finish_reason=\"stop\"} 2\n");
}

TEST(MetricsTest, SameLabelsSameSeries) {
  Registry r;
  Counter* a = r.GetCounter("c_total", "c", {{"x", "1"}});
  Counter* b = r.GetCounter("c_total", "c", {{"x", "1"}});
  EXPECT_EQ(a, b);
  EXPECT_NE(a, r.GetCounter("c_total", "c", {{"x", "2"}}));
  a->Inc(-5);  // counters never go down
  EXPECT_EQ(a->value(), 0);
}

TEST(MetricsTest, HistogramBucketsAreCumulativeWithSumAndCount) {
  Registry r;
  Histogram* h = r.GetHistogram("strata_ttft_seconds", "Time to first token.", {0.1, 0.5, 1}, {{"stage", "0"}});
  for (double v : {0.0625, 0.09375, 0.25, 0.75, 2.0}) h->Observe(v);
  const std::string text = r.Render();
  ExpectWellFormed(text);
  EXPECT_EQ(text,
            "# HELP strata_ttft_seconds Time to first token.\n"
            "# TYPE strata_ttft_seconds histogram\n"
            "strata_ttft_seconds_bucket{stage=\"0\",le=\"0.1\"} 2\n"
            "strata_ttft_seconds_bucket{stage=\"0\",le=\"0.5\"} 3\n"
            "strata_ttft_seconds_bucket{stage=\"0\",le=\"1\"} 4\n"
            "strata_ttft_seconds_bucket{stage=\"0\",le=\"+Inf\"} 5\n"
            "strata_ttft_seconds_sum{stage=\"0\"} 3.15625\n"
            "strata_ttft_seconds_count{stage=\"0\"} 5\n");
}

TEST(MetricsTest, HistogramWithoutLabels) {
  Registry r;
  r.GetHistogram("h", "h", {1})->Observe(1);  // le is inclusive
  EXPECT_NE(r.Render().find("h_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n"),
            std::string::npos)
      << r.Render();
}

TEST(MetricsTest, LabelValuesAndHelpAreEscaped) {
  EXPECT_EQ(EscapeLabelValue("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
  EXPECT_EQ(EscapeHelp("line\\one\nline \"two\""), "line\\\\one\\nline \"two\"");
  Registry r;
  r.GetGauge("g", "help with\nnewline", {{"path", "C:\\x \"q\"\n"}})->Set(1);
  const std::string text = r.Render();
  ExpectWellFormed(text);
  EXPECT_NE(text.find("# HELP g help with\\nnewline\n"), std::string::npos) << text;
  EXPECT_NE(text.find("g{path=\"C:\\\\x \\\"q\\\"\\n\"} 1\n"), std::string::npos) << text;
}

TEST(MetricsTest, ValuesRoundTripAndSpecials) {
  EXPECT_EQ(FormatValue(0), "0");
  EXPECT_EQ(FormatValue(0.1), "0.1");
  EXPECT_EQ(FormatValue(123456789012.0), "123456789012");
  EXPECT_EQ(std::stod(FormatValue(1.0 / 3)), 1.0 / 3);
  EXPECT_EQ(FormatValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(FormatValue(std::nan("")), "NaN");
}

TEST(MetricsTest, Names) {
  EXPECT_TRUE(ValidMetricName("strata:requests_total"));
  EXPECT_TRUE(ValidMetricName("_x9"));
  EXPECT_FALSE(ValidMetricName("9x"));
  EXPECT_FALSE(ValidMetricName("a-b"));
  EXPECT_FALSE(ValidMetricName(""));
  EXPECT_TRUE(ValidLabelName("finish_reason"));
  EXPECT_FALSE(ValidLabelName("a:b"));
  EXPECT_FALSE(ValidLabelName("__reserved"));
}

TEST(MetricsDeathTest, ProgrammingErrorsAbort) {
  Registry r;
  r.GetCounter("x_total", "x");
  EXPECT_DEATH(r.GetGauge("x_total", "x"), "two types");
  EXPECT_DEATH(r.GetCounter("bad-name", "x"), "invalid metric name");
  EXPECT_DEATH(r.GetHistogram("h", "h", {1}, {{"le", "1"}}), "invalid label name");
  EXPECT_DEATH(r.GetHistogram("h2", "h", {2, 1}), "strictly increasing");
}

TEST(MetricsTest, OnScrapeRunsBeforeRendering) {
  Registry r;
  int calls = 0;
  r.OnScrape([&] { r.GetGauge("scraped", "set at scrape time")->Set(++calls); });
  EXPECT_NE(r.Render().find("scraped 1\n"), std::string::npos);
  EXPECT_NE(r.Render().find("scraped 2\n"), std::string::npos);
}

TEST(MetricsTest, ConcurrentUpdatesAreCounted) {
  Registry r;
  Counter* c = r.GetCounter("c_total", "c");
  Histogram* h = r.GetHistogram("h", "h", LatencyBuckets());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        c->Inc();
        h->Observe(0.002);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(c->value(), 40000);
  const Histogram::Snapshot s = h->Take();
  EXPECT_EQ(s.count, 40000u);
  EXPECT_NEAR(s.sum, 80, 1e-6);
  ExpectWellFormed(r.Render());
}

TEST(MetricsTest, PowersOfTwo) {
  EXPECT_EQ(PowersOfTwo(8), (std::vector<double>{1, 2, 4, 8}));
  EXPECT_EQ(PowersOfTwo(10), (std::vector<double>{1, 2, 4, 8}));
}

}  // namespace
}  // namespace strata::metrics
