// HealthPort: a daemon's readiness as grpc.health.v1 on its own plaintext
// port, for probes that speak no TLS (kubelet's gRPC probe), next to the
// health service of the daemon's TLS ports (docs/deploy.md, "Health").
//
// The port serves grpc.health.v1 only: every other method is UNIMPLEMENTED,
// so nothing but health is ever answered without TLS.
//
// Thread-safety: Set may be called from any thread.
#ifndef STRATA_COMMON_HEALTH_PORT_H_
#define STRATA_COMMON_HEALTH_PORT_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/grpcpp.h"

namespace strata {

class HealthPort {
 public:
  // Listens on `address` (HOST:PORT; port 0 picks one) when it is not empty;
  // `mirrors` are the health services of the daemon's other servers, which
  // Set updates too (null entries are skipped). UNAVAILABLE when the address
  // cannot be bound.
  static absl::StatusOr<std::unique_ptr<HealthPort>> Start(
      const std::string& address, std::vector<grpc::HealthCheckServiceInterface*> mirrors);

  ~HealthPort();

  // Sets `service` ("" for the server as a whole; the named services keep
  // their own status) SERVING or NOT_SERVING here and on every mirror.
  void Set(const std::string& service, bool serving);
  // Sets "" and every named service at once (shutting down).
  void SetAll(bool serving);
  // The bound port; 0 without a port of its own.
  int port() const { return port_; }

 private:
  HealthPort() = default;

  grpc::CallbackGenericService unimplemented_;  // every other method
  std::unique_ptr<grpc::Server> server_;
  std::vector<grpc::HealthCheckServiceInterface*> health_;
  int port_ = 0;
};

}  // namespace strata

#endif  // STRATA_COMMON_HEALTH_PORT_H_
