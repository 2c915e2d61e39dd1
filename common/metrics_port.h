// MetricsPort: a daemon's metrics::Registry served as Prometheus text at
// GET /metrics on a plaintext HTTP port of its own (`--metrics-listen`), for
// a Prometheus inside the cluster (docs/metrics.md §1). Every other path is
// 404; nothing but metrics is ever answered there.
//
// Thread-safety: the port serves from its own threads; the registry is
// thread-safe.
#ifndef STRATA_COMMON_METRICS_PORT_H_
#define STRATA_COMMON_METRICS_PORT_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "common/metrics.h"

namespace httplib {
class Server;
}

namespace strata {

class MetricsPort {
 public:
  // Listens on `address` (HOST:PORT; port 0 picks one). An empty address
  // starts nothing (port() 0). UNAVAILABLE when it cannot be bound,
  // INVALID_ARGUMENT when it is not HOST:PORT.
  // REQUIRES: registry outlives the port.
  static absl::StatusOr<std::unique_ptr<MetricsPort>> Start(const std::string& address,
                                                            metrics::Registry* registry);
  ~MetricsPort();

  int port() const { return port_; }

 private:
  MetricsPort() = default;

  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace strata

#endif  // STRATA_COMMON_METRICS_PORT_H_
