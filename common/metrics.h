// Metrics in the Prometheus text exposition format (version 0.0.4): counters,
// gauges and histograms, each series named by its family and its labels, and
// the writer that renders a registry as the body of a `/metrics` response.
// The format, the names every daemon exports and their labels are in
// docs/metrics.md.
//
//   metrics::Registry reg;
//   metrics::Counter* done = reg.GetCounter("strata_requests_total", "Requests that ended.",
//                                           {{"finish_reason", "stop"}});
//   done->Inc();
//   std::string body = reg.Render();
//
// Thread-safety: everything is thread-safe. Updating a series (Inc, Set,
// Observe) is lock-free; GetCounter/GetGauge/GetHistogram and Render take the
// registry's mutex. Series live as long as the registry, so callers keep the
// pointers instead of looking them up on every update.
#ifndef STRATA_COMMON_METRICS_H_
#define STRATA_COMMON_METRICS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace strata::metrics {

// Label names and values of one series, in the order given.
using Labels = std::vector<std::pair<std::string, std::string>>;

// A value that only goes up (resets only when the process restarts).
class Counter {
 public:
  // REQUIRES: v >= 0.
  void Inc(double v = 1);
  double value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> v_{0};
};

// A value that goes up and down.
class Gauge {
 public:
  void Set(double v) { v_.store(v, std::memory_order_relaxed); }
  void Add(double v) { v_.fetch_add(v, std::memory_order_relaxed); }
  double value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> v_{0};
};

// Observations counted into buckets of upper bounds (le), with their sum and
// count. Rendered as cumulative `_bucket{le="..."}` series ending with
// le="+Inf", then `_sum` and `_count`.
class Histogram {
 public:
  // REQUIRES: bounds strictly increasing and finite (+Inf is implicit).
  explicit Histogram(std::vector<double> bounds);
  void Observe(double v);

  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative;  // one per bound, then +Inf (== count)
    double sum = 0;
    uint64_t count = 0;
  };
  // Bucket counts are read one by one while others may observe: a snapshot
  // taken under load can be off by the observations in flight.
  Snapshot Take() const;

 private:
  const std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // per bucket, +Inf last
  std::atomic<double> sum_{0};
  std::atomic<uint64_t> count_{0};
};

// Bucket bounds in seconds for latencies from 1 ms to 60 s.
std::vector<double> LatencyBuckets();
// Bounds 1, 2, 4, ... up to `max` (for sizes such as tokens per batch).
std::vector<double> PowersOfTwo(double max);

class Registry {
 public:
  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // The series of family `name` with these labels, created on first use.
  // REQUIRES (checked, aborting: a programming error): `name` and every
  // label name are valid Prometheus names ([a-zA-Z_:][a-zA-Z0-9_:]* and
  // [a-zA-Z_][a-zA-Z0-9_]*, no "le" on a histogram), and a family keeps one
  // type and one set of bucket bounds. Label values may hold anything; they
  // are escaped.
  Counter* GetCounter(const std::string& name, const std::string& help, const Labels& labels = {});
  Gauge* GetGauge(const std::string& name, const std::string& help, const Labels& labels = {});
  Histogram* GetHistogram(const std::string& name, const std::string& help, const std::vector<double>& bounds,
                          const Labels& labels = {});

  // `fn` runs at the start of every Render, before the registry's mutex is
  // taken (so it may call Get*): for gauges read from elsewhere, such as
  // queue lengths or a worker's KV pages.
  void OnScrape(std::function<void()> fn);

  // Every family in name order: `# HELP`, `# TYPE`, then its series in label
  // order. The body of a `/metrics` response, content type
  // kContentType.
  std::string Render() const;

 private:
  enum class Type { kCounter, kGauge, kHistogram };
  struct Family {
    Type type;
    std::string help;
    std::vector<double> bounds;  // histograms
    // By rendered label string ({a="x",b="y"} or empty).
    std::map<std::string, std::unique_ptr<Counter>> counters;
    std::map<std::string, std::unique_ptr<Gauge>> gauges;
    std::map<std::string, std::unique_ptr<Histogram>> histograms;
  };
  Family& FamilyLocked(const std::string& name, const std::string& help, Type type, const Labels& labels);

  mutable std::mutex mu_;
  std::map<std::string, Family> families_;  // guarded by mu_
  std::vector<std::function<void()>> on_scrape_;  // guarded by mu_
};

inline constexpr const char* kContentType = "text/plain; version=0.0.4; charset=utf-8";

// The pieces of the text format (exposed for tests).
// A label value: backslash, double quote and newline escaped.
std::string EscapeLabelValue(std::string_view v);
// A HELP text: backslash and newline escaped.
std::string EscapeHelp(std::string_view v);
// A sample value: the shortest decimal that reads back as the same double;
// +Inf, -Inf and NaN as Prometheus spells them.
std::string FormatValue(double v);
// `{a="x",b="y"}` (empty for no labels).
std::string FormatLabels(const Labels& labels);
bool ValidMetricName(std::string_view name);
bool ValidLabelName(std::string_view name);

}  // namespace strata::metrics

#endif  // STRATA_COMMON_METRICS_H_
