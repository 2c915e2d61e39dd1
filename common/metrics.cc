#include "common/metrics.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace strata::metrics {
namespace {

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "metrics: %s\n", what.c_str());
  std::abort();
}

bool NameChar(char c, bool first, bool colon) {
  const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon && c == ':');
  return alpha || (!first && c >= '0' && c <= '9');
}

void AppendSample(std::string* out, const std::string& name, const std::string& labels, double v) {
  out->append(name);
  out->append(labels);
  out->push_back(' ');
  out->append(FormatValue(v));
  out->push_back('\n');
}

// `labels` ({a="x"} or empty) with le="bound" added last.
std::string WithLe(const std::string& labels, const std::string& le) {
  const std::string pair = "le=\"" + le + "\"";
  if (labels.empty()) return "{" + pair + "}";
  return labels.substr(0, labels.size() - 1) + "," + pair + "}";
}

}  // namespace

void Counter::Inc(double v) {
  if (v > 0) v_.fetch_add(v, std::memory_order_relaxed);
}

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i <= bounds_.size(); ++i) counts_[i].store(0);
  for (size_t i = 0; i < bounds_.size(); ++i) {
    if (!std::isfinite(bounds_[i]) || (i > 0 && !(bounds_[i] > bounds_[i - 1]))) {
      Die("histogram bounds must be finite and strictly increasing");
    }
  }
}

void Histogram::Observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;  // le: v <= bound
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::Take() const {
  Snapshot s;
  s.bounds = bounds_;
  uint64_t acc = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    acc += counts_[i].load(std::memory_order_relaxed);
    s.cumulative.push_back(acc);
  }
  s.count = acc;  // consistent with the buckets, whatever count_ says now
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

std::vector<double> LatencyBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60};
}

std::vector<double> PowersOfTwo(double max) {
  std::vector<double> b;
  for (double v = 1; v <= max; v *= 2) b.push_back(v);
  return b;
}

bool ValidMetricName(std::string_view name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    if (!NameChar(name[i], i == 0, /*colon=*/true)) return false;
  }
  return true;
}

bool ValidLabelName(std::string_view name) {
  if (name.empty() || name.rfind("__", 0) == 0) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    if (!NameChar(name[i], i == 0, /*colon=*/false)) return false;
  }
  return true;
}

std::string EscapeLabelValue(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::string EscapeHelp(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}

std::string FormatLabels(const Labels& labels) {
  if (labels.empty()) return "";
  std::string out = "{";
  for (size_t i = 0; i < labels.size(); ++i) {
    if (i > 0) out.push_back(',');
    out += labels[i].first;
    out += "=\"";
    out += EscapeLabelValue(labels[i].second);
    out.push_back('"');
  }
  out.push_back('}');
  return out;
}

Registry::Family& Registry::FamilyLocked(const std::string& name, const std::string& help, Type type,
                                         const Labels& labels) {
  if (!ValidMetricName(name)) Die("invalid metric name '" + name + "'");
  for (const auto& [k, v] : labels) {
    if (!ValidLabelName(k) || (type == Type::kHistogram && k == "le")) {
      Die("invalid label name '" + k + "' on " + name);
    }
  }
  auto [it, inserted] = families_.try_emplace(name);
  Family& f = it->second;
  if (inserted) {
    f.type = type;
    f.help = help;
  } else if (f.type != type) {
    Die("metric " + name + " registered with two types");
  }
  return f;
}

Counter* Registry::GetCounter(const std::string& name, const std::string& help, const Labels& labels) {
  std::lock_guard<std::mutex> l(mu_);
  auto& slot = FamilyLocked(name, help, Type::kCounter, labels).counters[FormatLabels(labels)];
  if (!slot) slot = std::make_unique<Counter>();
  return slot.get();
}

Gauge* Registry::GetGauge(const std::string& name, const std::string& help, const Labels& labels) {
  std::lock_guard<std::mutex> l(mu_);
  auto& slot = FamilyLocked(name, help, Type::kGauge, labels).gauges[FormatLabels(labels)];
  if (!slot) slot = std::make_unique<Gauge>();
  return slot.get();
}

Histogram* Registry::GetHistogram(const std::string& name, const std::string& help,
                                  const std::vector<double>& bounds, const Labels& labels) {
  std::lock_guard<std::mutex> l(mu_);
  Family& f = FamilyLocked(name, help, Type::kHistogram, labels);
  if (f.histograms.empty()) {
    f.bounds = bounds;
  } else if (f.bounds != bounds) {
    Die("histogram " + name + " registered with two sets of bounds");
  }
  auto& slot = f.histograms[FormatLabels(labels)];
  if (!slot) slot = std::make_unique<Histogram>(bounds);
  return slot.get();
}

void Registry::OnScrape(std::function<void()> fn) {
  std::lock_guard<std::mutex> l(mu_);
  on_scrape_.push_back(std::move(fn));
}

std::string Registry::Render() const {
  std::vector<std::function<void()>> hooks;
  {
    std::lock_guard<std::mutex> l(mu_);
    hooks = on_scrape_;
  }
  for (const auto& fn : hooks) fn();
  std::lock_guard<std::mutex> l(mu_);
  std::string out;
  for (const auto& [name, f] : families_) {
    out += "# HELP " + name + " " + EscapeHelp(f.help) + "\n";
    switch (f.type) {
      case Type::kCounter:
        out += "# TYPE " + name + " counter\n";
        for (const auto& [labels, c] : f.counters) AppendSample(&out, name, labels, c->value());
        break;
      case Type::kGauge:
        out += "# TYPE " + name + " gauge\n";
        for (const auto& [labels, g] : f.gauges) AppendSample(&out, name, labels, g->value());
        break;
      case Type::kHistogram:
        out += "# TYPE " + name + " histogram\n";
        for (const auto& [labels, h] : f.histograms) {
          const Histogram::Snapshot s = h->Take();
          for (size_t i = 0; i < s.bounds.size(); ++i) {
            AppendSample(&out, name + "_bucket", WithLe(labels, FormatValue(s.bounds[i])),
                         static_cast<double>(s.cumulative[i]));
          }
          AppendSample(&out, name + "_bucket", WithLe(labels, "+Inf"), static_cast<double>(s.count));
          AppendSample(&out, name + "_sum", labels, s.sum);
          AppendSample(&out, name + "_count", labels, static_cast<double>(s.count));
        }
        break;
    }
  }
  return out;
}

}  // namespace strata::metrics
