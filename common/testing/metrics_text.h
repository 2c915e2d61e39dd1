// Reading samples back from a rendered metrics registry (the Prometheus text
// of common/metrics.h), for tests.
#ifndef STRATA_COMMON_TESTING_METRICS_TEXT_H_
#define STRATA_COMMON_TESTING_METRICS_TEXT_H_

#include <cstdlib>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>

namespace strata::testing {

// The value of the series written exactly as `series` (name and rendered
// labels, e.g. `strata_worker_steps_total{stage="0",kind="decode"}`), or
// nullopt when the body has no such line.
inline std::optional<double> MetricValue(const std::string& body, std::string_view series) {
  std::istringstream in(body);
  std::string line;
  while (std::getline(in, line)) {
    if (line.size() > series.size() && line.compare(0, series.size(), series) == 0 && line[series.size()] == ' ') {
      return std::strtod(line.c_str() + series.size() + 1, nullptr);
    }
  }
  return std::nullopt;
}

// Whether the body declares family `name` (its `# TYPE name` line).
inline bool HasFamily(const std::string& body, std::string_view name) {
  return body.find("# TYPE " + std::string(name) + " ") != std::string::npos;
}

}  // namespace strata::testing

#endif  // STRATA_COMMON_TESTING_METRICS_TEXT_H_
