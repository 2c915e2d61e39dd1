// Registrar: keeps a worker known to its coordinator — registers (retrying
// until the coordinator answers), then heartbeats at the interval the
// coordinator asked for, and registers again when a heartbeat says the
// worker is unknown (the coordinator restarted or declared it down).
//
// Thread-safety: owns one background thread; the destructor stops it.
#ifndef STRATA_WORKER_REGISTRAR_H_
#define STRATA_WORKER_REGISTRAR_H_

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "strata/v1/worker.grpc.pb.h"
#include "worker/stage_host.h"

namespace strata::worker {

struct RegistrarOptions {
  std::string coordinator;  // host:port
  std::string address;      // this worker's Worker service
  std::string name;
  // A GPU worker: the device its layers go to and the KV pool it reserves
  // there (reported instead of the host's memory).
  std::optional<int> gpu;
  int64_t gpu_kv_bytes = 0;
  // The channel to the coordinator's internal port (common/cluster_security.h).
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
};

class Registrar {
 public:
  // REQUIRES: `host` outlives the registrar.
  Registrar(RegistrarOptions options, StageHost* host);
  ~Registrar();

 private:
  void Loop();

  const RegistrarOptions options_;
  StageHost* const host_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;  // guarded by mu_
  std::thread thread_;
};

// The host's devices: "cpu" with total and available memory.
// What a worker tells the coordinator about itself: its address, name and the
// device its layers go to (the host's memory, or the GPU's with the KV pool
// it reserves there).
v1::RegisterRequest DescribeWorker(const RegistrarOptions& options);

}  // namespace strata::worker

#endif  // STRATA_WORKER_REGISTRAR_H_
