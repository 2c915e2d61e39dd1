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
#include <string>
#include <thread>

#include "strata/v1/worker.grpc.pb.h"
#include "worker/stage_host.h"

namespace strata::worker {

struct RegistrarOptions {
  std::string coordinator;  // host:port
  std::string address;      // this worker's Worker service
  std::string name;
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
v1::RegisterRequest DescribeWorker(const std::string& address, const std::string& name);

}  // namespace strata::worker

#endif  // STRATA_WORKER_REGISTRAR_H_
