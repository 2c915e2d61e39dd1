#include "common/health_port.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "grpcpp/health_check_service_interface.h"

namespace strata {

absl::StatusOr<std::unique_ptr<HealthPort>> HealthPort::Start(
    const std::string& address, std::vector<grpc::HealthCheckServiceInterface*> mirrors) {
  std::unique_ptr<HealthPort> h(new HealthPort);
  for (grpc::HealthCheckServiceInterface* m : mirrors) {
    if (m != nullptr) h->health_.push_back(m);
  }
  if (address.empty()) return h;
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder b;
  b.AddListeningPort(address, grpc::InsecureServerCredentials(), &h->port_);
  b.RegisterCallbackGenericService(&h->unimplemented_);
  h->server_ = b.BuildAndStart();
  if (h->server_ == nullptr || h->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address, " (--health-listen)"));
  }
  if (grpc::HealthCheckServiceInterface* own = h->server_->GetHealthCheckService()) {
    own->SetServingStatus(false);  // not ready until the daemon says so
    h->health_.push_back(own);
  }
  return h;
}

HealthPort::~HealthPort() {
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    server_->Wait();
  }
}

void HealthPort::Set(const std::string& service, bool serving) {
  for (grpc::HealthCheckServiceInterface* h : health_) h->SetServingStatus(service, serving);
}

void HealthPort::SetAll(bool serving) {
  for (grpc::HealthCheckServiceInterface* h : health_) h->SetServingStatus(serving);
}

}  // namespace strata
