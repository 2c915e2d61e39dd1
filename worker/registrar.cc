#include "worker/registrar.h"

#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "grpcpp/grpcpp.h"
#include "worker/device_stage.h"
#include "worker/stage_link.h"

namespace strata::worker {

v1::RegisterRequest DescribeWorker(const RegistrarOptions& options) {
  v1::RegisterRequest req;
  req.set_address(options.address);
  req.set_name(options.name);
  v1::Device* d = req.add_devices();
  if (options.gpu.has_value()) {
    d->set_name(absl::StrCat("cuda:", *options.gpu));
    d->set_kv_pool_bytes(options.gpu_kv_bytes);
    int64_t total = 0, free = 0;
    if (DeviceStage::Memory(*options.gpu, &total, &free).ok()) {  // else "unknown" (0)
      d->set_total_bytes(total);
      d->set_free_bytes(free);
    }
    return req;
  }
  d->set_name("cpu");
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  d->set_total_bytes(static_cast<int64_t>(pages) * page);
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    std::istringstream ls(line);
    std::string key;
    int64_t kb = 0;
    ls >> key >> kb;
    if (key == "MemAvailable:") d->set_free_bytes(kb * 1024);
  }
  return req;
}

Registrar::Registrar(RegistrarOptions options, StageHost* host)
    : options_(std::move(options)), host_(host), thread_([this] { Loop(); }) {}

Registrar::~Registrar() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Registrar::Loop() {
  auto channel = InternalChannel(options_.coordinator, options_.credentials);
  auto stub = v1::Coordinator::NewStub(channel);
  std::string worker_id;
  int interval_ms = 500;
  for (;;) {
    {
      std::unique_lock<std::mutex> l(mu_);
      if (cv_.wait_for(l, std::chrono::milliseconds(worker_id.empty() ? 200 : interval_ms), [&] { return stop_; })) {
        return;
      }
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    if (worker_id.empty()) {
      v1::RegisterResponse resp;
      grpc::Status st = stub->Register(&ctx, DescribeWorker(options_), &resp);
      if (st.ok()) {
        worker_id = resp.worker_id();
        if (resp.heartbeat_interval_ms() > 0) interval_ms = resp.heartbeat_interval_ms();
        log::Info("registered", {{"worker", options_.name}, {"worker_id", worker_id}, {"address", options_.address},
                                 {"coordinator", options_.coordinator}});
      }
      continue;
    }
    v1::HeartbeatRequest hb;
    hb.set_worker_id(worker_id);
    v1::WorkerStatsResponse stats = host_->Stats();
    hb.set_epoch(stats.epoch());
    hb.set_sequences(stats.sequences());
    v1::HeartbeatResponse resp;
    grpc::Status st = stub->Heartbeat(&ctx, hb, &resp);
    if (st.ok() && !resp.known()) {
      log::Warn("unknown_to_coordinator", {{"worker", options_.name}, {"worker_id", worker_id},
                                           {"coordinator", options_.coordinator}});
      worker_id.clear();  // registers again
    }
  }
}

}  // namespace strata::worker
