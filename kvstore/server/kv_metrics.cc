#include "kvstore/server/kv_metrics.h"

#include <chrono>

#include "absl/status/statusor.h"

namespace strata::kv {
namespace {

using Clock = std::chrono::steady_clock;

// The canonical name of a gRPC code (OK, NOT_FOUND, ...), as absl spells the
// same numbers.
std::string CodeName(grpc::StatusCode code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

// Bounds of the sync histogram: 50 µs to 60 s (a sync on tmpfs or a fast SSD
// is well under the 1 ms of metrics::LatencyBuckets).
std::vector<double> SyncBuckets() {
  std::vector<double> b = {0.00005, 0.0001, 0.00025, 0.0005};
  for (double v : metrics::LatencyBuckets()) b.push_back(v);
  return b;
}

class TimedFile final : public File {
 public:
  TimedFile(std::unique_ptr<File> base, KvStoreMetrics* m) : base_(std::move(base)), m_(m) {}
  absl::Status Write(uint64_t offset, std::string_view data) override { return base_->Write(offset, data); }
  absl::StatusOr<size_t> Read(uint64_t offset, size_t n, char* scratch) override {
    return base_->Read(offset, n, scratch);
  }
  absl::Status Sync() override {
    const Clock::time_point t0 = Clock::now();
    absl::Status s = base_->Sync();
    m_->fsync_seconds->Observe(std::chrono::duration<double>(Clock::now() - t0).count());
    if (!s.ok()) m_->fsync_errors->Inc();
    return s;
  }
  absl::Status Truncate(uint64_t size) override { return base_->Truncate(size); }
  absl::StatusOr<uint64_t> Size() override { return base_->Size(); }
  absl::Status Close() override { return base_->Close(); }

 private:
  std::unique_ptr<File> base_;
  KvStoreMetrics* const m_;
};

class SyncTimingEnv final : public Env {
 public:
  SyncTimingEnv(Env* base, KvStoreMetrics* m) : base_(base), m_(m) {}
  absl::StatusOr<std::unique_ptr<File>> Open(const std::string& path, OpenMode mode) override {
    absl::StatusOr<std::unique_ptr<File>> f = base_->Open(path, mode);
    if (!f.ok()) return f.status();
    return std::unique_ptr<File>(new TimedFile(std::move(*f), m_));
  }
  absl::Status SyncDir(const std::string& dir) override {
    const Clock::time_point t0 = Clock::now();
    absl::Status s = base_->SyncDir(dir);
    m_->fsync_seconds->Observe(std::chrono::duration<double>(Clock::now() - t0).count());
    if (!s.ok()) m_->fsync_errors->Inc();
    return s;
  }
  absl::Status Rename(const std::string& from, const std::string& to) override { return base_->Rename(from, to); }
  absl::Status Delete(const std::string& path) override { return base_->Delete(path); }
  absl::Status CreateDir(const std::string& dir) override { return base_->CreateDir(dir); }
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) override { return base_->ListDir(dir); }
  absl::StatusOr<uint64_t> FileSize(const std::string& path) override { return base_->FileSize(path); }
  bool FileExists(const std::string& path) override { return base_->FileExists(path); }
  absl::StatusOr<std::unique_ptr<FileLock>> LockFile(const std::string& path) override {
    return base_->LockFile(path);
  }

 private:
  Env* const base_;
  KvStoreMetrics* const m_;
};

}  // namespace

KvStoreMetrics::KvStoreMetrics(metrics::Registry* r)
    : registry(r),
      append_seconds(r->GetHistogram("strata_kvstore_append_seconds",
                                     "Time to write one Append rows message in place (before its commit).",
                                     SyncBuckets())),
      fsync_seconds(r->GetHistogram("strata_kvstore_fsync_seconds", "Time of one file or directory sync.",
                                    SyncBuckets())),
      bytes_appended(r->GetCounter("strata_kvstore_appended_bytes_total", "Row bytes written by Append streams.")),
      bytes_read(r->GetCounter("strata_kvstore_read_bytes_total", "Row bytes sent by Load streams.")),
      fsync_errors(r->GetCounter("strata_kvstore_fsync_errors_total", "File or directory syncs that failed.")),
      sessions_open(r->GetGauge("strata_kvstore_sessions_open", "Sessions open (cached, with their file handles).")),
      sessions_stored(r->GetGauge("strata_kvstore_sessions_stored", "Sessions stored in the directory.")) {}

metrics::Counter* KvStoreMetrics::Rpc(std::string_view method, grpc::StatusCode code) {
  std::lock_guard<std::mutex> l(mu_);
  auto key = std::make_pair(std::string(method), static_cast<int>(code));
  auto it = rpcs_.find(key);
  if (it != rpcs_.end()) return it->second;
  metrics::Counter* c = registry->GetCounter("strata_kvstore_rpcs_total", "RPCs finished, by method and status code.",
                                             {{"method", std::string(method)}, {"code", CodeName(code)}});
  rpcs_.emplace(std::move(key), c);
  return c;
}

std::unique_ptr<Env> NewSyncTimingEnv(Env* base, KvStoreMetrics* metrics) {
  return std::make_unique<SyncTimingEnv>(base, metrics);
}

}  // namespace strata::kv
