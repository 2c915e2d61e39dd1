#include "kvstore/server/server.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "grpcpp/health_check_service_interface.h"

namespace strata::kv {

absl::StatusOr<std::unique_ptr<KvStoreServer>> KvStoreServer::Start(Env* env,
                                                                    const ServerOptions& options) {
  std::unique_ptr<KvStoreServer> s(new KvStoreServer);
  s->env_ = NewSyncTimingEnv(env, &s->metrics_);
  ASSIGN_OR_RETURN(s->store_, Store::Open(s->env_.get(), options.store));
  {
    std::lock_guard<std::mutex> l(s->scrape_mu_);
    s->scrape_store_ = s->store_.get();
  }
  KvStoreServer* self = s.get();
  s->registry_.OnScrape([self] {
    std::lock_guard<std::mutex> l(self->scrape_mu_);
    if (self->scrape_store_ == nullptr) return;
    self->metrics_.sessions_open->Set(static_cast<double>(self->scrape_store_->OpenSessions()));
    absl::StatusOr<size_t> n = self->scrape_store_->StoredSessions();
    if (n.ok()) self->metrics_.sessions_stored->Set(static_cast<double>(*n));
  });
  s->service_ = std::make_unique<KvStoreService>(s->store_.get(), options.service, &s->metrics_);
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
  ASSIGN_OR_RETURN(s->metrics_port_, MetricsPort::Start(options.metrics_listen, &s->registry_));
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
    {
      std::lock_guard<std::mutex> l(scrape_mu_);
      scrape_store_ = nullptr;
    }
    store_.reset();  // last commit round of every session
  });
}

}  // namespace strata::kv
