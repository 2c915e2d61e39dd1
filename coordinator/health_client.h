// A small client of grpc.health.v1.Health/Check without generated stubs
// (the two messages are encoded by hand: HealthCheckRequest{string service = 1},
// HealthCheckResponse{ServingStatus status = 1}, SERVING = 1). Used by
// `strata up` and the tests to wait for readiness.
//
// Thread-safety: a pure function of its arguments.
#ifndef STRATA_COORDINATOR_HEALTH_CLIENT_H_
#define STRATA_COORDINATOR_HEALTH_CLIENT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"

namespace strata::coordinator {

// True when `service` ("" for the whole server) reports SERVING; false for
// NOT_SERVING; an error when the server cannot be asked (UNAVAILABLE,
// NOT_FOUND for an unknown service name, ...).
absl::StatusOr<bool> CheckHealth(const std::shared_ptr<grpc::Channel>& channel, const std::string& service,
                                 absl::Duration timeout);

}  // namespace strata::coordinator

#endif  // STRATA_COORDINATOR_HEALTH_CLIENT_H_
