// The KV store's metrics (docs/metrics.md §4): append and fsync latency,
// bytes appended and read, sessions open and stored, RPCs by method and
// code, registered once in a metrics::Registry that strata-kvstore serves on
// --metrics-listen.
//
// Thread-safety: the series are thread-safe (common/metrics.h); Rpc takes the
// struct's mutex to find a series; the struct is otherwise immutable.
#ifndef STRATA_KVSTORE_SERVER_KV_METRICS_H_
#define STRATA_KVSTORE_SERVER_KV_METRICS_H_

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

#include "common/metrics.h"
#include "grpcpp/grpcpp.h"
#include "kvstore/env.h"

namespace strata::kv {

struct KvStoreMetrics {
  // REQUIRES: registry outlives this.
  explicit KvStoreMetrics(metrics::Registry* registry);

  // strata_kvstore_rpcs_total{method, code}: an RPC that finished with `code`.
  metrics::Counter* Rpc(std::string_view method, grpc::StatusCode code);

  metrics::Registry* const registry;
  metrics::Histogram* const append_seconds;  // one Append rows message written in place
  metrics::Histogram* const fsync_seconds;   // one file or directory sync
  metrics::Counter* const bytes_appended;    // row bytes Append wrote
  metrics::Counter* const bytes_read;        // row bytes Load sent
  metrics::Counter* const fsync_errors;      // syncs that failed
  metrics::Gauge* const sessions_open;       // set at scrape time by the server
  metrics::Gauge* const sessions_stored;

 private:
  std::mutex mu_;
  std::map<std::pair<std::string, int>, metrics::Counter*> rpcs_;  // guarded by mu_
};

// An Env that passes everything to `base` and times every File::Sync and
// Env::SyncDir into metrics->fsync_seconds (failures into fsync_errors).
// REQUIRES: base and metrics outlive the Env and its files.
std::unique_ptr<Env> NewSyncTimingEnv(Env* base, KvStoreMetrics* metrics);

}  // namespace strata::kv

#endif  // STRATA_KVSTORE_SERVER_KV_METRICS_H_
