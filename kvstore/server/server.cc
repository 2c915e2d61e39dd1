#include "kvstore/server/server.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "grpcpp/health_check_service_interface.h"

namespace strata::kv {

absl::StatusOr<std::unique_ptr<KvStoreServer>> KvStoreServer::Start(Env* env,
                                                                    const ServerOptions& options) {
  std::unique_ptr<KvStoreServer> s(new KvStoreServer);
  ASSIGN_OR_RETURN(s->store_, Store::Open(env, options.store));
  s->service_ = std::make_unique<KvStoreService>(s->store_.get(), options.service);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen_address, options.credentials, &s->port_);
  builder.RegisterService(s->service_.get());
  builder.SetMaxReceiveMessageSize(options.max_receive_message_bytes);
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.listen_address));
  }
  s->drain_timeout_ = options.drain_timeout;
  ASSIGN_OR_RETURN(s->health_, HealthPort::Start(options.health_listen, {s->server_->GetHealthCheckService()}));
  s->health_->Set(kServiceName, true);
  s->health_->Set("", true);
  return s;
}

KvStoreServer::~KvStoreServer() { Shutdown(); }

void KvStoreServer::Shutdown() {
  std::call_once(shutdown_once_, [this] {
    if (server_ != nullptr) {
      if (health_ != nullptr) health_->SetAll(false);
      server_->Shutdown(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(drain_timeout_));
      server_->Wait();
    }
    store_.reset();  // last commit round of every session
  });
}

}  // namespace strata::kv
