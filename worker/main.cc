// strata-worker: hosts one pipeline stage (docs/service.md, "Worker").
//
//   strata-worker --coordinator HOST:PORT --model-root DIR [--listen 127.0.0.1:0] [--name w0]
//                 (--cluster-ca FILE --cluster-cert FILE --cluster-key FILE | --insecure-cluster)
//
// Prints "metrics ADDRESS" (with --metrics-listen, docs/metrics.md) and then
// "listening ADDRESS" on stdout once serving, logs events on stderr
// (docs/logging.md), registers with the coordinator's
// internal port, and stops on SIGINT / SIGTERM: readiness goes false and
// running calls get --drain-timeout-s before they are cancelled
// (docs/deploy.md).
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/cluster_security.h"
#include "common/flags.h"
#include "common/health_port.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/metrics_port.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "worker/registrar.h"
#include "worker/stage_host.h"
#include "worker/worker_service.h"

namespace {

int Usage(const std::string& msg, const strata::FlagSet& flags) {
  std::fprintf(stderr, "strata-worker: %s\n\nusage: strata-worker --coordinator HOST:PORT [flags]\n%s",
               msg.c_str(), flags.Help().c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  strata::FlagSet flags;
  flags.Declare("coordinator", "address of strata-coordinator's internal port (HOST:PORT)");
  flags.Declare("model-root", "load only model directories under this one (AssignLayers names the model)");
  flags.Declare("health-listen", "plaintext address serving only grpc.health.v1, for probes (default: none)");
  flags.Declare("metrics-listen", "plaintext address serving only GET /metrics, for Prometheus (default: none)");
  flags.Declare("drain-timeout-s", "on SIGTERM, running calls get this long before they are cancelled (default 5)");
  strata::DeclareClusterSecurityFlags(flags);
  flags.Declare("listen", "address to serve strata.v1.Worker on (default 127.0.0.1:0: any free port)");
  flags.Declare("advertise", "address the coordinator and the previous stage dial (default: the listen address)");
  flags.Declare("name", "worker name used in placement overrides and messages (default: the address)");
  flags.Declare("threads", "engine threads (default 0: one per core)");
  flags.Declare("max-chunk-bytes", "largest hidden-state payload per message (default 1048576)");
  flags.Declare("debug-step-delay-ms", "test hook: sleep this long before each batch (default 0)");
  flags.Declare("device", "where the layers run: cpu (default) or gpu (docs/gpu-engine.md)");
  flags.Declare("gpu", "with --device gpu: the CUDA device index (default 0)");
  flags.Declare("gpu-kv-bytes", "with --device gpu: device bytes reserved for the KV cache (default 4294967296)");
  flags.Declare("gpu-gemm", "with --device gpu: bf16 (default; f32 inputs enter as hi + lo bf16 terms), "
                            "bf16-rounded (inputs of steps over four rows rounded to bf16: faster prefill, "
                            "less exact) or f32 (a test mode matching the CPU engine)");
  flags.Declare("gpu-weights", "with --device gpu: fp8 (default: weights the checkpoint stores as fp8 with block "
                               "scales stay fp8 on the GPU, run as fp8 GEMMs) or bf16 (decoded to bf16 at load)");
  flags.Declare("help", "show this help", true);
  if (auto st = flags.Parse(argc, argv, 1); !st.ok()) return Usage(std::string(st.message()), flags);
  if (flags.Has("help")) {
    std::printf("usage: strata-worker --coordinator HOST:PORT [flags]\n%s", flags.Help().c_str());
    return 0;
  }
  if (!flags.Has("coordinator")) return Usage("--coordinator is required", flags);
  strata::log::Configure({"strata-worker", nullptr});
  auto threads = flags.GetInt("threads", 0);
  auto chunk = flags.GetInt("max-chunk-bytes", strata::worker::kDefaultMaxChunkBytes);
  if (!threads.ok()) return Usage(std::string(threads.status().message()), flags);
  if (*threads < 0 || *threads > strata::kMaxThreads) {
    return Usage(absl::StrCat("--threads must be in [0, ", strata::kMaxThreads, "] (0: one per core)"), flags);
  }
  if (!chunk.ok() || *chunk < 4096 || *chunk > (3 << 20)) {
    return Usage("--max-chunk-bytes must be in [4096, 3145728]", flags);
  }
  const std::string listen = flags.Get("listen", "127.0.0.1:0");

  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);  // every thread inherits this; main waits below

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  strata::worker::StageHostOptions ho;
  ho.threads = static_cast<int>(*threads);
  ho.max_chunk_bytes = static_cast<size_t>(*chunk);
  ho.name = flags.Get("name", "worker");
  auto delay = flags.GetInt("debug-step-delay-ms", 0);
  if (!delay.ok() || *delay < 0 || *delay > 10000) return Usage("--debug-step-delay-ms must be in [0, 10000]", flags);
  ho.debug_step_delay_ms = static_cast<int>(*delay);
  const std::string device = flags.Get("device", "cpu");
  if (device != "cpu" && device != "gpu") return Usage("--device must be cpu or gpu, not '" + device + "'", flags);
  ho.gpu = device == "gpu";
  if (ho.gpu && !strata::worker::DeviceStage::Built()) {
    return Usage("--device gpu: this strata-worker was built without CUDA (rebuild where nvcc is installed)", flags);
  }
  auto gpu_index = flags.GetInt("gpu", 0);
  auto kv_bytes = flags.GetInt("gpu-kv-bytes", int64_t{4} << 30);
  if (!gpu_index.ok() || *gpu_index < 0 || *gpu_index > 1023) return Usage("--gpu must be a device index", flags);
  if (!kv_bytes.ok()) return Usage(std::string(kv_bytes.status().message()), flags);
  if (*kv_bytes < 65536) return Usage("--gpu-kv-bytes must be at least 65536", flags);
  if (!ho.gpu && (flags.Has("gpu") || flags.Has("gpu-kv-bytes") || flags.Has("gpu-gemm") || flags.Has("gpu-weights"))) {
    return Usage("--gpu, --gpu-kv-bytes, --gpu-gemm and --gpu-weights need --device gpu", flags);
  }
  const std::string weights = flags.Get("gpu-weights", "fp8");
  if (weights != "fp8" && weights != "bf16") {
    return Usage("--gpu-weights must be fp8 or bf16, not '" + weights + "'", flags);
  }
  const std::string gemm = flags.Get("gpu-gemm", "bf16");
  if (gemm != "bf16" && gemm != "bf16-rounded" && gemm != "f32") {
    return Usage("--gpu-gemm must be bf16, bf16-rounded or f32, not '" + gemm + "'", flags);
  }
  ho.gpu_options.f32_gemm = gemm == "f32";
  ho.gpu_options.round_gemm_inputs = gemm == "bf16-rounded";
  ho.gpu_options.fp8_weights = weights == "fp8" && gemm != "f32";  // f32: the exact test mode decodes them
  ho.gpu_options.device = static_cast<int>(*gpu_index);
  ho.gpu_options.kv_cache_bytes = *kv_bytes;
  if (!flags.Has("model-root")) return Usage("--model-root is required: the directory holding the models to serve", flags);
  auto drain = flags.GetInt("drain-timeout-s", 5);
  if (!drain.ok() || *drain < 0 || *drain > 3600) return Usage("--drain-timeout-s must be in [0, 3600]", flags);
  auto creds = strata::ClusterCredentialsFromFlags(flags, "strata-worker");
  if (!creds.ok()) return Usage(std::string(creds.status().message()), flags);
  ho.credentials = creds->channel();
  ho.model_root = flags.Get("model-root");
  strata::metrics::Registry registry;  // outlives the host and the port
  ho.metrics = &registry;
  auto host = std::make_unique<strata::worker::StageHost>(ho);
  std::unique_ptr<strata::HealthPort> health;
  std::mutex health_mu;
  strata::worker::WorkerService service(host.get(), [&](bool ready) {
    std::lock_guard<std::mutex> l(health_mu);
    if (health) health->Set("strata.v1.Worker", ready);
  });
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen, creds->server(), &port);
  builder.RegisterService(&service);
  builder.SetMaxReceiveMessageSize(8 << 20);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 500);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    strata::log::Error("listen_failed", {{"address", listen}});
    return 1;
  }
  {
    auto h = strata::HealthPort::Start(flags.Get("health-listen"), {server->GetHealthCheckService()});
    if (!h.ok()) {
      strata::log::Error("listen_failed", {{"error", h.status().message()}});
      return 1;
    }
    std::lock_guard<std::mutex> l(health_mu);
    health = std::move(*h);
    health->Set("strata.v1.Worker", false);
    health->Set("", true);  // the process is up; "strata.v1.Worker" says whether layers are loaded
  }
  auto metrics_port = strata::MetricsPort::Start(flags.Get("metrics-listen"), &registry);
  if (!metrics_port.ok()) {
    strata::log::Error("listen_failed", {{"error", metrics_port.status().message()}});
    return 1;
  }
  if ((*metrics_port)->port() != 0) {
    const std::string ml = flags.Get("metrics-listen");
    std::printf("metrics %s:%d\n", ml.substr(0, ml.rfind(':')).c_str(), (*metrics_port)->port());
  }
  const std::string host_part = listen.substr(0, listen.rfind(':'));
  const std::string address = flags.Get("advertise", absl::StrCat(host_part, ":", port));
  std::printf("listening %s\n", address.c_str());
  std::fflush(stdout);
  strata::log::Info("listening", {{"worker", flags.Get("name", address)}, {"address", address},
                                  {"metrics_port", (*metrics_port)->port()}, {"device", device}});

  strata::worker::RegistrarOptions ro{flags.Get("coordinator"), address, flags.Get("name", address)};
  ro.credentials = creds->channel();
  if (ho.gpu) {
    ro.gpu = ho.gpu_options.device;
    ro.gpu_kv_bytes = ho.gpu_options.kv_cache_bytes;
  }
  auto registrar = std::make_unique<strata::worker::Registrar>(ro, host.get());

  int sig = 0;
  sigwait(&set, &sig);
  strata::log::Info("drain", {{"worker", flags.Get("name", address)}, {"signal", sig}, {"timeout_s", *drain}});
  {
    std::lock_guard<std::mutex> l(health_mu);
    health->SetAll(false);
  }
  std::thread([set] {  // a second signal exits at once
    int again = 0;
    sigwait(&set, &again);
    strata::log::Warn("exit_now", {{"signal", again}});
    std::_Exit(1);
  }).detach();
  registrar.reset();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(*drain));
  server->Wait();
  metrics_port->reset();
  host.reset();
  strata::log::Info("stopped", {{"worker", flags.Get("name", address)}});
  return 0;
}
