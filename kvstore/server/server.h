// KvStoreServer: a running `strata-kvstore` — the Store, the KVStore
// service, and grpc.health.v1 (service "" and "strata.v1.KVStore" report
// SERVING until shutdown) on one listening address, and its metrics
// (kvstore/server/kv_metrics.h; served on a port of their own with
// ServerOptions::metrics_listen). Used by the binary
// (kvstore/server/main.cc) and by in-process tests; flags and RPCs are in
// docs/coli-kv.md ("The KV store service").
//
// Thread-safety: Start, port and store may be called from any thread;
// Shutdown is idempotent and thread-safe.
#ifndef STRATA_KVSTORE_SERVER_SERVER_H_
#define STRATA_KVSTORE_SERVER_SERVER_H_

#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/health_port.h"
#include "common/metrics.h"
#include "common/metrics_port.h"
#include "grpcpp/grpcpp.h"
#include "kvstore/env.h"
#include "kvstore/server/kv_metrics.h"
#include "kvstore/server/service.h"
#include "kvstore/store.h"

namespace strata::kv {

struct ServerOptions {
  // host:port; port 0 picks a free port (see port()).
  std::string listen_address = "127.0.0.1:0";
  // Transport security of that port (the cluster's mutual TLS, or plaintext;
  // common/cluster_security.h).
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials();
  // When set, grpc.health.v1 alone on this plaintext address (for probes).
  std::string health_listen;
  // When set, GET /metrics alone on this plaintext address (for Prometheus;
  // common/metrics_port.h).
  std::string metrics_listen;
  // Shutdown gives running calls this long before cancelling them.
  absl::Duration drain_timeout = absl::Seconds(2);
  StoreOptions store;
  ServiceOptions service;
  // Largest request message accepted (Append rows messages).
  int max_receive_message_bytes = 64 << 20;
};

class KvStoreServer {
 public:
  static constexpr char kServiceName[] = "strata.v1.KVStore";

  // Opens the store (FAILED_PRECONDITION when another process holds the
  // directory) and starts serving. UNAVAILABLE when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<KvStoreServer>> Start(Env* env, const ServerOptions& options);

  ~KvStoreServer();  // Shutdown()

  int port() const { return port_; }
  // The health-only port; 0 without one.
  int health_port() const { return health_ != nullptr ? health_->port() : 0; }
  // The metrics-only port; 0 without one.
  int metrics_port() const { return metrics_port_ != nullptr ? metrics_port_->port() : 0; }
  Store* store() { return store_.get(); }
  // The server's metrics (docs/metrics.md §4), also after Shutdown.
  metrics::Registry* metrics() { return &registry_; }

  // Marks the health status NOT_SERVING, stops accepting calls, cancels the
  // ones still running after the drain timeout, and makes every written row
  // that can commit durable.
  void Shutdown();

 private:
  KvStoreServer() : metrics_(&registry_) {}

  metrics::Registry registry_;
  KvStoreMetrics metrics_;
  std::unique_ptr<Env> env_;  // the caller's, with syncs timed
  std::mutex scrape_mu_;
  Store* scrape_store_ = nullptr;  // guarded by scrape_mu_; null once the store is closing
  std::unique_ptr<MetricsPort> metrics_port_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<KvStoreService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<HealthPort> health_;
  absl::Duration drain_timeout_;
  int port_ = 0;
  std::once_flag shutdown_once_;
};

}  // namespace strata::kv

#endif  // STRATA_KVSTORE_SERVER_SERVER_H_
